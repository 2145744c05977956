"""The Llama forward runs Llama (with Llama-3 rope scaling), Mistral, Qwen2, Qwen3 and Gemma-3 checkpoints: fp32
logits agree with transformers, the native int8 forward gives every row what its one-token pass gives (prefill,
chain and tree), and every method equals ``ar`` on it. Each architecture is a tiny random model built here, loaded
from a saved Hugging Face folder."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import transformers

from paradecode.backends import native
from paradecode.backends.int8_llama import Int8LlamaBackend
from paradecode.backends.llama import ARCHITECTURES, LlamaBackend, LlamaShape
from tiny import TREE_PARENTS, assert_rows_equal_one_token_passes, run

VOCAB = 64
TINY = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.1, tie_word_embeddings=False)
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(**TINY, rope_parameters=LLAMA3_ROPE),
    # windows shorter than the tests' sequences, so that they bind
    "mistral": lambda: transformers.MistralConfig(**TINY, sliding_window=16),
    "qwen2": lambda: transformers.Qwen2Config(**TINY),
    # Qwen3's head_dim is its own (here 32 with 4 heads over a hidden size of 64, as Qwen3-0.6B's 128 x 16 > 1024)
    "qwen3": lambda: transformers.Qwen3Config(**TINY, head_dim=32),
    # a sliding layer (its own RoPE base) then a full one; a score scale other than head_dim^-0.5
    "gemma3_text": lambda: transformers.Gemma3TextConfig(**TINY, head_dim=32, sliding_window=8,
                                                         query_pre_attn_scalar=24,
                                                         layer_types=["sliding_attention", "full_attention"]),
}
CALIBRATION = [list(range(1, 60)), [5, 9, 5, 9, 30, 31, 2, 2, 2, 47] * 4]


def tiny_model(architecture: str, seed: int = 0):
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[architecture]()).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("bias", "norm.weight")):  # not the zeros / ones they start as
                param.normal_(0.0, 0.5)
        model.lm_head.weight.mul_(4.0)  # sharp logits: greedy choices that do not hinge on a last bit
    return model


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def saved(request, tmp_path_factory):
    model = tiny_model(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder)
    return request.param, model, folder


def tokens(n: int, seed: int) -> torch.Tensor:
    return torch.randint(VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


def test_every_listed_architecture_is_tested():
    assert sorted(CONFIGS) == sorted(ARCHITECTURES)


def test_the_shape_reads_each_architecture(saved):
    architecture, model, _ = saved
    shape = LlamaShape.from_config(model.config.to_dict())
    assert shape.architecture == architecture
    assert shape.attention_bias == (architecture == "qwen2") and not shape.o_bias
    assert shape.qk_norm == (architecture in ("qwen3", "gemma3_text"))
    assert shape.head_dim == (32 if architecture in ("qwen3", "gemma3_text") else 16)
    assert shape.rope["rope_type"] == ("llama3" if architecture == "llama" else "default")
    gemma = architecture == "gemma3_text"
    assert (shape.sandwich_norms, shape.unit_offset_norms, shape.activation) == (gemma, gemma,
                                                                                 "gelu_tanh" if gemma else "silu")
    assert shape.windows == {"mistral": (16, 16), "gemma3_text": (8, None)}.get(architecture, ())
    assert shape.local_rope == ({"rope_type": "default", "rope_theta": 10000.0} if gemma else None)
    assert shape.rope["rope_theta"] == {"llama": 500000.0, "gemma3_text": 1000000.0}.get(architecture, 10000.0)


def test_fp32_logits_agree_with_transformers(saved):
    _, model, folder = saved
    backend = LlamaBackend.from_pretrained(folder, max_length=128)
    ids = tokens(40, seed=1)
    chunks = [ids[:30], ids[30:32], ids[32:]]  # many rows, then few: both projection layouts
    got = torch.cat([backend.forward(chunk).logits for chunk in chunks])
    with torch.no_grad():
        want = model(ids[None]).logits[0]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


@pytest.mark.skipif(not native.enabled(), reason="PARADECODE_NATIVE=0 turns the native path off")
def test_native_int8_rows_are_exact_and_close_to_fp32(saved):
    architecture, model, folder = saved
    backend = Int8LlamaBackend.from_pretrained(folder, max_length=128, calibration=CALIBRATION)
    assert backend._native is not None
    ids = tokens(30, seed=2)
    got = backend.forward(ids).logits
    with torch.no_grad():
        want = model(ids[None]).logits[0]
    assert (got - want).abs().max() < 0.1 * want.abs().max(), architecture
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.9, architecture
    assert_rows_equal_one_token_passes(backend, tokens(40, seed=3), tokens(len(TREE_PARENTS), seed=4))


@pytest.mark.skipif(not native.enabled(), reason="PARADECODE_NATIVE=0 turns the native path off")
@pytest.mark.parametrize("method", ["ngram", "pld", "pld-tree", "jacobi", "lookahead", "layerskip"])
def test_methods_equal_ar_on_each_architecture(saved, method):
    _, _, folder = saved
    backend = Int8LlamaBackend.from_pretrained(folder, max_length=128, calibration=CALIBRATION)
    prompt = tokens(12, seed=5).tolist() * 2
    reference, _ = run(backend, "ar", prompt, max_new_tokens=32)
    output, _ = run(backend, method, prompt, max_new_tokens=32)
    assert output == reference


def test_qk_norm_changes_the_logits():
    """The per-head norms are applied (a forward that skipped them would still run)."""
    model = tiny_model("qwen3")
    backend = LlamaBackend.from_hf(model, max_length=64)
    ids = tokens(10, seed=6)
    before = backend.forward(ids).logits
    for layer in backend._layers:
        layer.q_norm = layer.q_norm * 3.0
    backend.reset()
    assert not torch.allclose(backend.forward(ids).logits, before, atol=1e-3)


WINDOWED = {"mistral": lambda: tiny_model("mistral"), "gemma3_text": lambda: tiny_model("gemma3_text"),
            "qwen2": lambda: transformers.AutoModelForCausalLM.from_config(transformers.Qwen2Config(
                **TINY, use_sliding_window=True, sliding_window=8, max_window_layers=1)).eval()}


@pytest.mark.parametrize("architecture", sorted(WINDOWED))
def test_the_sliding_window_binds_in_both_forwards(architecture):
    """Rows within the window of the start give what a forward without windows gives, rows past it do not; the
    native int8 forward and the PyTorch one drop the same slots (a forward that ignored its window would agree
    with the unwindowed one everywhere), and fp32 agrees with transformers past the window."""
    torch.manual_seed(0)
    model = WINDOWED[architecture]()
    shape = LlamaShape.from_config(model.config.to_dict())
    assert any(shape.windows) and min(w for w in shape.windows if w) < 40
    unbound = replace(shape, windows=tuple(None if w is None else 10**6 for w in shape.windows))  # RoPE kept
    window = min(w for w in shape.windows if w is not None)
    ids = tokens(40, seed=7)
    state = model.state_dict()
    with torch.no_grad():
        torch.testing.assert_close(LlamaBackend(shape, state, 64).forward(ids).logits, model(ids[None]).logits[0],
                                   atol=1e-4, rtol=0)
    int8 = Int8LlamaBackend(shape, state, 64, calibration=CALIBRATION, native=False)
    pairs = [(LlamaBackend(shape, state, 64), LlamaBackend(unbound, state, 64))]
    for on in (False, True) if native.enabled() else (False,):  # int8 on the PyTorch forward, then the native one
        pairs.append((Int8LlamaBackend(shape, state, 64, int8_state=int8.export_state(), native=on),
                      Int8LlamaBackend(unbound, state, 64, int8_state=int8.export_state(), native=on)))
    for backend, without in pairs:
        windowed, whole = backend.forward(ids).logits, without.forward(ids).logits
        torch.testing.assert_close(windowed[:window], whole[:window], atol=1e-5, rtol=0)
        assert (windowed[window + 4 :] - whole[window + 4 :]).abs().amax(-1).min() > 1e-3


@pytest.mark.parametrize("config,message", [
    (dict(model_type="gemma2"), "llama, mistral, qwen2, qwen3, gemma3_text checkpoints, not model_type 'gemma2'"),
    (dict(model_type="llama", hidden_act="gelu"), "SiLU MLP and Gemma's tanh-GELU MLP only"),
    (dict(model_type="gemma3_text", final_logit_softcapping=30.0), "final_logit_softcapping=30.0 is not supported"),
])
def test_unsupported_checkpoints_are_clear_errors(config, message):
    base = dict(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2)
    with pytest.raises(ValueError, match=message):
        LlamaShape.from_config({**base, **config})
