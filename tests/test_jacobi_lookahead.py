"""Jacobi and lookahead decoding: lossless against autoregressive decoding, exact under sampling, pure parts.

Greedy: token-for-token equal to ``ar`` on tiny random Llamas (every Jacobi init and variant, several lookahead
shapes, lookahead's chain fallback on a backend that verifies chains only), including EOS inside an accepted
draft, stop strings and the context limit. Sampling: the joint distribution of the first two tokens matches
the model's exact one (chi-squared, computed from the model itself), and a deliberately broken verifier
fails the same test. Unit tests cover the n-gram pool, the prefix tree and the lookahead window's mask.
"""

from functools import lru_cache

import pytest
import torch
from scipy.stats import chisquare

import paradecode.engine as engine
from paradecode.backends.llama import LlamaBackend
from paradecode.config import SamplingConfig
from paradecode.drafters.base import DecodeState
from paradecode.drafters.lookahead import LookaheadDrafter, window_mask, window_offsets
from paradecode.drafters.pld_tree import merge_prefix_tree
from paradecode.drafters.ngram_pool import NgramPool
from paradecode.errors import ParadecodeError
from paradecode.registry import get_method
from paradecode.verify.base import Verdict
from paradecode.verify.sampling import probabilities, sample, uniform
from tiny import PROMPTS, run, tiny_llama



class ChainOnlyBackend(LlamaBackend):
    """The tiny backend, declaring that it verifies chains only (lookahead must fall back to a chain)."""

    supports_tree = False


JACOBI = [("jacobi", {"init": init, "variant": variant}, False)
          for init in ("pad", "repeat-last", "ngram") for variant in ("jacobi", "gs")]
JACOBI[1][1]["window"] = 7  # pad + gs, with a wider block
LOOKAHEAD = [("lookahead", {}, False), ("lookahead", {"W": 1, "N": 3, "G": 1}, False),
             ("lookahead", {"W": 5, "N": 3, "G": 7}, False), ("lookahead", {"W": 4, "N": 5, "G": 2}, False),
             ("lookahead", {}, True), ("lookahead", {"W": 2, "N": 3, "G": 4}, True)]
METHODS = JACOBI + LOOKAHEAD




@lru_cache(maxsize=None)
def _backend(seed: int, chain_only: bool = False, vocab: int = 48, max_length: int | None = None):
    cls = ChainOnlyBackend if chain_only else LlamaBackend
    return cls.from_hf(tiny_llama(seed, vocab=vocab, sharp=4.0 if vocab == 48 else 8.0), max_length=max_length)


@lru_cache(maxsize=None)
def _ar(seed: int, prompt: tuple, max_new: int, eos: int | None = None, stop: str | None = None):
    return run(_backend(seed), "ar", list(prompt), max_new_tokens=max_new, eos_ids=() if eos is None else [eos],
               stop=() if stop is None else [stop])


def _ids(params):
    return [f"{method}-{'-'.join(f'{k}={v}' for k, v in options.items())}{'-chain' if chain else ''}"
            for method, options, chain in params]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("method,options,chain_only", METHODS, ids=_ids(METHODS))
def test_greedy_equals_autoregressive(seed, method, options, chain_only):
    backend = _backend(seed, chain_only)
    for prompt in PROMPTS:
        for max_new in (2, 9, 40):
            expected, _ = _ar(seed, tuple(prompt), max_new)
            got, stats = run(backend, method, prompt, max_new_tokens=max_new, **options)
            assert got == expected, (method, options, seed, prompt, max_new)
            assert stats.new_tokens == max_new and stats.forward_passes == len(stats.steps) <= max_new
            if chain_only:
                assert all(step.parents is None for step in stats.steps)


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("method,options,chain_only", METHODS, ids=_ids(METHODS))
def test_eos_inside_a_draft_stops_like_autoregressive(seed, method, options, chain_only):
    backend = _backend(seed, chain_only)
    for prompt in (PROMPTS[0], PROMPTS[2]):
        reference, _ = _ar(seed, tuple(prompt), 30)
        for eos_at in (0, 3, 11):
            expected, ar_stats = _ar(seed, tuple(prompt), 30, eos=reference[eos_at])
            assert ar_stats.stop_reason == "eos"
            got, stats = run(backend, method, prompt, max_new_tokens=30, eos_ids=[reference[eos_at]], **options)
            assert got == expected and stats.stop_reason == "eos"


