"""Training draft heads: self-distilled data is the target's own greedy answers and hidden states, training
lowers the loss, an interrupted run resumes, a saved head drafts exactly as the trained one, bad heads are
refused clearly, and the EAGLE export has the serving engines' layout and computes the same function.
"""

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers

from paradecode.backends.llama import LlamaBackend
from paradecode.errors import ParadecodeError
from paradecode.heads.eagle import HeadShape
from paradecode.heads.store import build_head, load_head, resolve_head_dir, target_weights
from paradecode.training.losses import draft_vocab, eagle_loss, make_batch, medusa_loss
from paradecode.training.selfdistill import DistillConfig, answer_and_record
from paradecode.training.trainer import TrainConfig, train_head
from tiny import PROMPTS, run, tiny_model_dir

LOSSES = {"eagle": eagle_loss, "medusa": medusa_loss}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    model_dir = tiny_model_dir(tmp_path_factory.mktemp("target"), seed=5)
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, 48, (int(n),), generator=generator).tolist() for n in torch.randint(3, 12, (40,))]
    rows = answer_and_record(hf, tokenizer, prompts, DistillConfig(max_new_tokens=24, batch_size=16, teacher="fp32"))
    return SimpleNamespace(model_dir=model_dir, rows=rows, prompts=prompts, target=target_weights(str(model_dir)))


def test_data_is_the_targets_greedy_answers_and_hidden_states(data):
    backend = LlamaBackend.from_pretrained(data.model_dir)
    for prompt, row in list(zip(data.prompts, data.rows))[:6]:
        expected, _ = run(backend, "ar", prompt, max_new_tokens=24, eos_ids=[1])
        assert row["tokens"].tolist() == prompt + expected and row["prompt_len"] == len(prompt)
        backend.reset()
        hidden = backend.forward(row["tokens"].long(), return_hidden=True).hidden  # [T, D]
        torch.testing.assert_close(row["hidden"].float(), hidden, atol=2e-2, rtol=1e-2)  # stored in fp16


def test_data_folder_refuses_other_prompts(tmp_path):
    from paradecode.training.selfdistill import generate_dataset

    model_dir = tiny_model_dir(tmp_path / "target", seed=5)
    config = DistillConfig(max_new_tokens=4, batch_size=8, teacher="fp32")
    first = generate_dataset(model_dir, ["w1 w2", "w3"], tmp_path / "data", config, log=lambda m: None)
    again = generate_dataset(model_dir, ["w1 w2", "w3"], tmp_path / "data", config, log=lambda m: None)
    assert first == again and len(first) == 1
    with pytest.raises(ParadecodeError, match="holds answers to other prompts"):
        generate_dataset(model_dir, ["w4"], tmp_path / "data", config, log=lambda m: None)


def test_int8_teacher_answers_like_the_int8_backend_in_any_number_of_workers(tmp_path, monkeypatch):
    """The default teacher: the int8 backend's own greedy answers (several prompts decoding at once, each answer
    the one it gets alone), with the hidden states it computes along them; two worker processes write the
    same shards as one; a tokens-only run (``hidden=False``) keeps the same answers without them."""
    import paradecode
    from paradecode.training import selfdistill

    model_dir = tiny_model_dir(tmp_path / "target", seed=5)
    words = ["w%d" % i for i in range(2, 40)]
    prompts = [" ".join(words[i : i + 2 + i % 5]) for i in range(8)]
    monkeypatch.setattr(selfdistill, "SHARD_SIZE", 4)  # two shards
    config = DistillConfig(max_new_tokens=12, teacher="int8", batch_size=3)
    cache = str(tmp_path / "cache")
    one = selfdistill.generate_dataset(model_dir, prompts, tmp_path / "one", config, log=lambda m: None,
                                       cache_dir=cache)
    two = selfdistill.generate_dataset(model_dir, prompts, tmp_path / "two", config, log=lambda m: None,
                                       workers=2, cache_dir=cache)
    assert len(one) == len(two) == 2
    tokens_only = selfdistill.generate_dataset(model_dir, prompts, tmp_path / "tokens", dataclasses.replace(
        config, hidden=False, shard_size=8), log=lambda m: None, cache_dir=cache)
    assert len(tokens_only) == 1
    rows, parallel = selfdistill.load_shards(one), selfdistill.load_shards(two)
    for row, bare in zip(rows, selfdistill.load_shards(tokens_only), strict=True):
        assert torch.equal(row["tokens"], bare["tokens"]) and "hidden" not in bare
    model = paradecode.load(str(model_dir), backend="llama", dtype="int8", cache_dir=cache)
    for prompt, row, other in zip(prompts, rows, parallel):
        ids = selfdistill.encode_prompt(model.tokenizer, prompt)
        answer = model.generate(ids, max_new_tokens=12).token_ids
        assert row["tokens"].tolist() == ids + answer and row["prompt_len"] == len(ids)
        assert torch.equal(row["tokens"], other["tokens"]) and torch.equal(row["hidden"], other["hidden"])
        model.backend.reset()
        hidden = model.backend.forward(row["tokens"].long(), return_hidden=True).hidden
        assert torch.equal(row["hidden"], hidden.half())
    with pytest.raises(ParadecodeError, match="unknown teacher"):
        selfdistill.generate_dataset(model_dir, prompts, tmp_path / "bad", DistillConfig(teacher="bf16"))


