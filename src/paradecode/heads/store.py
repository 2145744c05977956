"""Saving, loading and checking draft heads: a folder with ``head.safetensors`` and ``config.json``.

``config.json`` says what the head is (``kind``: one of ``KINDS``, its sizes), which target it was trained for
(sizes plus a fingerprint of the target's embedding matrix, so a head for another model fails clearly
instead of drafting garbage), its draft vocabulary size and how it was trained. ``head.safetensors`` holds
the head's weights (fp16) and, with a draft vocabulary, ``draft_ids`` [Vd]: the full-vocabulary id of each
draft logit. The target's embedding and LM head are never stored: they are read from the target itself.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from paradecode.errors import ParadecodeError
from paradecode.heads.eagle import EagleHead, HeadShape
from paradecode.heads.eagle3 import Eagle3Head, default_aux_layers
from paradecode.heads.medusa import MedusaHeads
from paradecode.heads.parallel import ParallelHead

KINDS = ("eagle", "eagle3", "parallel", "medusa")
AUX_KINDS = ("eagle3", "parallel")  # read the target's aux-layer features and score their own LM head
Head = EagleHead | Eagle3Head | ParallelHead | MedusaHeads

FORMAT_VERSION = 1
WEIGHTS_DIR = Path(__file__).parent / "weights"  # shipped heads: weights/<model>-<kind>/


@dataclass(frozen=True)
class TargetWeights:
    """The target's frozen pieces a head uses: token embeddings and LM head, float32."""

    embed: torch.Tensor  # [V, D]
    lm_head: torch.Tensor  # [V, D]
    config: dict  # the target's config.json

    @property
    def fingerprint(self) -> float:
        return round(float(self.embed[:512].double().abs().mean()), 6)


@lru_cache(maxsize=4)
def target_weights(model_dir: str) -> TargetWeights:
    """Embedding and LM head from a Hugging Face model directory (the converted model's safetensors)."""
    from safetensors import safe_open

    folder = Path(model_dir)
    config = json.loads((folder / "config.json").read_text())
    files = sorted(folder.glob("*.safetensors"))
    tensors = {}
    for path in files:
        with safe_open(path, "pt") as f:
            for name in ("model.embed_tokens.weight", "lm_head.weight"):
                if name in f.keys():
                    tensors[name] = f.get_tensor(name).float()
    if "model.embed_tokens.weight" not in tensors:
        raise ParadecodeError(f"no model.embed_tokens.weight in {folder}: draft heads need a Llama-style checkpoint.")
    embed = tensors["model.embed_tokens.weight"]
    return TargetWeights(embed, tensors.get("lm_head.weight", embed), config)


@dataclass
class LoadedHead:
    module: Head
    config: dict
    draft_ids: torch.Tensor | None  # [Vd] full-vocabulary ids of the draft logits; None = every token
    path: Path | None = None


def build_head(kind: str, shape: HeadShape, num_heads: int = 4, *, num_layers: int = 0,
               aux_layers: tuple[int, ...] = (), draft_vocab: int = 0) -> Head:
    """A fresh head of ``kind``. EAGLE-3 and the parallel head read the inputs of ``aux_layers`` of a
    ``num_layers``-layer target (default: ``default_aux_layers``) and score ``draft_vocab`` tokens (0: the
    whole vocabulary)."""
    if kind == "eagle":
        return EagleHead(shape)
    if kind in AUX_KINDS:
        aux_layers = tuple(aux_layers) or default_aux_layers(num_layers)
        bound = num_layers or max(aux_layers, default=0) + 1
        if not aux_layers or any(not 0 <= i < bound for i in aux_layers) or list(aux_layers) != sorted(set(aux_layers)):
            raise ParadecodeError(f"EAGLE-3 aux layers must be ascending layer indices of the target, got "
                                  f"{list(aux_layers)}.")
        return (Eagle3Head if kind == "eagle3" else ParallelHead)(shape, aux_layers, draft_vocab or shape.vocab_size)
    if kind == "medusa":
        return MedusaHeads(shape, num_heads)
    raise ParadecodeError(f"unknown head kind {kind!r}; choose one of: {', '.join(KINDS)}.")


