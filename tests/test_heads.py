"""Trained-head drafters (eagle, eagle3, parallel, medusa): lossless with random heads, exact under sampling, heads load safely.

Greedy output equals ``ar`` token for token on tiny random models with randomly initialised heads (chains,
trees, a draft vocabulary, EOS inside drafts, chain-only backends); sampled outputs follow the target's
two-token law (chi-squared); EAGLE's tree forwards give each node the features of its branch run as a
sequence, and the unrolled training passes compute exactly what drafting computes; a bad head is refused
with a clear error.
"""

from types import SimpleNamespace

import pytest
import torch
from scipy.stats import chisquare

from paradecode.backends.base import causal_mask
from paradecode.backends.llama import LlamaBackend
from paradecode.config import GenerationConfig, SamplingConfig
from paradecode.engine import decode
from paradecode.errors import ParadecodeError
from paradecode.heads.eagle import EagleCache, HeadShape
from paradecode.heads.store import build_head, head_config, save_head, target_weights
from paradecode.registry import get_method
from paradecode.stats import DecodeStats
from paradecode.verify.base import Verdict
from tiny import PROMPTS, WORDS, ChainOnly, tiny_model_dir, two_token_joint


def make_head(kind: str, model_dir, folder, seed: int = 0, draft_ids=None, scale: float = 1.0):
    """A randomly initialised head for the model in ``model_dir``, saved to ``folder``."""
    weights = target_weights(str(model_dir))
    torch.manual_seed(seed)
    module = build_head(kind, HeadShape.from_target_config(weights.config), num_heads=3,
                        num_layers=weights.config["num_hidden_layers"],
                        draft_vocab=len(draft_ids) if draft_ids is not None else 0)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * scale / p.shape[-1] ** 0.5 if p.dim() > 1 else 1 + 0.1 * torch.randn_like(p))
    save_head(folder, module, head_config(module, weights, "tiny", draft_ids), draft_ids)
    return folder


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    model_dir = tiny_model_dir(tmp_path_factory.mktemp("target"), seed=3)
    heads = {}
    for kind in ("eagle", "eagle3", "parallel", "medusa"):
        heads[kind] = make_head(kind, model_dir, tmp_path_factory.mktemp(kind), seed=1)
        subset = torch.randperm(len(WORDS), generator=torch.Generator().manual_seed(2))[:30]
        heads[kind + "-vocab"] = make_head(kind, model_dir, tmp_path_factory.mktemp(kind + "v"), 2, subset)
    return SimpleNamespace(model_dir=model_dir, heads=heads, backend=LlamaBackend.from_pretrained(model_dir))


def generate(setup, method, prompt, head="", backend=None, max_new_tokens=24, temperature=0.0, seed=0, eos=(),
             **options):
    context = SimpleNamespace(model_dir=setup.model_dir, name="tiny")
    if method != "ar":
        options["head"] = str(setup.heads[head or method])
    drafter = get_method(method).create(options, context=context)
    config = GenerationConfig(max_new_tokens=max_new_tokens, sampling=SamplingConfig(temperature=temperature, seed=seed))
    stats = DecodeStats()
    out = [t for step in decode(backend or setup.backend, drafter, prompt, config, eos_ids=frozenset(eos),
                                stats=stats) for t in step]
    return out, stats


FIXED = {"schedule": "fixed"}  # the whole tree every step (the cost schedule cuts trees of random heads short)
CASES = [("eagle", "", {"tree": True, "depth": 6, **FIXED}), ("eagle", "", {"depth": 4, **FIXED}),
         ("eagle", "", {}), ("medusa", "", {"schedule": "heuristic"}),
         ("eagle", "eagle-vocab", {"tree": True, "budget": 7, **FIXED}),
         ("eagle", "", {"tree": True, "budget": 30, "branching": 2, "width": 6, "depth": 8}),
         ("medusa", "", {"tree": True, **FIXED}), ("medusa", "", {}), ("medusa", "", {"tree": True}),
         ("medusa", "medusa-vocab", {"tree": True, "branching": 5, **FIXED}),
         ("eagle", "eagle-vocab", {"tree": True, "draft_vocab": 10, **FIXED}),
         ("eagle", "", {"tree": True, "head_dtype": "fp32", **FIXED}), ("medusa", "", {"head_dtype": "fp32", **FIXED}),
         ("eagle3", "", {"tree": True, "depth": 6, **FIXED}), ("eagle3", "", {"depth": 4, **FIXED}), ("eagle3", "", {}),
         ("eagle3", "eagle3-vocab", {"tree": True, "budget": 7, **FIXED}),
         ("eagle3", "eagle3-vocab", {"tree": True, "draft_vocab": 10, "head_dtype": "fp32", **FIXED}),
         ("parallel", "", {"depth": 5, **FIXED}), ("parallel", "", {}), ("parallel", "", {"tree": True, **FIXED}),
         ("parallel", "", {"tree": True, "budget": 9, "depth": 12, "branching": 2, **FIXED}),
         ("parallel", "parallel-vocab", {"tree": True, "draft_vocab": 10, "head_dtype": "fp32", **FIXED})]


