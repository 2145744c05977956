"""A stand-in llama.cpp worker for the tests: the real worker's protocol (``serve``, ``main``) around an engine
that needs no model and dies when told to. Run as ``python fake_llamacpp_worker.py PATH_OF_llamacpp_worker.py``.

Config keys (besides the real ones): ``die_at_prompt_len`` (generating for a prompt of this many tokens kills
the process), ``die_with`` ("SIGILL", "SIGSEGV" or "exit": ``os._exit(3)``), ``die_on_load`` (die while loading),
``starts_file`` (a line is appended to it each time a worker starts loading)."""

import importlib.util
import os
import signal
import sys

WALL_TIME_S = 0.25  # what the fake reports as its own timing


def die(how: str) -> None:
    if how == "exit":
        os._exit(3)
    os.kill(os.getpid(), getattr(signal, how))


class FakeEngine:
    def __init__(self, config: dict) -> None:
        self.config = config
        with open(config["starts_file"], "a") as starts:
            starts.write("start\n")
        if config.get("die_on_load"):
            die(config["die_with"])

    def generate(self, prompt_ids: list[int], max_new_tokens: int, stop_ids: list[int]) -> dict:
        if len(prompt_ids) == self.config.get("die_at_prompt_len"):
            die(self.config["die_with"])
        tokens = [3 + (sum(prompt_ids) + i) % 40 for i in range(max_new_tokens)]
        return dict(token_ids=tokens, wall_time_s=WALL_TIME_S, forward_passes=len(tokens),
                    draft_lengths=[0] * len(tokens), accepted_lengths=[0] * len(tokens),
                    accepted_per_step=[1] * len(tokens))


if __name__ == "__main__":
    spec = importlib.util.spec_from_file_location("llamacpp_worker", sys.argv[1])
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    worker.main({"llamacpp": FakeEngine})