@pytest.mark.parametrize("method,options,chain_only", METHODS, ids=_ids(METHODS))
def test_stop_strings_and_context_limit_like_autoregressive(method, options, chain_only):
    backend = _backend(1, chain_only)
    prompt = PROMPTS[2]
    reference, _ = _ar(1, tuple(prompt), 30)
    for at in (2, 9):
        stop = f"t{reference[at]} t{reference[at + 1]} "  # spans two tokens
        expected, ar_stats = _ar(1, tuple(prompt), 30, stop=stop)
        got, stats = run(backend, method, prompt, max_new_tokens=30, stop=[stop], **options)
        assert ar_stats.stop_reason == "stop" and got == expected and stats.stop_reason == "stop"
    short = _backend(4, chain_only, max_length=37)  # the window must not run past the cache
    expected, ar_stats = run(short, "ar", PROMPTS[1], max_new_tokens=100)
    got, stats = run(short, method, PROMPTS[1], max_new_tokens=100, **options)
    assert ar_stats.stop_reason == "context" and got == expected and stats.stop_reason == "context"


def test_lookahead_accepts_pooled_ngrams_through_a_tree():
    _, stats = run(_backend(1), "lookahead", PROMPTS[2], max_new_tokens=60, G=7)
    assert stats.mean_accepted > 1.5
    trees = [s for s in stats.steps if s.parents is not None]
    assert any(s.accepted for s in trees)  # a branching proposal got a path accepted
    assert stats.info["pool_size"] > 0


def test_jacobi_accepts_converged_guesses():
    _, stats = run(_backend(2), "jacobi", PROMPTS[4], max_new_tokens=60, init="repeat-last", variant="jacobi")
    assert stats.mean_accepted > 2.0


def test_gauss_seidel_blocks_shrink_until_converged():
    """variant=gs iterates one block: each step drafts the block's unconverged rest, then a fresh block."""
    _, stats = run(_backend(0), "jacobi", PROMPTS[3], max_new_tokens=40, init="pad", variant="gs", window=5)
    remaining = 5
    for step in stats.steps[:30]:  # later steps may be cut by the token budget
        assert len(step.drafted) == remaining
        remaining -= step.committed
        if remaining <= 0:
            remaining = 5
    sliding = run(_backend(0), "jacobi", PROMPTS[3], max_new_tokens=40, init="pad", variant="jacobi", window=5)[1]
    assert all(len(step.drafted) == 5 for step in sliding.steps[:30])


def test_seeded_sampling_is_reproducible():
    for method, options, _ in (JACOBI[4], LOOKAHEAD[0]):
        first, _ = run(_backend(2), method, PROMPTS[0], temperature=0.8, seed=11, max_new_tokens=30, **options)
        again, _ = run(_backend(2), method, PROMPTS[0], temperature=0.8, seed=11, max_new_tokens=30, **options)
        other, _ = run(_backend(2), method, PROMPTS[0], temperature=0.8, seed=12, max_new_tokens=30, **options)
        assert first == again and first != other


# -- sampling: the first two tokens are distributed exactly as the model's ------------------------------------
VOCAB = 8
SAMPLE_PROMPT = [3, 0, 6, 2, 5, 6, 2, 4, 0, 2]  # seed 2's own text: root 2 has two pooled 3-grams -> a tree
DRAWS = 3000


def _exact_joint(backend, prompt: list[int]) -> torch.Tensor:
    """[V, V] p(a) p(b | a) at temperature 1, straight from the model."""
    sampling = SamplingConfig(temperature=1.0)
    backend.reset()
    first = probabilities(backend.forward(torch.tensor(prompt)).logits[-1], sampling)  # [V]
    rows = []
    for a in range(VOCAB):
        backend.reset()
        rows.append(probabilities(backend.forward(torch.tensor(prompt + [a])).logits[-1], sampling))
    return first[:, None] * torch.stack(rows)