@pytest.mark.parametrize("method,head,options", CASES)
def test_greedy_equals_autoregressive(setup, method, head, options):
    drafted = accepted = 0
    for prompt in PROMPTS:
        for max_new in (1, 7, 40):
            expected, _ = generate(setup, "ar", prompt, max_new_tokens=max_new)
            got, stats = generate(setup, method, prompt, head, max_new_tokens=max_new, **options)
            assert got == expected, (method, options, prompt, max_new)
            assert stats.new_tokens == max_new and stats.forward_passes == len(stats.steps) <= max_new
            drafted += stats.drafted_tokens
            accepted += stats.accepted_tokens
    assert 0 < drafted and accepted < drafted  # drafts are made and (random heads) mostly rejected
    if options.get("schedule") == "fixed":
        assert accepted > 0 or not options.get("tree")  # trees of random heads hit the target's token at times


@pytest.mark.parametrize("method", ["eagle", "eagle3", "parallel", "medusa"])
def test_eos_inside_a_draft_and_chain_only_backends(setup, method):
    for prompt in PROMPTS[:3]:
        reference, _ = generate(setup, "ar", prompt, max_new_tokens=30)
        for eos_at in (0, 5):
            expected, _ = generate(setup, "ar", prompt, max_new_tokens=30, eos=[reference[eos_at]])
            got, stats = generate(setup, method, prompt, max_new_tokens=30, eos=[reference[eos_at]])
            assert got == expected and stats.stop_reason == "eos"
        got, stats = generate(setup, method, prompt, backend=ChainOnly(setup.backend), max_new_tokens=30)
        assert got == reference and all(s.parents is None for s in stats.steps)


@pytest.mark.parametrize("method,tree", [("eagle", True), ("medusa", True), ("eagle", False), ("eagle3", True),
                                         ("parallel", True), ("parallel", False)])
def test_sampling_through_the_engine_matches_the_model(tmp_path, method, tree):
    """The first two tokens sampled with a random head and a draft vocabulary (trees of branching 3) follow
    the target's joint law p(a) p(b | a)."""
    vocab, prompt, runs = 8, [1, 2, 3], 1500
    model_dir = tiny_model_dir(tmp_path / "target", seed=7, words=WORDS[:vocab])
    make_head(method, model_dir, tmp_path / "head", seed=4, draft_ids=torch.tensor([5, 2, 7, 0, 3, 6]), scale=0.3)
    target = LlamaBackend.from_pretrained(model_dir)
    joint = two_token_joint(target, prompt, vocab)  # [V, V]
    setup = SimpleNamespace(model_dir=model_dir, heads={method: tmp_path / "head"}, backend=target)
    counts = torch.zeros(vocab, vocab)
    accepted = 0
    for seed in range(runs):
        out, stats = generate(setup, method, prompt, max_new_tokens=3, temperature=1.0, seed=seed,
                              tree=tree, budget=6, branching=3, width=3, depth=3)
        counts[out[0], out[1]] += 1
        accepted += stats.accepted_tokens
    assert accepted > runs // 10  # drafts are accepted often enough for the test to see them
    expected = joint.flatten() * runs
    keep = expected >= 5
    obs, exp = counts.flatten()[keep], expected[keep]
    assert chisquare(obs.numpy(), (exp * obs.sum() / exp.sum()).numpy()).pvalue > 1e-3


