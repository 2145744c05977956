"""What the command modules share: the model and decoding flags, loading the model they name, the method they
ask for, the prompt they read, and checks on numbers given on the command line.

Each ``commands.py`` (beside the code it drives) builds its subcommands with these helpers; ``cli.py`` only
dispatches. A user mistake raises ``ParadecodeError``: the CLI prints it on one line and exits ``EXIT_USAGE``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable

from paradecode import utf8
from paradecode.errors import ParadecodeError
from paradecode.registry import DEFAULT_METHOD

EXIT_USAGE = 2
EXIT_NOT_LOSSLESS = 3  # generate --verify: the method's output differs from plain autoregressive decoding


# -- paths, checked where they are parsed (argparse ``type=``): a bad one fails before anything loads, with a
# ParadecodeError that names the flag (cli.main parses inside its error handling) ---------------------------
def _writable_folder(path: Path) -> str | None:
    if path.exists():
        if not path.is_dir():
            return f"{path} is a file, not a folder"
        return None if os.access(path, os.W_OK | os.X_OK) else f"{path} is a folder you cannot write to"
    existing = next(parent for parent in path.absolute().parents if parent.exists())
    if not existing.is_dir():
        return f"{path} cannot be created: {existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{path} cannot be created: {existing} is a folder you cannot write to"
    return None


def _writable_file(path: Path) -> str | None:
    if path.is_dir():
        return f"{path} is a folder; give the file to write"
    if path.exists() and not os.access(path, os.W_OK):
        return f"{path} is a file you cannot write to"
    return _writable_folder(path.absolute().parent)


def _readable_file(path: Path) -> str | None:
    if path.is_dir():
        return f"{path} is a folder, not a file"
    if not path.exists():
        return f"{path} does not exist"
    return None if os.access(path, os.R_OK) else f"{path} is a file you cannot read"


def _readable_folder(path: Path) -> str | None:
    if not path.exists():
        return f"{path} does not exist"
    return None if path.is_dir() else f"{path} is a file, not a folder"


def _path_argument(check: Callable[[Path], str | None]) -> Callable[[str], Callable[[str], str]]:
    def for_flag(flag: str) -> Callable[[str], str]:
        def argument(value: str) -> str:
            problem = check(Path(value).expanduser())
            if problem:
                raise ParadecodeError(f"{flag}: {problem}.")
            return value

        return argument

    return for_flag


folder_to_write = _path_argument(_writable_folder)  # a folder the command writes in: it exists or can be made
file_to_write = _path_argument(_writable_file)  # a file the command writes: not a folder; its folder can be made
file_to_read = _path_argument(_readable_file)
folder_to_read = _path_argument(_readable_folder)


def model_name(flag: str) -> Callable[[str], str]:
    """argparse type of --model / --draft-model: a built-in name, a .gguf file or a model folder."""
    def argument(value: str) -> str:
        from paradecode.models import locate

        try:
            locate(value)
        except ParadecodeError as error:
            raise ParadecodeError(f"{flag}: {error}") from None
        return value

    return argument


def add_cache_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cache-dir", type=folder_to_write("--cache-dir"),
                        help="model cache folder (default: $PARADECODE_CACHE or ~/.cache/paradecode)")


def add_model_arguments(parser: argparse.ArgumentParser, default_model: str) -> None:
    parser.add_argument("--model", "-m", default=default_model, type=model_name("--model"),
                        help=f"built-in name, .gguf file or HF model directory (default: {default_model})")
    parser.add_argument("--backend", default="auto", choices=("auto", "llama", "hf"),
                        help="auto: our transformer for Llama, Mistral, Qwen2, Qwen3 and Gemma-3 checkpoints, "
                             "transformers otherwise")
    from paradecode.api import DTYPES

    parser.add_argument("--dtype", default="auto", choices=DTYPES,
                        help="weights: int8 (llama backend: int8 weights and activations, 2-3x faster on a CPU), "
                             "q4 (a GGUF model's own Q4_0/Q4_1/Q4_K/Q5_0/Q6_K/Q8_0 blocks against int8 activations, "
                             "native forward only: fewer bytes per token than int8), fp32 (agrees with transformers), "
                             "auto (default): the model's measured default (see `paradecode models`), else fp32")
    add_cache_argument(parser)


def load_model(args: argparse.Namespace, dtype: str | None = None):
    """``paradecode.load`` with the model arguments of ``add_model_arguments`` (``dtype`` overrides ``--dtype``)."""
    import paradecode

    return paradecode.load(args.model, backend=args.backend, dtype=dtype or args.dtype, cache_dir=args.cache_dir)


def add_decoding_arguments(parser: argparse.ArgumentParser, temperature_help: str | None = None) -> None:
    """--method, --opt, --draft-model and the sampling flags. ``temperature_help`` replaces the default help of
    --temperature (and makes its default None, for a command that decides what no temperature means)."""
    parser.add_argument("--method", default=DEFAULT_METHOD,
                        help=f"decoding method (see `paradecode methods`; default: {DEFAULT_METHOD}, which picks the "
                        "fastest lossless drafter as it decodes; ar: plain decoding)")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="most tokens to generate (default: 256)")
    if temperature_help is None:
        parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default), > 0 samples")
        parser.add_argument("--top-k", type=int, default=0, help="sample from the k most likely tokens (0: off)")
        parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1: off)")
    else:
        parser.add_argument("--temperature", type=float, default=None, help=temperature_help)
        parser.add_argument("--top-k", type=int, default=None,
                            help="sample from the k most likely tokens (0: off; default: see --temperature)")
        parser.add_argument("--top-p", type=float, default=None,
                            help="nucleus sampling mass (1: off; default: see --temperature)")
    parser.add_argument("--seed", type=int, default=None, help="random seed for sampling")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--draft-model", type=model_name("--draft-model"),
                        help="draft model for --method draft (name, .gguf or directory)")
    parser.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE",
                        help="method option, e.g. --opt num_draft=4 (repeatable)")


def method_options(args: argparse.Namespace) -> dict:
    """Validate --method / --opt / --draft-model before any model is loaded, so mistakes fail fast."""
    from paradecode.registry import parse_options, resolve_method

    options = parse_options(args.opt)
    if args.draft_model:
        options["draft_model"] = args.draft_model  # a method without a draft model refuses it
    return resolve_method(args.method, options).options


def structured_output(args: argparse.Namespace) -> dict:
    """``--json-schema FILE`` / ``--regex RE`` / ``--grammar FILE`` as ``Model.generate`` arguments, checked before
    any model is loaded."""
    from paradecode.constraints import grammar_source

    given = {}
    if args.json_schema:
        given["json_schema"] = utf8.read(args.json_schema, f"the JSON schema file {args.json_schema}")
    if args.regex is not None:
        given["regex"] = args.regex
    if args.grammar:
        given["grammar"] = utf8.read(args.grammar, f"the grammar file {args.grammar}")
    grammar_source(**given)
    return given


def read_prompt(prompt: str | None) -> str:
    """The prompt argument, or standard input when it is absent or '-'; UTF-8 text either way (``utf8``)."""
    if prompt is None or prompt == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise ParadecodeError("no prompt: pass it as an argument or pipe it on stdin.")
        if hasattr(sys.stdin, "buffer"):  # the bytes as sent, decoded here so a bad byte is named
            prompt = utf8.decode(sys.stdin.buffer.read(), "standard input")
        else:
            prompt = sys.stdin.read()
    else:
        prompt = utf8.check(prompt, "the prompt argument", escaped_bytes=True)
    if not prompt.strip():
        raise ParadecodeError("the prompt is empty: give some text to continue or a question to answer.")
    return prompt


def positive(name: str, value: int) -> int:
    """``value`` of the flag ``name``, refused unless it is at least 1."""
    if value < 1:
        raise ParadecodeError(f"{name} must be a positive integer, got {value}.")
    return value