def _pvalue(method: str, options: dict, chain_only: bool, draws: int = DRAWS) -> float:
    backend = _backend(2, chain_only, vocab=VOCAB)
    counts = torch.zeros(VOCAB, VOCAB)
    for seed in range(draws):
        out, _ = run(backend, method, SAMPLE_PROMPT, max_new_tokens=2, temperature=1.0, seed=seed, **options)
        counts[out[0], out[1]] += 1
    expected = _exact_joint(backend, SAMPLE_PROMPT) * draws
    keep = expected.flatten() >= 5  # chi-squared needs enough expected counts per cell
    observed, expected = counts.flatten()[keep], expected.flatten()[keep]
    return float(chisquare(observed.numpy(), (expected * observed.sum() / expected.sum()).numpy()).pvalue)


def _forgetful_verifier(draft_tokens, parents, draft_probs, target_probs, rng):
    """Broken on purpose: accepts a draft token x with probability p(x) but then resamples from p instead of
    from p without x, so drafted tokens come out too often (p(x) (2 - p(x)) instead of p(x))."""
    parents = list(range(-1, len(draft_tokens) - 1)) if parents is None else parents
    accepted, node = [], -1
    while True:
        p = target_probs[node + 1]
        children = [i for i, parent in enumerate(parents) if parent == node]
        hit = next((c for c in children if uniform(rng) < float(p[draft_tokens[c]])), None)
        if hit is None:
            return Verdict(accepted, [draft_tokens[i] for i in accepted], sample(p, rng), bonus=not children)
        accepted.append(hit)
        node = hit


@pytest.mark.parametrize("method,options,chain_only", [
    ("jacobi", {"init": "ngram", "variant": "gs"}, False), ("lookahead", {}, False), ("lookahead", {}, True)],
    ids=["jacobi-gs-ngram", "lookahead-tree", "lookahead-chain"])
def test_sampling_matches_the_model_distribution(method, options, chain_only):
    _, stats = run(_backend(2, chain_only, vocab=VOCAB), method, SAMPLE_PROMPT, max_new_tokens=2, temperature=1.0)
    assert stats.steps[0].drafted  # the first token is drawn against a draft
    if method == "lookahead":
        assert (stats.steps[0].parents is None) == chain_only  # a branching tree unless chains only
    assert _pvalue(method, options, chain_only) > 1e-3


def test_broken_verifier_fails_the_distribution_test(monkeypatch):
    monkeypatch.setattr(engine, "verify_speculative", _forgetful_verifier)
    assert _pvalue("lookahead", {}, False, draws=1000) < 1e-6


# -- pure pieces ----------------------------------------------------------------------------------------------
def test_ngram_pool_is_lru_per_key_and_over_keys():
    pool = NgramPool(per_key=2, max_keys=2)
    pool.add([1, 2, 3])
    pool.add([1, 4, 5])
    assert pool.candidates(1, 5) == [(4, 5), (2, 3)]  # most recent first
    pool.add([1, 2, 3])  # refresh
    pool.add([1, 6, 7])  # evicts the least recent continuation, (4, 5)
    assert pool.candidates(1, 5) == [(6, 7), (2, 3)] and pool.candidates(1, 1) == [(6, 7)]
    pool.add([8, 9, 9])
    pool.add([1, 2, 3])  # key 1 becomes the most recent key
    pool.add([5, 5, 5])  # evicts key 8, the least recent
    assert pool.candidates(8, 2) == [] and pool.candidates(5, 2) == [(5, 5)] and len(pool) == 3
    assert [1, 2, 3] in pool and [1, 4, 5] not in pool
    with pytest.raises(ValueError):
        pool.add([4])


def test_ngram_pool_harvests_a_token_list():
    pool = NgramPool(per_key=3)
    pool.add_all([1, 2, 3, 1, 2, 4], 3)
    assert pool.candidates(1, 3) == [(2, 4), (2, 3)] and pool.candidates(2, 3) == [(3, 1)] and len(pool) == 4
    pool.add_all([1, 2, 3, 1, 2, 4, 9], 3, start=4)  # only n-grams beginning at index 4 or later are new
    assert pool.candidates(2, 3) == [(4, 9), (3, 1)] and len(pool) == 5


