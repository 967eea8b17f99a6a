"""The counts of a run, for its summary.

Owns: `RunStats`, what the engine counts as rounds run (requests, rounds, tokens, the rows each
round ran and held, groups, the KV budget's effect, times to first token), and `utilization`,
active row-rounds over held row-rounds.

Must not know: models, arrays, sampling or text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .scheduler import GroupRecord


@dataclass
class RunStats:
    """Counts for the run summary.  Utilization = active row-rounds / held row-rounds (a round
    holds the rows of its static group, or of the continuous pool: a single request is active
    in every row-round it holds)."""

    batch_size: int
    policy: str = "static"
    requests: int = 0
    # Requests that failed (an error of their own), and that their caller aborted.
    failed: int = 0
    aborted: int = 0
    rounds: int = 0
    prompt_tokens: int = 0
    # Of those, the ones copied from the prefix cache instead of computed.
    cached_prompt_tokens: int = 0
    generated_tokens: int = 0
    wall_seconds: float = 0.0
    # Static groups (none under continuous batching).
    groups: list[GroupRecord] = field(default_factory=list)
    # Per round: the rows that ran, and the rows whose KV slots were held.
    active_rows_per_round: list[int] = field(default_factory=list)
    held_rows_per_round: list[int] = field(default_factory=list)
    # The rows of each group or pool that the KV budget held down.
    kv_limited_rows: list[int] = field(default_factory=list)
    # Each served request's time to first token, in seconds from its arrival.
    first_token_seconds: list[float] = field(default_factory=list)

    def __repr__(self) -> str:
        """One line of the counts that matter, never every group's requests and token ids (the
        fields hold them; `print(llm.last_stats)` should not)."""
        return (
            f"RunStats(policy={self.policy!r}, batch_size={self.batch_size}, "
            f"requests={self.requests}, failed={self.failed}, aborted={self.aborted}, "
            f"rounds={self.rounds}, groups={len(self.groups)}, "
            f"prompt_tokens={self.prompt_tokens}, "
            f"cached_prompt_tokens={self.cached_prompt_tokens}, "
            f"generated_tokens={self.generated_tokens}, utilization={self.utilization:.1%}, "
            f"wall_seconds={self.wall_seconds:.3f})"
        )

    @property
    def utilization(self) -> float:
        held = sum(self.held_rows_per_round)
        if not held:
            return 0.0
        return sum(self.active_rows_per_round) / held
