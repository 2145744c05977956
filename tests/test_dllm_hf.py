"""Hugging Face masked diffusion folders (LLaDA / Dream layout: config.json with auto_map and the modelling code
in the folder) built in the test from a tiny random model: loaded offline, logits passed through (shifted for
Dream), decoded by the samplers; autoregressive and DiffusionGemma folders refused."""

import json
import textwrap

import pytest
import torch
import transformers

from paradecode import cli
from paradecode.dllm.decode import DecodeConfig, diffuse
from paradecode.dllm.hf import load_hf_diffusion
from paradecode.dllm.samplers import build_sampler
from paradecode.errors import ParadecodeError
from tiny import WORDS, tiny_model_dir

MODELLING = textwrap.dedent('''
    import torch
    from torch import nn
    from transformers import PretrainedConfig, PreTrainedModel
    from transformers.modeling_outputs import CausalLMOutput


    class TinyDiffConfig(PretrainedConfig):
        model_type = "MODEL_TYPE"

        def __init__(self, vocab_size=48, hidden_size=16, **kwargs):
            self.vocab_size, self.hidden_size = vocab_size, hidden_size
            super().__init__(**kwargs)


    class TinyDiffModel(PreTrainedModel):
        config_class = TinyDiffConfig

        def __init__(self, config):
            super().__init__(config)
            self.emb = nn.Embedding(config.vocab_size, config.hidden_size)
            self.attn = nn.MultiheadAttention(config.hidden_size, 2, batch_first=True)  # bidirectional
            self.head = nn.Linear(config.hidden_size, config.vocab_size)
            self.post_init()

        def forward(self, input_ids, **kwargs):
            h = self.emb(input_ids)
            h = h + self.attn(h, h, h, need_weights=False)[0]
            return CausalLMOutput(logits=4 * self.head(h))
''')


def diffusion_dir(path, model_type):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    (path / "modeling_tinydiff.py").write_text(MODELLING.replace("MODEL_TYPE", model_type))
    namespace = {}
    exec(compile(MODELLING.replace("MODEL_TYPE", model_type), "modeling_tinydiff", "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["TinyDiffModel"](namespace["TinyDiffConfig"](mask_token_id=2, eos_token_id=1))
    model.save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "modeling_tinydiff.TinyDiffConfig", "AutoModel": "modeling_tinydiff.TinyDiffModel"}
    config["max_position_embeddings"] = 64
    (path / "config.json").write_text(json.dumps(config))
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>",
                                         eos_token="<eos>").save_pretrained(path)
    return model, path


@pytest.mark.parametrize("model_type,shift", [("llada", False), ("dream", True)])
def test_remote_code_folder_loads_offline_and_decodes(tmp_path, model_type, shift):
    reference, folder = diffusion_dir(tmp_path, model_type)
    model = load_hf_diffusion(folder)
    assert (model.mask_id, model.eot_id, model.max_length, model.shift) == (2, 1, 64, shift)
    ids = torch.tensor([[5, 6, 7, 2, 2, 2]])
    with torch.no_grad():
        raw = reference(ids).logits
    ours = model(ids, index=torch.arange(6))
    expected = torch.cat([raw[:, :1], raw[:, :-1]], 1) if shift else raw
    assert torch.allclose(ours, expected, atol=1e-6)
    result = diffuse(model, model.encode("w3 w4 w5"), build_sampler("threshold", {"threshold": 0.5}),
                     DecodeConfig(gen_length=8))
    assert len(result.canvas) == 8 and model.mask_id not in result.canvas
    with pytest.raises(ParadecodeError, match="no key/value cache"):
        diffuse(model, [5, 6], build_sampler("topk"), DecodeConfig(gen_length=4, cache="dual"))


def test_cli_generate_on_a_remote_code_folder(tmp_path, capsys):
    _, folder = diffusion_dir(tmp_path, "llada")
    code = cli.main(["dllm", "generate", "--model", str(folder), "--gen-length", "8", "--json", "w3 w4 w5"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert len(json.loads(out)["canvas"]) == 8


def test_autoregressive_and_diffusion_gemma_folders_are_refused(tmp_path, capsys):
    folder = tiny_model_dir(tmp_path / "llama")
    code = cli.main(["dllm", "generate", "--model", str(folder), "w3 w4"])
    assert code == 2 and "not a masked diffusion model" in capsys.readouterr().err
    (tmp_path / "gemma").mkdir()
    (tmp_path / "gemma" / "config.json").write_text(json.dumps({"architectures": ["DiffusionGemmaForBlockDiffusion"],
                                                                "model_type": "diffusion_gemma"}))
    with pytest.raises(ParadecodeError, match="uniform-noise"):
        load_hf_diffusion(tmp_path / "gemma")
