"""Our own small transformer for masked diffusion (bidirectional) and its autoregressive twin (causal).

One pre-norm transformer, learned absolute positions, tied embeddings; ``ModelConfig.causal`` picks the
attention pattern, so the dLLM and its AR twin share every line but the mask. ``forward`` scores any subset of
positions against an optional ``KVCache`` (``paradecode.dllm.cache``): the dLLM's approximate prefix / dual
caches and the twin's exact autoregressive cache are the same buffers written at different positions.
Checkpoints are a folder with ``model.safetensors`` and ``config.json`` (``save`` / ``load_checkpoint``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from paradecode.dllm.cache import KVCache
from paradecode.dllm.tasks import VOCAB, Vocab
from paradecode.errors import ParadecodeError


@dataclass(frozen=True)
class ModelConfig:
    suite: str = "waiting-line"
    gen_length: int = 12  # canvas length the model was trained with (answer + end-of-text padding)
    causal: bool = False  # False: masked diffusion LM; True: its autoregressive twin
    vocab: tuple[str, ...] = tuple(VOCAB)
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    d_ff: int = 512
    max_len: int = 48  # positions: prompt + canvas
    info: dict = field(default_factory=dict, compare=False)  # training notes (steps, time, held-out accuracy)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ff = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_ff), nn.GELU(), nn.Linear(cfg.d_ff, cfg.d_model))

    def forward(self, h, allowed, layer_cache=None):  # h [B, S, d], allowed [B, 1, S, K] bool
        b, s, d = h.shape
        q, k, v = self.qkv(self.ln1(h)).view(b, s, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        if layer_cache is not None:  # k, v [B, H, S, dh] -> the cache's keys and values [B, H, K, dh]
            k, v = layer_cache(k, v)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)  # [B, H, S, dh]
        h = h + self.proj(attended.transpose(1, 2).reshape(b, s, d))
        return h + self.ff(self.ln2(h))


class TinyLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.vocab = Vocab(cfg.vocab)
        self.tok_emb = nn.Embedding(len(cfg.vocab), cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        nn.init.normal_(self.tok_emb.weight, std=0.02)
        nn.init.normal_(self.pos_emb.weight, std=0.02)

    @property
    def mask_id(self) -> int:
        return self.vocab.mask_id

    @property
    def eot_id(self) -> int:
        return self.vocab.eot_id

    @property
    def max_length(self) -> int:
        return self.config.max_len

    @property
    def gen_length(self) -> int:
        return self.config.gen_length

    supports_cache = True

    def new_cache(self) -> KVCache:
        return KVCache(self.config.n_layers)

    def encode(self, text: str) -> list[int]:
        return self.vocab.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.vocab.decode(ids)

    def forward(self, tokens, valid=None, index=None, cache=None):
        """Logits [B, S, V] for ``tokens`` [B, S].

        Training: ``valid`` [B, S] marks real tokens of left-padded rows (positions count real tokens only).
        Inference (batch 1): ``index`` [S] gives each token's position in the sequence; with ``cache`` the
        keys are the cache's (every position written so far), else just these tokens.
        """
        b, s = tokens.shape
        if valid is None:
            valid = torch.ones(b, s, dtype=torch.bool, device=tokens.device)
        if index is None:
            positions = (valid.long().cumsum(-1) - 1).clamp(min=0)  # [B, S]
            key_pos, key_valid = positions, valid
        else:
            positions = index.expand(b, s)
            key_pos = cache.positions(index).expand(b, -1) if cache is not None else positions
            key_valid = torch.ones_like(key_pos, dtype=torch.bool)
        if int(positions.max()) >= self.config.max_len:
            raise ParadecodeError(f"the sequence needs {int(positions.max()) + 1} positions but this model has "
                                  f"{self.config.max_len}: shorten the prompt or the canvas (--gen-length).")
        allowed = key_valid[:, None, :]  # [B, 1, K]
        if self.config.causal:
            allowed = allowed & (key_pos[:, None, :] <= positions[:, :, None])
        if index is None:  # every row attends to itself (padding rows would otherwise attend to nothing)
            allowed = allowed | torch.eye(s, dtype=torch.bool, device=tokens.device)
        h = self.tok_emb(tokens) + self.pos_emb(positions)
        for layer, block in enumerate(self.blocks):
            h = block(h, allowed[:, None], cache.layer(layer, index) if cache is not None else None)
        return self.ln_f(h) @ self.tok_emb.weight.T  # [B, S, V]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def save(self, folder: Path, dtype: torch.dtype = torch.float32) -> None:
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.detach().to(dtype).contiguous() for k, v in self.state_dict().items()}
        save_file(tensors, str(folder / "model.safetensors"))
        (folder / "config.json").write_text(json.dumps(asdict(self.config), indent=1), encoding="utf-8")


def load_checkpoint(folder: str | Path) -> TinyLM:
    """A ``TinyLM`` from a folder holding ``model.safetensors`` and ``config.json``."""
    from safetensors.torch import load_file

    folder = Path(folder)
    config_path, weights = folder / "config.json", folder / "model.safetensors"
    if not config_path.is_file() or not weights.is_file():
        raise ParadecodeError(f"{folder} is not a paradecode dLLM checkpoint (it needs config.json and "
                              "model.safetensors).")
    raw = json.loads(config_path.read_text(encoding="utf-8"))
    known = ModelConfig.__dataclass_fields__
    cfg = ModelConfig(**{k: tuple(v) if k == "vocab" else v for k, v in raw.items() if k in known})
    model = TinyLM(cfg)
    model.load_state_dict({k: v.float() for k, v in load_file(str(weights)).items()})
    return model.eval()
