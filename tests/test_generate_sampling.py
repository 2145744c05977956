"""``paradecode generate`` without --temperature: a chat prompt samples with the model's recommended settings and a
printed seed (so the run repeats with --seed); --temperature 0, --raw and --verify decode greedily."""

import json

import pytest
from transformers import AutoTokenizer

import paradecode
from paradecode import cli
from paradecode.models import FALLBACK_SAMPLING
from tiny import tiny_model_dir

CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}assistant : {% endif %}")
PROMPT = "w3 w4 w5 w3 w4"


def chat_model_dir(path, generation_config: dict | None = None) -> str:
    tiny_model_dir(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    if generation_config is not None:
        config = json.loads((path / "generation_config.json").read_text())
        (path / "generation_config.json").write_text(json.dumps({**config, **generation_config}))
    return str(path)


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    return chat_model_dir(tmp_path_factory.mktemp("chat"))


def generate(capsys, *argv) -> dict:
    code = cli.main(["generate", "--json", "--max-new-tokens", "12", *argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_chat_without_temperature_samples_with_a_printed_seed_that_repeats_the_run(capsys, chat_dir):
    first = generate(capsys, "--model", chat_dir, PROMPT)
    sampling = first["sampling"]
    assert (sampling["temperature"], sampling["top_k"], sampling["top_p"]) == (
        FALLBACK_SAMPLING.temperature, FALLBACK_SAMPLING.top_k, FALLBACK_SAMPLING.top_p)  # no recommendation
    assert isinstance(sampling["seed"], int) and sampling["source"] == FALLBACK_SAMPLING.source
    again = generate(capsys, "--model", chat_dir, "--seed", str(sampling["seed"]), PROMPT)
    assert again["token_ids"] == first["token_ids"] and again["sampling"] == sampling

    greedy = paradecode.load(chat_dir).generate(PROMPT, max_new_tokens=12)
    seeds = [generate(capsys, "--model", chat_dir, PROMPT)["sampling"]["seed"] for _ in range(3)]
    assert len(set(seeds + [sampling["seed"]])) > 1  # a seed is drawn per run
    for argv in (["--temperature", "0"], ["--raw"], ["--verify"]):
        out = generate(capsys, "--model", chat_dir, *argv, PROMPT)
        assert out["sampling"]["temperature"] == 0 and out["sampling"]["seed"] is None
        if "--raw" not in argv:
            assert out["token_ids"] == greedy.token_ids


def test_the_models_generation_config_gives_the_settings(capsys, tmp_path):
    folder = chat_model_dir(tmp_path / "chat", dict(do_sample=True, temperature=0.6, top_p=0.8))
    sampling = generate(capsys, "--model", folder, PROMPT)["sampling"]
    assert (sampling["temperature"], sampling["top_k"], sampling["top_p"]) == (0.6, 50, 0.8)  # top-k: transformers'
    assert sampling["source"].endswith("generation_config.json")
    mine = generate(capsys, "--model", folder, "--top-p", "0.5", "--seed", "3", PROMPT)["sampling"]
    assert (mine["temperature"], mine["top_p"], mine["seed"]) == (0.6, 0.5, 3)  # a flag given wins


def test_the_stats_line_names_the_seed_and_the_way_to_greedy(capsys, chat_dir):
    assert cli.main(["generate", "--model", chat_dir, "--max-new-tokens", "4", PROMPT]) == 0
    err = capsys.readouterr().err
    assert "sampled at temperature" in err and "--seed" in err and "--temperature 0" in err