def _loss(kind, head, data, vocab, soft=False):
    """Cross-entropy against the target's chosen tokens (soft=False: its floor is 0) or its distribution."""
    batch = make_batch(data.rows[:16])
    with torch.no_grad():
        return float(LOSSES[kind](head, data.target.embed, data.target.lm_head[vocab.ids], vocab, batch, 2,
                                  soft=soft)[0])


@pytest.mark.parametrize("kind,labels", [("eagle", "soft"), ("medusa", "soft"), ("eagle", "hard")])
def test_training_lowers_the_loss_and_the_saved_head_drafts_the_same(data, tmp_path, kind, labels):
    tmp_path = tmp_path / "not-made-yet"  # train_head makes its output folder
    config = TrainConfig(kind=kind, epochs=5, batch_size=4, lr=1e-2, draft_vocab=40, depth=2, eval_depth=3,
                         medusa_heads=3, holdout=4, checkpoint_every=2,  # a checkpoint before the first save
                         soft_labels=labels == "soft", precision="fp32")
    torch.manual_seed(config.seed)
    untrained = build_head(kind, HeadShape.from_target_config(data.target.config), 3)
    trained, saved = train_head(data.rows, data.target, "tiny", tmp_path, config, log=lambda m: None,
                                progress=False)
    vocab = draft_vocab(data.rows, 48, 40)
    soft = labels == "soft"  # the loss it was trained on
    assert _loss(kind, trained, data, vocab, soft) < 0.85 * _loss(kind, untrained, data, vocab, soft)
    assert len(saved["training"]["history"]) == 5 and saved["draft_vocab_size"] == 40
    sweep = saved["training"]["vocab_sweep"]
    assert [row["size"] for row in sweep] == [5, 10, 20, 40]
    assert [row["coverage"] for row in sweep] == sorted(row["coverage"] for row in sweep) and sweep[0]["coverage"] < 1
    loaded = load_head(tmp_path, kind, data.target)
    for name, tensor in trained.state_dict().items():  # fp16 on disk
        torch.testing.assert_close(loaded.module.state_dict()[name], tensor.half().float())
    from paradecode.drafters.head_drafter import HeadRuntime
    from paradecode.registry import get_method
    from paradecode.stats import DecodeStats
    from paradecode.config import GenerationConfig
    from paradecode.engine import decode

    backend = LlamaBackend.from_pretrained(data.model_dir)
    context = SimpleNamespace(model_dir=data.model_dir, name="tiny")
    for prompt in PROMPTS:
        proposals = []
        for module in (trained.half().float(), loaded.module):
            drafter = get_method(kind).create({"head": str(tmp_path), "schedule": "fixed"}, context)
            drafter.module = module
            stats = DecodeStats()
            list(decode(backend, drafter, prompt, GenerationConfig(max_new_tokens=20), stats=stats))
            proposals.append([(s.drafted, s.parents) for s in stats.steps])
        assert proposals[0] == proposals[1]


