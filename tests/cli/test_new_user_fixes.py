"""What a new user trips on first: a progress bar that completions are printed onto, a --prompt that
names a file, inspect's model flag, help piped into `head`, and "1 groups"."""

import io
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from minirt.__main__ import SUBCOMMANDS, main as minirt_main
from minirt.cli.command import EXIT_OK, EXIT_STDOUT_CLOSED, EXIT_USAGE, run_command
from minirt.cli.grids import continuous_grid, group_grid
from minirt.cli.output_file import OutputFile
from minirt.cli.plural import noun_for, plural
from minirt.cli.progress import Progress
from minirt.cli.records import OrderedOutput, block_header
from minirt.cli.round_tables import grid_text
from minirt.cli.simulation import simulate
from minirt.cli.summary import summary
from minirt.engine.params import SamplingParams
from minirt.engine.request import Request, Status
from minirt.engine.stats import RunStats
from minirt.generate import main as generate_main
from minirt.inspect import main as inspect_main


def rendered(screen: str) -> list[str]:
    """What a terminal shows for `screen`: a carriage return goes back to the line's start, and what
    is written then overwrites what was there."""
    lines = [""]
    column = 0
    for ch in screen:
        if ch == "\r":
            column = 0
        elif ch == "\n":
            lines.append("")
            column = 0
        else:
            line = lines[-1].ljust(column)
            lines[-1] = line[:column] + ch + line[column + 1 :]
            column += 1
    return [line.rstrip() for line in lines]


def finished_request(index: int = 0, tokens: int = 1) -> Request:
    request = Request(
        index=index,
        id=str(index),
        prompt="To be",
        prompt_ids=[1, 2],
        params=SamplingParams(max_new_tokens=tokens),
    )
    request.token_ids = [5] * tokens
    request.text = " or not"
    request.finish_reason = "length"
    request.group = 1
    request.first_round = 1
    request.finish_round = tokens
    request.status = Status.FINISHED
    return request


# ----------------------------------------------------------------------------- a. the progress bar


def test_a_completion_starts_on_a_clean_line_after_the_progress_bar():
    """Before: the bar's line was left as it was, and '### [0]: ...' was printed right after
    '... tok/s' on the same line of the terminal."""
    screen = io.StringIO()
    progress = Progress(2, stream=screen, enabled=True)
    output = OrderedOutput(2, screen, None, before_write=progress.clear)
    stats = RunStats(batch_size=2, rounds=1, generated_tokens=2)
    progress.update(stats, 0, force=True)
    output.final(finished_request(0))
    progress.update(stats, 1, force=True)
    output.final(finished_request(1))
    progress.update(stats, 2, force=True)
    progress.close()
    lines = rendered(screen.getvalue())
    headers = [line for line in lines if "### [" in line]
    assert len(headers) == 2 and all(line.startswith("### [") for line in headers), lines
    # The bar comes back after each completion, and its final state is the last line.
    assert lines[-2].startswith("generating [") and "2/2 requests" in lines[-2]
    assert not any("tok/s" in line and "### [" in line for line in lines)


def test_clearing_a_bar_not_drawn_writes_nothing():
    stream = io.StringIO()
    Progress(3, stream=stream, enabled=True).clear()
    Progress(3, stream=stream, enabled=False).clear()
    assert stream.getvalue() == ""


def read_all(fd: int, timeout: float = 120) -> bytes:
    chunks = []
    while True:
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            break
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: the other side of the pty is closed
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks)


