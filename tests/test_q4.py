"""The q4 dtype: a GGUF checkpoint's own 4-, 6- and 8-bit blocks on the native forward (backends/q4.py,
native/gemm_q4.h).

Blocks decode as gguf decodes them; the kernel computes the block formula; every row equals its one-token pass to
the bit (so every method equals ar, alone or batched); files and models it cannot run get a clear error."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from gguf import GGMLQuantizationType, quants

from paradecode.backends import native, q4
from paradecode.backends.int8_llama import Int8LlamaBackend
from paradecode.backends.llama import LlamaBackend
from paradecode.backends.q4_llama import Q4LlamaBackend
from paradecode.backends.sequences import Batcher
from paradecode.errors import ParadecodeError
from tiny import (TREE_PARENTS, shaped_llama, assert_rows_equal_one_token_passes,
                  assert_same_bits_on_any_thread_count, one_by_one, run)

pytestmark = pytest.mark.skipif(not native.enabled(), reason="PARADECODE_NATIVE=0 turns the native path off")

VOCAB = 64
CALIBRATION = [list(range(1, 60)), [5, 9, 5, 9, 30, 31, 2, 2, 2, 47] * 4]
# "small": one group of 32 inputs, qkv of 40 rows (a partial 16-column block), gate_up of 192 rows (an 8-block
# tile and single blocks), down over 3 groups; "deep": 4 groups per row, head_dim 64.
SHAPES = {"small": dict(hidden_size=32, num_attention_heads=8, num_key_value_heads=1, intermediate_size=96),
          "deep": dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64)}
KINDS = {"Q4_0": GGMLQuantizationType.Q4_0, "Q4_1": GGMLQuantizationType.Q4_1, "Q8_0": GGMLQuantizationType.Q8_0,
         "Q5_0": GGMLQuantizationType.Q5_0}


WIDE = dict(hidden_size=256, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64)  # Q6_K heads: 256


def llama(seed: int, shape: str) -> transformers.LlamaForCausalLM:
    return shaped_llama(seed, WIDE if shape == "wide" else SHAPES[shape], VOCAB)


def q6_k_blocks(weight: torch.Tensor) -> q4.Blocks:
    """A float weight [n, k] (k a multiple of 256) as Q6_K blocks, quantized the simple way: per 16 weights an int8
    scale of the largest |w|, per 256 a d that puts the largest scale at 127."""
    n, k = weight.shape
    w = weight.detach().double().reshape(n, k // 256, 16, 16)
    amax = w.abs().amax(-1).clamp_min(1e-12)  # [n, supers, 16]
    d = (amax.amax(-1) / (31 * 127)).half()  # [n, supers]
    scales = (amax / (31 * d.double()[..., None])).round().clamp(1, 127)
    q = (w / (d.double()[..., None, None] * scales[..., None])).round().clamp(-32, 31) + 32
    return q4.Blocks(q.reshape(n, k).to(torch.uint8), d, torch.zeros(n, 0), bits=6,
                     scales=scales.reshape(n, k // 16).to(torch.int8))


def head_blocks(weight: torch.Tensor, kind: str) -> q4.Blocks:
    return q6_k_blocks(weight) if kind == "Q6_K" else blocks_of(weight, kind)


def blocks_of(weight: torch.Tensor, kind: str = "Q4_1") -> q4.Blocks:
    """A float weight as gguf quantizes it, read back through paradecode's decoder."""
    raw = quants.quantize(weight.detach().float().numpy(), KINDS[kind])
    return q4.decode(raw, kind, *weight.shape)


def q4_layers(model: transformers.LlamaForCausalLM, kind: str = "Q4_1") -> list[dict[str, q4.Blocks]]:
    layers = []
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        layers.append(dict(
            qkv=blocks_of(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]), kind),
            o=blocks_of(a.o_proj.weight, kind),
            gate_up=blocks_of(torch.cat([m.gate_proj.weight, m.up_proj.weight]), kind),
            down=blocks_of(m.down_proj.weight, kind)))
    return layers


