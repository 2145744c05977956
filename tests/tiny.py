"""Tiny randomly initialised models for fast, exact tests (no downloads, a few ms per forward)."""

from __future__ import annotations

from types import SimpleNamespace

import torch
import transformers

from paradecode.backends.base import tree_depths, tree_mask
from paradecode.backends.int8_llama import Int8LlamaBackend
from paradecode.backends.llama import LlamaBackend
from paradecode.config import GenerationConfig, SamplingConfig
from paradecode.engine import decode
from paradecode.registry import get_method
from paradecode.stats import DecodeStats


# Token-id prompts for the lossless tests: a repeat (prompt lookup hits), a constant run, a period-4 pattern,
# a single token, and 25 distinct tokens.
PROMPTS = [[1, 2, 3, 4, 5, 1, 2, 3], [7, 7, 7, 7], [3, 9, 4, 9, 3, 9, 4, 9, 3, 9, 4], [11], list(range(5, 30))]


def tiny_llama(seed: int = 0, vocab: int = 48, layers: int = 2, sharp: float = 1.0) -> transformers.LlamaForCausalLM:
    """A random Llama; ``sharp`` scales the LM head so argmax choices are robust (and text repeats more)."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharp)
    return model


def shaped_llama(seed: int, shape: dict, vocab: int = 64, layers: int = 3) -> transformers.LlamaForCausalLM:
    """A random Llama of the given sizes (hidden_size, heads, kv heads, intermediate_size) with sharp logits:
    greedy choices that do not hinge on a last bit."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=vocab, num_hidden_layers=layers, max_position_embeddings=256,
                                      tie_word_embeddings=False, **shape)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)
    return model


def tiny_backend(seed: int = 0, **kwargs) -> LlamaBackend:
    return LlamaBackend.from_hf(tiny_llama(seed, **kwargs))


def tiny_int8_backend(seed: int = 0, calibration=((*range(1, 40),),), **kwargs) -> Int8LlamaBackend:
    return Int8LlamaBackend.from_hf(tiny_llama(seed, **kwargs), calibration=calibration)


def two_token_joint(target, prompt: list[int], vocab: int) -> torch.Tensor:
    """[V, V] the target's exact p(a, b | prompt) = p(a | prompt) p(b | prompt, a), for distribution tests."""
    with torch.no_grad():
        target.reset()
        p_first = torch.softmax(target.forward(torch.tensor(prompt)).logits[-1], -1)  # [V]
        p_second = []
        for a in range(vocab):
            target.reset()
            p_second.append(torch.softmax(target.forward(torch.tensor(prompt + [a])).logits[-1], -1))
    return p_first[:, None] * torch.stack(p_second)


def text_of(ids: list[int]) -> str:
    """A stand-in detokenizer: token t prints as 'tN '."""
    return "".join(f"t{t} " for t in ids)


def run(backend, method: str, prompt: list[int], *, max_new_tokens: int = 24, eos_ids=(), stop=(),
        temperature: float = 0.0, seed: int = 0, draft_backend=None, on_commit=None,
        **options) -> tuple[list[int], DecodeStats]:
    """Decode with a registered method straight through the engine; returns (output ids, stats)."""
    context = SimpleNamespace(load_draft_backend=lambda name: draft_backend, kept_file=lambda method, options: None)
    if draft_backend is not None:
        options.setdefault("draft_model", "tiny")
    drafter = get_method(method).create(options, context=context)
    config = GenerationConfig(max_new_tokens=max_new_tokens, stop=tuple(stop),
                              sampling=SamplingConfig(temperature=temperature, seed=seed))
    stats = DecodeStats(method=method)
    output = [t for step in decode(backend, drafter, prompt, config, eos_ids=frozenset(eos_ids),
                                   text_of=text_of, stats=stats, on_commit=on_commit) for t in step]
    return output, stats


WORDS = ["<unk>", "<eos>"] + [f"w{i}" for i in range(46)]


