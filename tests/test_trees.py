"""Token trees: pld-tree and draft-tree stay lossless, tree masks score like chains, tree sampling is exact.

Greedy: both tree drafters reproduce autoregressive decoding token for token (budgets, branching, EOS inside
a draft, stop strings, the context limit) and fall back to chains on a backend that verifies chains only.
Masks: one tree pass gives every node the logits its branch gets as a chain, in the target's verify pass and
in the draft model's tree forwards (and a self-drafted full tree is accepted along its greedy path). Sampling:
recursive rejection
sampling over siblings reproduces the target distribution (chi-squared on a 6-token toy model), while a
broken verifier, and the right verifier fed the wrong q, fail the same test; draft-tree through the engine
reproduces a tiny model's two-token distribution.
"""

import functools
import random

import pytest
import torch
from scipy.stats import chisquare

from paradecode.backends.base import tree_depths
from paradecode.config import SamplingConfig
from paradecode.drafters.base import DecodeState, Proposal
from paradecode.drafters.pld_tree import merge_prefix_tree
from paradecode.engine import _score_and_verify
from paradecode.registry import get_method
from paradecode.verify import verify_speculative
from paradecode.verify.base import Verdict
from paradecode.verify.sampling import sample, uniform
from paradecode.verify.tree import verify_tree
from tiny import PROMPTS, ChainOnly, run, run_case, tiny_backend, two_token_joint


TREES = [
    ("pld-tree", {}),
    ("pld-tree", {"budget": 3, "candidates": 8, "min_ngram": 1, "max_ngram": 2}),
    ("pld-tree", {"budget": 24, "num_draft": 10, "occurrences": 6, "candidates": 8}),
    ("draft-tree", {}),
    ("draft-tree", {"budget": 5, "branching": 2, "width": 1}),
    ("draft-tree", {"budget": 20, "branching": 4, "width": 6, "depth": 4}),
    ("draft-tree-self", {"budget": 8, "branching": 2, "width": 2}),
]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("method,options", TREES)
def test_greedy_trees_equal_autoregressive(seed, method, options):
    backend = tiny_backend(seed, sharp=4.0)
    for prompt in PROMPTS:
        for max_new in (1, 7, 40):
            expected, _ = run(backend, "ar", prompt, max_new_tokens=max_new)
            got, stats = run_case(backend, method, prompt, options, model_seed=seed, max_new_tokens=max_new)
            assert got == expected, (method, options, seed, prompt, max_new)
            assert stats.new_tokens == max_new and stats.forward_passes == len(stats.steps) <= max_new


@pytest.mark.parametrize("method,options", TREES)
def test_trees_are_proposed_and_accepted(method, options):
    trees = accepted_trees = 0
    for seed in range(2):
        backend = tiny_backend(seed, sharp=4.0)
        for prompt in PROMPTS[:3]:
            _, stats = run_case(backend, method, prompt, options, model_seed=seed, max_new_tokens=40)
            tree_steps = [s for s in stats.steps if s.parents is not None]
            trees += len(tree_steps)
            accepted_trees += sum(1 for s in tree_steps if s.accepted)
            budget = options.get("budget", get_method(method.replace("-self", "")).Options.budget)
            assert all(len(s.drafted) <= budget for s in stats.steps)
    assert trees > 0 and accepted_trees > 0  # branching paths are really drafted and verified


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("method,options", TREES[:2] + TREES[3:5])
def test_eos_inside_a_tree_stops_like_autoregressive(seed, method, options):
    backend = tiny_backend(seed, sharp=4.0)
    for prompt in PROMPTS[:3]:
        reference, _ = run(backend, "ar", prompt, max_new_tokens=30)
        for eos_at in (0, 3, 11):
            eos = reference[eos_at]
            expected, _ = run(backend, "ar", prompt, max_new_tokens=30, eos_ids=[eos])
            got, stats = run_case(backend, method, prompt, options, model_seed=seed, max_new_tokens=30, eos_ids=[eos])
            assert got == expected and stats.stop_reason == "eos"


