"""The ``pool`` sampler: it commits a confident block at once, fills an interchangeable pool in two forward
passes (probe, then test and fill), backs off when committing one position changes the others in another way
(positions that must agree, or that ignore each other), leaves near-tie counts for later, and is reproducible."""

import pytest
import torch

from paradecode.dllm.decode import DecodeConfig, diffuse
from paradecode.dllm.model import ModelConfig, TinyLM
from paradecode.dllm.samplers import build_sampler
from paradecode.dllm.samplers.pool import fill_by_counts, sure_counts
from paradecode.errors import ParadecodeError

MASK, EOT, VOCAB, PROMPT = 0, 1, 8, [2, 2, 2]


class ReactiveDLM:
    """A stand-in diffusion model whose distribution at each open canvas position is ``rule(committed)``, a
    function of the tokens committed so far (``committed``: canvas offset -> token)."""

    mask_id, eot_id, max_length, supports_cache = MASK, EOT, 64, False

    def __init__(self, gen_length, rule):
        self.gen_length, self.rule = gen_length, rule

    def __call__(self, x, index=None, cache=None):  # x [1, S] -> logits [1, S, V]
        canvas = x[0, len(PROMPT):].tolist()
        committed = {i: t for i, t in enumerate(canvas) if t != MASK}
        probs = torch.full((x.shape[1], VOCAB), 1e-6)
        probs[len(PROMPT):] = torch.as_tensor(self.rule(committed), dtype=torch.float32) + 1e-6
        return (probs / probs.sum(-1, keepdim=True)).log()[None]

    def decode(self, ids):
        return " ".join(map(str, ids))


def multiset(items):
    """Any arrangement of ``items`` is right: each open position predicts the remaining counts."""
    def rule(committed):
        left = torch.zeros(VOCAB)
        for t in items:
            left[t] += 1
        for t in committed.values():
            left[t] -= 1
        return left.clamp_min(0) / left.sum().clamp_min(1)
    return rule


def two_agreeing_pairs(committed):
    """Positions 0 and 1 must hold the same token, and so must 2 and 3; each pair is 3 or 4, evenly. Before
    any commit the four marginals are alike, but the positions are not interchangeable."""
    dist = torch.zeros(4, VOCAB)
    for pair in ((0, 1), (2, 3)):
        held = [committed[i] for i in pair if i in committed]
        for i in pair:
            if held:
                dist[i, held[0]] = 0.99
            else:
                dist[i, 3] = dist[i, 4] = 0.5
    return dist


def run(model, **options):
    return diffuse(model, PROMPT, build_sampler("pool", options), DecodeConfig(seed=0))


def test_fills_an_interchangeable_pool_in_two_forward_passes():
    items = [3, 3, 4, 5, 6, 7]
    result = run(ReactiveDLM(6, multiset(items)))
    assert sorted(result.canvas) == items
    assert result.stats.forward_passes == 2
    assert [len(s.positions) for s in result.stats.steps] == [1, 5]


def test_backs_off_to_one_per_step_when_committing_one_does_not_change_the_others():
    independent = ReactiveDLM(4, lambda committed: torch.tensor([0, 0, 0.5, 0.5, 0, 0, 0, 0]))
    result = run(independent)
    assert result.stats.forward_passes == 4
    assert all(len(s.positions) == 1 for s in result.stats.steps)


def test_backs_off_when_positions_must_agree():
    result = run(ReactiveDLM(4, two_agreeing_pairs))
    canvas = result.canvas
    assert canvas[0] == canvas[1] and canvas[2] == canvas[3]  # filling after the probe would split a pair
    assert [len(s.positions) for s in result.stats.steps] == [1, 1, 1, 1]
    assert run(ReactiveDLM(4, two_agreeing_pairs), check=1.0).canvas[2:] in ([3, 4], [4, 3])  # without the test


def test_commits_the_whole_block_when_every_position_is_confident():
    confident = ReactiveDLM(5, lambda committed: torch.eye(VOCAB)[[2, 3, 4, 5, 6]] * 0.99)
    result = run(confident)
    assert result.stats.forward_passes == 1 and result.canvas == [2, 3, 4, 5, 6]


def test_near_tie_counts_are_left_for_later():
    # 3 positions, expected counts 1.66 / 0.62 / 0.6 (+ tails): one 3 is sure, the second 3 and 4-vs-5 are not
    assert sure_counts(torch.tensor([0.0, 0, 0, 1.66, 0.62, 0.6]), 3, margin=0.15).tolist() == [0, 0, 0, 1, 0, 0]
    assert sure_counts(torch.tensor([0.0, 0, 0, 1.9, 0.95, 0.15]), 3, margin=0.15).tolist() == [0, 0, 0, 2, 1, 0]
    probs = torch.tensor([[0.0, 0.6, 0.4], [0.0, 0.7, 0.3], [0.0, 0.04, 0.04]])
    assert fill_by_counts(probs, torch.tensor([0, 1, 2]), floor=0.05).tolist() == [2, 1, -1]


def test_seeded_sampling_reproduces_and_greedy_is_deterministic():
    torch.manual_seed(0)
    model = TinyLM(ModelConfig(gen_length=8)).eval()
    prompt = model.encode("shuffle : 1 2 3 4")
    sampler = build_sampler("pool", {"threshold": 0.5})
    runs = [diffuse(model, prompt, sampler, DecodeConfig(temperature=1.0, seed=7)).canvas for _ in range(2)]
    assert runs[0] == runs[1]
    greedy = [diffuse(model, prompt, sampler, DecodeConfig(seed=s)).canvas for s in (1, 2)]
    assert greedy[0] == greedy[1]


@pytest.mark.parametrize("options", [{"check": 1.5}, {"similar": -0.1}, {"nope": 1}, {"threshold": "x"}])
def test_bad_options_are_refused(options):
    with pytest.raises(ParadecodeError):
        build_sampler("pool", options)