def run_case(backend, case: str, prompt: list[int], options: dict, *, model_seed: int = 0,
             **kwargs) -> tuple[list[int], DecodeStats]:
    """``run`` for a lossless-test case: a method name, where ``draft`` and ``draft-tree`` draft with an unrelated
    tiny model (many rejections), and ``METHOD-self`` runs METHOD drafting with the target's own weights (seed
    ``model_seed``: long accepted paths)."""
    method, self_draft = (case[: -len("-self")], True) if case.endswith("-self") else (case, False)
    if self_draft or method in ("draft", "draft-tree"):
        kwargs["draft_backend"] = tiny_backend(model_seed if self_draft else 99, sharp=4.0)
    return run(backend, method, prompt, **options, **kwargs)


def tiny_model_dir(path, seed: int = 0, words: list[str] = WORDS, max_positions: int = 256):
    """A tiny random Llama saved as a Hugging Face model directory, with a word-level tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders

    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", eos_token="<eos>")
    model = tiny_llama(seed, vocab=len(words), sharp=4.0)
    model.config.max_position_embeddings = max_positions
    model.config.eos_token_id = 1
    model.save_pretrained(path)
    fast.save_pretrained(path)
    return path


class ChainOnly:
    """A backend wrapper that verifies chains only (``supports_tree = False``); everything else is the inner one's."""

    supports_tree = False

    def __init__(self, inner) -> None:
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)


BYTE_TEXT = ("Café, naïve, über, smörgåsbord; 日本語のテキスト, 한국어, ελληνικά, русский — “quotes”, 1, 2, 3, 4, 5. "
             "The sea is calm tonight. Count to ten: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10.")


def tiny_bytes_model_dir(path, seed: int = 0, vocab: int = 300):
    """A tiny random Llama with a byte-level BPE tokenizer (GPT-2 style, as SmolLM2's): tokens are byte strings,
    so an output can stop in the middle of a UTF-8 character."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<eos>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([BYTE_TEXT] * 4, trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>")
    model = tiny_llama(seed, vocab=tokenizer.get_vocab_size(), sharp=4.0)
    model.config.eos_token_id = model.generation_config.eos_token_id = fast.eos_token_id
    model.config.bos_token_id = model.generation_config.bos_token_id = None
    model.save_pretrained(path)
    fast.save_pretrained(path)
    return path


TREE_PARENTS = [-1, 0, 0, 1, 2, -1, 5]  # two roots; paths 0-1-3, 0-2-4 and 5-6


def one_by_one(backend, ids: torch.Tensor) -> torch.Tensor:
    """Each token's logits from a one-token forward of its own, in turn."""
    return torch.stack([backend.forward(token.view(1)).logits[0] for token in ids])


def assert_rows_equal_one_token_passes(backend, prompt: torch.Tensor, chain: torch.Tensor) -> None:
    """A long pass (part of the prompt, then the chain), a causal chain and a tree over TREE_PARENTS give each
    row the logits a one-token forward gives it later, to the bit."""
    backend.reset()
    backend.forward(prompt[:20])
    prefill = backend.forward(torch.cat((prompt[20:], chain))).logits[len(prompt) - 20:]
    backend.rollback(len(prompt))
    single = one_by_one(backend, chain)
    assert torch.equal(prefill, single)
    backend.rollback(len(prompt))
    assert torch.equal(backend.forward(chain).logits, single)
    backend.rollback(len(prompt))
    positions = len(prompt) - 1 + torch.tensor(tree_depths(TREE_PARENTS))
    tree = backend.forward(chain, positions, tree_mask(TREE_PARENTS, len(prompt))).logits
    for node, path in [(3, [0, 1, 3]), (4, [0, 2, 4]), (6, [5, 6])]:
        backend.rollback(len(prompt))
        assert torch.equal(tree[node], one_by_one(backend, chain[path])[-1]), node


def assert_same_bits_on_any_thread_count(backend, passes: list[torch.Tensor], threads=(1, 2, 3, 2)) -> None:
    """Each pass (token ids, run from an empty cache) gives the same logits on every thread count: the native
    GEMMs hand column blocks to whichever thread is free. The tests otherwise run on one thread (conftest)."""
    outputs = []
    try:
        for count in threads:
            torch.set_num_threads(count)
            for i, ids in enumerate(passes):
                backend.reset()
                outputs.append((count, i, backend.forward(ids).logits))
    finally:
        torch.set_num_threads(1)
    first = {i: logits for count, i, logits in outputs if count == threads[0]}
    for count, i, logits in outputs:
        assert torch.equal(logits, first[i]), f"pass {i} on {count} threads differs from {threads[0]} thread(s)"