@pytest.mark.parametrize("method,options", TREES[:1] + TREES[3:4] + TREES[6:])
def test_stop_strings_and_context_limit_like_autoregressive(method, options):
    from paradecode.backends.llama import LlamaBackend
    from tiny import tiny_llama

    for seed in range(3):
        backend = tiny_backend(seed, sharp=4.0)
        reference, _ = run(backend, "ar", PROMPTS[2], max_new_tokens=30)
        for at in (2, 9):
            stop = f"t{reference[at]} t{reference[at + 1]} "
            expected, _ = run(backend, "ar", PROMPTS[2], max_new_tokens=30, stop=[stop])
            got, stats = run_case(backend, method, PROMPTS[2], options, model_seed=seed, max_new_tokens=30, stop=[stop])
            assert got == expected and stats.stop_reason == "stop"
        short = LlamaBackend.from_hf(tiny_llama(seed, sharp=4.0), max_length=37)
        expected, _ = run(short, "ar", PROMPTS[1], max_new_tokens=100)
        got, stats = run_case(short, method, PROMPTS[1], options, model_seed=seed, max_new_tokens=100)
        assert got == expected and stats.stop_reason == "context"


@pytest.mark.parametrize("method,options", [TREES[0], TREES[3], ("draft-tree-chain-draft", {})])
def test_chain_fallback_when_a_backend_verifies_chains_only(method, options):
    for seed in range(2):
        target = tiny_backend(seed, sharp=4.0)
        for prompt in PROMPTS[:3]:
            expected, _ = run(target, "ar", prompt, max_new_tokens=40)
            if method == "draft-tree-chain-draft":  # the target verifies trees, the draft model runs chains
                got, stats = run(target, "draft-tree", prompt, max_new_tokens=40,
                                 draft_backend=ChainOnly(tiny_backend(99, sharp=4.0)))
            else:
                got, stats = run_case(ChainOnly(target), method, prompt, options, max_new_tokens=40)
            assert got == expected
            assert all(s.parents is None for s in stats.steps) and stats.drafted_tokens > 0


def test_self_draft_tree_accepts_its_whole_greedy_path():
    """A full binary tree of depth 3 drafted by the target itself holds the greedy path: every step accepts 3."""
    backend = tiny_backend(3, sharp=4.0)
    _, stats = run(backend, "draft-tree", PROMPTS[0], max_new_tokens=40, draft_backend=tiny_backend(3, sharp=4.0),
                   budget=14, branching=2, width=8, depth=3)
    assert [len(s.drafted) for s in stats.steps[:-1]] == [14] * (len(stats.steps) - 1)
    assert [s.committed for s in stats.steps] == [4] * 10


class _Recording:
    """A draft backend that keeps the logits of its tree-masked forward passes, in cache-slot order."""

    def __init__(self, inner) -> None:
        self.inner, self.tree_rows = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def forward(self, token_ids, positions=None, mask=None, **kwargs):
        out = self.inner.forward(token_ids, positions, mask, **kwargs)
        if mask is not None:
            self.tree_rows.append(out.logits)
        return out


def test_draft_tree_forwards_give_each_node_its_branch_logits():
    """The draft model opens tree nodes level by level with tree masks; each node's logits must be those of
    its own branch run as a plain sequence."""
    from types import SimpleNamespace

    prompt = [4, 8, 15, 16, 23, 42]
    draft = _Recording(tiny_backend(6))
    drafter = get_method("draft-tree").create({"draft_model": "tiny", "budget": 20, "branching": 3, "width": 4},
                                              SimpleNamespace(load_draft_backend=lambda name: draft))
    state = DecodeState(tokens=list(prompt), prompt_len=len(prompt), sampling=SamplingConfig(),
                        rng=torch.Generator(), max_draft=8, target=tiny_backend(5))
    drafter.begin(state)
    proposal = drafter.propose(state)
    rows = torch.cat(draft.tree_rows)  # [fed nodes, V], row k = the node in cache slot k
    assert proposal.parents is not None and len(drafter.slots) == rows.shape[0] >= 8
    assert max(tree_depths(proposal.parents)) >= 3
    plain = tiny_backend(6)
    for node, slot in drafter.slots.items():
        path = []
        while node >= 0:
            path.insert(0, proposal.tokens[node])
            node = proposal.parents[node]
        plain.reset()
        torch.testing.assert_close(rows[slot], plain.forward(torch.tensor(prompt + path)).logits[-1],
                                   atol=1e-5, rtol=1e-5)


