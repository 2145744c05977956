"""Structured output stays exact under speculation: on a tiny model with a byte-level tokenizer, every method's
greedy constrained output equals ``ar``'s and follows its schema, regex or grammar; sampling draws from the
masked distribution exactly (chi-squared on the first two tokens, for deterministic drafts, a draft model's
chains and trees); drafts are cut where the grammar rejects them; forced tokens are drafted for free; and a bad
schema or grammar is a clear error in the API, the CLI (exit 2) and the server (400)."""

import json
import re

import httpx
import jsonschema
import pytest
import torch
from scipy.stats import chisquare

import paradecode
from paradecode import cli
from paradecode.constraints import Constraint
from paradecode.drafters.base import Proposal
from tiny import tiny_bytes_model_dir

PROMPT = "Count to ten: 1, 2,"
SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                      "n": {"type": "integer", "minimum": 0, "maximum": 99}},
     "required": ["name", "n"], "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["sea", "sky", "sun"]},
                                               "maxItems": 3},
                                      "ok": {"type": "boolean"}}, "required": ["tags", "ok"],
     "additionalProperties": False},
    {"type": "object"},
]
REGEX = r"[0-9]{3}-[a-z]{2,4}"
LARK = 'start: "yes" | "no" | "maybe " NUMBER\nNUMBER: /[0-9]{1,2}/'
GBNF = 'root ::= "(" [a-c]+ ")"'
METHODS = [("ar", {}), ("pld", {}), ("ngram", {}), ("pld-tree", {}), ("lookahead", {}), ("jacobi", {}),
           ("auto", {}), ("layerskip", {}), ("draft", {"num_draft": 3}), ("draft-tree", {}), ("draft-self", {})]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return (str(tiny_bytes_model_dir(tmp_path_factory.mktemp("bytes"))),
            str(tiny_bytes_model_dir(tmp_path_factory.mktemp("draft"), seed=5)))  # same tokenizer, other weights


@pytest.fixture(scope="module")
def model(dirs):
    return paradecode.load(dirs[0])


def _options(method: str, options: dict, dirs) -> tuple[str, dict]:
    if method == "draft-self":
        return "draft", dict(options, draft_model=dirs[0])  # drafts with the target's own (unmasked) distribution
    if method.startswith("draft"):
        return method, dict(options, draft_model=dirs[1])
    return method, options


def _constrained(model, dirs, method, options, **kwargs):
    name, options = _options(method, options, dirs)
    return model.generate(PROMPT, method=name, options=options, max_new_tokens=48, chat=False, **kwargs)


@pytest.mark.parametrize("method,options", METHODS, ids=[m for m, _ in METHODS])
def test_greedy_constrained_output_equals_ar_and_is_valid(model, dirs, method, options):
    constraints = [dict(json_schema=s) for s in SCHEMAS] + [dict(regex=REGEX), dict(grammar=LARK),
                                                             dict(grammar=GBNF)]
    for constraint in constraints:
        expected = _constrained(model, dirs, "ar", {}, **constraint)
        got = _constrained(model, dirs, method, options, **constraint)
        assert got.token_ids == expected.token_ids, (method, constraint)
        assert got.stats.stop_reason == "eos", (got.text, constraint)  # the grammar ran to its end
        if "json_schema" in constraint:
            jsonschema.validate(json.loads(got.text), constraint["json_schema"])
        elif "regex" in constraint:
            assert re.fullmatch(REGEX, got.text)
        else:
            pattern = r"yes|no|maybe [0-9]{1,2}" if constraint["grammar"] == LARK else r"\([a-c]+\)"
            assert re.fullmatch(pattern, got.text), got.text
        if method not in ("ar", "draft-tree", "draft-self", "draft") and "json_schema" in constraint:
            assert got.stats.info["grammar_forced_tokens"] > 0  # keys and separators were drafted for free
            assert got.stats.forward_passes < expected.stats.forward_passes


def test_ar_is_plain_decoding_under_a_grammar(model, dirs):
    out = _constrained(model, dirs, "ar", {}, json_schema=SCHEMAS[0])
    assert out.stats.forward_passes == len(out.token_ids) and out.stats.info["grammar_forced_tokens"] == 0
    assert out.stats.info["grammar_masks"] == len(out.token_ids) and out.stats.info["grammar_mask_time_s"] > 0


def _state(model, **constraint):
    from paradecode.constraints import grammar_source

    return Constraint(model.grammars.state(grammar_source(**constraint)))