@pytest.mark.parametrize("native", [False, True], ids=["torch", "native"])
def test_eagle_tree_children_rank_by_their_branch_logits(setup, native, monkeypatch):
    """Greedy tree: every node's children are the top tokens of the head run on the node's branch as a plain
    sequence of pairs (no tree mask), so the tree forwards' masks and positions are right; on the PyTorch head
    and on the native one (heads/eagle_native.py), whose rows do not depend on the pass they ride in."""
    from paradecode.backends import native as native_kernels
    from paradecode.drafters.base import DecodeState
    from paradecode.drafters.head_drafter import HeadRuntime

    if native and native_kernels.load() is None:
        pytest.skip("the native kernels are not built here")
    if not native:
        monkeypatch.setattr(HeadRuntime, "native_layer", lambda self, max_len: None)
    context = SimpleNamespace(model_dir=setup.model_dir, name="tiny")
    drafter = get_method("eagle").create({"head": str(setup.heads["eagle"]), "tree": True, "budget": 20,
                                          "branching": 3, "width": 4, "depth": 6}, context)
    prompt = [4, 8, 15, 16, 23, 42, 7]
    backend = setup.backend
    backend.reset()
    hidden = backend.forward(torch.tensor(prompt[:-1]), return_hidden=True).hidden  # [P-1, D]
    state = DecodeState(tokens=list(prompt), prompt_len=len(prompt), sampling=SamplingConfig(),
                        rng=torch.Generator(), max_draft=8, target=backend, prompt_hidden=hidden)
    drafter.begin(state)
    proposal = drafter.propose(state)
    assert proposal.parents is not None and len(proposal.tokens) == 20
    assert max(_depth(proposal.parents, n) for n in range(20)) >= 3
    runtime, module = drafter.runtime, drafter.module
    for node in [-1] + list(range(20)):
        children = [proposal.tokens[c] for c, p in enumerate(proposal.parents) if p == node]
        if not children:
            continue
        path, n = [], node
        while n >= 0:
            path.insert(0, proposal.tokens[n])
            n = proposal.parents[n]
        if native:  # the branch as a plain sequence of pairs on a native layer of its own
            layer = runtime.native_layer(64)
            out, logits = layer(torch.cat((runtime.embed[torch.tensor(prompt[1:])], hidden.float()), -1), None, None)
            for token in path:
                out, logits = layer(torch.cat((runtime.embed[token], out[-1]))[None], None, None)
            logits = logits[-1]
        else:
            cache = EagleCache(module.shape, 64)
            with torch.no_grad():
                out, _ = module(runtime.embed[torch.tensor(prompt[1:])][None], hidden[None],
                                torch.arange(len(prompt) - 1)[None], causal_mask(0, len(prompt) - 1)[None],
                                cache=cache)
                feature = out[0, -1]
                for token in path:
                    out, _ = module(runtime.embed[torch.tensor([token])][None], feature[None, None],
                                    torch.tensor([[cache.length]]), None, cache=cache)
                    feature = out[0, -1]
            logits = runtime.draft_logits(feature)
        top = torch.topk(logits, len(children)).indices.tolist()
        assert top == children, (node, path)


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_a_native_feed_that_skips_rows_gives_them_the_same_bits(setup, kind):
    """A catch-up feed reading only its last pair's draft logits (``skip``) runs one pass whose other rows skip the
    LM head: the output features, the last logits and the cache left behind are those of a feed reading every
    row's logits; the rows fed are left as they were. A skip that leaves no row is a clear error."""
    from paradecode.backends import native
    from paradecode.drafters.head_drafter import load_runtime

    if native.load() is None:
        pytest.skip("the native kernels are not built here")
    runtime = load_runtime(str(setup.heads[kind].resolve()), kind, str(setup.model_dir.resolve()), 0, "int8")
    d = runtime.head.module.shape.hidden_size
    generator = torch.Generator().manual_seed(9)
    pairs = torch.cat((runtime.embed[torch.randint(runtime.vocab, (8,), generator=generator)],
                       torch.randn(8, d, generator=generator)), -1)  # [8, 2D]
    given = pairs.clone()
    results = []
    for skip in (0, 5, 7):
        layer = runtime.native_layer(64)
        out, logits = layer(pairs, None, None, skip=skip)
        assert logits.shape[0] == 8 - skip and layer.length == 8
        after = layer(pairs[:1], None, None)  # a step after the feed reads the cache it left
        results.append((skip, out, logits, after))
    assert torch.equal(pairs, given), "a feed wrote into the caller's rows (EAGLE-3: a one-row feature half)"
    _, out0, logits0, after0 = results[0]
    for skip, out, logits, after in results[1:]:
        assert torch.equal(out, out0) and torch.equal(logits, logits0[skip:])
        assert torch.equal(after[0], after0[0]) and torch.equal(after[1], after0[1])
    with pytest.raises(ValueError, match="skip"):
        runtime.native_layer(64)(pairs, None, None, skip=8)


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_unrolled_training_passes_compute_what_drafting_computes(setup, kind):
    """Pass k of the training unroll at position r + k - 2 equals the depth-k chain draft from root r (EAGLE-3:
    pass 1 reads the target's aux features, deeper passes the head's own outputs)."""
    from paradecode.training.losses import Batch, eagle_passes

    weights = target_weights(str(setup.model_dir))
    torch.manual_seed(0)
    module = build_head(kind, HeadShape.from_target_config(weights.config), num_layers=2)
    with torch.no_grad():  # away from the identity start, so that fc and the layer matter
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))
    tokens = torch.randint(2, len(WORDS), (14,))
    backend = setup.backend
    backend.reset()
    out = backend.forward(tokens, return_hidden=True, aux_layers=module.aux_layers)
    hidden = out.aux if module.aux_layers else out.hidden  # [T, D] or [T, A*D]
    batch = Batch(tokens[None].repeat(2, 1), hidden[None].repeat(2, 1, 1), torch.tensor([14, 14]),
                  torch.tensor([3, 7]))  # passes >= 2 start at the shortest prompt's last token (root 2)
    with torch.no_grad():
        passes = eagle_passes(module, weights.embed, batch, depth=3)
        for root in (2, 4, 9):
            cache = EagleCache(module.shape, 64)
            out, _ = module(weights.embed[tokens[1 : root + 1]][None], module.fuse(hidden[None, :root]),
                            torch.arange(root)[None], causal_mask(0, root)[None], cache=cache)  # true pairs 0..root-1
            feature = out[0, -1]
            for k in range(1, 4):
                for row in (0, 1):
                    torch.testing.assert_close(passes[k - 1][row, root + k - 2], feature, atol=1e-5, rtol=1e-5)
                out, _ = module(weights.embed[tokens[root + k : root + k + 1]][None], feature[None, None],
                                torch.tensor([[root + k - 1]]), None, cache=cache)
                feature = out[0, -1]


