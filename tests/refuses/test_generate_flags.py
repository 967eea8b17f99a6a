"""`generate`'s flags that can never work are refused at the start.

Each refusal is exit 2 and one line on standard error, before anything is served or written: the checks
that need no model come before it loads (a missing --model would otherwise be the error shown), and the
one that needs the vocabulary (--stop-token-id) comes before the first request is served.
"""

from __future__ import annotations

import io
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import ROOT
from minirt.cli.command import EXIT_OK, EXIT_USAGE, run_command
from minirt.cli.kv_budget import parse_kv_budget
from minirt.generate import main
from minirt.llm import LLM

OLD = b'{"an": "existing record"}\n'


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("flags")
    (folder / "p.txt").write_text("To be\nShall I\n")
    return folder


@pytest.fixture(scope="module")
def vocab_size(tiny_lm) -> int:
    return LLM(tiny_lm).model.config.vocab_size


def refused(folder: Path, model: str, flags: list[str]) -> str:
    """Run with `flags` and an existing --output; check the run was refused with nothing written; the line."""
    output = folder / "out.jsonl"
    output.write_bytes(OLD)
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = run_command(
            main,
            [
                "--backend",
                "numpy",
                "--model",
                model,
                "--prompts",
                str(folder / "p.txt"),
                "--output",
                str(output),
                *flags,
            ],
            prog="minirt.generate",
        )
    lines = err.getvalue().splitlines()
    assert code == EXIT_USAGE and len(lines) == 1, err.getvalue()
    assert lines[0].startswith("minirt.generate: error: ") and "Traceback" not in err.getvalue()
    assert out.getvalue() == "" and output.read_bytes() == OLD
    assert sorted(p.name for p in folder.iterdir()) == [
        "out.jsonl",
        "p.txt",
    ]  # no partial file left
    return lines[0]


NOT_A_BUDGET = st.one_of(
    st.builds(
        lambda x, unit: repr(x) + unit,
        st.floats(max_value=0.0, allow_nan=False),
        st.sampled_from(["", "MiB", "GiB", "tokens"]),
    ),
    st.sampled_from(
        [
            "nan",
            "NaN",
            "-nan",
            "inf",
            "Infinity",
            "-inf",
            "1e400",
            "-0",
            "0",
            "0MiB",
            "1.5",
            "2.5tokens",
            "12XB",
            "MiB",
            "",
            "4096 MB",
            "1e3MiB",
            "0.0000001KiB",
            "99999999999GiB",
        ]
    ),
)


@settings(max_examples=40, deadline=None)
@given(budget=NOT_A_BUDGET)
def test_a_kv_budget_that_is_not_tokens_or_a_memory_size_is_refused_before_loading(files, budget):
    line = refused(
        files, "/no/such/model", [f"--kv-budget={budget}"]
    )  # before loading: not "does not exist"
    assert line.startswith("minirt.generate: error: --kv-budget: ") and repr(budget) in line, line


@pytest.mark.parametrize(
    "text, parsed",
    [
        ("20000", ("tokens", 20000)),
        ("20000tokens", ("tokens", 20000)),
        (" 1 token ", ("tokens", 1)),
        ("512MiB", ("bytes", 512 * 2**20)),
        ("1.5GiB", ("bytes", 3 * 2**29)),
        ("64kib", ("bytes", 65536)),
        ("4096MiB", ("bytes", 2**32)),
        (".5MiB", ("bytes", 2**19)),
    ],
)
def test_a_kv_budget_is_a_number_of_tokens_or_a_memory_size(text, parsed):
    assert parse_kv_budget(text) == parsed


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(max_value=-1))
def test_a_negative_seed_is_refused_before_loading(files, seed):
    assert f"--seed must be at least 0, got {seed}" in refused(
        files, "/no/such/model", [f"--seed={seed}"]
    )


@settings(max_examples=20, deadline=None)
@given(size=st.integers(max_value=0))
def test_a_batch_size_below_one_is_refused_before_loading(files, size):
    assert "--batch-size must be at least 1" in refused(
        files, "/no/such/model", [f"--batch-size={size}"]
    )


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_a_stop_token_id_outside_the_vocabulary_is_refused_before_serving(
    files, tiny_lm, vocab_size, data
):
    token_id = data.draw(st.one_of(st.integers(min_value=vocab_size), st.integers(max_value=-1)))
    good = data.draw(st.lists(st.integers(0, vocab_size - 1), max_size=2))
    flags = [f"--stop-token-id={t}" for t in [*good, token_id]]
    line = refused(files, str(tiny_lm), flags)
    if token_id < 0:
        # Refused before loading, as any sampling flag, naming the flag and the id as given.
        assert (
            "bad sampling flag --stop-token-id " in line and f" {token_id}: stop_token_ids" in line
        )
    else:
        # The id as the user wrote it (past 12 digits, its first 12 and "..."), and the range.
        shown = str(token_id) if token_id < 10**12 else f"{str(token_id)[:12]}..."
        assert line.startswith("minirt.generate: error: bad sampling flag --stop-token-id: ")
        assert f"stop token id {shown} is outside the vocabulary [0, {vocab_size})" in line


def test_the_last_token_of_the_vocabulary_is_a_fine_stop_token(files, tiny_lm, vocab_size):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = run_command(
            main,
            [
                "--backend",
                "numpy",
                "--model",
                str(tiny_lm),
                "--prompts",
                str(files / "p.txt"),
                "--max-new-tokens",
                "2",
                "--stop-token-id",
                str(vocab_size - 1),
                "--stop-token-id",
                "0",
            ],
            prog="minirt.generate",
        )
    assert code == EXIT_OK and out.getvalue().count("### ") == 2


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_a_huge_batch_size_with_few_requests_runs_at_once(tiny_lm, files, policy):
    start = time.perf_counter()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "minirt.generate",
            "--backend",
            "numpy",
            "--model",
            str(tiny_lm),
            "--prompts",
            str(files / "p.txt"),
            "--batch-size",
            str(10**9),
            "--max-new-tokens",
            "3",
            "--policy",
            policy,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert result.returncode == EXIT_OK, result.stderr
    assert result.stdout.count("### ") == 2 and "requests     2 (2 ok, 0 failed)" in result.stderr
    assert time.perf_counter() - start < 20
