"""Layer-skip self-speculation, adaptive n-gram drafting and draft-length schedules stay lossless.

Greedy outputs equal plain autoregressive decoding token for token (several exit layers, skip sets, draft
lengths and schedules; EOS inside a draft; stop strings; the context limit). A full-depth layer-skip draft
is the target itself, so it must be accepted in full. Under sampling, layer skip's first two tokens follow
the target's exact distribution (chi-squared on an 8-token vocabulary), and a broken verifier fails the
same test.
"""

import pytest
import torch
from scipy.stats import chisquare

import paradecode.engine
from paradecode.backends.llama import LlamaBackend
from paradecode.drafters.ngram import NgramTable
from paradecode.errors import ParadecodeError
from paradecode.verify.base import Verdict
from paradecode.verify.sampling import sample, uniform
from tiny import PROMPTS as TINY_PROMPTS, run, tiny_backend, tiny_llama, two_token_joint

LAYERS = 4
PROMPTS = TINY_PROMPTS[:4]  # all but the 25-token one
METHODS = [
    ("layerskip", {"exit_layer": 1, "schedule": "fixed"}),
    ("layerskip", {"exit_layer": 2, "num_draft": 6, "schedule": "fixed"}),
    ("layerskip", {"exit_layer": 3, "num_draft": 1, "schedule": "fixed"}),
    ("layerskip", {"skip": "1-2", "schedule": "fixed"}),
    ("layerskip", {"skip": "0,3", "schedule": "heuristic"}),
    ("layerskip", {}),  # the defaults: exit after 3 of 4 layers, cost schedule
    ("ngram", {}),
    ("ngram", {"max_ngram": 2, "schedule": "fixed", "num_draft": 12}),
    ("ngram", {"schedule": "heuristic", "min_accept": 0.2}),
    ("pld", {"schedule": "heuristic"}),
    ("pld", {"schedule": "cost", "num_draft": 2}),
    ("draft", {"schedule": "heuristic"}),
    ("draft", {"schedule": "cost"}),
]




def _target(seed: int) -> LlamaBackend:
    return tiny_backend(seed, sharp=4.0, layers=LAYERS)


_DRAFT_MODEL = []  # built once: making a transformers model is the slow part of a tiny run


def _run(backend, method, prompt, options, **kwargs):
    if method == "draft":
        if not _DRAFT_MODEL:
            _DRAFT_MODEL.append(tiny_backend(99, sharp=4.0))
        kwargs["draft_backend"] = _DRAFT_MODEL[0]
    return run(backend, method, prompt, **options, **kwargs)


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("method,options", METHODS)
def test_greedy_equals_autoregressive(seed, method, options):
    backend = _target(seed)
    for prompt in PROMPTS:
        for max_new in (1, 7, 40):
            expected, _ = run(backend, "ar", prompt, max_new_tokens=max_new)
            got, stats = _run(backend, method, prompt, options, max_new_tokens=max_new)
            assert got == expected, (method, options, seed, prompt, max_new)
            assert stats.new_tokens == max_new and stats.forward_passes == len(stats.steps) <= max_new


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("method,options", METHODS)
def test_eos_inside_a_draft_stops_like_autoregressive(seed, method, options):
    backend = _target(seed)
    for prompt in PROMPTS[:3]:
        reference, _ = run(backend, "ar", prompt, max_new_tokens=30)
        for eos_at in (0, 4, 13):
            expected, _ = run(backend, "ar", prompt, max_new_tokens=30, eos_ids=[reference[eos_at]])
            got, stats = _run(backend, method, prompt, options, max_new_tokens=30, eos_ids=[reference[eos_at]])
            assert got == expected and stats.stop_reason == "eos"


@pytest.mark.parametrize("method,options", METHODS)
def test_stop_strings_and_context_limit_like_autoregressive(method, options):
    backend = _target(1)
    reference, _ = run(backend, "ar", PROMPTS[2], max_new_tokens=30)
    for at in (2, 9):
        stop = f"t{reference[at]} t{reference[at + 1]} "
        expected, _ = run(backend, "ar", PROMPTS[2], max_new_tokens=30, stop=[stop])
        got, stats = _run(backend, method, PROMPTS[2], options, max_new_tokens=30, stop=[stop])
        assert got == expected and stats.stop_reason == "stop"
    small = LlamaBackend.from_hf(tiny_llama(4, sharp=4.0, layers=LAYERS), max_length=37)
    expected, _ = run(small, "ar", PROMPTS[1], max_new_tokens=100)
    got, stats = _run(small, method, PROMPTS[1], options, max_new_tokens=100)
    assert got == expected and stats.stop_reason == "context"