def test_parallel_training_passes_are_the_mask_rows_drafting_runs_in_one_forward(setup):
    """Pass k of a parallel head's training unroll at position r + k - 2 equals row k - 1 of the one forward
    the drafter runs from root r (the pairs 0..r-1, then mask rows), and a drafting step is one head forward
    whatever its depth; deeper passes differ from EAGLE-3's (they read mask rows, not the head's outputs)."""
    from paradecode.drafters.base import DecodeState
    from paradecode.training.losses import Batch, eagle_passes

    weights = target_weights(str(setup.model_dir))
    torch.manual_seed(0)
    module = build_head("parallel", HeadShape.from_target_config(weights.config), num_layers=2)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))
    tokens = torch.randint(2, len(WORDS), (14,))
    backend = setup.backend
    backend.reset()
    aux = backend.forward(tokens, return_hidden=True, aux_layers=module.aux_layers).aux  # [T, A*D]
    batch = Batch(tokens[None].repeat(2, 1), aux[None].repeat(2, 1, 1), torch.tensor([14, 14]), torch.tensor([3, 7]))
    with torch.no_grad():
        passes = eagle_passes(module, weights.embed, batch, depth=4)
        for root in (2, 5, 9):
            fused = module.fuse(aux[:root])
            embeds, features = module.mask_rows(3, fused[-1])
            embeds = torch.cat((weights.embed[tokens[1 : root + 1]], embeds))
            features = torch.cat((fused, features))
            out, _ = module(embeds[None], features[None], torch.arange(root + 3)[None],
                            causal_mask(0, root + 3)[None], cache=EagleCache(module.shape, 64))
            for k in range(1, 5):
                for row in (0, 1):
                    torch.testing.assert_close(passes[k - 1][row, root + k - 2], out[0, root - 2 + k], atol=1e-5,
                                               rtol=1e-5)
        eagle3 = build_head("eagle3", module.shape, num_layers=2)
        eagle3.load_state_dict({k: v for k, v in module.state_dict().items() if k != "mask_embed"})
        chained = eagle_passes(eagle3, weights.embed, batch, depth=2)
        torch.testing.assert_close(chained[0], passes[0])  # pass 1 is EAGLE-3's
        assert not torch.allclose(chained[1][:, 8:], passes[1][:, 8:])

    context = SimpleNamespace(model_dir=setup.model_dir, name="tiny")
    for depth in (2, 6):
        drafter = get_method("parallel").create({"head": str(setup.heads["parallel"]), "depth": depth,
                                                 "schedule": "fixed"}, context)
        prompt = tokens[:8].tolist()
        backend.reset()
        hidden = backend.forward(torch.tensor(prompt[:-1]), aux_layers=drafter.aux_layers).aux
        state = DecodeState(tokens=prompt, prompt_len=len(prompt), sampling=SamplingConfig(), rng=torch.Generator(),
                            max_draft=8, target=backend, prompt_hidden=hidden)
        drafter.begin(state)
        proposal = drafter.propose(state)
        assert len(proposal.tokens) == depth and drafter.draft_forward_passes == 1
        assert drafter.cache.length == len(prompt) - 1  # the prompt's pairs stay, the mask rows do not


def _depth(parents, node):
    depth = 0
    while node >= 0:
        depth, node = depth + 1, parents[node]
    return depth


