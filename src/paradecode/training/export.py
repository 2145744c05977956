"""Export an EAGLE head as an EAGLE-1 draft checkpoint for vLLM or SGLang (``--speculative-config`` method
``eagle`` / ``--speculative-algorithm EAGLE``), or an EAGLE-3 head as an EAGLE-3 checkpoint (method ``eagle3`` /
``EAGLE3``), so the same drafter serves the same target there.

Both engines read a Llama ``config.json`` with one hidden layer and these tensors (vLLM
``model_executor/models/llama_eagle.py``, SGLang ``srt/models/llama_eagle.py``; both prefix ``model.``
themselves and share the target's embedding and LM head):

    fc.weight                                   [D, 2D]   fc(cat(embed(token), feature))
    fc.bias                                     [D]       zeros: SGLang's fc has a bias, vLLM's ignores it
    layers.0.self_attn.{q,k,v,o}_proj.weight
    layers.0.post_attention_layernorm.weight    [D]       (layer 0 has no input norm)
    layers.0.mlp.{gate,up,down}_proj.weight

The engines differ in ``architectures``: vLLM maps ``LlamaForCausalLM`` to its ``EagleLlamaForCausalLM``;
SGLang wants ``LlamaForCausalLMEagle``. Both use pair i at RoPE position i with the target's rope_theta,
as this head was trained. What does not carry over: the draft vocabulary (the engines draft over the
full vocabulary, so the exported drafter can propose tokens this head never learned to rank; acceptance
may differ a little) and the tree settings (each engine has its own).

EAGLE-3 (vLLM ``llama_eagle3.py``, SGLang ``llama_eagle3.py``; architecture ``LlamaForCausalLMEagle3`` in both):

    fc.weight                                     [D, A*D]  the aux features, side by side, fused
    midlayer.input_layernorm.weight               [D]       on the token's embedding
    midlayer.hidden_norm.weight                   [D]       on the feature
    midlayer.self_attn.{q,k,v}_proj.weight        [*, 2D]   over [embedding ; feature]
    midlayer.self_attn.o_proj.weight, midlayer.post_attention_layernorm.weight, midlayer.mlp.*
    norm.weight                                   [D]
    lm_head.weight                                [Vd, D]   the draft vocabulary's logits
    d2t                                           [Vd]      int64: target id = draft id + d2t[draft id]
    t2d                                           [V]       bool: the target ids in the draft vocabulary

with ``draft_vocab_size`` Vd and ``target_hidden_size`` D in config.json, and the aux layers: vLLM reads
``eagle_aux_hidden_state_layer_ids`` as the layers whose *input* it captures (our convention), SGLang reads
``eagle_config.eagle_aux_hidden_state_layer_ids`` as layers whose *output* it captures (one less), so each
engine's export writes its own numbers. Neither captures the embedding (layer 0's input): a head reading it
cannot be exported. The embedding is the target's (not stored).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from paradecode.errors import ParadecodeError
from paradecode.heads.store import LoadedHead, TargetWeights

ARCHITECTURES = {"vllm": "LlamaForCausalLM", "sglang": "LlamaForCausalLMEagle"}
LAYER_NAMES = {  # our EagleHead parameter -> the EAGLE-1 checkpoint name
    "fc.weight": "fc.weight",
    "q_proj.weight": "layers.0.self_attn.q_proj.weight",
    "k_proj.weight": "layers.0.self_attn.k_proj.weight",
    "v_proj.weight": "layers.0.self_attn.v_proj.weight",
    "o_proj.weight": "layers.0.self_attn.o_proj.weight",
    "post_attention_layernorm": "layers.0.post_attention_layernorm.weight",
    "gate_proj.weight": "layers.0.mlp.gate_proj.weight",
    "up_proj.weight": "layers.0.mlp.up_proj.weight",
    "down_proj.weight": "layers.0.mlp.down_proj.weight",
}


def export_eagle(head: LoadedHead, target: TargetWeights, out: Path, engine: str = "vllm") -> dict:
    """Write ``out/config.json`` and ``out/model.safetensors``; returns the config."""
    from safetensors.torch import save_file

    if engine not in ARCHITECTURES:
        raise ParadecodeError(f"unknown serving engine {engine!r}; choose one of: {', '.join(ARCHITECTURES)}.")
    if head.config.get("kind") == "eagle3":
        return export_eagle3(head, target, out, engine)
    if head.config.get("kind") != "eagle":
        raise ParadecodeError("only EAGLE and EAGLE-3 heads have a serving-engine format; this head is "
                              f"{head.config.get('kind')!r}.")
    state = head.module.state_dict()
    tensors = {LAYER_NAMES[name]: state[name].to(torch.float16).contiguous() for name in LAYER_NAMES}
    tensors["fc.bias"] = torch.zeros(head.module.shape.hidden_size, dtype=torch.float16)
    config = {k: v for k, v in target.config.items() if not k.startswith("_")}
    config.update(architectures=[ARCHITECTURES[engine]], model_type="llama", num_hidden_layers=1,
                  torch_dtype="float16", rope_theta=head.module.shape.rope_theta)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    return config


EAGLE3_NAMES = {  # our Eagle3Head parameter -> the EAGLE-3 checkpoint name
    "fc.weight": "fc.weight",
    "input_layernorm": "midlayer.input_layernorm.weight",
    "hidden_norm": "midlayer.hidden_norm.weight",
    "q_proj.weight": "midlayer.self_attn.q_proj.weight",
    "k_proj.weight": "midlayer.self_attn.k_proj.weight",
    "v_proj.weight": "midlayer.self_attn.v_proj.weight",
    "o_proj.weight": "midlayer.self_attn.o_proj.weight",
    "post_attention_layernorm": "midlayer.post_attention_layernorm.weight",
    "gate_proj.weight": "midlayer.mlp.gate_proj.weight",
    "up_proj.weight": "midlayer.mlp.up_proj.weight",
    "down_proj.weight": "midlayer.mlp.down_proj.weight",
    "norm": "norm.weight",
    "lm_head.weight": "lm_head.weight",
}


def export_eagle3(head: LoadedHead, target: TargetWeights, out: Path, engine: str = "vllm") -> dict:
    """The EAGLE-3 layout (module docstring): ``out/config.json`` and ``out/model.safetensors``; returns the config."""
    from safetensors.torch import save_file

    module, vocab = head.module, target.config["vocab_size"]
    aux = list(module.aux_layers)
    if min(aux) < 1:
        raise ParadecodeError(f"this EAGLE-3 head reads the embedding (aux layers {aux}), which vLLM and SGLang "
                              "do not capture: train it with --aux-layers of 1 or more to export it.")
    state = module.state_dict()
    tensors = {EAGLE3_NAMES[name]: state[name].to(torch.float16).contiguous() for name in EAGLE3_NAMES}
    draft_ids = head.draft_ids if head.draft_ids is not None else torch.arange(vocab)
    tensors["d2t"] = (draft_ids.long() - torch.arange(len(draft_ids))).contiguous()
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[draft_ids.long()] = True
    tensors["t2d"] = t2d
    config = {k: v for k, v in target.config.items() if not k.startswith("_")}
    engine_ids = aux if engine == "vllm" else [i - 1 for i in aux]  # SGLang: the layer whose output it takes
    config.update(architectures=["LlamaForCausalLMEagle3"], model_type="llama", num_hidden_layers=1,
                  torch_dtype="float16", rope_theta=module.shape.rope_theta, tie_word_embeddings=False,
                  draft_vocab_size=len(draft_ids), target_hidden_size=module.shape.hidden_size,
                  eagle_config=dict(eagle_aux_hidden_state_layer_ids=engine_ids, use_aux_hidden_state=True))
    if engine == "vllm":
        config["eagle_aux_hidden_state_layer_ids"] = aux
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    return config
