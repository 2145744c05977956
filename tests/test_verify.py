"""Verification is exact: greedy walks match argmax; speculative sampling reproduces the target distribution.

The distribution tests draw two-token sequences from a toy bigram "model" (p depends on the previous token)
and compare the joint distribution of what the verifier emits with the model's own, by a chi-squared test.
A deliberately broken verifier must fail the same test, so the test can fail.
"""

import pytest
import torch
from scipy.stats import chisquare

from paradecode.config import SamplingConfig
from paradecode.verify import verify_greedy, verify_speculative
from paradecode.verify.base import Verdict
from paradecode.verify.sampling import probabilities, sample

V = 6  # vocabulary of the toy model
DRAWS = 12000


def _bigram(seed: int, sharp: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(V + 1, V, generator=g) * sharp, dim=-1)  # row V: start state


P = _bigram(0, 1.5)  # target: P[prev] is p(next | prev); P[V] is the first-token distribution
Q = _bigram(1, 1.0)  # draft model, deliberately different


def _draw_two(verifier, rng: torch.Generator, with_q: bool, k: int = 2) -> tuple[int, int]:
    """Two tokens by one speculative step (k drafts), finished autoregressively if the step gave one."""
    drafts, q_rows, prev = [], [], V
    for _ in range(k):
        q = Q[prev] if with_q else torch.nn.functional.one_hot(torch.tensor(int(torch.randint(V, (), generator=rng))), V).float()
        token = sample(q, rng)
        drafts.append(token)
        q_rows.append(q)
        prev = token
    target = torch.stack([P[V]] + [P[t] for t in drafts])  # [1+k, V]
    verdict = verifier(drafts, None, torch.stack(q_rows) if with_q else None, target, rng)
    out = verdict.accepted_tokens + [verdict.next_token]
    if len(out) < 2:
        out.append(sample(P[out[0]], rng))
    return out[0], out[1]


def _joint_pvalue(verifier, with_q: bool) -> float:
    rng = torch.Generator().manual_seed(1234)
    counts = torch.zeros(V, V)
    for _ in range(DRAWS):
        a, b = _draw_two(verifier, rng, with_q)
        counts[a, b] += 1
    expected = (P[V][:, None] * P[:V]) * DRAWS  # [V, V] p(a) p(b | a)
    keep = expected.flatten() >= 5  # chi-squared needs enough expected counts per cell
    obs, exp = counts.flatten()[keep], expected.flatten()[keep]
    exp = exp * obs.sum() / exp.sum()
    return float(chisquare(obs.numpy(), exp.numpy()).pvalue)


def _broken_residual(drafts, parents, q, p, rng):
    """Speculative sampling that resamples from p instead of max(0, p - q) after a rejection."""
    from paradecode.verify.sampling import uniform

    for i, token in enumerate(drafts):
        if uniform(rng) * float(q[i][token]) < float(p[i][token]):
            continue
        return Verdict(list(range(i)), list(drafts[:i]), sample(p[i], rng), bonus=False)
    return Verdict(list(range(len(drafts))), list(drafts), sample(p[len(drafts)], rng), bonus=True)


def _broken_always_accept(drafts, parents, q, p, rng):
    return Verdict(list(range(len(drafts))), list(drafts), sample(p[len(drafts)], rng), bonus=True)


def test_speculative_sampling_preserves_target_distribution():
    assert _joint_pvalue(verify_speculative, with_q=True) > 1e-3


def test_sampling_without_draft_probs_preserves_target_distribution():
    assert _joint_pvalue(verify_speculative, with_q=False) > 1e-3


@pytest.mark.parametrize("broken", [_broken_residual, _broken_always_accept])
def test_broken_verifier_is_detected(broken):
    assert _joint_pvalue(broken, with_q=True) < 1e-3


def test_tree_sampling_without_draft_probs_preserves_first_token_distribution():
    rng = torch.Generator().manual_seed(7)
    tokens, parents = [0, 1, 2, 3], [-1, -1, 0, 0]  # two roots' children, two grandchildren under node 0
    target = torch.stack([P[V], P[0], P[1], P[2], P[3]])
    counts = torch.zeros(V)
    for _ in range(DRAWS):
        verdict = verify_speculative(tokens, parents, None, target, rng)
        first = (verdict.accepted_tokens + [verdict.next_token])[0]
        counts[first] += 1
    assert chisquare(counts.numpy(), (P[V] * DRAWS).numpy()).pvalue > 1e-3


def test_greedy_chain_accepts_longest_matching_prefix_plus_target_token():
    logits = torch.full((4, V), -1.0)
    for row, best in enumerate([2, 3, 5, 1]):
        logits[row, best] = 1.0
    verdict = verify_greedy([2, 3, 4], None, logits)
    assert verdict.accepted == [0, 1] and verdict.accepted_tokens == [2, 3]
    assert verdict.next_token == 5 and not verdict.bonus
    full = verify_greedy([2, 3, 5], None, logits)
    assert full.accepted_tokens == [2, 3, 5] and full.next_token == 1 and full.bonus
    assert verify_greedy([4], None, logits).accepted == []


def test_greedy_tree_follows_the_matching_branch():
    # root argmax 2; node 1 (token 2) argmax 4; node 3 (token 4, child of 1) argmax 0
    tokens, parents = [1, 2, 3, 4, 4], [-1, -1, 0, 1, 0]
    logits = torch.zeros(6, V)
    for row, best in enumerate([2, 0, 4, 0, 0, 0]):
        logits[row, best] = 1.0
    verdict = verify_greedy(tokens, parents, logits)
    assert verdict.accepted == [1, 3] and verdict.accepted_tokens == [2, 4]
    assert verdict.next_token == 0 and verdict.bonus


def test_processors_top_k_and_top_p():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    top_k = probabilities(logits, SamplingConfig(temperature=1.0, top_k=2))
    assert torch.allclose(top_k, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    top_p = probabilities(logits, SamplingConfig(temperature=1.0, top_p=0.8))
    assert torch.allclose(top_p, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    top_p_edge = probabilities(logits, SamplingConfig(temperature=1.0, top_p=0.81))
    assert top_p_edge[2] > 0 and top_p_edge[3] == 0
    cold = probabilities(logits, SamplingConfig(temperature=0.5))
    assert cold[0] > 0.5 and torch.isclose(cold.sum(), torch.tensor(1.0))