def test_ngram_tree_shares_prefixes_parent_first():
    tokens, parents = merge_prefix_tree([[5, 6, 7], [5, 6, 8], [9, 6, 7], [5, 1, 2]], budget=100)
    assert tokens == [5, 6, 7, 8, 9, 6, 7, 1, 2]
    assert parents == [-1, 0, 1, 1, -1, 4, 5, 0, 7]
    assert merge_prefix_tree([], budget=100) == ([], [])


def test_window_mask_follows_the_paper():
    # W=3, N=4: level 0 = columns 1, 2 (the root is column 0); levels 1 and 2 = columns 0..2.
    # extras: 0:(0,1) 1:(0,2) 2:(1,0) 3:(1,1) 4:(1,2) 5:(2,0) 6:(2,1) 7:(2,2); mask column 0 is the root.
    assert window_offsets(3, 4) == [1, 2, 1, 2, 3, 2, 3, 4]
    rows = {  # visible extras of each extra (besides the root)
        0: [0], 1: [0, 1],  # level 0 is causal along its row
        2: [2], 3: [0, 3], 4: [0, 1, 4],  # level 1: level 0 before its column, then itself
        5: [2, 5], 6: [0, 3, 6], 7: [0, 1, 4, 7],  # level 2: also level 1 of its own column
    }
    expected = torch.zeros(8, 9, dtype=torch.bool)
    expected[:, 0] = True
    for row, visible in rows.items():
        expected[row, [1 + v for v in visible]] = True
    assert torch.equal(window_mask(3, 4), expected)


@pytest.mark.parametrize("width,depth", [(1, 3), (3, 3), (5, 4), (4, 6)])
def test_each_window_token_sees_a_contiguous_guess(width, depth):
    """Every window token sees the root and exactly one token at each position before its own."""
    mask, offsets = window_mask(width, depth), window_offsets(width, depth)
    assert mask.shape == (len(offsets), 1 + len(offsets)) == ((width - 1) + (depth - 2) * width, len(offsets) + 1)
    for row, offset in enumerate(offsets):
        seen = sorted([0] + [offsets[i] for i in range(len(offsets)) if mask[row, 1 + i]])
        assert seen == list(range(offset + 1))


def test_lookahead_proposal_layout():
    drafter = get_method("lookahead").create({"W": 3, "N": 4, "G": 2})
    assert isinstance(drafter, LookaheadDrafter)
    state = DecodeState(tokens=[4, 1, 2, 3, 4, 1, 5, 6, 4], prompt_len=9, sampling=SamplingConfig(),
                        rng=torch.Generator(), max_draft=8)
    drafter.begin(state)
    proposal = drafter.propose(state)
    assert proposal.tokens == [1, 5, 6, 2, 3] and proposal.parents == [-1, 0, 1, 0, 3]  # (1,5,6) and (1,2,3)
    extras = len(proposal.extra_tokens)
    assert extras == len(proposal.extra_positions) == 8
    assert proposal.extra_mask.shape == (extras, 1 + 5 + extras)
    assert not proposal.extra_mask[:, 1:6].any()  # never the draft nodes
    assert torch.equal(proposal.extra_mask[:, [0] + list(range(6, 6 + extras))], window_mask(3, 4))
    assert proposal.extra_positions == [8 + o for o in window_offsets(3, 4)]  # the root sits at position 8
    state.supports_tree = False
    chain = drafter.propose(state)
    assert chain.parents is None and chain.tokens == [1, 5, 6]


@pytest.mark.parametrize("method,options", [
    ("jacobi", {"window": 0}), ("jacobi", {"init": "zeros"}), ("jacobi", {"variant": "seidel"}),
    ("lookahead", {"N": 2}), ("lookahead", {"W": 0}), ("lookahead", {"G": -1})])
def test_bad_options_are_refused(method, options):
    with pytest.raises(ParadecodeError):
        get_method(method).create(options)