@pytest.mark.parametrize("method", ["eagle", "eagle3", "parallel", "medusa"])
def test_copies_draft_where_the_text_repeats_and_the_head_elsewhere(setup, method):
    """``lookup``: where the last 2+ tokens occurred before, the step drafts what followed them (up to
    ``lookup_draft`` tokens) and runs no head forward; elsewhere the head drafts. The output is ar's; a copy's
    verdict is not the head's."""
    prompt = PROMPTS[0] * 3  # the prompt repeats: copies from the first step on
    expected, _ = generate(setup, "ar", prompt, max_new_tokens=60)
    context = SimpleNamespace(model_dir=setup.model_dir, name="tiny")
    drafter = get_method(method).create({"head": str(setup.heads[method]), "schedule": "fixed", "depth": 2,
                                         "lookup_draft": 3}, context)
    copies, scheduled, passes = [], [], []
    copy_draft, proposed = drafter.copy_draft, drafter.finish

    def counting_copy(state):
        passes.append(drafter.draft_forward_passes)  # head forwards before this step
        copied = copy_draft(state)
        copies.append(copied is not None)
        assert copied is None or 1 <= len(copied.tokens) <= 3 and copied.parents is None
        return copied

    def counting_finish(proposal):
        scheduled.append(len(proposal.tokens))
        return proposed(proposal)

    drafter.copy_draft, drafter.finish = counting_copy, counting_finish
    stats = DecodeStats()
    config = GenerationConfig(max_new_tokens=60, sampling=SamplingConfig(temperature=0.0))
    assert [t for step in decode(setup.backend, drafter, prompt, config, stats=stats) for t in step] == expected
    assert any(copies) and not all(copies)  # both kinds of step ran
    assert len(scheduled) <= copies.count(False)  # the head's schedule sees its own steps only
    passes.append(drafter.draft_forward_passes)
    assert all(passes[i + 1] == passes[i] for i, copied in enumerate(copies) if copied)  # a copy runs no head
    assert passes[-1] > 0
    assert sum(len(s.drafted) for s in stats.steps) > sum(scheduled)  # the copies' tokens went out too


@pytest.mark.parametrize("method", ["eagle", "parallel", "medusa"])
def test_bad_lookup_options_are_refused_clearly(method):
    with pytest.raises(ParadecodeError, match="lookup"):
        get_method(method).Options(lookup=-1)
    with pytest.raises(ParadecodeError, match="lookup_draft"):
        get_method(method).Options(lookup_draft=0)


@pytest.mark.parametrize("method", ["eagle", "medusa"])
def test_bad_head_dtype_is_refused_clearly(method):
    with pytest.raises(ParadecodeError, match="head_dtype must be one of int8, fp32"):
        get_method(method).Options(head_dtype="bf16")


def test_a_parallel_draft_deeper_than_the_heads_mask_rows_is_refused_clearly():
    with pytest.raises(ParadecodeError, match="parallel option depth must be <= 16"):
        get_method("parallel").Options(depth=17)
    assert get_method("parallel").Options(depth=16).depth == 16


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "parallel"])
def test_the_native_eagle_step_computes_the_heads_forward(setup, kind):
    """The draft step on the native forward (heads/eagle_native.py) is the head's layer: its output features and
    draft logits follow the fp32 PyTorch head's on the same pairs, for a causal run of pairs and for two tree
    siblings at one position under a mask (int8 weights and activations, half-float keys and values: close, not
    equal). A wrong RoPE table, a norm where the head has none (EAGLE) or lacks one (EAGLE-3: its two input
    norms, its final norm before the LM head but not on the output feature) or a mask read the wrong way fails it."""
    from paradecode.backends import native
    from paradecode.drafters.head_drafter import load_runtime

    if native.load() is None:
        pytest.skip("the native kernels are not built here")
    runtime = load_runtime(str(setup.heads[kind].resolve()), kind, str(setup.model_dir.resolve()), 0, "int8")
    head, layer = runtime.head.module, runtime.native_layer(64)
    assert layer is not None and load_runtime(str(setup.heads[kind].resolve()), kind,
                                              str(setup.model_dir.resolve()), 0, "fp32").native_layer(64) is None
    generator = torch.Generator().manual_seed(5)
    t, d = 9, head.shape.hidden_size
    tokens = torch.randint(runtime.vocab, (t + 2,), generator=generator)
    features = torch.randn(t + 2, d, generator=generator)  # [T + 2, D]
    embeds = runtime.embed[tokens]
    cache = EagleCache(head.shape, 64)
    positions = torch.cat((torch.arange(t), torch.tensor([t, t])))  # two siblings at position t
    mask = torch.ones(2, t + 2, dtype=torch.bool)
    mask[0, t + 1] = mask[1, t] = False  # each sibling sees the committed pairs and itself
    with torch.no_grad():
        causal, _ = head(embeds[None, :t], features[None, :t], positions[None, :t], causal_mask(0, t)[None], cache)
        tree, _ = head(embeds[None, t:], features[None, t:], positions[None, t:], mask[None], cache)
    expected = torch.cat((causal[0], tree[0]))  # [T + 2, D]
    out, logits = layer(torch.cat((embeds[:t], features[:t]), -1), None, None)
    out_tree, logits_tree = layer(torch.cat((embeds[t:], features[t:]), -1), positions[t:], mask)
    out, logits = torch.cat((out, out_tree)), torch.cat((logits, logits_tree))
    assert ((out - expected).norm(dim=-1) / expected.norm(dim=-1)).max() < 0.05
    with torch.no_grad():
        expected_logits = head.draft_logits(expected, runtime.lm_rows)  # [T + 2, Vd]
    assert ((logits - expected_logits).norm(dim=-1) / expected_logits.norm(dim=-1)).max() < 0.05
    assert (logits.argmax(-1) == expected_logits.argmax(-1)).float().mean() >= 0.9