def test_interrupted_training_resumes(data, tmp_path):
    config = TrainConfig(kind="medusa", epochs=2, batch_size=4, draft_vocab=40, medusa_heads=2, holdout=4, precision="fp32")

    def stop_after_first_epoch(message):
        if message.startswith("epoch 1:"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_head(data.rows, data.target, "tiny", tmp_path, config, log=stop_after_first_epoch, progress=False)
    first = json.loads((tmp_path / "config.json").read_text())["training"]["history"]
    messages = []
    _, saved = train_head(data.rows, data.target, "tiny", tmp_path, config, log=messages.append, progress=False)
    assert messages[0] == "resuming at epoch 2, step 0"
    assert saved["training"]["history"][0] == first[0] and len(saved["training"]["history"]) == 2


def test_bad_heads_are_refused_clearly(data, tmp_path):
    from paradecode.heads.store import head_config, save_head

    other = target_weights(str(tiny_model_dir(tmp_path / "other", seed=9)))
    module = build_head("eagle", HeadShape.from_target_config(other.config))
    save_head(tmp_path / "head", module, head_config(module, other, "other-model", None), None)
    with pytest.raises(ParadecodeError, match="trained for model 'other-model'"):
        load_head(tmp_path / "head", "eagle", data.target)
    with pytest.raises(ParadecodeError, match="holds a 'eagle' head"):
        load_head(tmp_path / "head", "medusa", other)
    with pytest.raises(ParadecodeError, match="needs config.json and head.safetensors"):
        load_head(tmp_path / "missing", "eagle", other)
    (tmp_path / "head" / "config.json").write_text("{not json")
    with pytest.raises(ParadecodeError, match="not a valid head config"):
        load_head(tmp_path / "head", "eagle", other)
    with pytest.raises(ParadecodeError, match="no eagle head is shipped for model 'tiny'"):
        resolve_head_dir("", "eagle", "tiny")


def test_eagle_export_has_the_engines_layout_and_computes_the_same(data, tmp_path):
    """Names, shapes and config keys of vLLM's / SGLang's EAGLE-1 checkpoints; then the exported weights, run
    through transformers' own Llama decoder layer with the input norm skipped (the layer both engines
    subclass), give the head's output."""
    from safetensors.torch import load_file

    from paradecode.heads.store import head_config, save_head
    from paradecode.training.export import export_eagle

    torch.manual_seed(0)
    module = build_head("eagle", HeadShape.from_target_config(data.target.config))
    save_head(tmp_path / "head", module, head_config(module, data.target, "tiny", None), None)
    head = load_head(tmp_path / "head", "eagle", data.target)
    for engine, architecture in (("sglang", "LlamaForCausalLMEagle"), ("vllm", "LlamaForCausalLM")):
        config = export_eagle(head, data.target, tmp_path / engine, engine)
        assert json.loads((tmp_path / engine / "config.json").read_text()) == config
        assert config["architectures"] == [architecture] and config["num_hidden_layers"] == 1
    tensors = load_file(tmp_path / "vllm" / "model.safetensors")
    d, kv = 32, 2 * 8  # tiny_llama: hidden 32, 2 kv heads of dim 8
    shapes = {"fc.weight": (d, 2 * d), "fc.bias": (d,), "layers.0.self_attn.q_proj.weight": (d, d),
              "layers.0.self_attn.k_proj.weight": (kv, d), "layers.0.self_attn.v_proj.weight": (kv, d),
              "layers.0.self_attn.o_proj.weight": (d, d), "layers.0.post_attention_layernorm.weight": (d,),
              "layers.0.mlp.gate_proj.weight": (64, d), "layers.0.mlp.up_proj.weight": (64, d),
              "layers.0.mlp.down_proj.weight": (d, 64)}
    assert {k: tuple(v.shape) for k, v in tensors.items()} == shapes
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size",
                "rms_norm_eps", "rope_theta", "model_type", "max_position_embeddings"):
        assert key in config

    hf_config = transformers.LlamaConfig.from_pretrained(tmp_path / "vllm")
    layer = transformers.models.llama.modeling_llama.LlamaDecoderLayer(hf_config, 0).eval()
    layer.load_state_dict({k[len("layers.0."):]: v.float() for k, v in tensors.items() if k.startswith("layers.0.")},
                          strict=False)
    layer.input_layernorm = torch.nn.Identity()
    rotary = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(hf_config)
    tokens, features = torch.randint(48, (1, 7)), torch.randn(1, 7, d)
    positions = torch.arange(7)[None]
    embeds = data.target.embed[tokens]
    with torch.no_grad():
        x = torch.nn.functional.linear(torch.cat((embeds, features), -1), tensors["fc.weight"].float())
        mask = torch.full((7, 7), float("-inf")).triu(1)[None, None]
        theirs = layer(x, attention_mask=mask, position_ids=positions,
                       position_embeddings=rotary(x, positions))
        theirs = theirs[0] if isinstance(theirs, tuple) else theirs
        ours, _ = head.module(embeds, features, positions, torch.ones(7, 7, dtype=torch.bool).tril()[None])
    torch.testing.assert_close(theirs, ours, atol=2e-2, rtol=2e-2)  # fp16 export of fp16-stored weights


