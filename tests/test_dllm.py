"""Masked diffusion decoding: the samplers' commit rules on a scripted model, the EoT stop, the caches against
no cache on a random ``TinyLM``, seeded reproducibility, the AR twin's cache, training resume, the trace."""

import math

import pytest
import torch

from paradecode.dllm.ar import ar_generate
from paradecode.dllm.decode import DecodeConfig, diffuse
from paradecode.dllm.model import ModelConfig, TinyLM, load_checkpoint
from paradecode.dllm.samplers import build_sampler
from paradecode.dllm.samplers.base import planned_counts
from paradecode.errors import ParadecodeError

MASK, EOT, VOCAB = 0, 1, 8


class ScriptedDLM:
    """A stand-in diffusion model: canvas position i always predicts ``tokens[i]`` with probability
    ``confidences[i]`` (the rest spread evenly), whatever the context."""

    mask_id, eot_id, max_length, supports_cache = MASK, EOT, 64, False

    def __init__(self, tokens, confidences, prompt_len=3):
        self.tokens, self.confidences, self.prompt_len = tokens, confidences, prompt_len
        self.gen_length = len(tokens)

    def __call__(self, x, index=None, cache=None):  # x [1, S] -> logits [1, S, V]
        probs = torch.full((x.shape[1], VOCAB), 1.0 / VOCAB)
        for row, pos in enumerate(index.tolist()):
            i = pos - self.prompt_len
            if 0 <= i < len(self.tokens):
                probs[row] = (1 - self.confidences[i]) / (VOCAB - 1)
                probs[row, self.tokens[i]] = self.confidences[i]
        return probs.log()[None]

    def decode(self, ids):
        return " ".join(map(str, ids))


CONF = [0.5, 0.9, 0.3, 0.8, 0.6, 0.95]
SCRIPTED = ScriptedDLM([2, 3, 4, 5, 6, 7], CONF)
BY_CONFIDENCE = sorted(range(6), key=lambda i: -CONF[i])


def run(model, sampler, options=None, **config):
    return diffuse(model, [2, 2, 2], build_sampler(sampler, options), DecodeConfig(**config))


def committed_order(result):
    return [s.positions for s in result.stats.steps]


def test_topk_one_block_one_token_per_step_in_confidence_order():
    result = run(SCRIPTED, "topk", steps=6)
    assert committed_order(result) == [[i] for i in BY_CONFIDENCE]
    assert result.canvas == [2, 3, 4, 5, 6, 7] and result.stats.forward_passes == 6


def test_topk_fewer_steps_commit_the_planned_counts():
    assert planned_counts(7, 3) == [3, 2, 2]
    result = run(SCRIPTED, "topk", steps=2)
    assert committed_order(result) == [sorted(BY_CONFIDENCE[:3], key=BY_CONFIDENCE.index), BY_CONFIDENCE[3:]]


def test_threshold_above_every_confidence_is_one_per_step_and_zero_is_one_step():
    assert committed_order(run(SCRIPTED, "threshold", {"threshold": 0.99})) == [[i] for i in BY_CONFIDENCE]
    result = run(SCRIPTED, "threshold", {"threshold": 0.0})
    assert result.stats.forward_passes == 1 and sorted(committed_order(result)[0]) == list(range(6))


def test_threshold_commits_exactly_the_confident_positions():
    first = committed_order(run(SCRIPTED, "threshold", {"threshold": 0.8}))[0]
    assert sorted(first) == [1, 3, 5]


def test_factor_rule():
    # sorted confidences .95 .9 .8 .6 .5 .3: (n+1)(1-c_n) = .1, .3, .8, 2.0, ... -> n = 3 for f = 1, 1 for f = 0.2
    assert sorted(committed_order(run(SCRIPTED, "factor", {"factor": 1.0}))[0]) == [1, 3, 5]
    assert committed_order(run(SCRIPTED, "factor", {"factor": 0.2}))[0] == [5]


def test_entropy_and_margin_follow_confidence_when_the_rest_is_flat():
    assert committed_order(run(SCRIPTED, "entropy", steps=6)) == [[i] for i in BY_CONFIDENCE]
    assert committed_order(run(SCRIPTED, "margin", steps=6)) == [[i] for i in BY_CONFIDENCE]


def test_blocks_are_decoded_left_to_right():
    order = [p for step in committed_order(run(SCRIPTED, "topk", steps=6, block_length=3)) for p in step]
    assert order == [1, 0, 2, 5, 3, 4]


