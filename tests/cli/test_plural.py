"""Plurals: one of something is said in the singular, in the trace, the summary and the refusals."""

from __future__ import annotations

import io
import os

import pytest
from conftest import finished_request

from minirt.cli.grids import continuous_grid, group_grid
from minirt.cli.output_file import OutputFile
from minirt.cli.plural import noun_for, plural
from minirt.cli.progress import Progress
from minirt.cli.records import block_header
from minirt.cli.round_tables import grid_text
from minirt.cli.simulation import simulate
from minirt.cli.summary import summary
from minirt.engine.stats import RunStats


def test_plural_says_one_of_something_in_the_singular():
    assert [plural(n, "group") for n in (0, 1, 2)] == ["0 groups", "1 group", "2 groups"]
    assert plural(12345, "token", spec=",") == "12,345 tokens"
    assert noun_for(1, "request") == "request" and noun_for(None, "record") == "records"


def test_one_new_token_and_one_group_are_singular():
    """Before: '1 new tokens' in a completion's header, '1 groups' in the bar's final state."""
    request = finished_request(0, tokens=1)
    assert block_header(request) == "### [0]: length, 1 new token, group 1, rounds 1-1"
    stream = io.StringIO()
    stats = RunStats(batch_size=1, rounds=1, generated_tokens=1)
    stats.groups.append(object())
    Progress(1, stream=stream).update(stats, 1, force=True)
    assert " 1/1 requests | 1 group | round 1 | 1 token | " in stream.getvalue()


def test_a_runs_trace_and_summary_count_one_in_the_singular():
    sim = simulate([1], "static", 1)
    group = sim.stats.groups[0]
    assert group_grid(group, []).startswith("group 1: 1 member, rounds 1-1\n")
    assert "   1 token, length" in group_grid(group, [])
    assert grid_text(sim).startswith("static: 1 request, 1 row, 1 round, ")
    stats = RunStats(batch_size=1, policy="continuous", rounds=1)
    assert continuous_grid(sim.requests, stats).startswith(
        "continuous batching: 1 request in up to 1 row, rounds 1-1"
    )
    stats.active_rows_per_round = [1]
    stats.held_rows_per_round = [1]
    lines = summary(stats, 0.0).splitlines()
    assert "policy       continuous batching, up to 1 row" in lines
    assert any(line.endswith("(1 of 1 row-rounds)") for line in lines)


def test_a_file_that_fails_after_one_record_says_it_kept_one(tmp_path, monkeypatch):
    out = OutputFile(str(tmp_path / "out.jsonl"))
    out.write("{}\n")
    real_write = os.write

    def full(fd, data):
        if fd == out.fd:
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(Exception) as failure:
        out.write("{}\n")
    monkeypatch.undo()
    out.discard()
    assert "the 1 record before it is kept, a whole line" in str(failure.value)
