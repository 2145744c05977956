"""Export an EAGLE head as an EAGLE-1 draft checkpoint for vLLM or SGLang (``--speculative-config`` method
``eagle`` / ``--speculative-algorithm EAGLE``), so the same drafter serves the same target there.

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
    if head.config.get("kind") != "eagle":
        raise ParadecodeError("only EAGLE heads have a serving-engine format; this head is "
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
