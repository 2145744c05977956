"""4-bit projections for the native forward: a GGUF checkpoint's own Q4_0 / Q4_1 weight blocks, run as stored.

The int8 dtype dequantizes a 4-bit checkpoint and quantizes it again per output channel, which adds error and
reads ~1.4x the bytes per token. ``q4`` keeps the checkpoint's blocks (32 weights of one output column as
``w = d q + m``, ``q`` in 0..15; Q4_0 is ``m = -8 d``) and multiplies them against activations quantized per
group of the same 32 inputs (``backends/native/gemm_q4.h``: exact integer sums per group, then a fixed order of
float steps, so every row stays exact whatever else is in the pass). The LM head (the embedding, Q8_0 in the
shipped SmolLM2 file) stays the int8 backend's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from paradecode.errors import ParadecodeError

GROUP = 32  # weights per block of the checkpoint, and inputs per activation scale
BLOCK_COLS = 16
BLOCK_LAYOUTS = {"Q4_0": 18, "Q4_1": 20}  # bytes per 32 weights: d (fp16) [, m (fp16)], 16 bytes of nibbles
FORMAT = 1  # bump when the packed layout changes meaning


@dataclass
class Blocks:
    """A weight [n, k] as 4-bit blocks: q [n, k] uint8 (0..15), d and m [n, k / 32] float16."""

    q: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape[0], self.q.shape[1]

    def dequantize(self) -> torch.Tensor:
        """[n, k] float32: d q + m per block, as gguf computes it."""
        n, k = self.shape
        q = self.q.float().reshape(n, k // GROUP, GROUP)
        return (self.d.float()[..., None] * q + self.m.float()[..., None]).reshape(n, k)

    @property
    def m_is_minus_8d(self) -> bool:
        """Whether every block is Q4_0's (m = -8 d, exactly as a half float), so m need not be stored."""
        return torch.equal(self.m.float(), self.d.float() * -8)

    def rows(self, index: torch.Tensor) -> Blocks:
        return Blocks(self.q[index], self.d[index], self.m[index])

    @staticmethod
    def cat(parts: list[Blocks]) -> Blocks:
        return Blocks(torch.cat([p.q for p in parts]), torch.cat([p.d for p in parts]), torch.cat([p.m for p in parts]))


def decode(raw: np.ndarray, kind: str, n: int, k: int) -> Blocks:
    """A GGUF tensor's bytes ([n, k / 32 * block bytes] uint8) of type ``kind`` -> its blocks."""
    size = BLOCK_LAYOUTS[kind]
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(n, k // GROUP, size)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    if kind == "Q4_1":
        m, nibbles = blocks[..., 2:4].copy().view(np.float16)[..., 0], blocks[..., 4:]
    else:
        m, nibbles = (d.astype(np.float32) * -8).astype(np.float16), blocks[..., 2:]  # -8 d is exact in half floats
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1).reshape(n, k)  # weight i low, weight i + 16 high
    return Blocks(torch.from_numpy(q.copy()), torch.from_numpy(d.copy()), torch.from_numpy(m.copy()))