def test_epoch_batches_cover_every_row_once_and_pad_less_than_random_batches():
    from paradecode.training.trainer import epoch_batches

    generator = torch.Generator().manual_seed(3)
    rows = [dict(tokens=torch.zeros(int(n))) for n in torch.randint(5, 300, (203,), generator=generator)]
    batches = epoch_batches(rows, 8, seed=1)
    assert sorted(i for b in batches for i in b) == list(range(203)) and len(batches) == 26
    assert batches == epoch_batches(rows, 8, seed=1) and batches != epoch_batches(rows, 8, seed=2)

    def padded(groups):
        return sum(max(len(rows[i]["tokens"]) for i in g) * len(g) for g in groups)

    shuffled = torch.randperm(203, generator=generator).tolist()
    assert padded(batches) < 0.8 * padded([shuffled[i : i + 8] for i in range(0, 203, 8)])


def test_training_can_start_from_a_saved_head(data, tmp_path):
    config = TrainConfig(kind="eagle", epochs=2, batch_size=4, lr=1e-2, draft_vocab=40, depth=2, eval_depth=2,
                         holdout=4, precision="fp32")
    first, _ = train_head(data.rows, data.target, "tiny", tmp_path / "first", config, log=lambda m: None,
                          progress=False)
    still = dataclasses.replace(config, epochs=1, lr=1e-9, init=str(tmp_path / "first"))  # (almost) no steps
    again, _ = train_head(data.rows, data.target, "tiny", tmp_path / "again", still, log=lambda m: None,
                          progress=False)
    saved = load_head(tmp_path / "first", "eagle", data.target).module.state_dict()
    for name, tensor in again.state_dict().items():
        torch.testing.assert_close(tensor, saved[name], atol=1e-5, rtol=0)
    with pytest.raises(ParadecodeError, match="holds a 'eagle' head"):
        train_head(data.rows, data.target, "tiny", tmp_path / "bad",
                   dataclasses.replace(config, kind="medusa", init=str(tmp_path / "first")), log=lambda m: None,
                   progress=False)


def test_train_draft_head_answers_every_source_into_its_folder_then_trains(tmp_path):
    from paradecode.training.pipeline import train_draft_head

    model_dir = tiny_model_dir(tmp_path / "target", seed=5)
    sets = [(source, [f"w{i} w{i + 1} w{i + 2}" for i in range(start, start + 10)])
            for source, start in (("a.jsonl", 2), ("b.jsonl", 20))]
    saved = train_draft_head("tiny", model_dir, sets, tmp_path / "head", tmp_path / "data",
                             DistillConfig(max_new_tokens=6, batch_size=4, teacher="fp32"),
                             TrainConfig(kind="medusa", epochs=1, batch_size=2, draft_vocab=0, medusa_heads=2, holdout=4),
                             log=lambda m: None, progress=False, info={"command": "test"})
    assert (tmp_path / "data" / "a").is_dir() and (tmp_path / "data" / "b").is_dir()
    assert (tmp_path / "head" / "head.safetensors").is_file()
    assert saved["training"]["answers"] == 20 and saved["training"]["command"] == "test"