def test_drafts_are_cut_at_the_first_token_the_grammar_rejects(model):
    tokens = model.tokenizer.encode("123-ab", add_special_tokens=False)
    bad = model.tokenizer.encode("x", add_special_tokens=False)
    constraint = _state(model, regex=REGEX)
    chain = Proposal(tokens=tokens[:2] + bad + tokens[2:])
    masks = constraint.masks(chain)
    assert chain.tokens == tokens[:2] and masks.shape == (3, model.backend.vocab_size)  # cut before "x"
    assert all(masks[i, tokens[i]] for i in range(2)) and not masks[2, bad[0]]
    q = torch.full((len(tokens) + 1, model.backend.vocab_size), 1 / model.backend.vocab_size)
    sampled = Proposal(tokens=tokens[:2] + bad + tokens[2:], draft_probs=q)
    masks = constraint.masks(sampled)
    assert sampled.tokens == tokens[:2] + bad and sampled.draft_probs.shape[0] == 3  # q drafts keep it
    assert masks.shape[0] == 4 and masks[3].all()  # the row after it is never read
    tree = Proposal(tokens=[tokens[0], bad[0], tokens[1]], parents=[-1, -1, 0])
    masks = constraint.masks(tree)
    assert tree.tokens == [tokens[0], bad[0], tokens[1]] and masks[2].all() and not masks[0, bad[0]]
    assert masks[3, tokens[2]] and not masks[3, bad[0]]
    constraint.commit(tokens[:3])  # the state is back at the committed output, then advances
    assert constraint.masks(Proposal(tokens=tokens[3:]))[0, tokens[3]]


def test_forced_tokens_are_proposed_for_deterministic_drafts_only(model):
    constraint = _state(model, json_schema=SCHEMAS[0])
    forced = constraint.state.forced()
    assert model.decode(forced) == '{"name": "'[: len(model.decode(forced))] and forced
    assert constraint.with_forced(Proposal(), max_draft=10).tokens == forced
    longer = Proposal(tokens=forced + [5, 6])
    assert constraint.with_forced(longer, max_draft=10) is longer  # the drafter already agrees
    assert constraint.with_forced(Proposal(tokens=[7, 8]), max_draft=10).tokens == forced
    assert constraint.with_forced(Proposal(tokens=[7, 8]), max_draft=1).tokens == forced[:1]
    q = Proposal(tokens=[7], draft_probs=torch.ones(1, 4) / 4)
    assert constraint.with_forced(q, max_draft=10) is q


# -- sampling: exact for the masked distribution ------------------------------------------------------------
SAMPLE_REGEX = r"[abce][0-9]"
DRAWS = 1500


def _masked_joint(model, prompt_ids: list[int]) -> dict[tuple[int, ...], float]:
    """Exact probability of each two-token output under the grammar: p'(a) p'(b | a), p' = p masked, renormed."""
    constraint = _state(model, regex=SAMPLE_REGEX)
    backend = model.backend

    def masked(ids, allowed):
        backend.reset()
        logits = backend.forward(torch.tensor(ids)).logits[-1]
        return torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1)

    joint = {}
    first = masked(prompt_ids, constraint.state.allowed())
    for a in first.nonzero().flatten().tolist():
        constraint.commit([a])
        second = masked(prompt_ids + [a], constraint.state.allowed())
        constraint.state.rollback(1)
        for b in second.nonzero().flatten().tolist():
            joint[(a, b)] = float(first[a] * second[b])
    return joint


def _pvalue(model, dirs, method, options, draws=DRAWS) -> float:
    name, options = _options(method, options, dirs)
    counts: dict[tuple[int, ...], int] = {}
    for seed in range(draws):
        out = model.generate(PROMPT, method=name, options=options, max_new_tokens=2, chat=False, temperature=1.0,
                             seed=seed, regex=SAMPLE_REGEX)
        counts[tuple(out.token_ids)] = counts.get(tuple(out.token_ids), 0) + 1
    joint = _masked_joint(model, model.encode(PROMPT, chat=False))
    assert set(counts) <= set(joint), "an output the grammar does not allow"
    cells = [c for c in joint if joint[c] * draws >= 5]
    observed = [counts.get(c, 0) for c in cells]
    expected = [joint[c] * sum(observed) / sum(joint[c] for c in cells) for c in cells]
    assert len(cells) >= 8
    return float(chisquare(observed, expected).pvalue)


@pytest.mark.parametrize("method,options", [("pld", {}), ("draft", {"num_draft": 2}), ("draft-tree", {})])
def test_constrained_sampling_is_exact(model, dirs, method, options):
    assert _pvalue(model, dirs, method, options) > 1e-3


