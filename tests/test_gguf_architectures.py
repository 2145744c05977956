"""Each GGUF architecture a user may bring (llama, qwen2, qwen3, gemma3) as a tiny random checkpoint written here
with the ``gguf`` package, laid out as llama.cpp's converter lays it out (its tensor names, llama's q/k rows
permuted, Gemma's norms stored as 1 + w), then read the way ``paradecode.load`` reads a .gguf file:

* all F32: the converted model's fp32 logits equal the checkpoint's own (transformers, from the HF weights);
* projections as Q4_0 blocks, or projections and LM head as Q8_0 blocks: ``--dtype q4`` runs those blocks as
  stored, and its logits follow transformers' forward over the same blocks dequantized (int8 activations: close,
  not equal); a q/k row order read wrongly fails it. Methods equal ``ar`` on it.

(Mistral checkpoints are written as ``llama`` GGUF files by llama.cpp; the HF-folder tests in
``test_architectures.py`` cover its window.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

import paradecode
from paradecode.backends import native

gguf = pytest.importorskip("gguf")

VOCAB = 320  # the 256 byte tokens of a byte-level BPE vocabulary, then placeholders
TINY = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.1, tie_word_embeddings=False)
# only what transformers reads back from a GGUF file: for qwen3 no head_dim (its default, 128, as in every Qwen3),
# for gemma3 neither the score scale nor the layer types nor the local RoPE base (their defaults stand)
CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(**TINY),
    "qwen2": lambda: transformers.Qwen2Config(**TINY),
    "qwen3": lambda: transformers.Qwen3Config(**TINY, head_dim=128),
    "gemma3": lambda: transformers.Gemma3TextConfig(**TINY, head_dim=32, sliding_window=8),
}
ARCHS = {"llama": "LLAMA", "qwen2": "QWEN2", "qwen3": "QWEN3", "gemma3": "GEMMA3"}


def tiny_model(architecture: str) -> transformers.PreTrainedModel:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[architecture]()).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("bias", "norm.weight")):  # not the zeros / ones they start as
                param.normal_(0.0, 0.5)
            if name.endswith(("q_proj.weight", "k_proj.weight")):  # sharp attention: q/k rows read in the wrong
                param.mul_(4.0)  # order change the logits, not only a little
        model.lm_head.weight.mul_(4.0)  # sharp logits: greedy choices that do not hinge on a last bit
    return model


QUANTS = {"q4": "Q4_0", "q8": "Q8_0"}  # file name -> the blocks of its layers' projections (q8: and its LM head)


def write_gguf(model: transformers.PreTrainedModel, architecture: str, path, kind: str | None) -> None:
    """``model`` as llama.cpp's converter would write it; with ``kind`` the layers' projections as blocks of that
    type (Q8_0: the LM head too), else all F32."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    config, arch = model.config, getattr(gguf.MODEL_ARCH, ARCHS[architecture])
    names = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rope = config.rope_parameters
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(rope.get("full_attention", rope)["rope_theta"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(VOCAB)
    if architecture == "gemma3":
        writer.add_sliding_window(config.sliding_window)
    byte_chars = bytes_to_unicode()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([byte_chars[b] for b in range(256)] + [f"tok{i}" for i in range(256, VOCAB)])
    writer.add_token_scores([0.0] * VOCAB)
    writer.add_token_types([gguf.TokenType.NORMAL] * VOCAB)
    writer.add_token_merges([])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    for name, tensor in model.state_dict().items():
        data = tensor.float()
        if architecture == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):  # llama.cpp's rope layout
            heads = config.num_attention_heads if "q_proj" in name else config.num_key_value_heads
            data = data.reshape(heads, 2, data.shape[0] // heads // 2, -1).transpose(1, 2).reshape(data.shape)
        if architecture == "gemma3" and name.endswith("norm.weight"):  # stored as the 1 + w Gemma multiplies by
            data = data + 1
        data = data.numpy()
        new_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        blocks = kind is not None and (name.startswith("model.layers.") and name.endswith("proj.weight")
                                       or kind == "Q8_0" and name == "lm_head.weight")
        if blocks:
            quant = gguf.GGMLQuantizationType[kind]
            writer.add_tensor(new_name, gguf.quants.quantize(data, quant), raw_dtype=quant)
        else:
            writer.add_tensor(new_name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def written(request, tmp_path_factory):
    architecture = request.param
    model = tiny_model(architecture)
    folder = tmp_path_factory.mktemp(f"gguf-{architecture}")
    write_gguf(model, architecture, folder / f"{architecture}-f32.gguf", None)
    for file, kind in QUANTS.items():
        write_gguf(model, architecture, folder / f"{architecture}-{file}.gguf", kind)
    return architecture, model, folder, tmp_path_factory.mktemp("cache")


def ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


def test_the_writer_round_trips_through_transformers(written):
    """The files are what transformers reads back: the F32 file's logits are the checkpoint's."""
    architecture, model, folder, _ = written
    back = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=f"{architecture}-f32.gguf",
                                                             dtype=torch.float32).eval()
    tokens = ids(24, seed=1)[None]
    with torch.no_grad():
        torch.testing.assert_close(back(tokens).logits, model(tokens).logits, atol=1e-5, rtol=0)


def test_a_gguf_file_loads_on_our_forward_with_the_checkpoints_logits(written):
    architecture, model, folder, cache = written
    loaded = paradecode.load(str(folder / f"{architecture}-f32.gguf"), backend="llama", dtype="fp32",
                             max_length=128, cache_dir=cache)
    tokens = ids(40, seed=2)
    got = torch.cat([loaded.backend.forward(chunk).logits for chunk in (tokens[:30], tokens[30:])])
    with torch.no_grad():
        want = model(tokens[None]).logits[0]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


@pytest.mark.skipif(not native.enabled(), reason="PARADECODE_NATIVE=0 turns the native path off (q4 needs it)")
@pytest.mark.parametrize("file", sorted(QUANTS))
def test_q4_runs_the_files_own_blocks_of_each_architecture(written, file):
    architecture, _, folder, cache = written
    name = f"{architecture}-{file}.gguf"
    loaded = paradecode.load(str(folder / name), backend="llama", dtype="q4", max_length=128, cache_dir=cache)
    assert loaded.dtype == "q4"
    head = loaded.backend._lm_head  # the file's Q8_0 head as stored; an F32 head: the int8 backend's
    assert getattr(head, "bits", None) == (8 if file == "q8" else None)
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                                  dtype=torch.float32).eval()
    tokens = ids(40, seed=3)
    got = loaded.backend.forward(tokens).logits  # [T, V]
    with torch.no_grad():
        want = reference(tokens[None]).logits[0]
    error = (got - want).norm(dim=-1) / want.norm(dim=-1)  # measured: medians 0.010-0.025, most 0.058; with the
    assert error.median() < 0.05 and error.max() < 0.15, error  # q/k order decided wrongly 0.25-1.1 and 0.37-1.7
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9
    prompt = ids(12, seed=4).tolist()
    expected = loaded.generate(prompt, method="ar", max_new_tokens=24).token_ids
    for method in ("ngram", "pld-tree", "jacobi"):
        assert loaded.generate(prompt, method=method, max_new_tokens=24).token_ids == expected, method