@pytest.mark.parametrize("seed", range(3))
def test_full_depth_draft_is_accepted_in_full(seed):
    backend = _target(seed)
    got, stats = run(backend, "layerskip", PROMPTS[0], max_new_tokens=40, num_draft=4, exit_layer=LAYERS,
                     schedule="fixed")
    assert got == run(backend, "ar", PROMPTS[0], max_new_tokens=40)[0]
    assert stats.accepted_tokens == stats.drafted_tokens == stats.draft_forward_passes == 32
    assert stats.forward_passes == 8 and stats.mean_accepted == 5.0  # 4 drafts + the bonus, every step


def test_default_exit_layer_is_deep_but_never_the_whole_model():
    from paradecode.drafters.layerskip import default_exit_layer

    assert [default_exit_layer(n) for n in (1, 2, 4, 30, 32)] == [1, 1, 3, 27, 29]


def test_shallow_drafts_are_cheaper_and_sometimes_rejected():
    backend = _target(0)
    _, shallow = run(backend, "layerskip", PROMPTS[2], max_new_tokens=40, exit_layer=1, schedule="fixed")
    _, skipping = run(backend, "layerskip", PROMPTS[2], max_new_tokens=40, skip="1-3", schedule="fixed")
    for stats in (shallow, skipping):
        assert 0 < stats.accepted_tokens < stats.drafted_tokens  # the draft really is a different model
    assert shallow.info["draft_layers"] == "first 1 of 4 layers"
    assert skipping.info["draft_layers"] == "1 of 4 layers (skipping 1-3)"


def test_backend_runs_a_subset_of_layers_and_skipped_slots_are_rewritten():
    backend = _target(2)
    ids = torch.tensor([3, 9, 4, 9, 3])
    full = backend.forward(ids).logits
    backend.reset()
    early = backend.forward(ids, exit_layer=2).logits
    backend.reset()
    assert torch.equal(backend.forward(ids, layers=[0, 1]).logits, early)
    backend.reset()
    assert torch.allclose(backend.forward(ids, layers=range(LAYERS)).logits, full, atol=1e-6)
    backend.reset()
    assert not torch.allclose(backend.forward(ids, layers=[0, 3]).logits, full, atol=1e-3)  # layers really skipped
    # Draft-like use: the committed prefix by the full model, then partial passes over speculative slots
    # (layers 1 and 2 keep stale or zero slots there), a rollback, and a full pass must match a fresh one.
    backend.reset()
    backend.forward(ids[:3])
    backend.forward(torch.tensor([7]), layers=[0, 3])
    backend.forward(torch.tensor([8]), layers=[0, 3])
    backend.rollback(3)
    assert torch.allclose(backend.forward(ids[3:]).logits, full[3:], atol=1e-5)
    with pytest.raises(ValueError):
        backend.forward(ids, layers=[2, 1])
    with pytest.raises(ValueError):
        backend.forward(ids, exit_layer=1, layers=[0])


def test_drafting_leaves_the_cache_at_the_committed_text():
    from paradecode.config import SamplingConfig
    from paradecode.drafters.base import DecodeState
    from paradecode.registry import get_method

    backend = _target(0)
    prompt = PROMPTS[2]
    backend.forward(torch.tensor(prompt[:-1]))
    state = DecodeState(tokens=list(prompt), prompt_len=len(prompt), sampling=SamplingConfig(),
                        rng=torch.Generator(), max_draft=10, target=backend)
    drafter = get_method("layerskip").create({"exit_layer": 2, "num_draft": 5, "schedule": "fixed"})
    drafter.begin(state)
    proposal = drafter.propose(state)
    assert len(proposal.tokens) == 5 and backend.cache_len == len(prompt) - 1


