"""The closing counts of a generate run, one fact per line.

Owns: `summary`, from the engine's `RunStats` and the load time.

Must not know: models, sampling or how groups are chosen.
"""

from __future__ import annotations


from ..engine.stats import RunStats


def tokens_per_second(stats: RunStats) -> float:
    return stats.generated_tokens / stats.wall_seconds if stats.wall_seconds > 0 else 0.0


def kv_limit_lines(stats: RunStats) -> list[str]:
    """A summary line when the KV budget held a group (or the continuous pool) below the batch size."""
    if not stats.kv_limited_rows:
        return []
    if stats.policy == "static":
        n = len(stats.kv_limited_rows)
        return [
            f"kv budget    held {n} group{'s' if n != 1 else ''} below {stats.batch_size} rows "
            f"(rows: {', '.join(map(str, stats.kv_limited_rows))})"
        ]
    return [f"kv budget    held the pool to {stats.kv_limited_rows[0]} of {stats.batch_size} rows"]


def summary(stats: RunStats, load_seconds: float) -> str:
    """The closing counts, one fact per line."""
    row_rounds, active = (
        sum(stats.held_rows_per_round),
        sum(stats.active_rows_per_round),
    )  # rows held, rows run
    ttft = sorted(stats.first_token_seconds) or [0.0]
    lines = [
        f"requests     {stats.requests} ({stats.requests - stats.failed} ok, {stats.failed} failed)",
        (
            f"groups       {len(stats.groups)} (static, batch size {stats.batch_size})"
            if stats.policy == "static"
            else f"policy       continuous batching, up to {stats.batch_size} rows"
        ),
        *kv_limit_lines(stats),
        f"rounds       {stats.rounds}",
        f"utilization  {stats.utilization:.1%} active rows ({active} of {row_rounds} row-rounds)",
        f"tokens       {stats.prompt_tokens} prompt, {stats.generated_tokens} generated",
        f"speed        {tokens_per_second(stats):.1f} generated tokens/s",
        f"first token  {ttft[len(ttft) // 2]:.3f} s median, {ttft[-1]:.3f} s at most (time to first token)",
        f"wall time    {stats.wall_seconds:.2f} s generating, {load_seconds:.2f} s loading",
    ]
    return "\n".join(lines) + "\n"