def test_eot_stop_fills_padding_and_never_drops_an_answer_token():
    # answer 2 3 4, then end-of-text; the end-of-text at 3 is the most confident position
    model = ScriptedDLM([2, 3, 4, EOT, EOT, EOT], [0.6, 0.7, 0.8, 0.99, 0.5, 0.5])
    with_stop, without = run(model, "topk", steps=6), run(model, "topk", steps=6, eot_stop=False)
    assert with_stop.token_ids == without.token_ids == [2, 3, 4]
    assert with_stop.stats.steps[0].positions == [3] and with_stop.stats.steps[0].filled == [4, 5]
    assert with_stop.stats.forward_passes == 4 < without.stats.forward_passes == 6
    assert with_stop.stats.stop_reason == "eot" and with_stop.stats.mean_accepted == 3 / 4


@pytest.mark.parametrize("seed", range(4))
def test_eot_stop_fills_only_after_a_committed_eot_on_a_random_model(seed):
    torch.manual_seed(seed)
    model = TinyLM(ModelConfig(n_layers=1, d_model=32, n_heads=2, d_ff=64)).eval()
    with torch.no_grad():
        model.tok_emb.weight[model.eot_id] *= 8  # make end-of-text likely, so the stop has work to do
    result = diffuse(model, model.encode("sort : 3 1 2"), build_sampler("topk"), DecodeConfig(steps=12))
    decided: dict[int, int] = {}
    for step in result.stats.steps:
        for pos, tok in zip(step.positions, step.tokens):
            decided[pos] = tok
        first_eot = min((p for p, t in decided.items() if t == model.eot_id), default=None)
        assert all(first_eot is not None and p > first_eot for p in step.filled)
        decided.update({p: model.eot_id for p in step.filled})
    assert [decided[p] for p in range(len(result.token_ids))] == result.token_ids  # every answer token committed


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return TinyLM(ModelConfig(n_layers=2, d_model=32, n_heads=2, d_ff=64)).eval()


@pytest.mark.parametrize("cache", ["prefix", "dual"])
@pytest.mark.parametrize("sampler,options", [("topk", {}), ("threshold", {"threshold": 0.1})])
def test_cache_refreshed_every_step_equals_no_cache(tiny, cache, sampler, options):
    prompt = tiny.encode("reverse : 1 2 3 4 5")
    plain = diffuse(tiny, prompt, build_sampler(sampler, options), DecodeConfig(block_length=4))
    cached = diffuse(tiny, prompt, build_sampler(sampler, options),
                     DecodeConfig(block_length=4, cache=cache, refresh_every=1))
    assert cached.canvas == plain.canvas
    assert committed_order(cached) == committed_order(plain)
    assert [s.confidences for s in cached.stats.steps] == [s.confidences for s in plain.stats.steps]


def test_cached_block_logits_match_a_full_forward_before_anything_changes(tiny):
    x = torch.tensor(tiny.encode("copy : 1 2 3") + [tiny.mask_id] * 12)  # [T]
    full = tiny(x[None], index=torch.arange(len(x)))[0]
    cache = tiny.new_cache()
    tiny(x[None], index=torch.arange(len(x)), cache=cache)
    block = tiny(x[None, 9:13], index=torch.arange(9, 13), cache=cache)[0]
    assert torch.allclose(block, full[9:13], atol=1e-5)


def test_seeded_sampling_is_reproducible(tiny):
    prompt = tiny.encode("shuffle : 1 2 3 4")
    runs = [diffuse(tiny, prompt, build_sampler("random"), DecodeConfig(temperature=1.0, seed=s)).canvas
            for s in (7, 7, 8)]
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_ar_twin_cache_matches_full_forward_greedy():
    torch.manual_seed(1)
    twin = TinyLM(ModelConfig(causal=True, n_layers=2, d_model=32, n_heads=2, d_ff=64)).eval()
    prompt = twin.encode("copy : 4 5 6")
    ids, stats = ar_generate(twin, prompt, 8)
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(len(ids)):
            seq.append(int(twin(torch.tensor([seq]))[0, -1].argmax()))
    assert ids == seq[len(prompt):] and stats.forward_passes == len(ids) + (stats.stop_reason == "eos")


