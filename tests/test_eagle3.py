"""EAGLE-3: the target's aux features on every backend, training on token-only data, the vLLM / SGLang layout.

The aux features of a forward are the residual stream entering the named layers (Hugging Face's
``hidden_states[i]``): the same on transformers, our fp32 forward and (to int8 rounding) the native int8 one,
and bit for bit the same whether a row runs alone or shares a batched pass. An EAGLE-3 head trained through
``train_draft_head`` on token-only shards (features computed at training time) lowers its loss and drafts
losslessly; its export has the names, shapes and config keys vLLM's and SGLang's EAGLE-3 loaders read, and
the exported tensors, run as those engines run them, compute what the head computes. (Greedy equality with
``ar``, the sampling law and the unrolled training passes of random EAGLE-3 heads are in ``test_heads.py``.)
"""

import json

import pytest
import torch
import torch.nn.functional as F

import paradecode
from paradecode.backends import native
from paradecode.backends.hf import HFBackend
from paradecode.backends.int8_llama import Int8LlamaBackend
from paradecode.backends.llama import LlamaBackend
from paradecode.cli import main
from paradecode.errors import ParadecodeError
from paradecode.heads.eagle import HeadShape
from paradecode.heads.store import build_head, head_config, load_head, save_head, target_weights
from tiny import PROMPTS, shaped_llama, tiny_model_dir

SHAPE = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96)