def test_calibration_counts_judged_nodes_and_chains_path_chances():
    from paradecode.drafters.base import Proposal
    from paradecode.drafters.head_drafter import Calibration

    calibration = Calibration()  # starts calibrated: a 0.95 confidence is a 0.95 chance
    tree = Proposal(tokens=[5, 6, 7, 8], parents=[-1, 0, -1, 2], confidences=[0.95, 0.55, 0.05, 0.9])
    assert calibration.path_chances(tree.confidences, tree.node_parents) == pytest.approx([0.95, 0.95 * 0.55, 0.05, 0.05 * 0.95])
    # judged: 0 (hit), 1 (hit), 2 (miss); 3's parent was rejected
    calibration.update(tree, Verdict(accepted=[0, 1], accepted_tokens=[5, 6], next_token=9, bonus=True))
    assert calibration.seen[9] == 5 and calibration.hits[9] == pytest.approx(0.95 * 4 + 1)
    assert calibration.seen[5] == 5 and calibration.hits[5] == pytest.approx(0.55 * 4 + 1)
    assert calibration.seen[0] == 5 and calibration.hits[0] == pytest.approx(0.05 * 4)
    for _ in range(40):  # a head whose 0.9+ confidences always fail
        calibration.update(Proposal(tokens=[1], confidences=[0.97]), Verdict([], [], 2, False))
    assert calibration.path_chances([0.97, 0.5], [-1, 0])[0] < 0.15


def test_calibration_judges_the_nodes_a_cut_left_out():
    """A node the cut left out is judged like a sent one: when its parent is the root or an accepted node, it is
    a hit if its token is what the target committed after that parent. So a confidence bin whose nodes are
    always cut still learns how often they would have been accepted."""
    from paradecode.drafters.base import Proposal
    from paradecode.drafters.head_drafter import Calibration

    drafted = Proposal(tokens=[5, 6, 7, 8, 4], parents=[-1, 0, -1, 2, 0], confidences=[0.95, 0.15, 0.15, 0.15, 0.25])
    sent = Proposal(tokens=[5], parents=[-1], confidences=[0.95])  # the cut kept node 0
    calibration = Calibration()
    # node 0 accepted, then the target committed 6: node 1 (6, parent 0) a hit, node 4 (4, parent 0) a miss,
    # node 2 (7, the root's child) a miss (the target's token there was 5), node 3's parent 2 was not accepted
    calibration.update(sent, Verdict(accepted=[0], accepted_tokens=[5], next_token=6, bonus=True), drafted)
    assert calibration.seen[1] == 4 + 2 and calibration.hits[1] == pytest.approx(0.15 * 4 + 1)
    assert calibration.seen[2] == 4 + 1 and calibration.hits[2] == pytest.approx(0.25 * 4)
    assert calibration.seen[9] == 5 and calibration.hits[9] == pytest.approx(0.95 * 4 + 1)
    for _ in range(60):  # a bin of nodes that are always cut, and right half of the time
        right = _ % 2 == 0
        calibration.update(Proposal(tokens=[], confidences=[]), Verdict([], [], 3 if right else 2, False),
                           Proposal(tokens=[3], confidences=[0.05]))
    assert 0.4 < calibration.path_chances([0.05], [-1])[0] < 0.6
    before = list(calibration.seen)
    calibration.update(sent, Verdict([], [], 2, False), None)  # no cut: only the sent nodes are judged
    assert sum(calibration.seen) == sum(before) + 1