def test_data_only_then_train_only_on_the_shards_saved_so_far(tmp_path, monkeypatch):
    """A data run stopped part way (a shard missing) trains with --train-only on what it saved; a folder with
    no data is a clear error."""
    from paradecode.training import selfdistill
    from paradecode.training.pipeline import train_draft_head

    model_dir = tiny_model_dir(tmp_path / "target", seed=5)
    monkeypatch.setattr(selfdistill, "SHARD_SIZE", 4)
    prompts = [("p.jsonl", [f"w{i} w{i + 1} w{i + 2}" for i in range(2, 14)])]  # three shards
    distill = DistillConfig(max_new_tokens=6, batch_size=4, teacher="fp32", hidden=False)
    train = TrainConfig(kind="eagle", epochs=1, batch_size=2, draft_vocab=0, holdout=2, precision="fp32")
    common = dict(log=lambda m: None, progress=False)
    assert train_draft_head("tiny", model_dir, prompts, tmp_path / "head", tmp_path / "data", distill, train,
                            data_only=True, **common) is None
    assert not (tmp_path / "head" / "head.safetensors").exists()
    (tmp_path / "data" / "shard-00001.pt").unlink()  # as if stopped before it
    saved = train_draft_head("tiny", model_dir, prompts, tmp_path / "head", tmp_path / "data", distill, train,
                             train_only=True, keep_features=True, **common)
    assert saved["training"]["answers"] == 8 and not (tmp_path / "data" / "shard-00001.pt").exists()
    kept = list((tmp_path / "data" / "features" / Path(model_dir).name / "last").rglob("*.pt"))
    assert len(kept) == 8  # every answer's features, kept for the next epoch or run
    with pytest.raises(ParadecodeError, match="holds no train-draft data"):
        train_draft_head("tiny", model_dir, prompts, tmp_path / "head2", tmp_path / "nothing", distill, train,
                         train_only=True, **common)


def _exact_rows(data, count):
    """The data's first answers with the hidden states the fp32 backend computes along them (not rounded to fp16
    as stored), so a head's teacher-forced drafts are the ones it makes when decoding on that backend."""
    backend = LlamaBackend.from_pretrained(data.model_dir)
    rows = []
    for row in data.rows[:count]:
        backend.reset()
        hidden = backend.forward(row["tokens"].long(), return_hidden=True).hidden
        rows.append(dict(row, hidden=hidden))
    return backend, rows


def test_decode_walk_is_the_path_greedy_speculative_decoding_takes(data, tmp_path):
    """The roots ``decode_walk`` drafts from along an answer are the ones the fp32 backend's decoding with the
    same head (a fixed chain of 3) commits from, step for step, and its tokens per step are decoding's."""
    from paradecode.config import GenerationConfig
    from paradecode.engine import decode
    from paradecode.registry import get_method
    from paradecode.stats import DecodeStats
    from paradecode.training.losses import decode_walk

    config = TrainConfig(kind="eagle", epochs=3, batch_size=4, lr=1e-2, draft_vocab=0, depth=3, eval_depth=3,
                         holdout=4, precision="fp32")
    head, _ = train_head(data.rows, data.target, "tiny", tmp_path, config, log=lambda m: None, progress=False)
    head = head.half().float()  # as saved
    backend, rows = _exact_rows(data, 8)
    vocab = draft_vocab(data.rows, 48, 0)
    with torch.no_grad():
        _, hits = eagle_loss(head, data.target.embed, data.target.lm_head[vocab.ids], vocab, make_batch(rows), 3)
    on_path, steps, tokens = decode_walk(hits, "eagle", make_batch(rows))
    context = SimpleNamespace(model_dir=data.model_dir, name="tiny")
    decoded_steps = decoded_tokens = accepted = 0
    for b, row in enumerate(rows):
        drafter = get_method("eagle").create({"head": str(tmp_path), "schedule": "fixed", "depth": 3,
                                              "head_dtype": "fp32", "lookup": 0}, context)  # the head's own path
        stats = DecodeStats()
        prompt = row["tokens"][: row["prompt_len"]].tolist()
        answer = len(row["tokens"]) - row["prompt_len"]
        backend.reset()
        list(decode(backend, drafter, prompt, GenerationConfig(max_new_tokens=answer), stats=stats))
        roots, root = [], row["prompt_len"] - 1
        for step in stats.steps:
            roots.append(root)
            root += step.accepted_len + 1
            accepted += step.accepted_len
        assert roots == torch.nonzero(on_path[0, b]).flatten().tolist()
        decoded_steps, decoded_tokens = decoded_steps + len(stats.steps), decoded_tokens + answer
    assert (steps, tokens) == (decoded_steps, decoded_tokens) and accepted > 0  # a head that drafts something right


