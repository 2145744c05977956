"""The ``paradecode`` command line: parses the arguments and runs the command they name.

The commands live beside the code they drive (``commands.py`` for generate, models, methods, trace, profile
and quality; ``benchmark/``, ``server/``, ``training/`` and ``dllm/`` each have theirs). Every user mistake
ends in a one-line message on stderr and exit code 2; ``generate --verify`` exits 3 when the method's output
differs from plain autoregressive decoding.
"""

from __future__ import annotations

import argparse
import sys

from paradecode.arguments import EXIT_NOT_LOSSLESS, EXIT_USAGE  # noqa: F401  (the CLI's exit codes)
from paradecode.errors import ParadecodeError

COMMAND_MODULES = ("paradecode.commands", "paradecode.benchmark.commands", "paradecode.server.commands",
                   "paradecode.training.commands", "paradecode.dllm.commands")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)  # path flags are checked here (arguments.folder_to_write, ...)
        if not getattr(args, "run", None):
            parser.print_help()
            return EXIT_USAGE
        return args.run(args) or 0
    except ParadecodeError as error:
        print(f"paradecode: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("paradecode: interrupted", file=sys.stderr)
        return 130


class Parser(argparse.ArgumentParser):
    """argparse, with a mistake in the arguments told on one line like every other error (exit code 2)."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"paradecode: error: {message} (see `{self.prog} --help`).\n")


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = Parser(
        prog="paradecode", description="Parallel decoding for language models: faster, with the same output."
    )
    commands = parser.add_subparsers(metavar="COMMAND")
    for module in COMMAND_MODULES:
        importlib.import_module(module).add_commands(commands)
    return parser


if __name__ == "__main__":
    sys.exit(main())