def head_config(module: Head, target: TargetWeights, target_name: str,
                draft_ids: torch.Tensor | None, training: dict | None = None) -> dict:
    return dict(
        format_version=FORMAT_VERSION, kind=module.kind, shape=dataclasses.asdict(module.shape),
        num_heads=getattr(module, "num_heads", 1), draft_vocab_size=0 if draft_ids is None else len(draft_ids),
        aux_layers=list(getattr(module, "aux_layers", ())),
        target=dict(name=target_name, hidden_size=target.config["hidden_size"],
                    vocab_size=target.config["vocab_size"], num_hidden_layers=target.config["num_hidden_layers"],
                    embed_fingerprint=target.fingerprint),
        training=training or {},
    )


def save_head(folder: Path, module: Head, config: dict, draft_ids: torch.Tensor | None) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {name: p.detach().to(torch.float16).contiguous() for name, p in module.state_dict().items()}
    if draft_ids is not None:
        tensors["draft_ids"] = draft_ids.to(torch.int64).contiguous()
    save_file(tensors, folder / "head.safetensors")
    (folder / "config.json").write_text(json.dumps(config, indent=1) + "\n")


def load_head(folder: str | Path, kind: str | None, target: TargetWeights) -> LoadedHead:
    """Load and check a head folder (of ``kind``; None: any); every problem is a ParadecodeError that says what
    to do."""
    from safetensors.torch import load_file

    folder = Path(folder)
    if not (folder / "config.json").is_file() or not (folder / "head.safetensors").is_file():
        raise ParadecodeError(f"{folder} is not a draft head: it needs config.json and head.safetensors "
                              "(train one with `paradecode train-draft`).")
    try:
        config = json.loads((folder / "config.json").read_text())
        shape = HeadShape(**config["shape"])
        head_kind, num_heads, want = config["kind"], int(config.get("num_heads", 1)), config["target"]
        aux_layers, draft_vocab = tuple(int(i) for i in config.get("aux_layers", ())), int(config.get("draft_vocab_size", 0))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
        raise ParadecodeError(f"{folder}/config.json is not a valid head config ({type(error).__name__}: "
                              f"{error}).") from None
    if kind is not None and head_kind != kind:
        raise ParadecodeError(f"{folder} holds a {head_kind!r} head, but method {kind!r} needs a {kind} head.")
    have = target.config
    for key in ("hidden_size", "vocab_size", "num_hidden_layers"):
        if want.get(key) != have.get(key):
            raise ParadecodeError(f"the head in {folder} was trained for model {want.get('name')!r} ({key} "
                                  f"{want.get(key)}), but this model has {key} {have.get(key)}: use a head "
                                  "trained for this model (`paradecode train-draft`).")
    if abs(float(want.get("embed_fingerprint", 0.0)) - target.fingerprint) > 1e-4 * max(1.0, target.fingerprint):
        raise ParadecodeError(f"the head in {folder} was trained for model {want.get('name')!r}, whose weights "
                              "differ from this model's: use a head trained for this model (`paradecode train-draft`).")
    module = build_head(head_kind, shape, num_heads, num_layers=int(have.get("num_hidden_layers", 0)),
                        aux_layers=aux_layers, draft_vocab=draft_vocab)
    tensors = load_file(folder / "head.safetensors")
    draft_ids = tensors.pop("draft_ids", None)
    try:
        module.load_state_dict({k: v.float() for k, v in tensors.items()})
    except RuntimeError as error:
        raise ParadecodeError(f"{folder}/head.safetensors does not match its config.json: {error}") from None
    if draft_ids is not None and (draft_ids.min() < 0 or draft_ids.max() >= shape.vocab_size):
        raise ParadecodeError(f"{folder}: draft_ids name tokens outside the vocabulary.")
    return LoadedHead(module.eval(), config, draft_ids, folder)


def shipped_head(kind: str, model_name: str | None) -> Path | None:
    """The folder of the ``kind`` head shipped for the model, or None where none ships."""
    folder = WEIGHTS_DIR / f"{model_name}-{kind}"
    return folder if model_name and (folder / "config.json").is_file() else None


def resolve_head_dir(head: str, kind: str, model_name: str | None) -> Path:
    """``head`` option -> folder: a path as given, or (empty) the head shipped for the model."""
    if head:
        return Path(head).expanduser()
    shipped = shipped_head(kind, model_name)
    if shipped is None:
        raise ParadecodeError(f"no {kind} head is shipped for model {model_name!r}; train one with "
                              f"`paradecode train-draft --kind {kind} --model ... --out DIR` and pass --opt head=DIR.")
    return shipped
