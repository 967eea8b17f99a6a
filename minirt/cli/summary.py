"""The closing counts of a generate run, one fact per line.

Owns: `summary`, from the engine's `RunStats` and the load time.

Must not know: models, sampling or how groups are chosen.
"""

from __future__ import annotations


from .plural import plural
from ..engine.stats import RunStats


def tokens_per_second(stats: RunStats) -> float:
    if stats.wall_seconds > 0:
        return stats.generated_tokens / stats.wall_seconds
    return 0.0


def kv_limit_lines(stats: RunStats) -> list[str]:
    """A summary line when the KV budget held a group (or the continuous pool) below the batch
    size."""
    if not stats.kv_limited_rows:
        return []
    if stats.policy == "static":
        groups = plural(len(stats.kv_limited_rows), "group")
        return [
            f"kv budget    held {groups} below {plural(stats.batch_size, 'row')} "
            f"(rows: {', '.join(map(str, stats.kv_limited_rows))})"
        ]
    return [f"kv budget    held the pool to {stats.kv_limited_rows[-1]} of {stats.batch_size} rows"]


def summary(stats: RunStats, load_seconds: float) -> str:
    """The closing counts, one fact per line."""
    # Rows held, and rows run.
    row_rounds = sum(stats.held_rows_per_round)
    active = sum(stats.active_rows_per_round)
    ttft = sorted(stats.first_token_seconds) or [0.0]
    if stats.policy == "static":
        groups = f"groups       {len(stats.groups)} (static, batch size {stats.batch_size})"
    else:
        rows = plural(stats.batch_size, "row")
        groups = f"policy       continuous batching, up to {rows}"
    ok = stats.requests - stats.failed - stats.aborted
    outcomes = f"{ok} ok, {stats.failed} failed"
    # Only an engine driven by hand aborts: an offline run's line never mentions it.
    if stats.aborted:
        outcomes += f", {stats.aborted} aborted"
    lines = [
        f"requests     {stats.requests} ({outcomes})",
        groups,
        *kv_limit_lines(stats),
        f"rounds       {stats.rounds}",
        f"utilization  {stats.utilization:.1%} active rows ({active} of {row_rounds} row-rounds)",
        f"tokens       {stats.prompt_tokens} prompt{cached_note(stats)}, "
        f"{stats.generated_tokens} generated",
        f"speed        {tokens_per_second(stats):.1f} generated tokens/s",
        f"first token  {ttft[len(ttft) // 2]:.3f} s median, {ttft[-1]:.3f} s at most "
        "(time to first token)",
        f"wall time    {stats.wall_seconds:.2f} s generating, {load_seconds:.2f} s loading",
    ]
    return "\n".join(lines) + "\n"


def cached_note(stats: RunStats) -> str:
    """' (96 of them from the prefix cache, not computed)', when the cache gave any."""
    if not stats.cached_prompt_tokens:
        return ""
    return f" ({stats.cached_prompt_tokens} of them from the prefix cache, not computed)"
