"""Backends reproduce transformers' logits, and trees, rollback, commit and early exit keep the cache honest.

Everything runs on tiny random models built here; the one test on the real SmolLM2 is marked slow.
"""

from __future__ import annotations


import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
)

from paradecode.backends import HFBackend, LlamaBackend, tree_depths, tree_mask

VOCAB = 64
ATOL = 1e-4
TREE_PARENTS = [-1, 0, 0, 1, 2, -1]  # two roots; the first branches twice
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}


# the shape every tiny test model here shares (Llama and Gemma-3 alike)
TINY = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.1)


def tiny_llama(**overrides) -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**{**TINY, **overrides})).eval()


def tiny_gemma3() -> Gemma3ForCausalLM:
    """Sliding window 4 on layer 0, so sequences of 10+ tokens exercise the window."""
    torch.manual_seed(0)
    config = Gemma3TextConfig(**TINY, head_dim=8, sliding_window=4, layer_types=["sliding_attention", "full_attention"])
    return Gemma3ForCausalLM(config).eval()


CASES = {
    "reference": (tiny_llama, LlamaBackend.from_hf),
    "hf-llama": (tiny_llama, HFBackend),
    "hf-gemma3": (tiny_gemma3, HFBackend),
}


@pytest.fixture(scope="module", params=list(CASES))
def built_case(request):
    make_model, make_backend = CASES[request.param]
    model = make_model()
    return make_backend(model), model


@pytest.fixture
def case(built_case):
    """(backend with an empty cache, the transformers model it must agree with)."""
    backend, model = built_case
    backend.reset()
    return backend, model


def tokens(n: int, seed: int) -> torch.Tensor:
    return torch.randint(VOCAB, (n,), generator=torch.Generator().manual_seed(seed))  # [n]


def full_logits(model, token_ids: torch.Tensor) -> torch.Tensor:
    """[n, vocab] logits of transformers' own uncached forward over the whole sequence."""
    with torch.inference_mode():
        return model(token_ids[None]).logits[0].float()


def branch(parents: list[int], node: int) -> list[int]:
    """Indices of the nodes from a root down to ``node``."""
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


def forward_tree(backend, nodes: torch.Tensor, parents: list[int]) -> torch.Tensor:
    positions = backend.cache_len - 1 + torch.tensor(tree_depths(parents))  # [N] depth decides the position
    return backend.forward(nodes, positions, tree_mask(parents, backend.cache_len)).logits  # [N, vocab]


def test_incremental_forwards_match_the_full_sequence(case):
    backend, model = case
    ids = tokens(14, seed=1)
    logits = torch.cat([backend.forward(ids[:7]).logits, backend.forward(ids[7:8]).logits, backend.forward(ids[8:]).logits])
    torch.testing.assert_close(logits, full_logits(model, ids), atol=ATOL, rtol=0)
    assert backend.cache_len == 14


@pytest.mark.parametrize(
    "overrides",
    [{"rope_parameters": LLAMA3_ROPE}, {"attention_bias": True, "mlp_bias": True}, {"tie_word_embeddings": False}],
    ids=["llama3-rope", "biases", "untied"],
)
def test_reference_matches_transformers_variants(overrides):
    model = tiny_llama(**overrides)
    backend = LlamaBackend.from_hf(model)
    ids = tokens(40, seed=2)  # past the llama3 test's original context of 16
    chunks = [ids[:30], ids[30:32], ids[32:]]  # many rows, then few: both projection layouts
    logits = torch.cat([backend.forward(chunk).logits for chunk in chunks])
    torch.testing.assert_close(logits, full_logits(model, ids), atol=ATOL, rtol=0)


def test_reference_loads_a_saved_checkpoint(tmp_path):
    model = tiny_llama()
    model.save_pretrained(tmp_path)
    backend = LlamaBackend.from_pretrained(tmp_path, max_length=32)
    ids = tokens(9, seed=3)
    torch.testing.assert_close(backend.forward(ids).logits, full_logits(model, ids), atol=ATOL, rtol=0)
    assert backend.max_length == 32


