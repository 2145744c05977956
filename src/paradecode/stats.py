"""What every generation reports, whatever the method: ``DecodeStats`` with one ``StepRecord`` per step.

Glossary (as in vLLM): a step is one target forward pass that verifies a proposal. Of the drafted tokens,
the *accepted* ones matched; then the target adds one token of its own: the *recovered* token (resampled
after a rejection) or the *bonus* token (after every draft token was accepted). So a step commits
``accepted_len + 1`` tokens, and ``mean_accepted`` (tokens per target forward, bonus counted) is at least 1.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace


@dataclass
class StepRecord:
    drafted: list[int]  # draft token ids (chain order, or tree nodes in order)
    parents: list[int] | None  # tree: parent index of each drafted node (-1: root); None for a chain
    accepted: list[int]  # indices into `drafted` of the accepted path
    next_token: int  # the target's own token after the accepted path
    bonus: bool  # True: every drafted token on a full path was accepted (next_token is the bonus)
    committed: int  # tokens this step added to the output (may be cut by EOS, stop or max tokens)
    time_s: float = 0.0
    info: dict | None = None  # method-specific notes (e.g. which drafter `auto` used)

    @property
    def accepted_len(self) -> int:
        return len(self.accepted)


@dataclass
class DecodeStats:
    method: str = ""
    prompt_tokens: int = 0
    new_tokens: int = 0
    forward_passes: int = 0  # target forward passes in decode steps (prefill not counted)
    draft_forward_passes: int = 0  # forward passes run by the drafter (draft model, layer skip)
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    prefill_time_s: float = 0.0
    wall_time_s: float = 0.0  # prefill + decode
    stop_reason: str = ""  # "eos" | "max_new_tokens" | "stop" | "context"
    steps: list[StepRecord] = field(default_factory=list)
    info: dict = field(default_factory=dict)  # method-level notes

    @property
    def accepted_per_step(self) -> list[int]:
        """Tokens committed per target forward (accepted drafts + the target's own token)."""
        return [s.committed for s in self.steps]

    @property
    def mean_accepted(self) -> float:
        return self.new_tokens / self.forward_passes if self.forward_passes else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def decode_time_s(self) -> float:
        return max(self.wall_time_s - self.prefill_time_s, 0.0)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0

    def to_dict(self, with_steps: bool = True) -> dict:
        # without steps, asdict's deep copy skips them (a request's last chunk in the server: ~1 ms a step)
        data = asdict(self if with_steps else replace(self, steps=[]))
        if not with_steps:
            data.pop("steps")
        data.update(
            accepted_per_step=self.accepted_per_step,
            mean_accepted=self.mean_accepted,
            acceptance_rate=self.acceptance_rate,
            decode_time_s=self.decode_time_s,
            tokens_per_second=self.tokens_per_second,
        )
        return data
