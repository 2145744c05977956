"""Block projections for the native forward: a GGUF checkpoint's own Q4_0 / Q4_1 / Q4_K / Q5_0 / Q6_K / Q8_0
weight blocks, run as stored.

The int8 dtype dequantizes a 4-bit checkpoint and quantizes it again per output channel, which adds error and
reads ~1.4x the bytes per token. ``q4`` keeps the checkpoint's blocks (32 weights of one output column as
``w = d q + m``, ``q`` in 0..15; Q4_0 is ``m = -8 d``) and multiplies them against activations quantized per
group of the same 32 inputs (``backends/native/gemm_q4.h``: exact integer sums per group, then a fixed order of
float steps, so every row stays exact whatever else is in the pass). Q8_0 blocks (``w = d q``, ``q`` in -127..127)
run in the same kernel as 8-bit ``q + 128`` with ``m = -128 d``, and Q6_K blocks (``w = d sc (q - 32)`` per 16 of
256) keep their 6 bits there. The LM head is the file's too where its type is one of these (the embedding, Q8_0 in
the shipped SmolLM2 file; Q6_K in most Q4_0 and Q4_K_M files); otherwise the int8 backend's.

The K-quant files' types run as stored too: Q4_K (the main type of Q4_K_M files: per 256 weights a half-float ``d``
and ``dmin``, per 32 a 6-bit scale ``sc`` and min ``mn``: ``w = d sc q - dmin mn``, q in 0..15; the kernel forms ``d
sc`` and ``-dmin mn`` per group, exact products, and takes Q4_1's float steps; 4.625 bits a weight) and Q5_0 (``w =
d (q - 16)``, q in 0..31, which those files use where rows are no multiple of 256: the nibbles plus a plane of
fifth bits, Q4_0's steps with m = -16 d; 5.5 bits). Other types (Q5_1, Q5_K, Q3_K, ...) run on the int8 dtype. A
fused projection (q, k and v; gate and up) whose parts differ in type runs each part on its own columns
(``Fused``).
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
# bytes per block of the types q4 runs (32 weights; the K-quants 256), and the kernel width each runs at
BLOCK_LAYOUTS = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34, "Q6_K": 210, "Q5_0": 22, "Q4_K": 144}
Q4K = 14  # Q4_K's format id where the others have their width (gemm_q4.h's kQ4K)
BITS = {"Q4_0": 4, "Q4_1": 4, "Q8_0": 8, "Q6_K": 6, "Q5_0": 5, "Q4_K": Q4K}
SUPPORTED = "Q4_0, Q4_1, Q4_K, Q5_0, Q6_K and Q8_0"  # for error messages
SUPER = 256  # weights per K-quant block (Q6_K: a d for 16 sub-blocks of 16, each with an int8 scale)
IMPLIED_M = {4: -8, 5: -16, 8: -128}  # m as a multiple of d where the kernel computes it (Q4_0, Q5_0, Q8_0)
FORMAT = 5  # bump when the packed layout (or the kept copy's metadata) changes meaning


@dataclass
class Blocks:
    """A weight [n, k] as blocks of ``bits`` bits: q [n, k] uint8 (0..15, 0..31 for 5 bits, or 0..255 for 8 bits:
    Q8_0's q + 128), d and m [n, k / 32] (float16; m float32 for 5 and 8 bits, where it is -16 d or -128 d). 6 bits
    (Q6_K): q in 0..63 (w = d * scale * (q - 32)), d [n, k / 256], ``scales`` [n, k / 16] int8, m unused (empty).
    Q4_K (``bits`` Q4K): q in 0..15 (w = d sc q - dmin mn), d and m [n, k / 256] (float16: d and dmin), ``scales``
    [n, k / 32, 2] uint8 (sc, mn)."""

    q: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor
    bits: int = 4
    scales: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape[0], self.q.shape[1]

    def dequantize(self) -> torch.Tensor:
        """[n, k] float32: d q + m per block (Q6_K: d scale (q - 32)), as gguf computes it."""
        n, k = self.shape
        if self.bits == Q4K:  # d sc q - dmin mn, in gguf's order of float32 operations
            sc, mn = (self.scales[..., i].float().reshape(n, k // SUPER, 8) for i in (0, 1))
            step, low = (self.d.float()[..., None] * sc).reshape(n, -1), (self.m.float()[..., None] * mn).reshape(n, -1)
            return (step[..., None] * self.q.float().reshape(n, k // GROUP, GROUP) - low[..., None]).reshape(n, k)
        if self.bits == 6:
            step = (self.d.float()[..., None] * self.scales.float().reshape(n, k // SUPER, 16)).reshape(n, k // 16)
            return (step[..., None] * (self.q.float() - 32).reshape(n, k // 16, 16)).reshape(n, k)
        q = self.q.float().reshape(n, k // GROUP, GROUP)
        return (self.d.float()[..., None] * q + self.m.float()[..., None]).reshape(n, k)

    @property
    def m_is_implied(self) -> bool:
        """Whether every m is the multiple of d the kernel computes (Q4_0's -8 d, Q8_0's -128 d; Q6_K has none),
        so m need not be stored."""
        if self.bits == Q4K:
            return False
        return self.bits == 6 or torch.equal(self.m.float(), self.d.float() * IMPLIED_M[self.bits])

    @property
    def stores_m(self) -> bool:
        """Whether the packed layout holds m: 4-bit blocks whose m is not the implied -8 d (Q4_1)."""
        return self.bits == 4 and not self.m_is_implied

    def rows(self, index: torch.Tensor) -> Blocks:
        scales = self.scales[index] if self.scales is not None else None
        return Blocks(self.q[index], self.d[index], self.m[index], self.bits, scales)

    @staticmethod
    def cat(parts: list[Blocks]) -> Blocks:
        """The parts' rows one after the other, all of one width."""
        bits = {p.bits for p in parts}
        if len(bits) > 1:
            raise ValueError(f"blocks of one width only, not {sorted(bits)} bits: see fuse")
        scales = torch.cat([p.scales for p in parts]) if parts[0].scales is not None else None
        return Blocks(torch.cat([p.q for p in parts]), torch.cat([p.d for p in parts]),
                      torch.cat([p.m.float() for p in parts]).to(parts[0].m.dtype), bits.pop(), scales)


@dataclass
class Fused:
    """A fused projection (q, k and v, or gate and up) whose parts the file stores at different widths (a Q4_K q
    and k beside a Q6_K v in Q4_K_M files): each part is packed and computed on its own columns."""

    parts: list[Blocks]

    @property
    def shape(self) -> tuple[int, int]:
        return sum(p.shape[0] for p in self.parts), self.parts[0].shape[1]

    def dequantize(self) -> torch.Tensor:
        return torch.cat([p.dequantize() for p in self.parts])


def fuse(parts: list[Blocks]) -> Blocks | Fused:
    """One fused projection of ``parts``' rows one after the other: blocks where they are of one type, else a
    ``Fused`` of the parts as they are (each read at its own width)."""
    return Blocks.cat(parts) if len({p.bits for p in parts}) == 1 else Fused(list(parts))


def decode(raw: np.ndarray, kind: str, n: int, k: int) -> Blocks:
    """A GGUF tensor's bytes ([n, k / 32 * block bytes] uint8) of type ``kind`` -> its blocks."""
    size = BLOCK_LAYOUTS[kind]
    if kind in ("Q6_K", "Q4_K"):
        blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(n, k // SUPER, size)
        return _decode_q6_k(blocks, n, k) if kind == "Q6_K" else _decode_q4_k(blocks, n, k)
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(n, k // GROUP, size)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    if kind == "Q8_0":  # q as the kernel reads it, unsigned: q + 128; m = -128 d (as a float: it may overflow halves)
        q = (blocks[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8).reshape(n, k)
        m = d.astype(np.float32) * -128
        return Blocks(torch.from_numpy(q), torch.from_numpy(d.copy()), torch.from_numpy(m), bits=8)
    if kind == "Q5_0":  # bit i of the 32-bit qh is weight i's fifth bit; byte i of qs holds weight i low, i + 16 high
        high = (blocks[..., 2:6].copy().view("<u4") >> np.arange(32, dtype=np.uint32)) & 1
        nibbles = blocks[..., 6:]
        q = (np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1) | (high.astype(np.uint8) << 4)).reshape(n, k)
        m = d.astype(np.float32) * -16
        return Blocks(torch.from_numpy(q.copy()), torch.from_numpy(d.copy()), torch.from_numpy(m), bits=5)
    if kind == "Q4_1":
        m, nibbles = blocks[..., 2:4].copy().view(np.float16)[..., 0], blocks[..., 4:]
    else:
        m, nibbles = (d.astype(np.float32) * -8).astype(np.float16), blocks[..., 2:]  # -8 d is exact in half floats
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1).reshape(n, k)  # weight i low, weight i + 16 high
    return Blocks(torch.from_numpy(q.copy()), torch.from_numpy(d.copy()), torch.from_numpy(m.copy()))


def _decode_q6_k(blocks: np.ndarray, n: int, k: int) -> Blocks:
    """Q6_K blocks [n, k / 256, 210]: the low 4 bits of the 256 q in 128 bytes (byte b of half h: weight 128 h + b
    in its low nibble, 128 h + 64 + b in its high one), their 2 high bits in 64 bytes (byte b of half h, bits 2 t:
    weight 128 h + 32 t + b), 16 int8 scales, d."""
    low, high = blocks[..., :128].reshape(n, -1, 2, 1, 64), blocks[..., 128:192].reshape(n, -1, 2, 1, 32)
    low = (low >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 1, 2, 1)) & 0x0F  # [n, blocks, half, 2, 64]
    high = (high >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 1, 4, 1)) & 0x03  # [n, blocks, half, 4, 32]
    q = low.reshape(n, k) | (high.reshape(n, k) << 4)
    scales = blocks[..., 192:208].copy().view(np.int8).reshape(n, k // 16)
    d = blocks[..., 208:210].copy().view(np.float16)[..., 0]
    return Blocks(torch.from_numpy(q.astype(np.uint8)), torch.from_numpy(d.copy()), torch.zeros(n, 0),
                  bits=6, scales=torch.from_numpy(scales.copy()))


def _decode_q4_k(blocks: np.ndarray, n: int, k: int) -> Blocks:
    """Q4_K blocks [n, k / 256, 144]: d, dmin, 12 bytes of 6-bit scales and mins (unpacked by gguf's own code),
    128 bytes of nibbles (byte i of chunk c: weight 64 c + i low, 64 c + 32 + i high)."""
    from gguf.quants import Q4_K

    supers = k // SUPER
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0]  # [n, supers]
    dmin = blocks[..., 2:4].copy().view(np.float16)[..., 0]
    sc, mn = Q4_K.get_scale_min(blocks[..., 4:16].reshape(-1, 12))  # [n * supers, 8] each
    scales = np.stack([sc, mn], axis=-1).reshape(n, k // GROUP, 2)
    nibbles = blocks[..., 16:].reshape(n, supers, 4, 32)
    q = np.stack([nibbles & 0x0F, nibbles >> 4], axis=3).reshape(n, k)  # [n, super, chunk, low/high, 32]
    return Blocks(torch.from_numpy(q), torch.from_numpy(d.copy()), torch.from_numpy(dmin.copy()), bits=Q4K,
                  scales=torch.from_numpy(scales.astype(np.uint8)))


def _padded(x: torch.Tensor, columns: int) -> torch.Tensor:
    """``x``'s rows (one per output column) followed by zero rows up to ``columns``, a whole number of 16."""
    out = torch.zeros(columns, *x.shape[1:], dtype=x.dtype)
    out[:x.shape[0]] = x
    return out


def _by_block(x: torch.Tensor) -> torch.Tensor:
    """[b, count, 16 * item bytes] uint8: per 16 columns, each of ``x``'s ``count`` values of the 16 columns in turn
    (x: [16 b, count])."""
    return x.reshape(-1, BLOCK_COLS, x.shape[1]).permute(0, 2, 1).contiguous().view(torch.uint8)


def _pack_q6(blocks: Blocks) -> torch.Tensor:
    """gemm_q4.h's 6-bit layout: per 16 columns, per 256 inputs, 8 groups of 416 bytes (the low nibbles as the 4-bit
    layout's 256 bytes; the 2 high bits in two 64-byte vectors, [column][byte i] of vector t holding inputs 16 t + i,
    16 t + 4 + i, 16 t + 8 + i, 16 t + 12 + i from its low bits up; the two sub-blocks' 16 int8 scales each), then
    the 16 columns' d (half floats)."""
    n, k = blocks.shape
    columns = -(-n // BLOCK_COLS) * BLOCK_COLS
    b, groups, supers = columns // BLOCK_COLS, k // GROUP, k // SUPER
    q = _padded(blocks.q, columns)
    scales = _padded(blocks.scales, columns)
    top = (q >> 4).reshape(b, BLOCK_COLS, groups, 2, 4, 4)  # [block, column, group, t, (j parity, half), i]
    fields = top[..., 0, :] | (top[..., 1, :] << 2) | (top[..., 2, :] << 4) | (top[..., 3, :] << 6)
    high = fields.permute(0, 2, 3, 1, 4).reshape(b, groups, 128)  # [block, group, t, column, i]
    sub = scales.reshape(b, BLOCK_COLS, groups, 2).permute(0, 2, 3, 1).reshape(b, groups, 32).view(torch.uint8)
    packed = torch.cat([_nibbles(q & 0x0F, b, groups), high, sub], dim=2).reshape(b, supers, 8 * 416)
    return torch.cat([packed, _by_block(_padded(blocks.d, columns))], dim=2).reshape(-1).contiguous()


def _nibbles(q: torch.Tensor, b: int, groups: int) -> torch.Tensor:
    """[b, groups, 256]: the 4-bit layout's bytes of q [16 b, k] (vector j, column c, byte i: input 8 j + i in the low
    nibble, 8 j + 4 + i in the high one)."""
    q = q.reshape(b, BLOCK_COLS, groups, 4, 2, 4)  # [block, column, group, j, low/high, i]
    return (q[..., 0, :] | (q[..., 1, :] << 4)).permute(0, 2, 3, 1, 4).reshape(b, groups, 256)


def _pack_q4_k(blocks: Blocks) -> torch.Tensor:
    """gemm_q4.h's Q4_K layout: per 16 columns and 256 inputs, 8 groups of 288 bytes (the 4-bit layout's 256, the
    16 columns' sc, their mn), then the 16 columns' d and dmin (half floats)."""
    n, k = blocks.shape
    columns = -(-n // BLOCK_COLS) * BLOCK_COLS
    b, groups, supers = columns // BLOCK_COLS, k // GROUP, k // SUPER
    scales = _padded(blocks.scales, columns)
    sc, mn = (_by_block(scales[..., i]) for i in (0, 1))  # [block, group, column]
    packed = torch.cat([_nibbles(_padded(blocks.q, columns), b, groups), sc, mn], dim=2).reshape(b, supers, 8 * 288)
    halves = [_by_block(_padded(x, columns)) for x in (blocks.d, blocks.m)]  # d, dmin: [block, super, 32]
    return torch.cat([packed, *halves], dim=2).reshape(-1).contiguous()


def pack(blocks: Blocks, with_m: bool | None = None) -> torch.Tensor:
    """The native kernel's layout (gemm_q4.h): per 16 columns and 32 inputs, 256 bytes of nibbles (vector j,
    column c, byte i: input 8j+i low, 8j+4+i high; for 5 bits followed by 64 bytes of fifth bits, column c, byte
    i, bits 2j and 2j+1) or, for 8 bits, 512 bytes (vector v, column c, byte i: input 4v+i), then the 16 columns'
    d and, unless every m is the implied one (Q4_0's -8 d, Q5_0's -16 d, Q8_0's -128 d: the kernel computes it, to
    the same bits), m as half floats. ``with_m`` forces m in or out (out only where every m is implied; 5- and
    8-bit blocks never store m). 6-bit blocks: ``_pack_q6``; Q4_K: ``_pack_q4_k``."""
    if blocks.bits in (6, Q4K):
        if with_m:
            raise ValueError("6-bit and Q4_K blocks store no m")
        return _pack_q6(blocks) if blocks.bits == 6 else _pack_q4_k(blocks)
    n, k = blocks.shape
    columns = -(-n // BLOCK_COLS) * BLOCK_COLS
    b, groups = columns // BLOCK_COLS, k // GROUP
    q = _padded(blocks.q, columns)
    if blocks.bits == 8:
        quants = q.reshape(b, BLOCK_COLS, groups, 8, 4).permute(0, 2, 3, 1, 4).reshape(b, groups, 512)
    elif blocks.bits == 5:  # the nibbles, then per column 4 bytes of fifth bits: byte i, bits 2 j and 2 j + 1
        top = (q >> 4).reshape(b, BLOCK_COLS, groups, 4, 2, 4)  # [block, column, group, j, low/high, i]
        fields = sum(top[:, :, :, j, half] << (2 * j + half) for j in range(4) for half in (0, 1))
        quants = torch.cat([_nibbles(q & 0x0F, b, groups), fields.permute(0, 2, 1, 3).reshape(b, groups, 64)], dim=2)
    else:
        quants = _nibbles(q, b, groups)
    if with_m is None:
        with_m = blocks.stores_m
    if with_m and blocks.bits in (5, 8):
        raise ValueError("5- and 8-bit blocks never store m: every m must be -16 d or -128 d")
    if not with_m and not blocks.m_is_implied:
        raise ValueError("m can be left out only where every m is implied (Q4_0, Q5_0 or Q8_0 blocks)")
    stored = (blocks.d, blocks.m) if with_m else (blocks.d,)
    scales = [_by_block(_padded(x.to(torch.float16), columns)) for x in stored]
    return torch.cat([quants, *scales], dim=2).reshape(-1).contiguous()


@dataclass
class Q4Linear:
    """A projection on a checkpoint's 4-, 6- or 8-bit blocks; runs in the native forward only (``parts``)."""

    packed: torch.Tensor  # uint8, gemm_q4.h's layout
    n: int
    k: int
    bias: torch.Tensor | None = None  # [n], float32 whatever it is given in
    # (columns, bits, m stored) per part, packed one after the other: one part, unless the parts of a fused
    # projection differ in type (``Fused``)
    layout: tuple[tuple[int, int, bool], ...] = ()

    def __post_init__(self) -> None:
        if self.bias is not None:
            self.bias = self.bias.float()
        self.layout = tuple((int(n), int(bits), bool(with_m)) for n, bits, with_m in self.layout)

    @classmethod
    def from_blocks(cls, blocks: Blocks | Fused, bias: torch.Tensor | None = None) -> Q4Linear:
        n, k = blocks.shape
        parts = blocks.parts if isinstance(blocks, Fused) else [blocks]
        packed = [pack(part, part.stores_m) for part in parts]
        return cls(packed[0] if len(packed) == 1 else torch.cat(packed), n, k, bias,
                   tuple((part.shape[0], part.bits, part.stores_m) for part in parts))

    @property
    def bits(self) -> int:
        """The blocks' width (or Q4K); 0 where the parts differ."""
        widths = {bits for _, bits, _ in self.layout}
        return widths.pop() if len(widths) == 1 else 0

    def with_bias(self, bias: torch.Tensor | None) -> Q4Linear:
        """The same packed weight with ``bias``."""
        return dataclasses.replace(self, bias=bias)

    @property
    def nbytes(self) -> int:
        return self.packed.numel()

    def parts(self) -> tuple:
        """What the native forward takes of a block projection."""
        return "blocks", self.packed, self.n, self.k, self.bias, list(self.layout)


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


def load_blocks(path: Path, num_layers: int, heads: int, kv_heads: int,
                cache: Path | None) -> tuple[list[dict[str, Q4Linear]], Q4Linear | None]:
    """``read_layers`` and ``read_head``, packed (``Q4Linear``, no bias), kept in ``cache`` after the first read of
    this file. The gguf package's reader parses every metadata field of the file, the tokenizer's ~100,000
    strings included: SmolLM2-135M's layers took 2.5 s to read that way, most of a load, and its packed copy reads
    back in a fraction of a second (Intel Xeon, 2026-12-05). A kept copy that cannot be read is read from the
    GGUF file again, with a warning, and replaced."""
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
                layers = [{name: Q4Linear(file.get_tensor(f"{i}.{name}"), n, k, layout=layout)
                           for name, (n, k, layout) in shapes[i].items()} for i in range(num_layers)]
                head_shape = json.loads(file.metadata()["head"])
                head = None if head_shape is None else Q4Linear(file.get_tensor("head"), *head_shape[:2],
                                                                layout=head_shape[2])
                return layers, head
        except Exception as error:  # a damaged or truncated file, or another writer's
            warnings.warn(f"paradecode: the kept 4-bit layers {kept} could not be read ({type(error).__name__}: "
                          f"{error}); reading {path.name} again.", stacklevel=2)
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    layers = [{name: Q4Linear.from_blocks(blocks) for name, blocks in layer.items()}
              for layer in iter_layers(path, num_layers, heads, kv_heads, reader)]
    head_blocks = read_head(reader)
    head = None if head_blocks is None else Q4Linear.from_blocks(head_blocks)
    if kept is not None:
        shapes = [{name: [linear.n, linear.k, linear.layout] for name, linear in layer.items()} for layer in layers]
        tensors = {f"{i}.{name}": linear.packed for i, layer in enumerate(layers) for name, linear in layer.items()}
        if head is not None:
            tensors["head"] = head.packed
        keep_tensors(tensors, kept, metadata={"shapes": json.dumps(shapes), "head": json.dumps(
            None if head is None else [head.n, head.k, head.layout])})
    return layers, head


def read_head(reader) -> Blocks | None:
    """The LM head's blocks from a GGUF reader: ``output.weight``, or the embedding where the head is tied to it;
    None where its type is not one the kernel runs (an F16 or Q5_K head: the int8 backend's head then)."""
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    tensor = tensors.get("output.weight", tensors.get("token_embd.weight"))
    if tensor is None or tensor.tensor_type.name not in BLOCK_LAYOUTS:
        return None
    k, n = (int(x) for x in tensor.shape[:2])
    return decode(tensor.data, tensor.tensor_type.name, n, k)


def read_layers(path: Path, num_layers: int, heads: int, kv_heads: int) -> list[dict[str, Blocks | Fused]]:
    """Each layer's qkv, o, gate_up and down as 4-bit blocks in the Hugging Face row order (llama.cpp's
    converter reorders the q and k rows for its RoPE; this undoes it, as transformers does)."""
    return list(iter_layers(path, num_layers, heads, kv_heads))


def iter_layers(path: Path, num_layers: int, heads: int, kv_heads: int,
                reader=None) -> Iterator[dict[str, Blocks | Fused]]:
    """``read_layers`` one layer at a time (the file is mapped, not read: a large model's blocks need not all be
    unpacked at once); ``reader``: the file's GGUFReader where the caller has one."""
    from gguf import GGUFReader

    from paradecode.models import gguf_architecture

    reader = reader if reader is not None else GGUFReader(str(path))
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
                f"dtype q4 runs {SUPPORTED} weight blocks; {name} in {path.name} is {kind}: use --dtype int8."
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
            qkv=fuse([q, k, blocks(name.format("attn_v"))]),
            o=blocks(name.format("attn_output")),
            gate_up=fuse([blocks(name.format("ffn_gate")), blocks(name.format("ffn_up"))]),
            down=blocks(name.format("ffn_down")),
        )