def pack(blocks: Blocks, with_m: bool | None = None) -> torch.Tensor:
    """The native kernel's layout (gemm_q4.h): per 16 columns and 32 inputs, 256 bytes of nibbles (vector j,
    column c, byte i: input 8j+i low, 8j+4+i high), then the 16 columns' d and, unless every m is -8 d (Q4_0:
    the kernel computes it, to the same bits), m as half floats. ``with_m`` forces m in or out (out only where
    every m is -8 d)."""
    n, k = blocks.shape
    columns = -(-n // BLOCK_COLS) * BLOCK_COLS
    groups = k // GROUP
    q = torch.zeros(columns, k, dtype=torch.uint8)
    q[:n] = blocks.q
    d = torch.zeros(columns, groups, dtype=torch.float16)
    m = torch.zeros(columns, groups, dtype=torch.float16)
    d[:n], m[:n] = blocks.d, blocks.m
    b = columns // BLOCK_COLS
    q = q.reshape(b, BLOCK_COLS, groups, 4, 2, 4)  # [block, column, group, j, low/high, i]
    nibbles = q[..., 0, :] | (q[..., 1, :] << 4)  # [block, column, group, j, i]
    nibbles = nibbles.permute(0, 2, 3, 1, 4).reshape(b, groups, 256)
    if with_m is None:
        with_m = not blocks.m_is_minus_8d
    elif not with_m and not blocks.m_is_minus_8d:
        raise ValueError("m can be left out only where every m is -8 d (Q4_0 blocks)")
    stored = (d, m) if with_m else (d,)
    scales = [x.reshape(b, BLOCK_COLS, groups).permute(0, 2, 1).contiguous().view(torch.uint8) for x in stored]
    return torch.cat([nibbles, *scales], dim=2).reshape(-1).contiguous()


@dataclass
class Q4Linear:
    """A projection on 4-bit blocks; runs in the native forward only (``parts``)."""

    packed: torch.Tensor  # uint8, gemm_q4.h's layout
    n: int
    k: int
    bias: torch.Tensor | None = None  # [n], float32 whatever it is given in

    def __post_init__(self) -> None:
        if self.bias is not None:
            self.bias = self.bias.float()

    @classmethod
    def from_blocks(cls, blocks: Blocks, bias: torch.Tensor | None = None) -> Q4Linear:
        n, k = blocks.shape
        return cls(pack(blocks), n, k, bias)

    def with_bias(self, bias: torch.Tensor | None) -> Q4Linear:
        """The same packed weight with ``bias``."""
        return dataclasses.replace(self, bias=bias)

    @property
    def nbytes(self) -> int:
        return self.packed.numel()

    def parts(self) -> tuple:
        """What the native forward takes of a 4-bit projection."""
        return "q4", self.packed, self.n, self.k, self.bias


def gguf_source(model_dir: Path) -> Path:
    """The .gguf file a converted model folder came from (``models.converted_from``)."""
    from paradecode.models import converted_from

    try:
        source = converted_from(model_dir)
    except (OSError, ValueError, AttributeError):  # an unreadable or damaged record
        source = None
    if source is None:
        raise ParadecodeError(
            f"dtype q4 runs a GGUF checkpoint's own 4-bit blocks, and {model_dir} was not converted from a .gguf "
            "file: use --dtype int8 (or load the model's .gguf)."
        ) from None
    if not source.is_file():
        raise ParadecodeError(f"dtype q4 reads the 4-bit blocks of {source}, which is gone: load that .gguf again.")
    return source


def load_layers(path: Path, num_layers: int, heads: int, kv_heads: int,
                cache: Path | None) -> list[dict[str, Q4Linear]]:
    """``read_layers``, packed (``Q4Linear``, no bias), kept in ``cache`` after the first read of this file. The
    gguf package's reader parses every metadata field of the file, the tokenizer's ~100,000 strings included:
    SmolLM2-135M's layers took 2.5 s to read that way, most of a load, and its packed copy reads back in a
    fraction of a second (Intel Xeon, 2026-12-05). A kept copy that cannot be read is read from the GGUF file
    again, with a warning, and replaced."""
    import hashlib
    import json
    import warnings

    from safetensors import safe_open

    from paradecode.models import keep_tensors

    stat = path.stat()
    key = hashlib.sha256(json.dumps([str(path.resolve()), stat.st_size, stat.st_mtime_ns, FORMAT, num_layers, heads,
                                     kv_heads]).encode()).hexdigest()[:16]
    kept = cache / "q4" / f"{path.stem}-{key}.safetensors" if cache is not None else None
    if kept is not None and kept.is_file():
        try:
            with safe_open(str(kept), "pt") as file:
                shapes = json.loads(file.metadata()["shapes"])
                return [{name: Q4Linear(file.get_tensor(f"{i}.{name}"), *shapes[i][name]) for name in shapes[i]}
                        for i in range(num_layers)]
        except Exception as error:  # a damaged or truncated file, or another writer's
            warnings.warn(f"paradecode: the kept 4-bit layers {kept} could not be read ({type(error).__name__}: "
                          f"{error}); reading {path.name} again.", stacklevel=2)
    layers = [{name: Q4Linear.from_blocks(blocks) for name, blocks in layer.items()}
              for layer in iter_layers(path, num_layers, heads, kv_heads)]
    if kept is not None:
        shapes = [{name: [linear.n, linear.k] for name, linear in layer.items()} for layer in layers]
        keep_tensors({f"{i}.{name}": linear.packed for i, layer in enumerate(layers) for name, linear in layer.items()},
                     kept, metadata={"shapes": json.dumps(shapes)})
    return layers


def read_layers(path: Path, num_layers: int, heads: int, kv_heads: int) -> list[dict[str, Blocks]]:
    """Each layer's qkv, o, gate_up and down as 4-bit blocks in the Hugging Face row order (llama.cpp's
    converter reorders the q and k rows for its RoPE; this undoes it, as transformers does)."""
    return list(iter_layers(path, num_layers, heads, kv_heads))


def iter_layers(path: Path, num_layers: int, heads: int, kv_heads: int) -> Iterator[dict[str, Blocks]]:
    """``read_layers`` one layer at a time (the file is mapped, not read: a large model's blocks need not all be
    unpacked at once)."""
    from gguf import GGUFReader

    from paradecode.models import gguf_architecture

    reader = GGUFReader(str(path))
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    # llama.cpp's converter reorders the q and k rows of the "llama" architecture (Llama, Mistral) for its RoPE;
    # qwen2 and qwen3 files keep the checkpoint's order.
    permuted = gguf_architecture(reader) in ("llama", None)

    def blocks(name: str) -> Blocks:
        tensor = tensors.get(name)
        if tensor is None:
            raise ParadecodeError(f"{path.name} has no tensor {name}: dtype q4 runs Llama-family GGUF files "
                                  "(Llama, Mistral, Qwen2, Qwen3, Gemma-3): use --dtype int8.")
        kind = tensor.tensor_type.name
        if kind not in BLOCK_LAYOUTS:
            raise ParadecodeError(
                f"dtype q4 runs Q4_0 and Q4_1 weight blocks; {name} in {path.name} is {kind}: use --dtype int8."
            )
        k, n = (int(x) for x in tensor.shape[:2])
        return decode(tensor.data, kind, n, k)

    def unpermute(b: Blocks, groups: int) -> Blocks:
        n = b.shape[0]
        order = torch.arange(n).reshape(groups, n // groups // 2, 2).transpose(1, 2).reshape(n)
        return b.rows(order)

    for i in range(num_layers):
        name = f"blk.{i}.{{}}.weight"
        q, k = blocks(name.format("attn_q")), blocks(name.format("attn_k"))
        if permuted:
            q, k = unpermute(q, heads), unpermute(k, kv_heads)
        yield dict(
            qkv=Blocks.cat([q, k, blocks(name.format("attn_v"))]),
            o=blocks(name.format("attn_output")),
            gate_up=Blocks.cat([blocks(name.format("ffn_gate")), blocks(name.format("ffn_up"))]),
            down=blocks(name.format("ffn_down")),
        )