@pytest.mark.parametrize(
    "options,message",
    [
        ({"exit_layer": LAYERS + 1}, "has 4 layers"),
        ({"skip": "2-9"}, "names layer 9"),
        ({"skip": "0-3"}, "every layer"),
    ],
)
def test_layer_choices_the_model_cannot_take_are_clear_errors(options, message):
    with pytest.raises(ParadecodeError, match=message):
        run(_target(0), "layerskip", PROMPTS[0], **options)


@pytest.mark.parametrize("options", [{"skip": "4-x"}, {"skip": "5-2"}, {"exit_layer": 2, "skip": "1"}, {"exit_layer": -1}])
def test_bad_layerskip_options(options):
    from paradecode.registry import get_method

    with pytest.raises(ParadecodeError, match="layerskip"):
        get_method("layerskip").create(options)


# -- sampling ---------------------------------------------------------------------------------------------

VOCAB = 8
SAMPLE_PROMPT = [1, 5, 2]


def _pvalue(backend, expected: torch.Tensor, draws: int) -> float:
    """Chi-squared p-value of the first two tokens of ``draws`` seeded layer-skip runs against ``expected``."""
    counts = torch.zeros(VOCAB, VOCAB)
    for seed in range(draws):
        out, _ = run(backend, "layerskip", SAMPLE_PROMPT, max_new_tokens=3, temperature=1.0, seed=seed,
                     exit_layer=1, num_draft=2, schedule="fixed")
        counts[out[0], out[1]] += 1
    exp = expected.flatten() * draws
    keep = exp >= 5  # chi-squared needs enough expected counts per cell; the rest are pooled into one
    obs, exp = counts.flatten()[keep], exp[keep]
    if not keep.all():
        obs = torch.cat([obs, counts.flatten()[~keep].sum()[None]])
        exp = torch.cat([exp, (expected.flatten()[~keep].sum() * draws)[None]])
    return float(chisquare(obs.numpy(), (exp * obs.sum() / exp.sum()).numpy()).pvalue)


def _residual_from_p(drafts, parents, q, p, rng):
    """A broken speculative sampler: after a rejection it resamples from p, not from max(0, p - q)."""
    for i, token in enumerate(drafts):
        if uniform(rng) * float(q[i][token]) < float(p[i][token]):
            continue
        return Verdict(list(range(i)), list(drafts[:i]), sample(p[i], rng), bonus=False)
    return Verdict(list(range(len(drafts))), list(drafts), sample(p[len(drafts)], rng), bonus=True)


def test_layerskip_sampling_preserves_the_target_distribution(monkeypatch):
    backend = tiny_backend(2, vocab=VOCAB, sharp=10.0, layers=2)  # its 1-layer draft is far from p (TV ~0.3)
    expected = two_token_joint(backend, SAMPLE_PROMPT, VOCAB)
    assert _pvalue(backend, expected, draws=3000) > 1e-3
    monkeypatch.setattr(paradecode.engine, "verify_speculative", _residual_from_p)
    assert _pvalue(backend, expected, draws=1000) < 1e-3  # the test can fail (here p is ~1e-20)


def test_seeded_sampling_is_reproducible():
    backend = _target(2)
    for method, options in (("layerskip", {"exit_layer": 2, "schedule": "heuristic"}), ("ngram", {})):
        first, _ = run(backend, method, PROMPTS[0], temperature=0.8, seed=11, max_new_tokens=30, **options)
        again, _ = run(backend, method, PROMPTS[0], temperature=0.8, seed=11, max_new_tokens=30, **options)
        assert first == again


# -- n-gram table -----------------------------------------------------------------------------------------

def test_ngram_table_predicts_the_most_frequent_successor_at_every_level():
    table = NgramTable(1, 3)
    tokens = [5, 1, 2, 5, 1, 3, 5, 1, 3, 9, 1, 2]
    table.update(tokens)
    # after (5, 1): 3 twice, 2 once; after (1,): 2 and 3 twice each, the latest (2) wins the tie
    assert table.predict([5, 1]) == [(3, (2, 2, True)), (2, (1, 2, False))]
    assert table.predict([9, 1]) == [(2, (2, 1, True)), (2, (1, 2, False))]  # (9, 1) was followed by 2 once
    assert table.predict([7, 4, 1]) == [(2, (1, 2, False))]  # only the 1-gram is known
    assert table.predict([8]) == []
    grown = NgramTable(1, 3)  # the same counts when the text arrives a few tokens at a time, as while decoding
    for end in (2, 3, 7, len(tokens)):
        grown.update(tokens[:end])
    assert all(grown.predict(context) == table.predict(context) for context in ([5, 1], [9, 1], [1, 3], [2]))


