"""Lossless: every method's greedy output equals plain autoregressive decoding, token for token.

Tiny random Llamas with small vocabularies make repeats (so n-gram drafts get accepted and rejected), EOS
inside drafts and stop strings easy to hit. A draft model that is the target itself accepts everything; an
unrelated random draft model rejects nearly everything: both paths are exercised.
"""

import pytest

from tiny import PROMPTS, run, run_case, tiny_backend

LOSSLESS = [("pld", {}), ("pld", {"num_draft": 2, "max_ngram": 1}), ("pld", {"num_draft": 10, "max_ngram": 5}),
            ("draft", {"num_draft": 3}), ("draft-self", {"num_draft": 5})]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("method,options", LOSSLESS)
def test_greedy_equals_autoregressive(seed, method, options):
    backend = tiny_backend(seed, sharp=4.0)
    for prompt in PROMPTS:
        for max_new in (1, 7, 40):
            expected, _ = run(backend, "ar", prompt, max_new_tokens=max_new)
            got, stats = run_case(backend, method, prompt, options, max_new_tokens=max_new, model_seed=seed)
            assert got == expected, (method, options, seed, prompt, max_new)
            assert stats.new_tokens == len(got) == max_new  # no EOS configured: the budget is used exactly
            assert stats.forward_passes == len(stats.steps) <= max_new


def test_self_draft_accepts_everything():
    backend = tiny_backend(3, sharp=4.0)
    got, stats = run(backend, "draft", PROMPTS[0], max_new_tokens=40, draft_backend=tiny_backend(3, sharp=4.0),
                     num_draft=4)
    assert stats.accepted_tokens == stats.drafted_tokens > 0
    assert stats.forward_passes == 8  # 40 tokens, 5 per step (4 drafts + bonus)
    assert stats.mean_accepted == 5.0


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("method,options", LOSSLESS)
def test_eos_inside_a_draft_stops_like_autoregressive(seed, method, options):
    backend = tiny_backend(seed, sharp=4.0)
    for prompt in PROMPTS[:3]:
        reference, _ = run(backend, "ar", prompt, max_new_tokens=30)
        for eos_at in (0, 3, 11):  # make the token AR emits at this position the EOS token
            eos = reference[eos_at]
            expected, ar_stats = run(backend, "ar", prompt, max_new_tokens=30, eos_ids=[eos])
            assert expected[-1] == eos and eos not in expected[:-1] and ar_stats.stop_reason == "eos"
            got, stats = run_case(backend, method, prompt, options, max_new_tokens=30, eos_ids=[eos], model_seed=seed)
            assert got == expected and stats.stop_reason == "eos"


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("method,options", LOSSLESS)
def test_stop_strings_cut_drafts_like_autoregressive(seed, method, options):
    backend = tiny_backend(seed, sharp=4.0)
    prompt = PROMPTS[2]
    reference, _ = run(backend, "ar", prompt, max_new_tokens=30)
    for at in (2, 9):
        stop = f"t{reference[at]} t{reference[at + 1]} "  # a stop string spanning two tokens
        expected, ar_stats = run(backend, "ar", prompt, max_new_tokens=30, stop=[stop])
        assert ar_stats.stop_reason == "stop" and stop in "".join(f"t{t} " for t in expected)
        got, stats = run_case(backend, method, prompt, options, max_new_tokens=30, stop=[stop], model_seed=seed)
        assert got == expected and stats.stop_reason == "stop"


def test_pld_drafts_from_repeated_text():
    backend = tiny_backend(1, sharp=4.0)
    _, stats = run(backend, "pld", PROMPTS[1], max_new_tokens=60)
    assert stats.drafted_tokens > 0 and stats.accepted_tokens > 0
    assert stats.mean_accepted > 1.0


def test_seeded_sampling_is_reproducible():
    backend = tiny_backend(2)
    for method, extra in (("ar", {}), ("pld", {}), ("draft", {"draft_backend": tiny_backend(5)})):
        first, _ = run(backend, method, PROMPTS[0], temperature=0.8, seed=11, max_new_tokens=30, **extra)
        again, _ = run(backend, method, PROMPTS[0], temperature=0.8, seed=11, max_new_tokens=30, **extra)
        other, _ = run(backend, method, PROMPTS[0], temperature=0.8, seed=12, max_new_tokens=30, **extra)
        assert first == again and first != other


@pytest.mark.parametrize("method,options", LOSSLESS)
def test_context_limit_stops_like_autoregressive(method, options):
    from paradecode.backends.llama import LlamaBackend
    from tiny import tiny_llama

    backend = LlamaBackend.from_hf(tiny_llama(4, sharp=4.0), max_length=37)
    expected, ar_stats = run(backend, "ar", PROMPTS[1], max_new_tokens=100)
    assert ar_stats.stop_reason == "context" and len(PROMPTS[1]) + len(expected) == 37
    got, stats = run_case(backend, method, PROMPTS[1], options, max_new_tokens=100, model_seed=4)
    assert got == expected and stats.stop_reason == "context"
