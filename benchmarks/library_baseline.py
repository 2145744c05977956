"""What one client through ``paradecode serve`` is compared with: the same short chat questions as
``server_load.py``, decoded one after another by ``Model.generate`` in this process (no HTTP).

    python benchmarks/library_baseline.py --prompts 16 --max-tokens 64          # the server's default method
    python benchmarks/library_baseline.py --method ar

Two untimed questions first (as the load test's warm-up); prints generated tokens per second over the timed
ones. Run it on an idle machine, right after (or before) ``serve_compare.py --clients 1``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import paradecode  # noqa: E402
from server_load import QUESTIONS  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--method", help="decoding method (default: the library's default)")
    parser.add_argument("--prompts", type=int, default=16, help="questions, in server_load.py's order (default: 16)")
    parser.add_argument("--max-tokens", type=int, default=64, help="max new tokens per answer (default: 64)")
    args = parser.parse_args()
    if not 1 <= args.prompts <= len(QUESTIONS):
        parser.error(f"--prompts must be between 1 and {len(QUESTIONS)}")
    model = paradecode.load(args.model)
    kwargs = dict(max_new_tokens=args.max_tokens, **({"method": args.method} if args.method else {}))
    for question in QUESTIONS[:2]:
        model.generate(question, **kwargs)
    tokens, start = 0, time.perf_counter()
    for question in QUESTIONS[: args.prompts]:
        tokens += len(model.generate(question, **kwargs).token_ids)
    wall = time.perf_counter() - start
    print(f"Model.generate, {args.prompts} chat questions one after another, {args.method or 'default method'}, "
          f"{args.max_tokens} tokens: {tokens} tokens in {wall:.2f} s = {tokens / wall:.1f} tok/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
