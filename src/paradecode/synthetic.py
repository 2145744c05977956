"""Random-weight models in real models' shapes, as GGUF files llama.cpp loads and as our native backends.

A one-token forward of a model of 0.5B parameters and more is almost all weight reading, and a T-token forward's
cost follows from the shapes, not the values; so speed at sizes no one can download here is measured on random
weights (``benchmarks/scaling.py``). ``write_gguf`` lays a file out as ``llama-quantize Q4_0`` would: every
layer's projections Q4_0, the output matrix Q6_K (Q8_0 where the hidden size is no multiple of 256, llama-quantize's
fallback), norms F32, and a placeholder vocabulary. ``load`` builds our native backend on that same file, its
Q4_0 blocks as stored (``q4``) or the same weights quantized per output channel (``int8``), without ever holding
the fp32 model (an 8B one would not fit in 24 GB as fp32).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

# Real models' shapes (their config.json). Rope scaling and Qwen's q/k/v biases are left out: they change no byte
# read and no measurable work.
SHAPES: dict[str, dict[str, Any]] = {
    "0.5b": dict(model="Qwen2.5-0.5B", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24,
                 num_heads=14, num_kv_heads=2, head_dim=64, tie_word_embeddings=True, rope_theta=1e6),
    "1b": dict(model="Llama-3.2-1B", vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16,
               num_heads=32, num_kv_heads=8, head_dim=64, tie_word_embeddings=True, rope_theta=5e5),
    "3b": dict(model="Llama-3.2-3B", vocab_size=128256, hidden_size=3072, intermediate_size=8192, num_layers=28,
               num_heads=24, num_kv_heads=8, head_dim=128, tie_word_embeddings=True, rope_theta=5e5),
    "8b": dict(model="Llama-3.1-8B", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
               num_heads=32, num_kv_heads=8, head_dim=128, tie_word_embeddings=False, rope_theta=5e5),
}
EPS = 1e-5
BYTE_TOKENS = 256  # the placeholder vocabulary starts with the 256 byte tokens llama.cpp's SentencePiece vocab wants


def llama_shape(spec: Mapping[str, Any]):
    """Our ``LlamaShape`` of a SHAPES entry."""
    from paradecode.backends.llama import LlamaShape

    fields = {k: v for k, v in spec.items() if k not in ("model", "rope_theta")}
    return LlamaShape(**fields, rms_norm_eps=EPS, max_position_embeddings=4096, attention_bias=False, mlp_bias=False,
                      rope=dict(rope_type="default", rope_theta=spec["rope_theta"]))


def parameters(spec: Mapping[str, Any]) -> tuple[int, int]:
    """(weights of one layer's projections, of the output matrix) of a SHAPES entry."""
    d, hd, heads, kv = spec["hidden_size"], spec["head_dim"], spec["num_heads"], spec["num_kv_heads"]
    return d * (heads + 2 * kv) * hd + heads * hd * d + 3 * d * spec["intermediate_size"], spec["vocab_size"] * d


# -- random blocks, as the quantizers lay them out ---------------------------------------------------------------
def _half(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).view(np.uint8).reshape(*values.shape, 2)


def random_rows(rng: np.random.Generator, kind: str, n: int, k: int, scale: float = 1.0) -> np.ndarray:
    """[n, bytes per row] uint8: n rows of k random weights as ``kind`` blocks, spread about 0.02 (a trained
    layer's) times ``scale``."""
    if kind == "Q4_0":  # 32 weights: d (fp16), 16 bytes of nibbles; w = d (q - 8)
        blocks = rng.integers(0, 256, (n, k // 32, 18), dtype=np.uint8)
        blocks[..., 0:2] = _half(scale * rng.uniform(0.003, 0.006, (n, k // 32)))
    elif kind == "Q8_0":  # 32 weights: d (fp16), 32 int8; w = d q
        blocks = rng.integers(0, 256, (n, k // 32, 34), dtype=np.uint8)
        blocks[..., 0:2] = _half(scale * rng.uniform(2e-4, 4e-4, (n, k // 32)))
    elif kind == "Q6_K":  # 256 weights: ql[128], qh[64], 16 int8 scales, d (fp16); w = d scale (q - 32)
        blocks = rng.integers(0, 256, (n, k // 256, 210), dtype=np.uint8)
        blocks[..., 192:208] = rng.integers(4, 12, (n, k // 256, 16), dtype=np.uint8)
        blocks[..., 208:210] = _half(scale * rng.uniform(1e-4, 2e-4, (n, k // 256)))
    elif kind == "Q4_K":  # 256 weights: d, dmin (fp16), 12 bytes of 6-bit scales and mins, 128 bytes of nibbles;
        blocks = rng.integers(0, 256, (n, k // 256, 144), dtype=np.uint8)  # w = d sc q - dmin mn per 32
        d = scale * rng.uniform(0.6e-4, 1.2e-4, (n, k // 256))
        blocks[..., 0:2] = _half(d)
        blocks[..., 2:4] = _half(d * rng.uniform(7.0, 8.0, d.shape))  # dmin mn about d sc q on average: centred
    else:
        raise ValueError(f"no random blocks of type {kind}")
    return blocks.reshape(n, -1)


def head_kind(hidden: int) -> str:
    """What llama-quantize gives the output matrix of a Q4_0 file: Q6_K, or Q8_0 where rows are no multiple of 256."""
    return "Q6_K" if hidden % 256 == 0 else "Q8_0"


QUANTS = ("q4_0", "q4_k_m")  # the layouts write_gguf writes, as llama-quantize's types of the same names


def more_bits(layer: int, layers: int) -> bool:
    """Whether llama-quantize's Q4_K_M gives a layer's attn_v and ffn_down Q6_K (its use_more_bits): the first and
    last eighth of the layers and every third one between."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def k_quant_shapes(spec: Mapping[str, Any]) -> bool:
    """Whether every projection's rows are multiples of 256, as Q4_K and Q6_K blocks need."""
    return all(spec[key] % 256 == 0 for key in ("hidden_size", "intermediate_size")) and (
        spec["num_heads"] * spec["head_dim"]) % 256 == 0


def write_gguf(spec: Mapping[str, Any], path: Path, seed: int = 0, progress: bool = True,
               scale: float = 1.0, quant: str = "q4_0") -> None:
    """A Llama-architecture GGUF of random weights in ``spec``'s shapes (a SHAPES entry), written tensor by tensor,
    laid out as llama-quantize's ``quant`` lays a model out: ``q4_0`` (every projection Q4_0, the output matrix
    Q6_K or Q8_0) or ``q4_k_m`` (projections Q4_K, attn_v and ffn_down Q6_K on ``more_bits`` layers, the output
    matrix Q6_K; its rows must be multiples of 256); ``scale`` multiplies the layers' weights (tests make attention
    sharp with it)."""
    import gguf

    d, inter, hd, v = spec["hidden_size"], spec["intermediate_size"], spec["head_dim"], spec["vocab_size"]
    q, kv, tied = spec["num_heads"] * hd, spec["num_kv_heads"] * hd, spec["tie_word_embeddings"]
    if v <= BYTE_TOKENS + 2:
        raise ValueError(f"the placeholder vocabulary needs more than {BYTE_TOKENS + 2} tokens, got {v}")
    if quant not in QUANTS:
        raise ValueError(f"write_gguf writes {', '.join(QUANTS)}, not {quant}")
    if quant == "q4_k_m" and not k_quant_shapes(spec):
        raise ValueError(f"{spec['model']}: q4_k_m needs rows of multiples of 256 (hidden {d}, intermediate {inter}, "
                         f"query width {q})")
    layers = spec["num_layers"]

    def kind(name: str, layer: int) -> str:
        if quant == "q4_0":
            return "Q4_0"
        return "Q6_K" if name in ("attn_v", "ffn_down") and more_bits(layer, layers) else "Q4_K"

    plain = "Q4_0" if quant == "q4_0" else "Q4_K"  # an untied embedding
    tensors: list[tuple[str, str, int, int]] = [("token_embd.weight", head_kind(d) if tied else plain, v, d)]
    for i in range(layers):
        tensors += [(f"blk.{i}.attn_norm.weight", "F32", 1, d), (f"blk.{i}.ffn_norm.weight", "F32", 1, d)]
        tensors += [(f"blk.{i}.{name}.weight", kind(name, i), n, k) for name, n, k in (
            ("attn_q", q, d), ("attn_k", kv, d), ("attn_v", kv, d), ("attn_output", d, q),
            ("ffn_gate", inter, d), ("ffn_up", inter, d), ("ffn_down", d, inter))]
    tensors.append(("output_norm.weight", "F32", 1, d))
    if not tied:
        tensors.append(("output.weight", head_kind(d), v, d))

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"synthetic {spec['model']} (random weights)")
    writer.add_context_length(4096)
    writer.add_embedding_length(d)
    writer.add_block_count(spec["num_layers"])
    writer.add_feed_forward_length(inter)
    writer.add_head_count(spec["num_heads"])
    writer.add_head_count_kv(spec["num_kv_heads"])
    writer.add_key_length(hd)
    writer.add_value_length(hd)
    writer.add_rope_dimension_count(hd)
    writer.add_rope_freq_base(spec["rope_theta"])
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_vocab_size(v)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0 if quant == "q4_0" else gguf.LlamaFileType.MOSTLY_Q4_K_M)
    writer.add_tokenizer_model("llama")
    writer.add_token_list([f"<0x{b:02X}>" for b in range(BYTE_TOKENS)] + [f"t{i}" for i in range(BYTE_TOKENS, v)])
    writer.add_token_scores([0.0] * v)
    writer.add_token_types([gguf.TokenType.BYTE] * BYTE_TOKENS + [gguf.TokenType.NORMAL] * (v - BYTE_TOKENS))
    writer.add_bos_token_id(BYTE_TOKENS)
    writer.add_eos_token_id(BYTE_TOKENS + 1)
    for name, kind, n, k in tensors:
        if kind == "F32":
            writer.add_tensor_info(name, [k], np.dtype(np.float32), k * 4)
        else:
            qtype = gguf.GGMLQuantizationType[kind]
            block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
            writer.add_tensor_info(name, [n, k // block * block_bytes], np.dtype(np.uint8),
                                   n * (k // block) * block_bytes, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for index, (name, kind, n, k) in enumerate(tensors):
        if kind == "F32":
            writer.write_tensor_data(np.ones(k, dtype=np.float32))
        else:
            writer.write_tensor_data(random_rows(rng, kind, n, k, scale if name.startswith("blk.") else 1.0))
        if progress and (index % 20 == 0 or index == len(tensors) - 1):
            print(f"  {path.name}: {index + 1}/{len(tensors)} tensors", file=sys.stderr, flush=True)
    writer.close()


# -- our backend on the file ----------------------------------------------------------------------------------------
def dense(tensor, rows: int = 8192) -> torch.Tensor:
    """A GGUF tensor as float32 ([n, k], or [k] for a vector), dequantized a slice of rows at a time (gguf's numpy
    dequantization makes several temporaries the size of its input)."""
    import gguf

    data = tensor.data
    if tensor.tensor_type == gguf.GGMLQuantizationType.F32:
        return torch.from_numpy(np.array(data, dtype=np.float32))
    parts = [gguf.quants.dequantize(data[i : i + rows], tensor.tensor_type) for i in range(0, data.shape[0], rows)]
    return torch.from_numpy(np.concatenate(parts))


def int8_linear(weight: torch.Tensor, precise: bool):
    """Per-output-channel int8 of ``weight`` with a max-abs scale (the real path's clipping search changes values,
    not the bytes read or the work)."""
    from paradecode.backends.int8 import Int8Linear

    step = weight.abs().amax(dim=1).clamp_min(1e-12) / 127.0
    return Int8Linear(torch.round(weight / step[:, None]).clamp_(-127, 127).to(torch.int8), step, None, precise)


def load(path: Path, spec: Mapping[str, Any], dtype: str, max_length: int, kernel_cache: Path | None = None):
    """Our native backend on a ``write_gguf`` file: its blocks as stored (``q4``) or the same weights as
    per-channel int8 (``int8``); the embedding, and the LM head from the file's output matrix: its Q8_0 or Q6_K
    blocks as stored on ``q4`` (as the real path runs them), else int8."""
    from gguf import GGUFReader

    from paradecode.backends import q4
    from paradecode.backends.int8 import PRECISE, PROJECTIONS
    from paradecode.backends.int8_llama import Int8LlamaBackend
    from paradecode.backends.llama import _Layer
    from paradecode.backends.q4_llama import Q4LlamaBackend

    if dtype not in ("q4", "int8"):
        raise ValueError(f"synthetic models load as q4 or int8, not {dtype!r}")
    shape = llama_shape(spec)
    reader = GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    embed = dense(tensors["token_embd.weight"])  # [V, D]
    head_blocks = q4.read_head(reader) if dtype == "q4" else None
    if head_blocks is not None:
        head = q4.Q4Linear.from_blocks(head_blocks)
    else:
        head = int8_linear(dense(tensors["output.weight"]) if "output.weight" in tensors else embed, precise=True)
    layers = []
    for i, blocks in enumerate(q4.iter_layers(path, shape.num_layers, shape.num_heads, shape.num_kv_heads, reader)):
        if dtype == "q4":
            linears = {name: q4.Q4Linear.from_blocks(blocks[name]) for name in PROJECTIONS}
        else:
            linears = {name: int8_linear(blocks[name].dequantize(), name in PRECISE) for name in PROJECTIONS}
        layers.append(_Layer(attn_norm=dense(tensors[f"blk.{i}.attn_norm.weight"]),
                             mlp_norm=dense(tensors[f"blk.{i}.ffn_norm.weight"]), **linears))
    cls = Q4LlamaBackend if dtype == "q4" else Int8LlamaBackend
    return cls.from_parts(shape, layers, embed, dense(tensors["output_norm.weight"]), head, max_length,
                          kernel_cache=kernel_cache)
