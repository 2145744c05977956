"""The registries and the method resolver: one answer to "is this method known, does it take these options,
does it need a draft model, does it sample exactly", and the cost curve measured only for a drafter that asks."""

import pytest

import paradecode
from paradecode.drafters.base import Drafter, Proposal
from paradecode.errors import ParadecodeError
from paradecode.registry import METHODS, Registry, resolve_method
from tiny import tiny_model_dir


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return paradecode.load(str(tiny_model_dir(tmp_path_factory.mktemp("tiny"))))


def test_a_registry_names_its_entries_and_refuses_unknown_and_twice_registered_names():
    registry = Registry("widget", name_attribute="name")

    @registry.register("a")
    class A:
        Options = None

    assert A.name == "a" and registry.names() == ["a"] and registry.lookup("a") is A and "a" in registry
    with pytest.raises(ParadecodeError, match="unknown widget 'b'; choose one of: a"):
        registry.lookup("b")
    with pytest.raises(ValueError, match="registered twice"):
        registry.register("a")(type("B", (), {}))


@pytest.mark.parametrize("name,options,draft_model,message", [
    ("warp", {}, None, "unknown method 'warp'"),
    ("pld", {"depth": 3}, None, "no option depth"),
    ("pld", {"num_draft": "many"}, None, "must be an integer"),
    ("pld", {"num_draft": 0}, None, "num_draft must be >= 1"),
    ("draft", {}, None, "needs a draft model"),
    ("pld", {"draft_model": "x"}, None, "no option draft_model"),
])
def test_the_resolver_refuses_what_a_method_does_not_take(name, options, draft_model, message):
    with pytest.raises(ParadecodeError, match=message):
        resolve_method(name, options, draft_model)


def test_the_resolver_gives_the_draft_model_to_methods_that_take_one_only():
    draft = resolve_method("draft", {}, "some-model")
    assert draft.takes_draft_model and draft.options == {"draft_model": "some-model"}
    assert draft.settings.draft_model == "some-model"
    pld = resolve_method("pld", {"num_draft": 4}, "some-model")
    assert not pld.takes_draft_model and pld.options == {"num_draft": 4} and pld.settings.num_draft == 4
    assert all(resolve_method(name, {}, "m").samples_exactly for name in METHODS.names())


class _Lossy(Drafter):
    """A method that could not sample exactly (none of the built-in ones is such)."""

    lossless_sampling = False

    def propose(self, state):
        return Proposal()


def test_a_method_that_cannot_sample_exactly_is_refused_at_temperature_above_0(monkeypatch, model):
    monkeypatch.setitem(METHODS, "lossy", _Lossy)
    monkeypatch.setattr(_Lossy, "method_name", "lossy")
    assert not resolve_method("lossy").samples_exactly
    with pytest.raises(ParadecodeError, match="cannot sample exactly"):
        model.generate("w3 w4", method="lossy", temperature=0.7, max_new_tokens=3)
    assert len(model.generate("w3 w4", method="lossy", max_new_tokens=3).token_ids) == 3  # greedy runs


def test_the_cost_curve_is_measured_only_for_a_drafter_that_asks(monkeypatch, model):
    import paradecode.profile

    measured = []
    real = paradecode.profile.cached_curve
    monkeypatch.setattr(paradecode.profile, "cached_curve",
                        lambda *args, **kwargs: measured.append(1) or real(*args, **kwargs))
    model.generate("w3 w4 w3 w4", method="ar", max_new_tokens=4)
    model.generate("w3 w4 w3 w4", method="pld", max_new_tokens=4, options={"schedule": "fixed"})
    assert measured == []
    model.generate("w3 w4 w3 w4", method="pld", max_new_tokens=4)  # the cost schedule reads it
    assert measured == [1]


def test_lookahead_takes_snake_case_options_and_its_old_names_with_a_warning():
    from tiny import PROMPTS, run, tiny_backend

    backend = tiny_backend(1, sharp=4.0)
    new, _ = run(backend, "lookahead", PROMPTS[0], window=4, ngram_size=4, candidates=3)
    with pytest.warns(FutureWarning, match="option W of method 'lookahead' is now called window"):
        old, _ = run(backend, "lookahead", PROMPTS[0], W=4, N=4, G=3)
    assert old == new
    assert resolve_method("lookahead", {"G": 3}).options == {"candidates": 3}
    with pytest.raises(ParadecodeError, match="both W and window"):
        resolve_method("lookahead", {"W": 3, "window": 4})
