"""The counts of a run, for its summary.

Owns: `RunStats`, what the engine counts as rounds run (requests, rounds, tokens, the rows each round ran and
held, groups, the KV budget's effect, times to first token), and `utilization`, active row-rounds over held
row-rounds.

Must not know: models, arrays, sampling or text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .scheduler import GroupRecord


@dataclass
class RunStats:
    """Counts for the run summary.  Utilization = active row-rounds / held row-rounds (a round holds the rows of
    its static group, or of the continuous pool: a single request is active in every row-round it holds)."""

    batch_size: int
    policy: str = "static"
    requests: int = 0
    failed: int = 0
    rounds: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    wall_seconds: float = 0.0
    groups: list[GroupRecord] = field(default_factory=list)  # static groups (none under continuous)
    active_rows_per_round: list[int] = field(default_factory=list)
    held_rows_per_round: list[int] = field(default_factory=list)
    kv_limited_rows: list[int] = field(
        default_factory=list
    )  # rows of each group or pool the KV budget held down
    first_token_seconds: list[float] = field(
        default_factory=list
    )  # each served request's time to first token

    @property
    def utilization(self) -> float:
        held = sum(self.held_rows_per_round)
        return sum(self.active_rows_per_round) / held if held else 0.0
