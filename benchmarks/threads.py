"""``Model.generate`` called from the main thread, from one worker thread, or from a pool of threads taking turns:
generated tokens per second of each (see ``paradecode.backends.openmp`` for why the thread matters).

    python benchmarks/threads.py --mode main
    python benchmarks/threads.py --mode worker        # every call on one other thread
    python benchmarks/threads.py --mode pool          # calls go round 4 threads in turn
    python benchmarks/threads.py --mode pool --warm-up-on-main   # a generation on the main thread first

The model loads on the main thread. Each round decodes the same chat questions (``server_load.py``'s) one after
another; an untimed round first; prints the median round. Run the modes as separate processes, taking turns.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import paradecode  # noqa: E402
from server_load import QUESTIONS  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--mode", choices=("main", "worker", "pool"), default="main")
    parser.add_argument("--method", default="ar")
    parser.add_argument("--prompts", type=int, default=8, help="questions a round (default: 8)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (default: 3)")
    parser.add_argument("--warm-up-on-main", action="store_true",
                        help="one short generation on the main thread before the rounds")
    args = parser.parse_args()
    if not 1 <= args.prompts <= len(QUESTIONS) or args.rounds < 1:
        parser.error(f"--prompts must be in 1..{len(QUESTIONS)} and --rounds at least 1")
    model = paradecode.load(args.model)
    if args.warm_up_on_main:
        model.generate(QUESTIONS[0], method=args.method, max_new_tokens=8)

    def one(question: str) -> int:
        return len(model.generate(question, method=args.method, max_new_tokens=args.max_tokens).token_ids)

    # the pool's threads take the calls in turn (one executor each: a shared one would reuse one idle thread)
    pool = [ThreadPoolExecutor(1) for _ in range({"main": 0, "worker": 1, "pool": 4}[args.mode])]
    used, calls = set(), [0]

    def call(question: str) -> int:
        if not pool:
            used.add(threading.get_ident())
            return one(question)
        calls[0] += 1
        return pool[calls[0] % len(pool)].submit(lambda: (used.add(threading.get_ident()), one(question))[1]).result()

    rates = []
    for round_ in range(args.rounds + 1):
        start, tokens = time.perf_counter(), 0
        for question in QUESTIONS[: args.prompts]:
            tokens += call(question)
        if round_:
            rates.append(tokens / (time.perf_counter() - start))
    print(f"{args.mode}{' after a warm-up on the main thread' if args.warm_up_on_main else ''}, {len(used)} "
          f"thread(s), {args.method}, {args.prompts} questions x {args.max_tokens} tokens: median "
          f"{statistics.median(rates):.1f} tok/s (rounds {', '.join(f'{r:.1f}' for r in rates)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