def test_aux_features_are_the_inputs_of_the_layers_on_every_backend():
    model = shaped_llama(4, SHAPE, vocab=64, layers=4)
    ids = torch.randint(64, (30,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        states = model(ids[None], output_hidden_states=True).hidden_states  # [embeddings, after layer 0, ...]
    want = torch.cat([states[i][0] for i in (1, 3)], -1)  # the inputs of layers 1 and 3
    fp32 = LlamaBackend.from_hf(model).forward(ids, aux_layers=(1, 3), logits=False)
    torch.testing.assert_close(fp32.aux, want, atol=1e-5, rtol=1e-5)
    assert fp32.hidden is None  # aux features do not bring the last hidden state along
    torch.testing.assert_close(HFBackend(model).forward(ids, aux_layers=(1, 3)).aux, want, atol=1e-5, rtol=1e-5)
    int8 = Int8LlamaBackend.from_hf(model, calibration=[ids.tolist()])
    out = int8.forward(ids, aux_layers=(0, 1, 3), return_hidden=True)
    torch.testing.assert_close(out.aux[:, :64], states[0][0])  # layer 0's input: the embedding, exactly
    assert (out.aux[:, 64:] - want).abs().max() < 0.05 * want.abs().max()  # int8 rounding only
    assert out.hidden is not None and out.logits is not None
    for bad in ((3, 1), (1, 1), (4,), (-1,)):
        int8.reset()
        with pytest.raises(ValueError, match="aux_layers must be ascending indices of layers the pass runs"):
            int8.forward(ids, aux_layers=bad)
    with pytest.raises(ValueError, match="aux_layers must be"):
        LlamaBackend.from_hf(model).forward(ids, exit_layer=2, aux_layers=(3,))  # layer 3 does not run


@pytest.mark.skipif(native.load() is None, reason="the native int8 forward could not be built here")
def test_aux_features_of_a_row_do_not_depend_on_the_batch():
    model = shaped_llama(4, SHAPE, vocab=64, layers=4)
    backend = Int8LlamaBackend.from_hf(model, calibration=[list(range(40))])
    a, b = (torch.randint(64, (n,), generator=torch.Generator().manual_seed(n)) for n in (20, 33))
    alone = []
    for ids in (a, b):
        backend.reset()
        alone.append(backend.forward(ids, aux_layers=(1, 2)).aux)
    batcher = backend.batcher(4 << 20)
    import threading

    got = [None, None]

    def one(i, ids):
        with batcher.open(64) as sequence:
            got[i] = sequence.forward(ids, aux_layers=(1, 2)).aux

    threads = [threading.Thread(target=one, args=(i, ids)) for i, ids in enumerate((a, b))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert torch.equal(got[0], alone[0]) and torch.equal(got[1], alone[1])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """An EAGLE-3 head trained end to end on token-only shards of the int8 teacher's answers."""
    from paradecode.training.pipeline import train_draft_head
    from paradecode.training.selfdistill import DistillConfig
    from paradecode.training.trainer import TrainConfig

    root = tmp_path_factory.mktemp("eagle3")
    model_dir = tiny_model_dir(root / "target", seed=5)
    words = ["w%d" % i for i in range(2, 40)]
    prompts = [" ".join(words[i % 30 : i % 30 + 2 + i % 5]) for i in range(60)]
    config = TrainConfig(kind="eagle3", epochs=4, batch_size=4, lr=1e-2, draft_vocab=40, depth=2, eval_depth=3,
                         holdout=6, precision="fp32", aux_layers=(1,))
    cache = str(root / "cache")
    saved = train_draft_head("tiny", model_dir, [("mine", prompts)], root / "head", root / "data",
                             DistillConfig(max_new_tokens=20, batch_size=8, hidden=False), config,
                             cache_dir=cache, log=lambda m: None, progress=False)
    return model_dir, root / "head", saved, cache


def test_an_eagle3_head_trains_on_token_only_data_and_drafts_losslessly(trained):
    model_dir, head, saved, cache = trained
    assert "hidden" not in torch.load(sorted((head.parent / "data").glob("shard-*.pt"))[0])[0]
    assert saved["kind"] == "eagle3" and saved["aux_layers"] == [1] and saved["draft_vocab_size"] == 40
    history = saved["training"]["history"]
    assert history[-1]["loss"] < 0.7 * history[0]["loss"] and history[-1]["acceptance"][0] > 0.3
    model = paradecode.load(str(model_dir), backend="llama", dtype="int8", cache_dir=cache)
    accepted = 0
    for prompt in PROMPTS:
        expected = model.generate(prompt, max_new_tokens=24, method="ar").token_ids
        for options in ({"head": str(head)}, {"head": str(head), "tree": True, "schedule": "fixed"}):
            result = model.generate(prompt, max_new_tokens=24, method="eagle3", options=options)
            assert result.token_ids == expected, (prompt, options)
            accepted += result.stats.accepted_tokens
    assert accepted > 0
    with pytest.raises(ParadecodeError, match="holds a 'eagle3' head, but method 'eagle' needs"):
        model.generate(PROMPTS[0], max_new_tokens=4, method="eagle", options={"head": str(head)})


def test_the_eagle3_export_has_the_engines_layout_and_computes_the_same(tmp_path):
    """Names, shapes and config keys of vLLM's / SGLang's EAGLE-3 checkpoints (each engine's aux layer
    numbering), d2t mapping draft ids to target ids; then the exported tensors, run as those engines run an
    EAGLE-3 layer (norms on embedding and feature, [embedding ; feature] into q/k/v, the residual from the
    fused feature, final norm, own LM head), give the head's logits and its fed-back feature."""
    from safetensors.torch import load_file

    from paradecode.training.export import export_eagle

    model_dir = tiny_model_dir(tmp_path / "target", seed=5)
    target = target_weights(str(model_dir))
    torch.manual_seed(0)
    draft_ids = torch.tensor([7, 3, 30, 12, 5, 9])
    module = build_head("eagle3", HeadShape.from_target_config(target.config), num_layers=2, aux_layers=(1,),
                        draft_vocab=6)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.2 * torch.randn_like(p))
    save_head(tmp_path / "head", module, head_config(module, target, "tiny", draft_ids), draft_ids)
    head = load_head(tmp_path / "head", None, target)
    d, kv, vocab = 32, 2 * 8, target.config["vocab_size"]
    for engine, ids in (("vllm", [1]), ("sglang", [0])):  # the input of layer 1 = the output of layer 0
        config = export_eagle(head, target, tmp_path / engine, engine)
        assert json.loads((tmp_path / engine / "config.json").read_text()) == config
        assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["num_hidden_layers"] == 1
        assert config["draft_vocab_size"] == 6 and config["target_hidden_size"] == d and config["vocab_size"] == vocab
        assert config["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True}
        assert config.get("eagle_aux_hidden_state_layer_ids", ids) == ids and not config["tie_word_embeddings"]
    tensors = load_file(tmp_path / "vllm" / "model.safetensors")
    m = "midlayer."
    shapes = {"fc.weight": (d, d), m + "input_layernorm.weight": (d,), m + "hidden_norm.weight": (d,),
              m + "self_attn.q_proj.weight": (d, 2 * d), m + "self_attn.k_proj.weight": (kv, 2 * d),
              m + "self_attn.v_proj.weight": (kv, 2 * d), m + "self_attn.o_proj.weight": (d, d),
              m + "post_attention_layernorm.weight": (d,), m + "mlp.gate_proj.weight": (64, d),
              m + "mlp.up_proj.weight": (64, d), m + "mlp.down_proj.weight": (d, 64), "norm.weight": (d,),
              "lm_head.weight": (6, d), "d2t": (6,), "t2d": (vocab,)}
    assert {k: tuple(v.shape) for k, v in tensors.items()} == shapes
    assert torch.equal(torch.arange(6) + tensors["d2t"], draft_ids) and tensors["t2d"].sum() == 6
    assert tensors["t2d"][draft_ids].all()

    w = {k: v.float() for k, v in tensors.items()}
    eps, theta = target.config["rms_norm_eps"], target.config.get("rope_theta", 10000.0)
    tokens, aux = torch.randint(48, (7,)), torch.randn(7, d)
    embeds = target.embed[tokens]

    def norm(x, name):
        return F.rms_norm(x, (d,), w[name], eps)

    def rope(x):  # [T, H, 8]: rotate-half, pair i at position i
        angles = torch.arange(7)[:, None].float() / theta ** (torch.arange(0, 8, 2).float() / 8)
        cos, sin = torch.cat((angles, angles), -1).cos()[:, None], torch.cat((angles, angles), -1).sin()[:, None]
        return x * cos + torch.cat((-x[..., 4:], x[..., :4]), -1) * sin

    g = aux @ w["fc.weight"].t()
    x = torch.cat((norm(embeds, m + "input_layernorm.weight"), norm(g, m + "hidden_norm.weight")), -1)
    q = rope((x @ w[m + "self_attn.q_proj.weight"].t()).view(7, 4, 8)).transpose(0, 1)
    k = rope((x @ w[m + "self_attn.k_proj.weight"].t()).view(7, 2, 8)).transpose(0, 1).repeat_interleave(2, 0)
    v = (x @ w[m + "self_attn.v_proj.weight"].t()).view(7, 2, 8).transpose(0, 1).repeat_interleave(2, 0)
    attn = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1).reshape(7, d)
    h = g + attn @ w[m + "self_attn.o_proj.weight"].t()
    n = norm(h, m + "post_attention_layernorm.weight")
    prenorm = h + (F.silu(n @ w[m + "mlp.gate_proj.weight"].t()) * (n @ w[m + "mlp.up_proj.weight"].t())) @ \
        w[m + "mlp.down_proj.weight"].t()
    logits = norm(prenorm, "norm.weight") @ w["lm_head.weight"].t()
    with torch.no_grad():
        ours, _ = head.module(embeds[None], head.module.fuse(aux[None]), torch.arange(7)[None],
                              torch.ones(7, 7, dtype=torch.bool).tril()[None])
        torch.testing.assert_close(prenorm, ours[0], atol=2e-2, rtol=2e-2)  # fp16 export of fp16-stored weights
        torch.testing.assert_close(logits, head.module.draft_logits(ours[0]), atol=3e-2, rtol=3e-2)


def test_an_eagle3_head_reading_the_embedding_is_not_exported(tmp_path):
    from paradecode.training.export import export_eagle

    model_dir = tiny_model_dir(tmp_path / "target", seed=5)
    target = target_weights(str(model_dir))
    module = build_head("eagle3", HeadShape.from_target_config(target.config), num_layers=2)  # default: (0, 1)
    save_head(tmp_path / "head", module, head_config(module, target, "tiny", None), None)
    with pytest.raises(ParadecodeError, match="reads the embedding"):
        export_eagle(load_head(tmp_path / "head", "eagle3", target), target, tmp_path / "out")


@pytest.mark.parametrize("args, message", [
    (["--kind", "eagle", "--aux-layers", "1,2"], "--aux-layers applies to --kind eagle3 and parallel only"),
    (["--kind", "eagle3", "--aux-layers", "one"], "--aux-layers must be comma-separated layer numbers"),
    (["--kind", "eagle3", "--labels", "soft"], "eagle3 heads train on hard labels only"),
    (["--kind", "eagle3", "--shard-size", "-1"], "--shard-size must be >= 0"),
])
def test_train_draft_refuses_bad_eagle3_arguments(tmp_path, capsys, args, message):
    assert main(["train-draft", *args, "--out", str(tmp_path / "head")]) == 2
    assert message in capsys.readouterr().err


def test_bad_aux_layers_are_refused_clearly():
    shape = HeadShape(hidden_size=32, vocab_size=48, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=64)
    for bad in ((2, 1), (0, 30), (1, 1)):
        with pytest.raises(ParadecodeError, match="EAGLE-3 aux layers must be ascending layer indices"):
            build_head("eagle3", shape, num_layers=30, aux_layers=bad)


def test_teacher_forced_acceptance_ranks_a_trained_head_above_a_fresh_one(trained, tmp_path):
    from paradecode.training.acceptance import evaluate_heads

    model_dir, head, _, cache = trained
    target = target_weights(str(model_dir))
    fresh = build_head("eagle3", HeadShape.from_target_config(target.config), num_layers=2, aux_layers=(1,),
                       draft_vocab=40)
    ids = load_head(head, "eagle3", target).draft_ids
    save_head(tmp_path / "fresh", fresh, head_config(fresh, target, "tiny", ids), ids)
    model = paradecode.load(str(model_dir), backend="llama", dtype="int8", cache_dir=cache)
    prompts = [model.encode(p) for p in ("w3 w4 w5", "w9 w10", "w20 w21 w22 w23", "w31 w32")]
    results = evaluate_heads(model, model_dir, [str(head), str(tmp_path / "fresh")], prompts, 20, 3,
                             log=lambda m: None)
    for r in results:
        shares = r["acceptance"]
        assert len(shares) == 3 and all(0 <= b <= a <= 1 for a, b in zip(shares, shares[1:]))
        assert r["tau_chain"] == pytest.approx(1 + sum(shares))
        assert r["draft_step_ms"] > 0 and r["target_forward_ms"] > 0 and r["ratio"] > 0
        assert [1.0 <= t <= length + 1 for length, t in enumerate(r["tau_decode"], 1)] == [True] * 3
    assert results[0]["acceptance"][0] > results[1]["acceptance"][0] + 0.2
    assert results[0]["tau_decode"][-1] > results[1]["tau_decode"][-1] + 0.2  # decoding gains what it accepts


def test_eval_draft_refuses_a_folder_that_is_not_a_head(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["eval-draft", "--head", str(tmp_path / "empty")]) == 2
    assert "is not a head folder" in capsys.readouterr().err


def test_a_parallel_head_trains_on_token_only_data_drafts_losslessly_and_is_timed_as_one_forward(tmp_path):
    """``train-draft --kind parallel`` end to end on a tiny target: the loss falls, the deeper mask rows learn
    (held-out acceptance at depth 2 beats a fresh head's), drafting equals ``ar``, eval-draft times one step
    as the forward of depth rows, and the head has no serving-engine layout (a clear error)."""
    from paradecode.training.acceptance import evaluate_heads
    from paradecode.training.export import export_eagle
    from paradecode.training.pipeline import train_draft_head
    from paradecode.training.selfdistill import DistillConfig
    from paradecode.training.trainer import TrainConfig

    model_dir = tiny_model_dir(tmp_path / "target", seed=5)
    words = ["w%d" % i for i in range(2, 40)]
    prompts = [" ".join(words[i % 30 : i % 30 + 2 + i % 5]) for i in range(60)]
    config = TrainConfig(kind="parallel", epochs=4, batch_size=4, lr=1e-2, draft_vocab=40, depth=3, eval_depth=3,
                         holdout=6, precision="fp32", aux_layers=(1,))
    cache = str(tmp_path / "cache")
    saved = train_draft_head("tiny", model_dir, [("mine", prompts)], tmp_path / "head", tmp_path / "data",
                             DistillConfig(max_new_tokens=20, batch_size=8, hidden=False), config,
                             cache_dir=cache, log=lambda m: None, progress=False)
    assert saved["kind"] == "parallel" and saved["aux_layers"] == [1]
    history = saved["training"]["history"]
    assert history[-1]["loss"] < 0.85 * history[0]["loss"]  # (each epoch's last batch: noisy)
    target = target_weights(str(model_dir))
    fresh = build_head("parallel", HeadShape.from_target_config(target.config), num_layers=2, aux_layers=(1,),
                       draft_vocab=40)
    ids = load_head(tmp_path / "head", "parallel", target).draft_ids
    save_head(tmp_path / "fresh", fresh, head_config(fresh, target, "tiny", ids), ids)
    model = paradecode.load(str(model_dir), backend="llama", dtype="int8", cache_dir=cache)
    questions = [model.encode(p) for p in ("w3 w4 w5", "w9 w10", "w20 w21 w22 w23", "w31 w32")]
    trained, untrained = evaluate_heads(model, model_dir, [str(tmp_path / "head"), str(tmp_path / "fresh")],
                                        questions, 20, 3, log=lambda m: None)
    assert trained["acceptance"][1] > untrained["acceptance"][1] + 0.1
    assert trained["draft_tokens"] == 4 and trained["draft_step_ms"] > 0
    accepted = 0
    for prompt in PROMPTS:
        expected = model.generate(prompt, max_new_tokens=24, method="ar").token_ids
        for options in ({"head": str(tmp_path / "head")}, {"head": str(tmp_path / "head"), "tree": True,
                                                            "schedule": "fixed"}):
            result = model.generate(prompt, max_new_tokens=24, method="parallel", options=options)
            assert result.token_ids == expected, (prompt, options)
            accepted += result.stats.accepted_tokens
    assert accepted > 0
    with pytest.raises(ParadecodeError, match="only EAGLE and EAGLE-3 heads have a serving-engine format"):
        export_eagle(load_head(tmp_path / "head", None, target), target, tmp_path / "out")