def test_on_policy_weights_off_the_path_as_much_as_on_it_is_the_plain_loss(data):
    torch.manual_seed(3)
    vocab = draft_vocab(data.rows, 48, 40)
    batch = make_batch(data.rows[:8])
    for kind, loss in LOSSES.items():
        head = build_head(kind, HeadShape.from_target_config(data.target.config), 3)
        with torch.no_grad():
            plain, _ = loss(head, data.target.embed, data.target.lm_head[vocab.ids], vocab, batch, 3)
            even, _ = loss(head, data.target.embed, data.target.lm_head[vocab.ids], vocab, batch, 3, on_policy=1.0)
            only, _ = loss(head, data.target.embed, data.target.lm_head[vocab.ids], vocab, batch, 3, on_policy=0.0)
        torch.testing.assert_close(even, plain)
        assert abs(float(only) - float(plain)) > 1e-4  # the path's drafts alone weigh differently


def test_on_policy_fine_tuning_lowers_the_loss_on_the_decoding_path(data, tmp_path):
    """``--on-policy`` needs a trained head; fine-tuning one lowers its loss on the drafts decoding makes (the
    on-policy loss with nothing off the path) more than plain fine-tuning with the same steps does, and the
    saved history reports greedy decoding's tokens per step."""
    from paradecode.training.losses import eagle_loss as loss

    config = TrainConfig(kind="eagle", epochs=2, batch_size=4, lr=1e-2, draft_vocab=40, depth=2, eval_depth=2,
                         holdout=4, precision="fp32")
    train_head(data.rows, data.target, "tiny", tmp_path / "first", config, log=lambda m: None, progress=False)
    with pytest.raises(ParadecodeError, match="--init"):
        dataclasses.replace(config, on_policy=True)
    vocab = draft_vocab(data.rows, 48, 40)
    batch = make_batch(data.rows[:16])
    path_loss = {}
    for on_policy in (False, True):
        tuned = dataclasses.replace(config, epochs=2, lr=3e-3, init=str(tmp_path / "first"), on_policy=on_policy)
        head, saved = train_head(data.rows, data.target, "tiny", tmp_path / f"tuned-{on_policy}", tuned,
                                 log=lambda m: None, progress=False)
        assert saved["training"]["config"]["on_policy"] is on_policy
        for h in saved["training"]["history"]:  # chains of 1 and 2: at most 2 and 3 tokens a step
            assert [1.0 <= t <= length + 1 for length, t in enumerate(h["tau_decode"], 1)] == [True, True]
        with torch.no_grad():
            path_loss[on_policy] = float(loss(head, data.target.embed, data.target.lm_head[vocab.ids], vocab, batch,
                                              2, on_policy=0.0)[0])
    assert path_loss[True] < path_loss[False]


def test_kept_features_are_read_back_instead_of_recomputed(tmp_path):
    """``--keep-features``: a row's features are written once per layer set and read back by a later run (which
    then never loads the target), equal to the computed ones rounded to half floats."""
    from paradecode.training.features import TargetFeatures

    model_dir = tiny_model_dir(tmp_path / "target", seed=5)
    rows = [dict(tokens=torch.tensor(t, dtype=torch.int32), prompt_len=2) for t in ([3, 4, 5, 6], [7, 8, 9])]
    plain = TargetFeatures(model_dir, str(tmp_path / "cache"))
    first = TargetFeatures(model_dir, str(tmp_path / "cache"), store=tmp_path / "features")
    for layers in ((), (0, 1)):
        computed = plain(rows, layers)
        kept = first(rows, layers)
        for c, k in zip(computed, kept):
            torch.testing.assert_close(k, c.half().float(), rtol=0, atol=0)
    assert len(list((tmp_path / "features").rglob("*.pt"))) == 4  # two rows x two layer sets
    later = TargetFeatures(None, store=tmp_path / "features")  # no model: it could not compute anything
    for layers in ((), (0, 1)):
        for k, again in zip(first(rows, layers), later(rows, layers)):
            torch.testing.assert_close(again, k, rtol=0, atol=0)
    assert later.model is None