def test_tree_pass_scores_each_node_like_its_branch_as_a_chain():
    backend = tiny_backend(5, sharp=4.0)
    prompt = [4, 8, 15, 16, 23, 42]
    chains = [[1, 2, 3, 4], [1, 2, 9], [1, 7], [5, 6, 7], [5, 6, 8, 9, 10]]
    tokens, parents = merge_prefix_tree(chains, budget=100)
    assert len(tokens) == 12

    def score(proposal: Proposal) -> torch.Tensor:  # [1+N, V] through the engine's own path
        backend.reset()
        backend.forward(torch.tensor(prompt[:-1]))
        state = DecodeState(tokens=list(prompt), prompt_len=len(prompt), sampling=SamplingConfig(),
                            rng=torch.Generator(), max_draft=10, target=backend)
        return _score_and_verify(backend, proposal, state).target_logits

    tree_logits = score(Proposal(tokens=tokens, parents=parents))
    for chain in chains:
        chain_logits = score(Proposal(tokens=chain))
        nodes, node = [], -1
        for token in chain:
            node = next(i for i in range(len(tokens)) if parents[i] == node and tokens[i] == token)
            nodes.append(node)
        rows = [0] + [1 + n for n in nodes]
        torch.testing.assert_close(tree_logits[rows], chain_logits, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(tree_logits[1], tree_logits[2])  # nodes differ: the comparison is not vacuous


# -- sampling: recursive rejection sampling over siblings ---------------------------------------------------

V = 6
DRAWS = 10000


def _bigram(seed: int, sharp: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(V + 1, V, generator=g) * sharp, dim=-1)  # row V: the start state


P = _bigram(0, 1.0)  # target p(next | prev)
Q = _bigram(1, 3.0)  # draft q: sharper than p and different, so siblings are often rejected


@functools.lru_cache(maxsize=None)
def _q_without(row: int, drawn: tuple[int, ...]) -> torch.Tensor:
    """[V] q of bigram row ``row`` with the tokens already drawn removed, renormalised."""
    left = Q[row].clone()
    left[list(drawn)] = 0.0
    return left / left.sum()


def _children(row: int, k: int, replace: bool, draws: random.Random, report_plain_q: bool = False):
    """k sibling tokens drawn from Q[row] (with or without replacement) and the q_j each is verified against."""
    tokens, rows = [], []
    for _ in range(k):
        q_j = Q[row] if replace else _q_without(row, tuple(tokens))
        tokens.append(draws.choices(range(V), weights=q_j.tolist())[0])
        rows.append(Q[row] if report_plain_q else q_j)
    return tokens, rows


def _draw_two(verifier, rng, draws, replace: bool, report_plain_q: bool = False, k: int = 3, m: int = 2):
    """First two tokens from one tree step: k children of the root, m children under each; completed by
    plain sampling from P when the step emitted one token."""
    tokens, parents, q_rows = [], [], []
    first, rows = _children(V, k, replace, draws, report_plain_q)
    tokens += first
    parents += [-1] * k
    q_rows += rows
    for parent in range(k):
        second, rows = _children(tokens[parent], m, replace, draws, report_plain_q)
        tokens += second
        parents += [parent] * m
        q_rows += rows
    target = P[[V] + tokens]  # [1+N, V] bigram: p after a node depends on its token only
    verdict = verifier(tokens, parents, torch.stack(q_rows), target, rng)
    out = verdict.accepted_tokens + [verdict.next_token]
    if len(out) < 2:
        out.append(sample(P[out[0]], rng))
    return out[0], out[1]


def _pvalue(verifier, replace: bool, report_plain_q: bool = False) -> float:
    rng, draws = torch.Generator().manual_seed(2024), random.Random(2024)
    counts = torch.zeros(V, V)
    for _ in range(DRAWS):
        a, b = _draw_two(verifier, rng, draws, replace, report_plain_q)
        counts[a, b] += 1
    expected = (P[V][:, None] * P[:V]) * DRAWS  # [V, V] p(a) p(b | a)
    keep = expected.flatten() >= 5
    obs, exp = counts.flatten()[keep], expected.flatten()[keep]
    return float(chisquare(obs.numpy(), (exp * obs.sum() / exp.sum()).numpy()).pvalue)


def _no_residual_update(tokens, parents, q, p, rng):
    """Broken: tries every sibling against the original p (no p <- normalize(max(0, p - q)) in between)."""
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(parents):
        children.setdefault(parent, []).append(i)
    accepted, node = [], -1
    while True:
        siblings = children.get(node, [])
        for child in siblings:
            if uniform(rng) * float(q[child][tokens[child]]) < float(p[node + 1][tokens[child]]):
                accepted.append(child)
                node = child
                break
        else:
            residual = torch.clamp(p[node + 1] - q[siblings[-1]], min=0) if siblings else p[node + 1]
            return Verdict(accepted, [tokens[i] for i in accepted], sample(residual / residual.sum(), rng), False)


def test_tree_sampling_with_independent_siblings_preserves_target_distribution():
    assert _pvalue(verify_tree, replace=True) > 1e-3


def test_tree_sampling_without_replacement_preserves_target_distribution():
    assert _pvalue(verify_speculative, replace=False) > 1e-3  # dispatched to verify_tree for trees with q


def test_tree_sampling_without_replacement_needs_the_renormalised_q():
    assert _pvalue(verify_tree, replace=False, report_plain_q=True) < 1e-3


def test_broken_tree_verifier_is_detected():
    assert _pvalue(_no_residual_update, replace=True) < 1e-3


def test_draft_tree_sampling_through_the_engine_matches_the_model():
    """The first two of three tokens sampled with draft-tree (trees of depth <= 2, branching 3) follow the
    target's joint law."""
    from paradecode.config import GenerationConfig
    from paradecode.engine import decode
    from types import SimpleNamespace

    vocab, prompt, runs = 8, [1, 2, 3], 2000
    target, draft = tiny_backend(7, vocab=vocab, layers=1), tiny_backend(8, vocab=vocab, layers=1, sharp=0.5)
    joint = two_token_joint(target, prompt, vocab)  # [V, V]
    context = SimpleNamespace(load_draft_backend=lambda name: draft)
    drafter = get_method("draft-tree").create({"draft_model": "tiny", "budget": 6, "branching": 3, "width": 3},
                                              context)
    counts = torch.zeros(vocab, vocab)
    tree_steps = 0
    from paradecode.stats import DecodeStats

    for seed in range(runs):
        config = GenerationConfig(max_new_tokens=3, sampling=SamplingConfig(temperature=1.0, seed=seed))
        stats = DecodeStats()
        out = [t for step in decode(target, drafter, prompt, config, stats=stats) for t in step]
        counts[out[0], out[1]] += 1
        tree_steps += sum(s.parents is not None for s in stats.steps)
    assert tree_steps >= runs
    expected = joint.flatten() * runs
    keep = expected >= 5
    obs, exp = counts.flatten()[keep], expected[keep]
    assert chisquare(obs.numpy(), (exp * obs.sum() / exp.sum()).numpy()).pvalue > 1e-3