@pytest.mark.parametrize("method", ["eagle", "medusa"])
def test_cost_schedule_cuts_greedy_trees_of_a_random_head(setup, method):
    """Greedy under the cost schedule: the tree is cut to the nodes worth their verify time, so a random head
    (almost never right) ends up drafting far less than the fixed tree; the output is unchanged."""
    options = {"tree": True, "budget": 12, "depth": 4, "lookup": 0}  # the head's own drafts, no copies
    prompt = PROMPTS[4]
    expected, _ = generate(setup, "ar", prompt, max_new_tokens=60)
    cut, cut_stats = generate(setup, method, prompt, max_new_tokens=60, **options)
    full, full_stats = generate(setup, method, prompt, max_new_tokens=60, **options, **FIXED)
    assert cut == full == expected
    assert cut_stats.drafted_tokens < full_stats.drafted_tokens / 2


@pytest.mark.parametrize("method", ["medusa", "parallel"])
def test_a_head_whose_cuts_keep_nothing_rests(setup, method):
    """Greedy under the cost schedule with a random head: after cuts that keep nothing the head skips steps
    (1, 2, 4, ...), so it runs in far fewer steps than the fixed schedule's every one; the output is ar's."""
    from paradecode.drafters.head_drafter import HeadDrafter

    prompt, new = PROMPTS[4], 120
    expected, _ = generate(setup, "ar", prompt, max_new_tokens=new)
    runs = {}
    for schedule in ("cost", "fixed"):
        context = SimpleNamespace(model_dir=setup.model_dir, name="tiny")
        drafter = get_method(method).create({"head": str(setup.heads[method]), "schedule": schedule, "lookup": 0},
                                            context)
        stats = DecodeStats()
        config = GenerationConfig(max_new_tokens=new, sampling=SamplingConfig(temperature=0.0))
        out = [t for step in decode(setup.backend, drafter, prompt, config, stats=stats) for t in step]
        assert out == expected
        runs[schedule] = (drafter.draft_forward_passes, len(stats.steps))
    (cost_passes, cost_steps), (fixed_passes, fixed_steps) = runs["cost"], runs["fixed"]
    assert fixed_passes == fixed_steps - 1  # (the last step drafts nothing: no token budget left)
    assert cost_passes < cost_steps / 3
    assert HeadDrafter.MAX_REST >= 8


def test_int8_heads_quantize_every_linear_but_fc_including_the_draft_lm_head(setup):
    """head_dtype=int8: every linear layer runs int8 except EAGLE's ``fc``, which reads the target's features
    (outlier dimensions: a per-tensor int8 activation scale would flatten the rest; docs/heads.md)."""
    from paradecode.drafters.head_drafter import load_runtime

    for kind in ("eagle", "eagle3", "parallel", "medusa"):
        runtime = load_runtime(str(setup.heads[kind].resolve()), kind, str(setup.model_dir.resolve()), 0, "int8")
        modules = list(runtime.module.named_modules()) + list(runtime.lm.named_modules())
        assert [name for name, m in modules if type(m) is torch.nn.Linear] == (["fc"] if kind != "medusa" else [])
        assert any("quantized" in type(m).__module__ for m in runtime.lm.modules())