def _first_proposal(method: str, tokens: list[int], **options) -> list[int]:
    from paradecode.config import SamplingConfig
    from paradecode.drafters.base import DecodeState
    from paradecode.registry import get_method

    state = DecodeState(tokens=list(tokens), prompt_len=len(tokens), sampling=SamplingConfig(),
                        rng=torch.Generator(), max_draft=8)
    drafter = get_method(method).create(options)
    drafter.begin(state)
    return drafter.propose(state).tokens


def test_ngram_drafts_beyond_a_single_copied_span():
    # "c d" was followed by "e f" twice and by "x" once, most recently: pld copies the latest occurrence,
    # ngram follows the most frequent successor
    tokens = [12, 13, 14, 15, 12, 13, 14, 15, 30, 10, 11, 12, 13, 20, 10, 11]  # c d e f c d e f _ a b c d x a b
    assert _first_proposal("ngram", tokens, max_ngram=2, min_accept=0.0, num_draft=4) == [12, 13, 14, 15]
    assert _first_proposal("pld", tokens, max_ngram=2, num_draft=4) == [12, 13, 20, 10]
    # a copied span that runs into the end of the text: pld stops there, ngram keeps going
    tokens = [5, 6, 7, 8, 1, 2, 3, 1, 2]
    assert _first_proposal("pld", tokens, max_ngram=2, num_draft=6) == [3, 1, 2]
    assert _first_proposal("ngram", tokens, max_ngram=2, min_accept=0.0, num_draft=6) == [3, 1, 2, 3, 1, 2]


def test_ngram_learns_to_stop_drafting_what_is_rejected():
    backend = _target(1)
    prompt = [3, 9, 4, 9, 3, 9, 4, 9, 3, 9, 4, 9, 3]
    _, trusting = run(backend, "ngram", prompt, max_new_tokens=40, schedule="fixed", min_accept=0.0)
    _, learning = run(backend, "ngram", prompt, max_new_tokens=40, schedule="fixed", min_accept=0.3)
    assert learning.drafted_tokens < trusting.drafted_tokens
    assert learning.acceptance_rate >= trusting.acceptance_rate


def test_ngram_drafts_repeated_output():
    _, stats = run(_target(1), "ngram", PROMPTS[1], max_new_tokens=60, schedule="fixed")
    assert stats.accepted_tokens > 0 and stats.mean_accepted > 1.0


# -- schedules keep the fixed behaviour ---------------------------------------------------------------------

def test_fixed_schedule_drafts_exactly_what_pld_and_draft_always_drafted():
    from paradecode.drafters.pld import NgramIndex

    backend = _target(1)
    prompt = PROMPTS[2]
    _, stats = run(backend, "pld", prompt, max_new_tokens=40, schedule="fixed", num_draft=5)
    tokens, index = list(prompt), NgramIndex(1, 3)
    for step in stats.steps:
        budget = min(5, 40 - (len(tokens) - len(prompt)) - 1)
        assert step.drafted == (index.continuation(tokens, budget) if budget > 0 else [])
        tokens += step.drafted[: len(step.accepted)] + [step.next_token]
    _, stats = _run(backend, "draft", prompt, {"schedule": "fixed", "num_draft": 3}, max_new_tokens=40)
    done = 0
    for step in stats.steps:
        assert len(step.drafted) == min(3, 40 - done - 1)
        done += step.committed


def test_transformers_backend_is_refused_clearly():
    from paradecode.backends.hf import HFBackend

    with pytest.raises(ParadecodeError, match="subset of the model's layers"):
        run(HFBackend(tiny_llama(0, sharp=4.0, layers=LAYERS)), "layerskip", PROMPTS[0], max_new_tokens=5)