def test_on_a_terminal_the_bar_never_shares_a_line_with_a_completion(tiny_lm, tmp_path):
    """`python -m minirt.generate --prompts FILE` with standard output and error on one terminal."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("a\nb\nc\nd\ne\n")
    leader, follower = pty.openpty()
    argv = [sys.executable, "-m", "minirt.generate", "--model", str(tiny_lm)]
    argv += ["--prompts", str(prompts), "--batch-size", "2", "--max-new-tokens", "3"]
    proc = subprocess.Popen(
        argv + ["--ignore-eos"],
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=follower,
        cwd=ROOT,
    )
    os.close(follower)
    try:
        screen = read_all(leader).decode("utf-8", "replace")
    finally:
        os.close(leader)
    assert proc.wait(timeout=120) == EXIT_OK, screen
    assert "generating [" in screen  # the bar was drawn
    lines = rendered(screen.replace("\x1b[1m", "").replace("\x1b[0m", ""))
    headers = [line for line in lines if "### [" in line]
    assert len(headers) == 5 and all(line.startswith("### [") for line in headers), lines
    assert not any("tok/s" in line and "### [" in line for line in lines), lines


# ----------------------------------------------------------------------------- b. --prompt FILE


def run_generate(argv, capsys):
    code = run_command(generate_main, argv, prog="minirt.generate")
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_prompt_that_names_a_file_is_still_text_but_gets_a_hint(
    tiny_lm, tmp_path, capsys, monkeypatch
):
    # A short relative path: the tiny model's context holds its text whatever tmp_path is.
    monkeypatch.chdir(tmp_path)
    prompts = Path("p.txt")
    prompts.write_text("To be\n")
    argv = ["--model", str(tiny_lm), "--prompt", str(prompts), "--max-new-tokens", "2"]
    code, out, err = run_generate(argv, capsys)
    assert code == EXIT_OK and out.startswith("### [0]: ")
    # Generated from the path's text, as before.
    assert f"\n{prompts}" in out
    note = (
        f"note: --prompt takes the prompt's text; {prompts} is a file: "
        f"use --prompts {prompts} to read it"
    )
    assert [line for line in err.splitlines() if "note:" in line] == [
        f"python -m minirt.generate: {note}".removeprefix("python -m ")
    ]


def test_a_prompt_that_is_no_file_gets_no_hint(tiny_lm, capsys):
    argv = ["--model", str(tiny_lm), "--prompt", "To be", "--max-new-tokens", "2"]
    code, _, err = run_generate(argv, capsys)
    assert code == EXIT_OK and "note:" not in err


def test_prompts_text_that_is_no_file_suggests_prompt(tiny_lm, capsys):
    argv = ["--model", str(tiny_lm), "--prompts", "To be, or not to be"]
    code, out, err = run_generate(argv, capsys)
    assert code == EXIT_USAGE and out == "" and err.count("\n") == 1
    assert err.startswith(
        "minirt.generate: error: prompts file To be, or not to be does not exist; "
        "pass a .txt or .jsonl file, or - for standard input"
    )
    assert "use --prompt 'To be, or not to be'" in err


# ----------------------------------------------------------------------------- c. inspect --model


def test_inspect_takes_its_model_as_model_too(tiny_lm, capsys):
    assert inspect_main(["--model", str(tiny_lm), "--ids", "5,6"]) == EXIT_OK
    flag = capsys.readouterr().out
    assert inspect_main([str(tiny_lm), "--ids", "5,6"]) == EXIT_OK
    positional = capsys.readouterr().out
    assert flag.startswith(f"model      {tiny_lm}\n")
    assert flag.splitlines()[1] == positional.splitlines()[1]


def test_inspect_refuses_the_model_given_twice_in_one_line(tiny_lm, capsys):
    argv = [str(tiny_lm), "--model", str(tiny_lm)]
    code = run_command(inspect_main, argv, prog="minirt.inspect")
    err = capsys.readouterr().err
    assert code == EXIT_USAGE and err.count("\n") == 1
    assert "the model is given twice" in err and "--model" in err


# ----------------------------------------------------------------------------- d. help into `head`

HELP_FORMS = [["-h"], ["--help"], ["--version"]] + [
    [name, flag] for name in sorted(SUBCOMMANDS) for flag in ("--help", "--version")
]


@pytest.mark.parametrize("argv", HELP_FORMS, ids=" ".join)
def test_help_into_a_closed_pipe_exits_quietly_with_0(argv):
    """`minirt -h | head -3`: before, sometimes "standard output was closed" and exit 141 (or
    Python's "Exception ignored ... BrokenPipeError")."""
    reader, writer = os.pipe()
    # The reader has gone before anything is written: what `head` does once it has its lines.
    os.close(reader)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "minirt", *argv],
            stdout=writer,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            timeout=120,
        )
    finally:
        os.close(writer)
    assert (done.returncode, done.stderr) == (EXIT_OK, "")


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_each_modules_help_into_a_closed_pipe_exits_quietly(name):
    reader, writer = os.pipe()
    os.close(reader)
    try:
        done = subprocess.run(
            [sys.executable, "-m", f"minirt.{name}", "--help"],
            stdout=writer,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            timeout=120,
        )
    finally:
        os.close(writer)
    assert (done.returncode, done.stderr) == (EXIT_OK, "")


@pytest.fixture
def closed_stdout(monkeypatch):
    """Standard output on a pipe whose reader has gone, as after `| head -3`."""
    reader, writer = os.pipe()
    os.close(reader)
    stream = os.fdopen(writer, "w")
    monkeypatch.setattr(sys, "stdout", stream)
    yield stream
    monkeypatch.undo()
    try:
        stream.close()
    except OSError:
        pass


def test_help_written_to_a_closed_stdout_in_process(closed_stdout, capsys):
    assert minirt_main(["-h"]) == EXIT_OK
    with pytest.raises(SystemExit) as exit_:
        minirt_main(["rounds", "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().err == ""


def test_completions_cut_by_head_still_exit_141(tiny_lm, tmp_path):
    """Only help and --version are quiet: a run whose output is cut short says so."""
    (tmp_path / "p.txt").write_text("a\nb\n")
    reader, writer = os.pipe()
    os.close(reader)
    argv = [sys.executable, "-m", "minirt", "generate", "--model", str(tiny_lm)]
    argv += ["--prompts", str(tmp_path / "p.txt"), "--max-new-tokens", "2"]
    try:
        done = subprocess.run(
            argv, stdout=writer, stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=120
        )
    finally:
        os.close(writer)
    assert done.returncode == EXIT_STDOUT_CLOSED
    assert "standard output was closed" in done.stderr


# ----------------------------------------------------------------------------- e. plurals


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
    group = sim.scheduler.groups[0]
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