class _Scripted:
    """Stands in for ``auto``'s other arms: proposes the scripted drafts in turn (right or wrong continuations) and
    lets ``follower`` witness every verdict, as ``auto`` does for a head arm that did not propose the step."""

    method_name = "scripted"
    needs_hidden = True
    draft_forward_passes = 0

    def __init__(self, follower, script) -> None:
        self.follower, self.script, self.state = follower, list(script), None
        self.aux_layers = tuple(getattr(follower, "aux_layers", ()))  # the target features the follower reads

    def wants_cost_curve(self) -> bool:
        return False

    def begin(self, state) -> None:
        self.follower.begin(state)

    def propose(self, state):
        from paradecode.drafters.base import Proposal

        self.state = state
        tokens = self.script.pop(0) if self.script else []
        return Proposal(tokens=[int(t) for t in tokens])

    def observe(self, state, verdict) -> None:
        assert self.follower.witness(state, verdict)

    def end(self, state) -> None:
        pass

    def summary(self) -> dict:
        return {}


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "medusa"])
def test_a_head_that_witnessed_other_drafters_steps_drafts_as_if_it_had_read_the_text_at_once(setup, kind):
    """A head drafter that only witnessed the steps other drafters proposed (plain steps, accepted drafts, rejected
    ones: ``auto``'s head arms) drafts next what a head begun on the whole text so far drafts: its features
    follow the text without a re-sync (which ``begin`` cannot do: it has no features of generated text)."""
    prompt = [4, 8, 15, 16, 23, 42, 7]
    options = {"head": str(setup.heads[kind]), "depth": 3, "schedule": "fixed", "lookup": 0}  # the head's drafts
    context = SimpleNamespace(model_dir=setup.model_dir, name="tiny")
    greedy, _ = generate(setup, "ar", prompt, max_new_tokens=16)
    # drafts from the greedy continuation (accepted), a wrong token (rejected), and plain steps, in turn
    script = [[], greedy[1:3], [], [(greedy[4] + 1) % 40], greedy[5:8], [], greedy[9:10]]
    follower = get_method(kind).create(options, context=context)
    scripted = _Scripted(follower, script)
    config = GenerationConfig(max_new_tokens=12, sampling=SamplingConfig())
    out = [t for step in decode(setup.backend, scripted, prompt, config) for t in step]
    assert out == greedy[:12]
    state = scripted.state
    text = list(state.tokens)
    state.max_draft = 4
    drafted = follower.propose(state)
    fresh = get_method(kind).create(options, context=context)
    backend = setup.backend
    backend.reset()
    out = backend.forward(torch.tensor(text[:-1]), return_hidden=True, aux_layers=getattr(fresh, "aux_layers", ()))
    from paradecode.drafters.base import DecodeState

    fresh_state = DecodeState(tokens=text, prompt_len=len(text), sampling=SamplingConfig(), rng=torch.Generator(),
                              max_draft=4, target=backend,
                              prompt_hidden=out.aux if getattr(fresh, "aux_layers", ()) else out.hidden)
    fresh.begin(fresh_state)
    expected = fresh.propose(fresh_state)
    assert len(drafted.tokens) > 0 and drafted.tokens == expected.tokens
    # the same head outputs, not merely the same argmax (within the fp32 target's last bits: its rows' features
    # come from passes of other sizes here)
    assert drafted.confidences == pytest.approx(expected.confidences, rel=1e-4)


def test_auto_runs_a_shipped_head_as_an_arm_and_equals_ar(setup, tmp_path, monkeypatch):
    """Where a head ships for the model, ``auto`` takes ``eagle`` among its default arms: it reads the target's
    features every step, the head arm follows the other arms' steps (begun once per request, never re-synced),
    and the output is plain decoding's. Under sampling the head arm (sampled drafts) sits out."""
    import shutil

    from paradecode.drafters import auto as auto_module
    from paradecode.drafters.eagle import EagleDrafter
    from paradecode.heads import store

    weights = tmp_path / "weights"
    shutil.copytree(setup.heads["eagle"], weights / "tiny-eagle")
    monkeypatch.setattr(store, "WEIGHTS_DIR", weights)
    begun = []
    original_begin = EagleDrafter.begin
    monkeypatch.setattr(EagleDrafter, "begin", lambda self, state: (begun.append(1), original_begin(self, state)))
    context = SimpleNamespace(model_dir=setup.model_dir, name="tiny", kept_file=lambda method, options: None)
    prompt = [3, 9, 27, 5, 9, 27, 5, 9]
    greedy, _ = generate(setup, "ar", prompt, max_new_tokens=40)
    drafter = get_method("auto").create({"exploration": 4.0, "keep": False}, context=context)
    assert "eagle" in drafter.arms and drafter.needs_hidden
    stats = DecodeStats()
    config = GenerationConfig(max_new_tokens=40, sampling=SamplingConfig())
    out = [t for step in decode(setup.backend, drafter, prompt, config, stats=stats) for t in step]
    assert out == greedy
    arms = stats.info["auto"]["candidates"]
    assert arms["eagle"]["steps"] >= 2 and sum(arm["steps"] for arm in arms.values()) > arms["eagle"]["steps"]
    assert len(begun) == 1  # followed the other arms' steps instead of re-beginning
    sampled = [t for step in decode(setup.backend, drafter, prompt,
                                    GenerationConfig(max_new_tokens=8, sampling=SamplingConfig(temperature=1.0,
                                                                                               seed=1)))
               for t in step]
    assert len(sampled) == 8 and "eagle" not in drafter.active
    shutil.copytree(setup.heads["eagle3"], weights / "tiny-eagle3")  # reads other features: one kind per request
    mixed = get_method("auto").create({"candidates": "ar,eagle,eagle3", "keep": False}, context=context)
    assert "eagle" in mixed.arms and "other target features" in mixed.skipped["eagle3"]
    monkeypatch.setattr(store, "WEIGHTS_DIR", tmp_path / "none")
    assert "eagle" not in get_method("auto").create({"keep": False}, context=context).arms
    assert auto_module.DEFAULT_HEADS == ("eagle",)