@pytest.mark.parametrize("sampler,options,config,message", [
    ("nope", {}, {}, "unknown sampler"),
    ("threshold", {"threshold": 1.5}, {}, "threshold must be in"),
    ("factor", {"factor": 0}, {}, "factor must be"),
    ("threshold", {"tau": 0.5}, {}, "no option tau"),
    ("threshold", {}, {"steps": 4}, "chooses its own number of steps"),
    ("topk", {}, {"steps": 0}, "steps must be a positive integer"),
    ("topk", {}, {"block_length": 5}, "must divide"),
    ("topk", {}, {"gen_length": 60}, "more than this model's context"),
    ("topk", {}, {"cache": "full"}, "unknown cache"),
])
def test_bad_inputs_raise_clear_errors(tiny, sampler, options, config, message):
    with pytest.raises(ParadecodeError, match=message):
        diffuse(tiny, tiny.encode("copy : 1 2"), build_sampler(sampler, options), DecodeConfig(**config))


def test_unknown_words_are_refused(tiny):
    with pytest.raises(ParadecodeError, match="does not know: hello"):
        tiny.encode("hello : 1 2")


def test_training_writes_a_checkpoint_and_resumes(tmp_path):
    from paradecode.dllm.train import TrainConfig, train

    cfg = dict(suite="latin", steps=2, batch_size=4, checkpoint_every=1)
    first = train(TrainConfig(**cfg), tmp_path, progress=False)
    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "train_state.pt").is_file()
    longer = train(TrainConfig(**{**cfg, "steps": 3}), tmp_path, progress=False)  # resumes at step 2
    assert len(__import__("json").loads((tmp_path / "loss.json").read_text())) == 3
    loaded = load_checkpoint(tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), longer.state_dict().values()))
    assert not all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), longer.state_dict().values()))
    with pytest.raises(ParadecodeError, match="other settings"):
        train(TrainConfig(**{**cfg, "batch_size": 8}), tmp_path, progress=False)
    assert math.isfinite(loaded.config.info["final_loss"])


@pytest.mark.parametrize("objective", ["diffusion", "ar"])
def test_training_recreates_the_same_file_and_a_resumed_run_equals_an_uninterrupted_one(tmp_path, objective):
    from paradecode.dllm.train import TrainConfig, train

    cfg = dict(suite="waiting-line", objective=objective, steps=4, cooldown=2, warmup=2, batch_size=4,
               checkpoint_every=1)
    for run in ("a", "b"):
        train(TrainConfig(**cfg), tmp_path / run, progress=False)
    train(TrainConfig(**{**cfg, "steps": 2, "cooldown": 0}), tmp_path / "resumed", progress=False)  # stopped early
    train(TrainConfig(**cfg), tmp_path / "resumed", progress=False)  # resumed with the full schedule
    files = [(tmp_path / run / "model.safetensors").read_bytes() for run in ("a", "b", "resumed")]
    assert files[0] == files[1] == files[2]
    other = train(TrainConfig(**{**cfg, "seed": 1}), tmp_path / "c", progress=False)
    assert (tmp_path / "c" / "model.safetensors").read_bytes() != files[0]
    assert other.config.causal == (objective == "ar")


def test_trace_shows_every_step(tiny):
    from paradecode.dllm.trace import render_dllm_trace

    result = diffuse(tiny, tiny.encode("copy : 1 2"), build_sampler("threshold", {"threshold": 0.05}), DecodeConfig())
    page = render_dllm_trace(tiny, "copy : 1 2", result, "tiny")
    assert page.count("<tr><th>") == len(result.stats.steps) + 1 and "threshold on tiny" in page


def test_learning_rate_before_the_cooldown_does_not_depend_on_the_run_length():
    from paradecode.dllm.train import TrainConfig, learning_rate

    short, long = TrainConfig(steps=1000, cooldown=200), TrainConfig(steps=5000, cooldown=1000)
    assert all(learning_rate(short, s) == learning_rate(long, s) for s in range(800))
    assert learning_rate(short, 900) == pytest.approx(0.5 * short.lr) and learning_rate(short, 999) > 0
    with pytest.raises(ParadecodeError, match="cooldown"):
        TrainConfig(steps=10, cooldown=11)


@pytest.mark.parametrize("causal", [False, True])
def test_left_padding_does_not_change_a_rows_logits(causal):
    torch.manual_seed(0)
    model = TinyLM(ModelConfig(causal=causal, n_layers=2, d_model=32, n_heads=2, d_ff=64)).eval()
    row = torch.tensor(model.encode("copy : 1 2 3"))
    padded = torch.cat([torch.full((6,), model.vocab.pad_id), row])[None]
    valid = padded != model.vocab.pad_id
    with torch.no_grad():
        alone, in_batch = model(row[None]), model(padded, valid)
    assert torch.allclose(alone[0], in_batch[0, 6:], atol=1e-5)
