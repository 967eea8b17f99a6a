"""Every command output quoted in README.md and docs/*.md is what the command prints now (tools/quality/
quoted_outputs.py: timings blanked, each SVG byte for byte), and every fenced block there either quotes a command
or says why it does not: a quote cannot go stale unseen.

`python tools/quality/quoted_outputs.py --write` remakes them all from the commands."""

from __future__ import annotations

import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools" / "quality"))

import quoted_outputs  # after the sys.path insert above

QUOTES, PROBLEMS = quoted_outputs.all_quotes()


def test_every_fenced_block_quotes_a_command_or_says_why_not():
    assert PROBLEMS == []


def test_the_quotes_are_found():
    """The markers have teeth: README quotes the first run, the trace, the seed exercise and both SVGs."""
    commands = [q.command for q in QUOTES if q.document == "README.md"]
    assert "python -m minirt.rounds --lengths 2,5,8,4 --batch-size 3" in commands
    assert sum(q.svg is not None for q in QUOTES) == 2
    assert len(QUOTES) >= 9


@pytest.mark.parametrize("quote", QUOTES, ids=[q.where for q in QUOTES])
def test_each_quote_is_what_its_command_prints_now(quote):
    assert quoted_outputs.stale(quote) is None, quote.where


def test_a_stale_quote_is_caught(tmp_path, monkeypatch):
    """The check has teeth: the seed exercise's old legend (without `~ prefill chunk`), as the README once
    showed it, is stale; so is a changed count, while a changed speed is not."""
    document = tmp_path / "doc.md"
    now = quoted_outputs.quoted_lines(
        next(
            q
            for q in QUOTES
            if q.command.endswith("--lengths 2,5,8,4 --batch-size 3") and q.svg is None
        )
    )
    old_legend = [line.replace("~ prefill chunk, ", "") for line in now]
    summary = ["rounds       100", "speed        570.0 generated tokens/s"]
    marker = "<!-- output: python -m minirt.rounds --lengths 2,5,8,4 --batch-size 3 -->"
    document.write_text("\n".join([marker, "```", *old_legend, "```", ""]))
    monkeypatch.setattr(quoted_outputs, "ROOT", tmp_path)
    [quote], problems = quoted_outputs.quotes_in("doc.md")
    assert problems == []
    assert "prefill chunk" in quoted_outputs.stale(quote)
    # Timing lines compare with their numbers blanked; other numbers count.
    assert quoted_outputs.blanked(summary) == quoted_outputs.blanked(
        ["rounds       100", "speed        12.5 generated tokens/s"]
    )
    assert quoted_outputs.blanked(summary) != quoted_outputs.blanked(
        ["rounds       101", "speed        570.0 generated tokens/s"]
    )


def test_an_unlabelled_block_is_a_problem(tmp_path, monkeypatch):
    (tmp_path / "doc.md").write_text("Some text.\n\n```\nan output nobody checks\n```\n")
    monkeypatch.setattr(quoted_outputs, "ROOT", tmp_path)
    quotes, problems = quoted_outputs.quotes_in("doc.md")
    assert quotes == [] and len(problems) == 1 and "doc.md:3" in problems[0]