def test_tree_pass_matches_each_branch_as_a_chain(case):
    backend, _ = case
    assert backend.supports_tree
    prompt, nodes = tokens(6, seed=4), tokens(len(TREE_PARENTS), seed=5)
    backend.forward(prompt)
    tree = forward_tree(backend, nodes, TREE_PARENTS)
    for node in range(len(TREE_PARENTS)):
        backend.rollback(len(prompt))
        chain = backend.forward(nodes[branch(TREE_PARENTS, node)]).logits
        torch.testing.assert_close(tree[node], chain[-1], atol=ATOL, rtol=0)
    # A causal pass over the same nodes differs: the tree mask really separates the branches.
    backend.rollback(len(prompt))
    assert not torch.allclose(backend.forward(nodes).logits, tree, atol=1e-2)


def test_rollback_then_forward_matches_a_fresh_computation(case):
    backend, model = case
    ids, junk = tokens(11, seed=6), tokens(5, seed=7)
    backend.forward(ids[:8])
    backend.forward(junk)
    backend.rollback(8)
    assert backend.cache_len == 8
    logits = backend.forward(ids[8:]).logits
    torch.testing.assert_close(logits, full_logits(model, ids)[8:], atol=ATOL, rtol=0)


@pytest.mark.parametrize("node", [1, 4, 5], ids=["contiguous", "gather", "second-root"])
def test_commit_leaves_the_cache_of_the_kept_path(case, node):
    backend, model = case
    prompt, nodes, after = tokens(6, seed=8), tokens(len(TREE_PARENTS), seed=9), tokens(2, seed=10)
    backend.forward(prompt)
    forward_tree(backend, nodes, TREE_PARENTS)
    keep = branch(TREE_PARENTS, node)
    backend.commit(len(prompt), keep)
    assert backend.cache_len == len(prompt) + len(keep)
    logits = backend.forward(after).logits
    expected = full_logits(model, torch.cat([prompt, nodes[keep], after]))[-len(after) :]
    torch.testing.assert_close(logits, expected, atol=ATOL, rtol=0)


def test_return_hidden_is_the_final_normed_state(case):
    backend, model = case
    ids = tokens(5, seed=11)
    out = backend.forward(ids, return_hidden=True)
    with torch.inference_mode():
        expected = model(ids[None], output_hidden_states=True).hidden_states[-1][0]
    torch.testing.assert_close(out.hidden, expected, atol=ATOL, rtol=0)
    assert backend.forward(ids[:1]).hidden is None


def test_context_overflow_raises(case):
    backend, _ = case
    with pytest.raises(ValueError):
        backend.forward(tokens(backend.max_length + 1, seed=12))


def test_exit_layer_equals_a_truncated_model():
    model = tiny_llama(num_hidden_layers=3)
    truncated = LlamaForCausalLM(LlamaConfig(**{**model.config.to_dict(), "num_hidden_layers": 2})).eval()
    truncated.load_state_dict(model.state_dict(), strict=False)  # drops layer 2
    backend = LlamaBackend.from_hf(model)
    ids = tokens(10, seed=13)
    logits = torch.cat([backend.forward(ids[:7], exit_layer=2).logits, backend.forward(ids[7:], exit_layer=2).logits])
    torch.testing.assert_close(logits, full_logits(truncated, ids), atol=ATOL, rtol=0)


def test_hf_backend_refuses_to_run_a_subset_of_layers():
    backend = HFBackend(tiny_llama())
    with pytest.raises(NotImplementedError):
        backend.forward(tokens(2, seed=14), exit_layer=1)
    with pytest.raises(NotImplementedError):
        backend.forward(tokens(2, seed=14), layers=[0])


@pytest.fixture(scope="module")
def smollm2_dir():
    """SmolLM2-135M dequantised from its GGUF by paradecode's own converter (cached after the first use)."""
    from paradecode.models import resolve

    return resolve("smollm2-135m")[0]


@pytest.mark.slow
def test_reference_matches_transformers_on_smollm2(smollm2_dir):
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    backend = LlamaBackend.from_pretrained(smollm2_dir)
    ids = torch.randint(model.config.vocab_size, (48,), generator=torch.Generator().manual_seed(0))
    expected = full_logits(model, ids)
    logits = torch.cat([backend.forward(ids[:40]).logits, backend.forward(ids[40:41]).logits, backend.forward(ids[41:]).logits])
    torch.testing.assert_close(logits, expected, atol=ATOL * expected.abs().max().item(), rtol=0)
    assert HFBackend(model).supports_tree
