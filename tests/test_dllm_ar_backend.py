"""The AR twin behind the backend protocol: lossless methods give exactly its greedy output, rollback then
forward equals a fresh computation (stale keys are never attended), non-prefix commits and trees are refused."""

import pytest
import torch

from paradecode.backends.base import tree_mask
from paradecode.dllm.ar import ar_generate
from paradecode.dllm.ar_backend import TwinBackend, ar_engine_generate
from paradecode.dllm.model import ModelConfig, TinyLM
from paradecode.dllm.protocol import load_tiny
from paradecode.dllm.tasks import heldout
from paradecode.errors import ParadecodeError


def random_twin(seed: int = 0) -> TinyLM:
    torch.manual_seed(seed)
    model = TinyLM(ModelConfig(causal=True, d_model=32, n_layers=2, n_heads=2, d_ff=64)).eval()
    with torch.no_grad():
        model.tok_emb.weight.mul_(40.0)  # sharp argmax choices, so greedy paths repeat and drafts get accepted
    return model


@pytest.mark.parametrize("method", ["pld", "ngram"])
def test_lossless_methods_on_the_shipped_twin_equal_its_greedy_answers(method):
    twin = load_tiny("waiting-line-ar", causal=True)
    backend = TwinBackend(twin)
    drafted = 0
    for _, prompt, _ in heldout(twin.config.suite, 2):
        ids = twin.encode(prompt)
        greedy, _ = ar_generate(twin, ids, twin.gen_length)
        out, stats = ar_engine_generate(twin, ids, twin.gen_length, method, backend=backend)
        assert out == greedy
        assert stats.new_tokens == len(greedy)
        drafted += stats.drafted_tokens
    assert drafted > 0  # the drafts were really verified, not skipped


@pytest.mark.parametrize("method", ["pld", "ngram"])
def test_lossless_methods_on_a_random_twin_equal_greedy(method):
    twin = random_twin()
    accepted = 0
    for prompt in ([2, 3, 4, 5, 2, 3, 4], [6, 6, 6, 6], [7, 3, 9, 7, 3, 9, 7], [4]):
        greedy, _ = ar_generate(twin, prompt, 30)
        out, stats = ar_engine_generate(twin, prompt, 30, method)
        assert out == greedy
        accepted += stats.accepted_tokens
    assert accepted > 0


def test_rollback_then_forward_equals_a_fresh_computation():
    twin = random_twin(1)
    backend = TwinBackend(twin)
    backend.forward(torch.tensor([2, 3, 4, 5, 6, 7, 8]))  # 7 keys, 4 of them about to go stale
    backend.rollback(3)
    assert backend.cache_len == 3
    resumed = backend.forward(torch.tensor([9, 10])).logits  # positions 3, 4; stale keys sit at 5, 6
    fresh = TwinBackend(twin).forward(torch.tensor([2, 3, 4, 9, 10])).logits[3:]
    torch.testing.assert_close(resumed, fresh)
    backend.forward(torch.tensor([11]))  # position 5: its stale key must be overwritten, not attended
    fresh = TwinBackend(twin).forward(torch.tensor([2, 3, 4, 9, 10, 11])).logits[5:]
    torch.testing.assert_close(backend.forward(torch.tensor([12])).logits,
                               TwinBackend(twin).forward(torch.tensor([2, 3, 4, 9, 10, 11, 12])).logits[6:])
    assert fresh.shape == (1, len(twin.config.vocab))


def test_commit_keeps_a_prefix_and_refuses_anything_else():
    backend = TwinBackend(random_twin())
    backend.forward(torch.tensor([2, 3, 4, 5, 6]))
    with pytest.raises(ValueError, match="prefixes only"):
        backend.commit(1, [0, 2])
    backend.commit(1, [0, 1])
    assert backend.cache_len == 3
    with pytest.raises(ValueError, match="chains only"):
        backend.forward(torch.tensor([7, 8, 9]), mask=tree_mask([-1, -1, 0], 3))
    with pytest.raises(ValueError, match="next positions"):
        backend.forward(torch.tensor([7]), positions=torch.tensor([5]))


def test_the_adapter_refuses_a_diffusion_model():
    with pytest.raises(ParadecodeError, match="causal"):
        TwinBackend(TinyLM(ModelConfig(causal=False, d_model=32, n_layers=1, n_heads=2, d_ff=64)))


def test_bench_puts_the_lossless_twin_rows_beside_greedy_and_checks_them():
    from paradecode.dllm import bench, report

    torch.manual_seed(0)
    small = dict(d_model=32, n_layers=1, n_heads=2, d_ff=64)
    model = TinyLM(ModelConfig(**small)).eval()
    results = bench.run_bench([model], {"waiting-line": random_twin()}, ["threshold"], {"threshold": [0.5]}, [],
                              per_task=1, progress=False)
    summary = results["summary"]["waiting-line"]
    assert {"ar-twin", "ar-twin pld", "ar-twin ngram"} <= set(summary)
    same = results["twin_agreement"]["waiting-line"]
    assert same["ar-twin pld"] == same["ar-twin ngram"] == [7, 7]
    assert summary["ar-twin pld"]["all"]["tokens_per_forward"] > 0
    assert "`ar-twin pld` 7 of 7" in report.render_report(results)
    assert not report.best_within(summary, "all", "one-per-step")[0].startswith("ar-twin")