# -- errors --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("constraint, fragment", [
    (dict(json_schema={"type": "strin"}), "invalid JSON schema"),
    (dict(json_schema="{not json"), "not valid JSON"),
    (dict(json_schema=[1]), "JSON object"),
    (dict(regex="a(b"), "invalid regex"),
    (dict(grammar="start: foo"), "unknown name"),
    (dict(grammar="root ::= ("), "neither Lark"),
    (dict(regex="a", grammar="start: \"a\""), "one constraint at a time"),
])
def test_bad_constraints_are_clear_errors(model, constraint, fragment):
    with pytest.raises(paradecode.ParadecodeError, match=re.escape(fragment)):
        model.generate(PROMPT, max_new_tokens=4, chat=False, **constraint)


def test_cli_structured_output_and_exit_2(model, dirs, tmp_path, capsys):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMAS[0]))
    code = cli.main(["generate", "--model", dirs[0], "--raw", "--json", "--method", "pld", "--json-schema",
                     str(schema), "--max-new-tokens", "48", PROMPT])
    payload = json.loads(capsys.readouterr().out)
    assert code == 0 and payload["text"] == _constrained(model, dirs, "ar", {}, json_schema=SCHEMAS[0]).text
    grammar = tmp_path / "g.gbnf"
    grammar.write_text(GBNF)
    assert cli.main(["generate", "--model", dirs[0], "--raw", "--grammar", str(grammar), PROMPT]) == 0
    assert re.fullmatch(r"\([a-c]+\)\n", capsys.readouterr().out)
    assert cli.main(["generate", "--model", dirs[0], "--raw", "--regex", "[0-9]+", PROMPT, "--max-new-tokens", "6"]) == 0
    assert re.fullmatch(r"[0-9]+\n", capsys.readouterr().out)
    schema.write_text('{"type": "strin"}')
    for argv, fragment in ([["--json-schema", str(schema)], "invalid JSON schema"],
                           [["--json-schema", str(tmp_path / "missing.json")], "does not exist"],
                           [["--regex", "a(b"], "invalid regex"],
                           [["--regex", "a", "--grammar", str(grammar)], "not allowed with"]):
        with pytest.raises(SystemExit) if fragment == "not allowed with" else _no_exit():
            code = cli.main(["generate", "--model", dirs[0], *argv, PROMPT])
            assert code == 2
        err = capsys.readouterr().err
        assert fragment in err and "Traceback" not in err


class _no_exit:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_server_response_format_and_errors(dirs):
    from test_server import serving

    model = paradecode.load(dirs[0])
    reference = paradecode.load(dirs[0])
    with serving(model, method="ngram", max_new_tokens=48) as url:
        schema = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMAS[0], "strict": True}}
        for response_format, constraint in ((schema, dict(json_schema=SCHEMAS[0])),
                                            ({"type": "json_object"}, dict(json_schema={"type": "object"}))):
            expected = reference.generate(PROMPT, method="ngram", max_new_tokens=48, chat=False, **constraint).text
            body = dict(prompt=PROMPT, response_format=response_format)
            assert httpx.post(f"{url}/v1/completions", json=body, timeout=30).json()["choices"][0]["text"] == expected
            pieces = []
            with httpx.stream("POST", f"{url}/v1/completions", json=dict(body, stream=True), timeout=30) as response:
                pieces = [json.loads(line[6:])["choices"][0]["text"] for line in response.iter_lines()
                          if line.startswith("data: {") and json.loads(line[6:])["choices"]]
            assert "".join(pieces) == expected and isinstance(json.loads(expected), dict)
        regex = httpx.post(f"{url}/v1/completions", json=dict(prompt=PROMPT, paradecode={"regex": REGEX}), timeout=30)
        assert re.fullmatch(REGEX, regex.json()["choices"][0]["text"])
        for body, fragment, param in (
                (dict(response_format={"type": "json_schema", "json_schema": {"schema": {"type": "strin"}}}),
                 "invalid JSON schema", "response_format"),
                (dict(response_format={"type": "json_schema"}), "json_schema.schema",
                 "response_format.json_schema.schema"),
                (dict(response_format={"type": "xml"}), "json_object or json_schema", "response_format.type"),
                (dict(paradecode={"grammar": "start: foo"}), "unknown name", "paradecode"),
                (dict(frequency_penalty=1.0), "supported: n, logprobs", "frequency_penalty")):
            answer = httpx.post(f"{url}/v1/completions", json=dict(body, prompt=PROMPT), timeout=30)
            error = answer.json()["error"]
            assert answer.status_code == 400 and fragment in error["message"] and error["param"] == param, error
