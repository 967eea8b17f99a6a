"""Runs in which every request would fail the same way are refused before anything is served.

Exit 2 and one line, and an existing --output stays as it was (instead of exit 1 and a file of error
records): text prompts for a model without a tokenizer, and budgets that no request fits.  The boundary is
tested too: a run in which one request fits still runs, and only the others fail, each alone.  The
positions a request needs are computed here by hand: its prompt plus every new token but the last.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import ROOT

BASE = ROOT / "tests" / "fixtures" / "base"  # no tokenizer; context 64
OLD = b'{"an": "existing record"}\n'


def run(tmp_path, lines: list, flags: list[str], suffix: str = "jsonl"):
    """generate on the base fixture: (exit status, stderr lines, the --output file's bytes)."""
    prompts = tmp_path / f"p.{suffix}"
    if suffix == "jsonl":
        prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in lines))
    else:
        prompts.write_text("".join(p + "\n" for p in lines))
    output = tmp_path / "out.jsonl"
    output.write_bytes(OLD)
    done = subprocess.run(
        [sys.executable, "-m", "minirt.generate", "--model", str(BASE), "--prompts", str(prompts)]
        + ["--output", str(output), "--quiet", *flags],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    return done.returncode, done.stderr.splitlines(), output.read_bytes()


def needs(prompt_len: int, max_new_tokens: int) -> int:
    """KV positions a request reserves, by hand: prompt + max_new_tokens - 1, at least the prompt."""
    return min(max(prompt_len + max_new_tokens - 1, prompt_len), 64)


@settings(max_examples=8, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=3),
    max_new_tokens=st.integers(1, 6),
    data=st.data(),
)
def test_a_kv_budget_that_no_request_fits_is_exit_2_and_one_that_one_fits_runs(
    tmp_path_factory, lengths, max_new_tokens, data
):
    tmp_path = tmp_path_factory.mktemp("budget")
    smallest = min(needs(n, max_new_tokens) for n in lengths)
    budget = data.draw(st.integers(1, smallest + 2), label="budget")
    lines = [list(range(1, n + 1)) for n in lengths]
    flags = ["--kv-budget", str(budget), "--max-new-tokens", str(max_new_tokens)]
    status, stderr, output = run(tmp_path, lines, flags)
    if budget < smallest:
        assert status == 2 and len(stderr) == 1, stderr
        assert "no request of this run fits its budgets" in stderr[0]
        assert f"over the budget of {budget}" in stderr[0] and "Traceback" not in stderr[0]
        assert output == OLD
        return
    records = [json.loads(line) for line in output.splitlines()]
    fits = [needs(n, max_new_tokens) <= budget for n in lengths]
    assert [r["error"] is None for r in records] == fits
    assert status == (0 if all(fits) else 1)


def test_a_budget_that_one_request_fits_runs_and_the_other_fails_alone(tmp_path):
    """The boundary by hand: a 2-token prompt with 3 new tokens needs 2 + 3 - 1 = 4 positions, a 12-token one
    14; with a budget of 4 the first runs and only the second fails."""
    lines = [[1, 2], list(range(1, 13))]
    status, stderr, output = run(tmp_path, lines, ["--kv-budget", "4", "--max-new-tokens", "3"])
    assert status == 1, stderr
    records = [json.loads(line) for line in output.splitlines()]
    assert records[0]["error"] is None and len(records[0]["token_ids"]) == 3
    assert "needs 14 KV cache positions, over the budget of 4" in records[1]["error"]


def test_a_round_token_budget_under_every_prompt_is_exit_2_when_prefill_is_not_chunked(tmp_path):
    lines = [[1, 2, 3], [4, 5, 6, 7]]
    status, stderr, output = run(
        tmp_path,
        lines,
        ["--policy", "continuous", "--max-round-tokens", "2", "--no-chunked-prefill"],
    )
    assert status == 2 and len(stderr) == 1 and "exceeds the round token budget of 2" in stderr[0]
    assert output == OLD


def test_a_round_token_budget_under_every_prompt_chunks_them_and_changes_no_token(tmp_path):
    lines = [[1, 2, 3], [4, 5, 6, 7]]
    flags = ["--policy", "continuous", "--max-new-tokens", "5"]
    status, stderr, output = run(tmp_path, lines, [*flags, "--max-round-tokens", "2"])
    assert status == 0, stderr
    chunked = [json.loads(line) for line in output.splitlines()]
    status, stderr, output = run(tmp_path, lines, [*flags, "--no-chunked-prefill"])
    assert status == 0, stderr
    whole = [json.loads(line) for line in output.splitlines()]
    assert [r["token_ids"] for r in chunked] == [r["token_ids"] for r in whole]
    # Two tokens a round, decode rows first: the first prompt's 3 tokens take rounds 1-2 (its first token
    # comes in 2, then one a round to 6); the second's 4 take what is left, rounds 2-5, so its 5 tokens end in 9.
    assert [r["first_round"] for r in chunked] == [1, 2]
    assert [r["finish_round"] for r in chunked] == [6, 9]


@pytest.mark.parametrize("suffix", ["txt", "jsonl"])
def test_text_prompts_for_a_model_without_a_tokenizer_are_exit_2(tmp_path, suffix):
    status, stderr, output = run(tmp_path, ["To be", "or not"], ["--max-new-tokens", "2"], suffix)
    assert status == 2 and len(stderr) == 1
    assert "has no tokenizer, and every prompt is text" in stderr[0]
    assert output == OLD


def test_one_token_id_prompt_among_text_ones_runs_and_the_text_ones_fail_alone(tmp_path):
    status, stderr, output = run(
        tmp_path, ["To be", [1, 2, 3], "or not"], ["--max-new-tokens", "2"]
    )
    assert status == 1
    records = [json.loads(line) for line in output.splitlines()]
    assert [r["error"] is None for r in records] == [False, True, False]
    assert "no tokenizer" in records[0]["error"]


def test_a_bad_line_fails_alone_and_its_record_has_the_fields_of_its_peers(tmp_path):
    """A line refused before any prompt is made of it (an unknown field) is a failed record in its
    place, with the fields every record of the run has: with --logprobs, an empty logprobs list."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": [1, 2]}\n{"prompt": [3], "colour": "red"}\n{"prompt": [4]}\n')
    output = tmp_path / "out.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "minirt.generate", "--model", str(BASE), "--prompts", str(prompts)]
        + ["--output", str(output), "--quiet", "--logprobs", "--max-new-tokens", "2"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    good, bad, last = [json.loads(line) for line in output.read_text().splitlines()]
    assert bad["index"] == 1 and bad["finish_reason"] == "error" and "colour" in bad["error"]
    assert bad["token_ids"] == [] and bad["logprobs"] == [] and bad["first_round"] is None
    assert set(bad) == set(good) == set(last)
    assert len(good["logprobs"]) == len(good["token_ids"]) == 2