def q4_backend(seed: int = 0, shape: str = "small", kind: str = "Q4_1", head: str | None = None) -> Q4LlamaBackend:
    """The q4 backend of a tiny model: its layers as ``kind`` blocks; the LM head as ``head`` blocks (the file's
    own head), or with None the int8 backend's."""
    model = llama(seed, shape)
    config = LlamaBackend.from_hf(model)
    if head is not None:
        return Q4LlamaBackend(config.shape, model.state_dict(), layers=q4_layers(model, kind),
                              head=head_blocks(model.lm_head.weight, head))
    int8 = Int8LlamaBackend.from_hf(model, calibration=CALIBRATION, native=False).export_state()
    return Q4LlamaBackend(config.shape, model.state_dict(), layers=q4_layers(model, kind), int8_state=int8)


def tokens(n: int, seed: int) -> torch.Tensor:
    return torch.randint(VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_blocks_decode_as_gguf_dequantizes_them(kind):
    weight = torch.randn(40, 96) * torch.linspace(0.1, 3.0, 96)
    raw = quants.quantize(weight.numpy(), KINDS[kind])
    blocks = q4.decode(raw, kind, 40, 96)
    assert blocks.bits == q4.BITS[kind] and blocks.shape == (40, 96)
    assert blocks.q.max() <= {"Q8_0": 255, "Q5_0": 31}.get(kind, 15) and blocks.q.max() > 8
    assert blocks.m_is_implied == (kind != "Q4_1")
    assert np.array_equal(blocks.dequantize().numpy(), quants.dequantize(raw, KINDS[kind]))


def test_q5_0_blocks_decode_as_gguf_dequantizes_them():
    """Q5_0 (w = d (q - 16), q in 0..31): 5-bit blocks with m = -16 d, gguf's weights exactly."""
    weight = torch.randn(40, 96) * torch.linspace(0.1, 3.0, 96)
    raw = quants.quantize(weight.numpy(), GGMLQuantizationType.Q5_0)
    blocks = q4.decode(raw, "Q5_0", 40, 96)
    assert blocks.bits == 5 and blocks.m_is_implied and blocks.q.max() == 31 and blocks.q.min() == 0
    assert np.array_equal(blocks.dequantize().numpy(), quants.dequantize(raw, GGMLQuantizationType.Q5_0))


def q4_k_raw(n: int, k: int, seed: int = 0) -> np.ndarray:
    from paradecode import synthetic

    return synthetic.random_rows(np.random.default_rng(seed), "Q4_K", n, k)


def test_q4_k_blocks_decode_as_gguf_dequantizes_them():
    """Q4_K (w = d sc q - dmin mn per 32 of 256) keeps its 6-bit scales and mins: the same weights as gguf's."""
    raw = q4_k_raw(24, 512)
    blocks = q4.decode(raw, "Q4_K", 24, 512)
    assert blocks.bits == q4.Q4K and blocks.q.max() == 15 and blocks.shape == (24, 512)
    assert blocks.scales.shape == (24, 16, 2) and blocks.scales.max() == 63 and not blocks.m_is_implied
    assert np.array_equal(blocks.dequantize().numpy(), quants.dequantize(raw, GGMLQuantizationType.Q4_K))


def test_parts_of_one_type_fuse_into_one_blocks_and_of_several_into_a_fused():
    same = q4.fuse([blocks_of(torch.randn(16, 64), "Q4_0"), blocks_of(torch.randn(32, 64), "Q4_0")])
    assert isinstance(same, q4.Blocks) and same.shape == (48, 64)
    parts = [blocks_of(torch.randn(16, 64), "Q5_0"), blocks_of(torch.randn(32, 64), "Q8_0")]
    mixed = q4.fuse(parts)
    assert isinstance(mixed, q4.Fused) and mixed.shape == (48, 64)
    assert torch.equal(mixed.dequantize(), torch.cat([p.dequantize() for p in parts]))


def test_q6_k_blocks_decode_as_gguf_dequantizes_them():
    from paradecode import synthetic

    raw = synthetic.random_rows(np.random.default_rng(0), "Q6_K", 40, 512)
    blocks = q4.decode(raw, "Q6_K", 40, 512)
    assert blocks.bits == 6 and blocks.q.max() <= 63 and blocks.q.max() > 32 and blocks.scales.shape == (40, 32)
    assert np.array_equal(blocks.dequantize().numpy(), quants.dequantize(raw, GGMLQuantizationType.Q6_K))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_packing_puts_each_weight_where_the_kernel_reads_it(kind):
    """Unpack the packed bytes by the layout gemm_q4.h documents and get every nibble (Q8_0: byte; Q5_0: with its
    fifth bit), d and m back (Q4_0, Q5_0 and Q8_0 store no m: the kernel computes -8 d, -16 d and -128 d)."""
    blocks = blocks_of(torch.randn(40, 64), kind)
    group_bytes = {"Q4_0": 288, "Q4_1": 320, "Q8_0": 544, "Q5_0": 352}[kind]
    scales = {"Q8_0": 512, "Q5_0": 320}.get(kind, 256)
    packed = q4.pack(blocks).reshape(3, 2, group_bytes)  # 3 blocks of 16 columns (the last one partial), 2 groups
    for col in (0, 17, 39):
        b, c = divmod(col, 16)
        for g in range(2):
            group = packed[b, g]
            for k in range(32):
                if kind == "Q8_0":  # vector k // 4, byte k % 4 of the column
                    value = group[(k // 4) * 64 + c * 4 + k % 4]
                else:
                    j, rest = divmod(k, 8)
                    byte = group[j * 64 + c * 4 + rest % 4]
                    value = byte & 0x0F if rest < 4 else byte >> 4
                    if kind == "Q5_0":  # bit 2 j (low nibble) or 2 j + 1 (high) of byte k % 4 of the column
                        value |= ((group[256 + c * 4 + rest % 4] >> (2 * j + rest // 4)) & 1) << 4
                assert value == blocks.q[col, g * 32 + k]
            d = group[scales + 2 * c: scales + 2 + 2 * c].view(torch.float16)
            assert d == blocks.d[col, g]
            if kind == "Q4_1":
                m = group[288 + 2 * c: 290 + 2 * c].view(torch.float16)
                assert m == blocks.m[col, g]


def load_dequantized(model, layers) -> None:
    """Set ``model``'s projections to ``layers``' blocks, dequantized (the model the q4 forward computes)."""
    with torch.no_grad():
        for layer, blocks in zip(model.model.layers, layers):
            a, m = layer.self_attn, layer.mlp
            sizes = [a.q_proj.weight.shape[0], a.k_proj.weight.shape[0], a.v_proj.weight.shape[0]]
            for proj, part in zip((a.q_proj, a.k_proj, a.v_proj), blocks["qkv"].dequantize().split(sizes)):
                proj.weight.copy_(part)
            a.o_proj.weight.copy_(blocks["o"].dequantize())
            gate, up = blocks["gate_up"].dequantize().chunk(2)
            m.gate_proj.weight.copy_(gate)
            m.up_proj.weight.copy_(up)
            m.down_proj.weight.copy_(blocks["down"].dequantize())


def assert_computes_the_blocks_model(model, backend: Q4LlamaBackend, layers, head: q4.Blocks, method: str) -> None:
    """``backend``'s logits are those of ``model`` with its projections and LM head set to the blocks, dequantized,
    up to the activations' 8-bit rounding; every row equals its one-token pass; ``method`` equals ar."""
    load_dequantized(model, layers)
    with torch.no_grad():
        model.lm_head.weight.copy_(head.dequantize())
    reference = LlamaBackend.from_hf(model)
    ids = tokens(40, seed=3)
    got, want = backend.forward(ids).logits, reference.forward(ids).logits
    assert (got - want).abs().max() < 0.05 * want.abs().max()
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.9
    assert_rows_equal_one_token_passes(backend, tokens(70, seed=1), tokens(len(TREE_PARENTS), seed=2))
    prompt = tokens(20, seed=10).tolist() * 2
    assert run(backend, method, prompt, max_new_tokens=30)[0] == run(backend, "ar", prompt, max_new_tokens=30)[0]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_q4_forward_computes_the_blocks_model(kind):
    """Against the fp32 model whose weights are the dequantized blocks (same int8 LM head): the logits differ by
    the activations' 8-bit rounding only."""
    model = llama(2, "deep")
    backend = q4_backend(2, "deep", kind)
    load_dequantized(model, q4_layers(model, kind))
    reference = LlamaBackend.from_hf(model)
    ids = tokens(40, seed=3)
    got, want = backend.forward(ids).logits, reference.forward(ids).logits
    assert (got - want).abs().max() < 0.05 * want.abs().max()
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.9
    assert backend.dtype == "q4" and backend.kernels.startswith("q4-")
    # the vector kernel everywhere; the tiles where the CPU has AMX (this model's int8 LM head, k 128, fits them)
    amx = "amx_int8" in native.cpu_flags().split()
    assert backend.available_kernels() == (["own", "interleaved", "amx"] if amx else ["own", "interleaved"])
    int8_bytes = Int8LlamaBackend.from_hf(model, calibration=CALIBRATION).weight_bytes
    if kind == "Q8_0":  # a byte per weight as int8, plus a half float per 32
        assert int8_bytes < backend.weight_bytes < 1.07 * int8_bytes
    else:
        assert backend.weight_bytes < int8_bytes


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_q4_row_equals_its_one_token_pass_to_the_bit(shape, kind):
    """A long pass, a causal chain and a tree give each row what a one-token forward gives it later."""
    backend = q4_backend(3, shape, kind)
    assert_rows_equal_one_token_passes(backend, tokens(70, seed=1), tokens(len(TREE_PARENTS), seed=2))


@pytest.mark.parametrize("head", sorted([*KINDS, "Q6_K"]))
def test_the_files_own_lm_head_computes_its_blocks_and_keeps_rows_exact(head):
    """With the file's head blocks (SmolLM2's Q8_0 embedding; the Q6_K of most Q4_0 and Q4_K_M files) every
    weight of the forward is the checkpoint's: the logits are the fully dequantized model's up to the activations'
    8-bit rounding, the final norm is the checkpoint's (no smoothing to undo on returned hidden states), rows stay
    exact and methods equal ar."""
    model = llama(5, "wide")
    backend = q4_backend(5, "wide", "Q4_1", head=head)
    assert isinstance(backend._lm_head, q4.Q4Linear) and backend._lm_head.bits == q4.BITS[head]
    load_dequantized(model, q4_layers(model))
    with torch.no_grad():
        model.lm_head.weight.copy_(head_blocks(model.lm_head.weight, head).dequantize())
    reference = LlamaBackend.from_hf(model)
    ids = tokens(40, seed=3)
    got = backend.forward(ids, return_hidden=True)
    want = reference.forward(ids, return_hidden=True)
    assert (got.logits - want.logits).abs().max() < 0.05 * want.logits.abs().max()
    assert (got.logits.argmax(-1) == want.logits.argmax(-1)).float().mean() > 0.9
    assert (got.hidden - want.hidden).abs().max() < 0.05 * want.hidden.abs().max()
    assert_rows_equal_one_token_passes(backend, tokens(70, seed=1), tokens(len(TREE_PARENTS), seed=2))
    prompt = tokens(20, seed=10).tolist() * 2
    reference_ids, _ = run(backend, "ar", prompt, max_new_tokens=30)
    for method in ("pld-tree", "jacobi"):
        assert run(backend, method, prompt, max_new_tokens=30)[0] == reference_ids, method


@pytest.mark.parametrize("qk,v", [("Q4_1", "Q8_0"), ("Q4_1", "Q6_K"), ("Q4_K", "Q6_K")])
def test_a_fused_projection_mixing_block_widths_computes_each_part_on_its_own_columns(qk, v):
    """q and k beside a v of another width (Q4_K_M files keep some layers' v as Q6_K beside Q4_K q and k): each part
    packed and computed on its own columns, the logits those of the blocks' model, rows exact, methods equal ar."""
    model = llama(7, "wide")
    config = LlamaBackend.from_hf(model)
    layers = q4_layers(model)
    for i, (layer, blocks) in enumerate(zip(model.model.layers, layers)):
        a = layer.self_attn
        if qk == "Q4_K":
            q, k = (q4.decode(q4_k_raw(*x.shape, seed=2 * i + j), "Q4_K", *x.shape)
                    for j, x in enumerate((a.q_proj.weight, a.k_proj.weight)))
        else:
            q, k = blocks_of(a.q_proj.weight, qk), blocks_of(a.k_proj.weight, qk)
        blocks["qkv"] = q4.fuse([q, k, head_blocks(a.v_proj.weight, v)])
        assert isinstance(blocks["qkv"], q4.Fused) and blocks["qkv"].shape == (512, 256)
    head = head_blocks(model.lm_head.weight, "Q8_0")
    backend = Q4LlamaBackend(config.shape, model.state_dict(), layers=layers, head=head)
    with_m = qk == "Q4_1"
    assert backend._layers[0].qkv.layout == ((256, q4.BITS[qk], with_m), (128, q4.BITS[qk], with_m),
                                             (128, q4.BITS[v], False))
    assert_computes_the_blocks_model(model, backend, layers, head, "pld-tree")


def test_a_file_head_of_the_wrong_shape_is_a_clear_error():
    model = llama(5, "small")
    config = LlamaBackend.from_hf(model)
    with pytest.raises(ParadecodeError, match="LM head is 64 x 64, the model's 64 x 32"):
        Q4LlamaBackend(config.shape, model.state_dict(), layers=q4_layers(model),
                       head=blocks_of(torch.randn(64, 64), "Q8_0"))


# bucket -> kernel: the 4-bit GEMM's AMX tile form (gemm_q4_amx.h) on every pass size, and on verify and prefill;
# the one-row pass on several blocks at once ("interleaved") instead of one stream
KERNEL_CHOICES = {"amx": dict(one="amx", verify="amx", prefill="amx"),
                  "mixed-amx": dict(one="own", verify="amx", prefill="amx"),
                  "interleaved": dict(one="interleaved", verify="interleaved", prefill="own")}


def use_kernels(backend: Q4LlamaBackend, choice: str) -> None:
    missing = set(KERNEL_CHOICES[choice].values()) - set(backend.available_kernels())
    if missing:
        pytest.skip(f"this machine offers no {', '.join(sorted(missing))} kernel")
    backend.use_kernels(KERNEL_CHOICES[choice])


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("kernels", sorted(KERNEL_CHOICES))
def test_every_q4_row_equals_its_one_token_pass_to_the_bit_on_each_kernel(kernels, kind):
    """The tile form and the interleaved one-row pass give each row the vector kernel's bits: a 57-row pass and a 12-row chain on the tiles (a
    partial 16-row tile each), 7-row chains and trees and one-token passes on the vector kernel, all alike; and a
    100-row pass (two 64-row chunks) equals the same pass on the vector kernel. 4 groups per row: the tiles step
    two groups at a time."""
    backend = q4_backend(3, "deep", kind)
    use_kernels(backend, kernels)
    assert_rows_equal_one_token_passes(backend, tokens(70, seed=1), tokens(len(TREE_PARENTS), seed=2))
    ids = tokens(100, seed=4)
    backend.reset()
    backend.forward(ids[:30])
    chain = backend.forward(ids[30:42]).logits
    backend.rollback(30)
    assert torch.equal(chain, one_by_one(backend, ids[30:42]))
    backend.reset()
    on_tiles = backend.forward(ids).logits
    backend.reset()
    backend.use_kernels(dict.fromkeys(KERNEL_CHOICES[kernels], "own"))
    assert torch.equal(backend.forward(ids).logits, on_tiles)


@pytest.mark.parametrize("method", ["ngram", "pld-tree", "jacobi"])
def test_methods_equal_ar_on_the_q4_amx_tiles(method):
    backend = q4_backend(9, "deep")
    prompt = tokens(20, seed=10).tolist() * 2
    reference, _ = run(backend, "ar", prompt, max_new_tokens=40)
    use_kernels(backend, "mixed-amx")
    output, _ = run(backend, method, prompt, max_new_tokens=40)
    assert output == reference


def test_q4_0_without_its_m_computes_the_same_bits(monkeypatch):
    """Q4_0 blocks packed without m (the kernel computes -8 d) give the bits the layout with m gives, on every
    instruction path the build has, and read 10% fewer bytes."""
    compact = q4_backend(4, "deep", "Q4_0")
    ids = tokens(30, seed=5)
    want = compact.forward(ids).logits
    monkeypatch.setattr(q4.Blocks, "stores_m", property(lambda blocks: blocks.bits == 4))  # m packed all the same
    full = q4_backend(4, "deep", "Q4_0")
    assert full._layers[0].o.layout == ((128, 4, True),) and compact._layers[0].o.layout == ((128, 4, False),)
    assert torch.equal(full.forward(ids).logits, want)
    assert compact.weight_bytes < full.weight_bytes
    with pytest.raises(ValueError, match="only where every m is implied"):
        q4.pack(blocks_of(torch.randn(16, 32), "Q4_1"), with_m=False)
    with pytest.raises(ValueError, match="8-bit blocks never store m"):
        q4.pack(blocks_of(torch.randn(16, 32), "Q8_0"), with_m=True)


@pytest.mark.parametrize("method,kind", [(method, "Q4_1") for method in ("ngram", "pld", "pld-tree", "jacobi",
                                                                           "lookahead")]
                         + [("pld-tree", "Q8_0"), ("jacobi", "Q8_0")])
def test_methods_equal_ar_on_q4(method, kind):
    backend = q4_backend(9, kind=kind)
    prompt = tokens(20, seed=10).tolist() * 2
    reference, _ = run(backend, "ar", prompt, max_new_tokens=40)
    output, _ = run(backend, method, prompt, max_new_tokens=40)
    assert output == reference


def test_q4_sequences_sharing_a_pass_get_exactly_their_own_rows():
    """Rows of two sequences in one pass, each through its own page table, equal their passes alone (the batch
    invariance the batcher relies on)."""
    backend = q4_backend(6, "deep")
    forward = backend._native.forward
    pages_a, pages_b = torch.tensor([3, 1], dtype=torch.int32), torch.tensor([0, 2], dtype=torch.int32)
    a, b = tokens(100, seed=11), tokens(90, seed=12)
    layers = list(range(3))

    def run_alone(ids, pages, split):
        forward(ids[:split], torch.arange(split), [(pages, 0, split, None)], layers, False)
        rest = len(ids) - split
        return forward(ids[split:], torch.arange(split, len(ids)), [(pages, split, rest, None)], layers, True)[1]

    alone_a, alone_b = run_alone(a, pages_a, 80), run_alone(b, pages_b, 70)
    forward(a[:80], torch.arange(80), [(pages_a, 0, 80, None)], layers, False)
    forward(b[:70], torch.arange(70), [(pages_b, 0, 70, None)], layers, False)
    both = forward(torch.cat((a[80:], b[70:])), torch.cat((torch.arange(80, 100), torch.arange(70, 90))),
                   [(pages_a, 80, 20, None), (pages_b, 70, 20, None)], layers, True)[1]
    assert torch.equal(both[:20], alone_a) and torch.equal(both[20:], alone_b)
    assert isinstance(backend.batcher(1 << 20), Batcher)


def test_a_model_not_from_a_gguf_file_is_a_clear_error(tmp_path):
    with pytest.raises(ParadecodeError, match="was not converted from a .gguf file"):
        q4.gguf_source(tmp_path)


def test_a_gguf_file_without_block_layers_it_runs_is_a_clear_error(tmp_path):
    from gguf import GGUFWriter

    path = tmp_path / "q5.gguf"
    writer = GGUFWriter(str(path), "llama")
    weight = np.random.default_rng(0).standard_normal((16, 32)).astype(np.float32)
    for name in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
        raw = quants.quantize(weight, GGMLQuantizationType.Q5_1)
        writer.add_tensor(f"blk.0.{name}.weight", raw, raw_shape=raw.shape, raw_dtype=GGMLQuantizationType.Q5_1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ParadecodeError, match="Q4_0, Q4_1, Q4_K, Q5_0, Q6_K and Q8_0 .* is Q5_1"):
        q4.read_layers(path, 1, 2, 1)


@pytest.mark.parametrize("method", ["pld-tree", "jacobi"])
def test_q4_k_and_q5_0_layers_compute_their_blocks_model_with_exact_rows(method):
    """A model whose o, gate_up and down are Q4_K and whose qkv is Q5_0 (as in Q4_K_M files), with the file's own
    Q6_K head: the logits are its converted blocks' model's up to the activations' rounding, every row equals its
    one-token pass, and methods equal ar."""
    model = llama(6, "wide")
    config = LlamaBackend.from_hf(model)
    layers = []
    for i, layer in enumerate(model.model.layers):
        a, m = layer.self_attn, layer.mlp
        q4_k = {name: q4.decode(q4_k_raw(n, k, seed=10 * i + j), "Q4_K", n, k)
                for j, (name, (n, k)) in enumerate([("o", a.o_proj.weight.shape),
                                                    ("gate_up", (2 * m.up_proj.weight.shape[0], 256))])}
        qkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
        raw = quants.quantize(qkv.detach().numpy(), GGMLQuantizationType.Q5_0)
        layers.append(dict(qkv=q4.decode(raw, "Q5_0", *qkv.shape), down=blocks_of(m.down_proj.weight, "Q4_1"),
                           **q4_k))
    head = head_blocks(model.lm_head.weight, "Q6_K")
    backend = Q4LlamaBackend(config.shape, model.state_dict(), layers=layers, head=head)
    assert_computes_the_blocks_model(model, backend, layers, head, method)


@pytest.mark.slow
def test_the_shipped_gguf_blocks_are_the_converted_checkpoints_weights():
    """SmolLM2's Q4_1 layers, read and reordered by paradecode, dequantize to exactly the weights transformers
    converted from the same file (q and k rows included, which llama.cpp's converter reorders)."""
    from safetensors.torch import load_file

    from paradecode.backends.llama import LlamaShape
    from paradecode.models import resolve

    model_dir, _ = resolve("smollm2-135m")
    shape = LlamaShape.from_config(__import__("json").loads((model_dir / "config.json").read_text()))
    layers = q4.read_layers(q4.gguf_source(model_dir), shape.num_layers, shape.num_heads, shape.num_kv_heads)
    state = load_file(model_dir / "model.safetensors")
    for i in (0, shape.num_layers - 1):
        prefix = f"model.layers.{i}."
        qkv = torch.cat([state[prefix + f"self_attn.{x}_proj.weight"] for x in "qkv"])
        gate_up = torch.cat([state[prefix + f"mlp.{x}_proj.weight"] for x in ("gate", "up")])
        assert torch.equal(layers[i]["qkv"].dequantize(), qkv)
        assert torch.equal(layers[i]["o"].dequantize(), state[prefix + "self_attn.o_proj.weight"])
        assert torch.equal(layers[i]["gate_up"].dequantize(), gate_up)
        assert torch.equal(layers[i]["down"].dequantize(), state[prefix + "mlp.down_proj.weight"])


def test_a_q4_pass_gives_the_same_bits_on_one_thread_or_several():
    """The 4-bit GEMMs hand column blocks to whichever thread is free: the thread count must not change a bit."""
    model = shaped_llama(4, dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1,
                                 intermediate_size=1056), 1000)
    int8 = Int8LlamaBackend.from_hf(model, calibration=CALIBRATION, native=False).export_state()
    backend = Q4LlamaBackend(LlamaBackend.from_hf(model).shape, model.state_dict(), layers=q4_layers(model),
                             int8_state=int8)
    assert_same_bits_on_any_thread_count(backend, [tokens(rows, rows) for rows in (1, 6, 70)])


def write_q4_gguf(path, layers: int = 2, hidden: int = 32, heads: int = 2, kv_heads: int = 1, inter: int = 64,
                  head: str = "Q8_0"):
    """A Llama GGUF file of ``layers`` layers of Q4_1 projections and a tied embedding of type ``head`` (random
    weights; no metadata beyond the architecture)."""
    from gguf import GGUFWriter

    rng = np.random.default_rng(0)
    hd = hidden // heads
    shapes = dict(attn_q=(heads * hd, hidden), attn_k=(kv_heads * hd, hidden), attn_v=(kv_heads * hd, hidden),
                  attn_output=(hidden, heads * hd), ffn_gate=(inter, hidden), ffn_up=(inter, hidden),
                  ffn_down=(hidden, inter))
    writer = GGUFWriter(str(path), "llama")
    for i in range(layers):
        for name, shape in shapes.items():
            raw = quants.quantize(rng.standard_normal(shape).astype(np.float32), GGMLQuantizationType.Q4_1)
            writer.add_tensor(f"blk.{i}.{name}.weight", raw, raw_shape=raw.shape, raw_dtype=GGMLQuantizationType.Q4_1)
    kind = GGMLQuantizationType[head]
    raw = quants.quantize(rng.standard_normal((VOCAB, hidden)).astype(np.float32), kind)
    writer.add_tensor("token_embd.weight", raw, raw_shape=raw.shape, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_packed_layers_are_kept_after_the_first_read_and_read_again_when_the_kept_copy_is_damaged(tmp_path,
                                                                                              monkeypatch):
    """``load_blocks`` packs the file's layers once and keeps them in the cache: later loads read the kept copy (the
    gguf reader parses every metadata field, seconds on a real model) and get the same bytes; a damaged copy is read
    from the file again with a warning and replaced; a changed file is a new copy."""
    path, cache = tmp_path / "m.gguf", tmp_path / "cache"
    write_q4_gguf(path)
    first, head = q4.load_blocks(path, 2, 2, 1, cache)
    fresh = [{name: q4.Q4Linear.from_blocks(blocks) for name, blocks in layer.items()}
             for layer in q4.read_layers(path, 2, 2, 1)]
    from gguf import GGUFReader

    fresh_head = q4.Q4Linear.from_blocks(q4.read_head(GGUFReader(str(path))))
    (kept,) = (cache / "q4").iterdir()

    def same(a, b):
        return all(torch.equal(a[i][n].packed, b[i][n].packed) and (a[i][n].n, a[i][n].k) == (b[i][n].n, b[i][n].k)
                   for i in range(2) for n in ("qkv", "o", "gate_up", "down"))

    assert same(first, fresh) and torch.equal(head.packed, fresh_head.packed)
    assert (head.n, head.k, head.bits) == (VOCAB, 32, 8)
    read = q4.iter_layers
    monkeypatch.setattr(q4, "iter_layers", lambda *a: pytest.fail("the kept copy was not used"))
    layers, kept_head = q4.load_blocks(path, 2, 2, 1, cache)
    assert same(layers, fresh) and torch.equal(kept_head.packed, fresh_head.packed) and kept_head.bits == 8
    kept.write_bytes(kept.read_bytes()[:100])  # truncated
    monkeypatch.setattr(q4, "iter_layers", read)
    with pytest.warns(UserWarning, match="could not be read"):
        assert same(q4.load_blocks(path, 2, 2, 1, cache)[0], fresh)
    monkeypatch.setattr(q4, "iter_layers", lambda *a: pytest.fail("the replaced copy was not used"))
    assert same(q4.load_blocks(path, 2, 2, 1, cache)[0], fresh)
    monkeypatch.setattr(q4, "iter_layers", read)
    write_q4_gguf(path, layers=3)  # another file at the same path
    assert len(q4.load_blocks(path, 3, 2, 1, cache)[0]) == 3 and len(list((cache / "q4").iterdir())) == 2
    assert q4.load_blocks(path, 3, 2, 1, None)[0]  # no cache: read, nothing kept
    write_q4_gguf(path, head="F16")  # a head type the kernel does not run: the int8 backend's head instead
    layers, head = q4.load_blocks(path, 2, 2, 1, cache)
    assert len(layers) == 2 and head is None
    assert q4.load_blocks(path, 2, 2, 1, cache)[1] is None  # and so from the kept copy
