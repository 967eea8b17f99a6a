"""`generate --output` and standard output lose nothing and clobber nothing.

A run refused at the start leaves an existing --output untouched; --output may not be the prompts file
or anything inside the model folder; a failed write (a full disk, /dev/full, a size limit) exits 74 with
only whole records kept; a closed standard output (`| head`) exits 141; SIGTERM (143) and Ctrl-C (130)
keep every final record.  Each failure is one line on standard error, never a traceback.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import io
import json
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import ROOT, fake_hub_cache
from minirt.cli.command import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_OUTPUT_FAILED,
    EXIT_STDOUT_CLOSED,
    EXIT_TERMINATED,
    EXIT_USAGE,
    run_command,
)
from minirt.cli.output_file import OutputFile
from minirt.cli.signals import StopSignals
from minirt.errors import MinirtError, OutputError, Terminated
from minirt.engine.engine import Engine
from minirt.generate import main
from minirt.model.gpt2 import GPT2

OLD = b'{"an": "existing record"}\n'


def run_in_process(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = run_command(
            main, ["--backend", "numpy", "--no-progress", *argv], prog="minirt.generate"
        )
    return code, out.getvalue(), err.getvalue()


# `python -m minirt.generate` with a clock that stands still: every timing field of every record is 0.0, so two
# runs of the same input write the same bytes (with a running clock a record's length varies from run to run
# with how wide its timings happen to be).
STILL_CLOCK = """
import runpy, time
time.perf_counter = lambda: 0.0
runpy.run_module("minirt.generate", run_name="__main__", alter_sys=True)
"""


def popen(argv: list[str], fsize: int | None = None, still_clock: bool = False) -> subprocess.Popen:
    """`python -m minirt.generate ARGV`, with pipes; `fsize` limits the size of any file it writes, and
    `still_clock` stops the clock (STILL_CLOCK)."""

    def child_setup():
        signal.signal(
            signal.SIGINT, signal.SIG_DFL
        )  # Ctrl-C works even if the test runner ignores it
        if fsize is not None:  # past the limit a write fails (EFBIG) instead of killing the process
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    if still_clock:
        command = [sys.executable, "-c", STILL_CLOCK]
    else:
        command = [sys.executable, "-m", "minirt.generate"]
    return subprocess.Popen(
        [*command, "--backend", "numpy", "--no-progress", *argv],
        cwd=ROOT,
        preexec_fn=child_setup,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err and "Exception ignored" not in err
    return lines[0]


def whole_jsonl(path: Path) -> list[dict]:
    """The records, after checking the file is JSONL line by line and ends with a whole line."""
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n"), data[-80:]
    return [
        json.loads(line) for line in data.split(b"\n")[:-1]
    ]  # not splitlines(): JSON may hold U+2028


def folder_state(folder: Path) -> dict:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if p.is_file()
    }


def prompts_file(folder: Path, n: int) -> Path:
    path = folder / "p.txt"
    path.write_text("".join(f"prompt number {i}\n" for i in range(n)))
    return path


# ---------------------------------------------------------------- a run refused at the start


@pytest.mark.parametrize(
    "case, flags, fragment",
    [
        ("missing model", ["--model", "/no/such/model"], "does not exist"),
        ("broken model", ["--model", "{broken}"], "config.json"),
        ("bad flag", ["--kv-budget", "nan"], "--kv-budget"),
        ("bad sampling flag", ["--temperature", "-1"], "temperature"),
        ("missing prompts", ["--prompts", "/no/such/prompts.txt"], "does not exist"),
        ("empty prompts", ["--prompts", "{empty}"], "holds no prompts"),
        ("stop token out of vocabulary", ["--stop-token-id", "100000"], "--stop-token-id"),
    ],
)
def test_a_run_refused_at_the_start_leaves_the_output_file_as_it_was(
    tiny_lm, tmp_path, case, flags, fragment
):
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{")
    (tmp_path / "empty.txt").write_text("\n")
    prompts = prompts_file(tmp_path, 2)
    out = tmp_path / "out.jsonl"
    out.write_bytes(OLD)
    before = folder_state(tmp_path)
    flags = [f.format(broken=tmp_path / "broken", empty=tmp_path / "empty.txt") for f in flags]
    argv = ["--model", str(tiny_lm), "--prompts", str(prompts), "--output", str(out), *flags]
    code, stdout, err = run_in_process(argv)
    assert code == EXIT_USAGE, case
    assert fragment in one_error_line(err) and stdout == ""
    assert folder_state(tmp_path) == before  # the old records, and no partial file left behind
    assert not list(tmp_path.glob(".*partial"))


@pytest.mark.parametrize(
    "where",
    [
        "config.json",
        "weights file",
        "new file",
        "through a symlinked folder",
        "symlink to config.json",
        "prompts file",
        "symlink to the prompts file",
    ],
)
def test_output_on_the_prompts_file_or_inside_the_model_folder_is_refused(tiny_lm, tmp_path, where):
    model = shutil.copytree(tiny_lm, tmp_path / "model")
    prompts = prompts_file(tmp_path, 2)
    (tmp_path / "link").symlink_to(model, target_is_directory=True)
    (tmp_path / "config_link.jsonl").symlink_to(model / "config.json")
    (tmp_path / "prompts_link.jsonl").symlink_to(prompts)
    output = {
        "config.json": model / "config.json",
        "weights file": model / "model.safetensors",
        "new file": model / "records.jsonl",
        "through a symlinked folder": tmp_path / "link" / "config.json",
        "symlink to config.json": tmp_path / "config_link.jsonl",
        "prompts file": prompts,
        "symlink to the prompts file": tmp_path / "prompts_link.jsonl",
    }[where]
    before, model_before = folder_state(tmp_path), folder_state(model)
    code, stdout, err = run_in_process(
        ["--model", str(model), "--prompts", str(prompts), "--output", str(output)]
    )
    assert code == EXIT_USAGE
    line = one_error_line(err)
    assert ("prompts file" in line) if "prompts" in where else ("inside the model folder" in line)
    assert stdout == "" and folder_state(tmp_path) == before and folder_state(model) == model_before


def test_a_finished_run_replaces_the_output_and_keeps_its_mode(tiny_lm, tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_bytes(OLD)
    out.chmod(0o640)
    code, _, _ = run_in_process(
        [
            "--model",
            str(tiny_lm),
            "--prompts",
            str(prompts_file(tmp_path, 3)),
            "--output",
            str(out),
            "--max-new-tokens",
            "2",
            "--quiet",
        ]
    )
    assert code == EXIT_OK
    assert [r["index"] for r in whole_jsonl(out)] == [0, 1, 2]
    assert out.stat().st_mode & 0o777 == 0o640 and not list(tmp_path.glob(".*partial"))


# ---------------------------------------------------------------- write failures


@settings(max_examples=60, deadline=None)
@given(
    lines=st.lists(
        st.dictionaries(st.text(max_size=5), st.text(max_size=30), max_size=3), max_size=8
    ),
    limit=st.integers(0, 600),
    chunk=st.integers(1, 64),
)
def test_a_write_that_fails_part_way_is_cut_back_to_the_last_whole_record(
    tmp_path_factory, lines, limit, chunk
):
    """Writes land `chunk` bytes at a time (partial writes) until `limit` bytes, then the disk is full."""
    folder = tmp_path_factory.mktemp("enospc")
    target = folder / "out.jsonl"
    target.write_bytes(OLD)
    written = {"bytes": 0}
    real_write = os.write

    def full_disk(fd, data):
        room = min(len(data), chunk, limit - written["bytes"])
        if room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written["bytes"] += room
        return real_write(fd, bytes(data[:room]))

    records = [json.dumps(x, ensure_ascii=False) + "\n" for x in lines]
    file, kept = OutputFile(str(target)), 0
    with mock.patch("minirt.cli.output_file.os.write", full_disk):
        try:
            for line in records:
                file.write(line)
                kept += 1
        except OutputError as exc:
            assert (
                exc.exit_code == EXIT_OUTPUT_FAILED
                and "No space left" in str(exc)
                and "\n" not in str(exc)
            )
            assert (
                sum(len(r.encode()) for r in records[: kept + 1]) > limit
            )  # it failed only when out of room
    file.keep()
    assert target.read_text(encoding="utf-8") == "".join(records[:kept])
    assert [json.loads(x) for x in target.read_bytes().split(b"\n")[:-1]] == lines[:kept]
    assert not list(folder.glob(".*partial"))


@pytest.fixture(scope="module")
def unlimited_run(tiny_lm, tmp_path_factory) -> tuple[list[str], bytes, list[int]]:
    """A still-clock run of 6 prompts with no size limit: its arguments but --output, the bytes it wrote, and
    where each record ends in them (the boundaries every limited run of the same input has too)."""
    folder = tmp_path_factory.mktemp("unlimited")
    argv = [
        "--model",
        str(tiny_lm),
        "--prompts",
        str(prompts_file(folder, 6)),
        "--max-new-tokens",
        "3",
        "--quiet",
    ]
    out = folder / "full.jsonl"
    proc = popen([*argv, "--output", str(out)], still_clock=True)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_OK, err
    records = whole_jsonl(out)
    # The clock stood still: no record's length depends on when it was written.
    timings = {
        record[name] for record in records for name in ("arrival_s", "first_token_s", "finish_s")
    }
    assert len(records) == 6 and timings == {0.0}, timings
    full = out.read_bytes()
    ends = [index + 1 for index, byte in enumerate(full) if byte == ord("\n")]
    return argv, full, ends


# Where the size limit falls, from the unlimited run's record ends: (ends) -> limit in bytes.
LIMITS = {
    "one byte": lambda ends: 1,
    "one byte short of the first record's end": lambda ends: ends[0] - 1,
    "exactly at the first record's end": lambda ends: ends[0],
    "one byte past the first record's end": lambda ends: ends[0] + 1,
    "exactly at the third record's end": lambda ends: ends[2],
    "halfway through the fourth record": lambda ends: (ends[2] + ends[3]) // 2,
    "one byte short of the last record's end": lambda ends: ends[-1] - 1,
    "exactly at the last record's end": lambda ends: ends[-1],
}


@pytest.mark.parametrize("where", LIMITS)
def test_a_file_size_limit_exits_74_with_whole_records(unlimited_run, tmp_path, where):
    """A record that would pass the file size limit (RLIMIT_FSIZE: the write fails with EFBIG) is cut back, and
    every record before it is kept whole: exactly those that end at or before the limit."""
    argv, full, ends = unlimited_run
    limit = LIMITS[where](ends)
    # Those that fit: a record ending exactly at the limit fits, one a byte past it does not.
    fitting = sum(end <= limit for end in ends)
    out = tmp_path / "out.jsonl"
    out.write_bytes(OLD)
    proc = popen([*argv, "--output", str(out)], fsize=limit, still_clock=True)
    _, err = proc.communicate(timeout=60)
    kept = out.read_bytes()
    assert kept == full[: ends[fitting - 1] if fitting else 0]
    assert not list(tmp_path.glob(".*partial"))
    if fitting == len(ends):
        # Every record fitted: nothing failed.
        assert proc.returncode == EXIT_OK, err
        return
    assert proc.returncode == EXIT_OUTPUT_FAILED
    line = one_error_line(err)
    assert f"cannot write --output {out} (File too large); the {fitting} record" in line


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
def test_dev_full_exits_74_in_one_line(tiny_lm, tmp_path):
    proc = popen(
        [
            "--model",
            str(tiny_lm),
            "--prompts",
            str(prompts_file(tmp_path, 2)),
            "--output",
            "/dev/full",
            "--max-new-tokens",
            "2",
        ]
    )
    stdout, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_OUTPUT_FAILED
    assert "cannot write --output /dev/full (No space left on device)" in one_error_line(err)
    assert stdout.startswith("### [0]")  # the completion was shown before its record failed


# ---------------------------------------------------------------- a read-only file system, no permission, a full disk

# What a system gives when --output cannot be opened, and the one line that must say so: the reason in words
# that say what it means, and what to do.
OPEN_REFUSALS = {
    errno.EROFS: ": it is on a read-only file system; write the records somewhere else",
    errno.EACCES: " (Permission denied); check the folder exists and is writable",
    errno.ENOSPC: (
        " (No space left on device): the disk is full; free some space, or write the records somewhere else"
    ),
}


def failing_opens(error: int):
    """os.open and os.access as a file system gives them when it refuses writes with `error`: read-only
    (EROFS) or unwritable (EACCES), neither a file nor a folder can be written; full (ENOSPC), an existing file
    opens for writing but no new file can be made.  Reading still works."""
    real_open, real_access = os.open, os.access
    if error == errno.ENOSPC:
        refused_flags = os.O_CREAT
    else:
        refused_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT

    def fake_open(path, flags, *args, **kwargs):
        if flags & refused_flags:
            raise OSError(error, os.strerror(error), path)
        return real_open(path, flags, *args, **kwargs)

    def fake_access(path, mode, *args, **kwargs):
        # A read-only or unwritable file is not writable, as access(2) says (root included, on a read-only one).
        if mode & os.W_OK and error != errno.ENOSPC:
            return False
        return real_access(path, mode, *args, **kwargs)

    return mock.patch.multiple(os, open=fake_open, access=fake_access)


@pytest.mark.parametrize("existing", [True, False], ids=["existing file", "new file"])
@pytest.mark.parametrize("error", list(OPEN_REFUSALS), ids=errno.errorcode.get)
def test_an_output_that_cannot_be_opened_says_why_in_one_line_before_anything_runs(
    tiny_lm, tmp_path, error, existing
):
    prompts = prompts_file(tmp_path, 2)
    out = tmp_path / "out.jsonl"
    if existing:
        out.write_bytes(OLD)
    before = folder_state(tmp_path)
    with failing_opens(error):
        code, stdout, err = run_in_process(
            ["--model", str(tiny_lm), "--prompts", str(prompts), "--output", str(out)]
        )
    assert code == EXIT_USAGE and stdout == ""
    assert (
        one_error_line(err)
        == f"minirt.generate: error: cannot write --output {out}{OPEN_REFUSALS[error]}"
    )
    assert folder_state(tmp_path) == before and not list(tmp_path.glob(".*partial"))


# What follows "cannot write --output PATH" when a write fails part-way through a run.
WRITE_REASONS = {
    errno.EROFS: ": it is on a read-only file system",
    errno.ENOSPC: " (No space left on device): the disk is full",
    errno.EFBIG: " (File too large)",
    errno.EIO: " (Input/output error)",
}


@pytest.mark.parametrize("error", list(WRITE_REASONS), ids=errno.errorcode.get)
def test_a_write_that_fails_says_why_and_keeps_the_records_before_it(tmp_path, error):
    target = tmp_path / "out.jsonl"
    file = OutputFile(str(target))
    file.write('{"first": 1}\n')
    with mock.patch(
        "minirt.cli.output_file.os.write", side_effect=OSError(error, os.strerror(error))
    ):
        with pytest.raises(OutputError) as refusal:
            file.write('{"second": 2}\n')
    file.keep()
    assert refusal.value.exit_code == EXIT_OUTPUT_FAILED
    assert str(refusal.value) == (
        f"cannot write --output {target}{WRITE_REASONS[error]}; the 1 record before it is kept, a whole line"
    )
    assert target.read_bytes() == b'{"first": 1}\n'


def test_an_empty_output_path_is_refused_and_nothing_is_made(tmp_path, monkeypatch):
    """OutputFile(""): not the current folder's parent's partial file renamed over the current folder."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MinirtError, match="^--output is empty; "):
        OutputFile("")
    assert list(tmp_path.iterdir()) == [] and list(tmp_path.parent.glob(".minirt-*")) == []


# ---------------------------------------------------------------- a closed standard output


@pytest.mark.parametrize("with_output", [False, True], ids=["stdout only", "with --output"])
def test_a_closed_standard_output_exits_141_and_says_how_far_it_got(tiny_lm, tmp_path, with_output):
    n = 150
    out = tmp_path / "out.jsonl"
    argv = [
        "--model",
        str(tiny_lm),
        "--prompts",
        str(prompts_file(tmp_path, n)),
        "--batch-size",
        "4",
        "--max-new-tokens",
        "30",
        "--ignore-eos",
    ] + (["--output", str(out)] if with_output else [])
    proc = popen(argv)
    assert proc.stdout.readline().startswith("### [0]")
    proc.stdout.close()  # as `| head -1` does
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == EXIT_STDOUT_CLOSED
    line = one_error_line(err)
    shown = int(re.search(rf"closed after (\d+) of {n} completions reached it", line).group(1))
    assert 1 <= shown < n
    if with_output:
        assert "--output" in line and [r["index"] for r in whole_jsonl(out)] == list(range(n))
    else:
        assert "stopped" in line


class ClosesAfter(io.StringIO):
    """A standard output whose reader goes away after `blocks` completions (each one write)."""

    def __init__(self, blocks: int):
        super().__init__()
        self.left = blocks

    def write(self, text: str) -> int:
        if self.left == 0:
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")
        self.left -= 1
        return super().write(text)


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 7),
    batch_size=st.integers(1, 3),
    shown=st.integers(0, 7),
    with_output=st.booleans(),
)
def test_a_closed_standard_output_stops_the_run_unless_output_wants_the_rest(
    tiny_lm, tmp_path_factory, n, batch_size, shown, with_output
):
    folder = tmp_path_factory.mktemp("closed")
    out, tokens = folder / "out.jsonl", 3
    argv = [
        "--backend",
        "numpy",
        "--model",
        str(tiny_lm),
        "--prompts",
        str(prompts_file(folder, n)),
        "--batch-size",
        str(batch_size),
        "--max-new-tokens",
        str(tokens),
        "--ignore-eos",
    ]
    argv += ["--output", str(out)] if with_output else []
    rounds, real_forward, err = [], GPT2.forward, io.StringIO()

    def counted_forward(self, *args, **kwargs):
        rounds.append(1)
        return real_forward(self, *args, **kwargs)

    with (
        mock.patch.object(GPT2, "forward", counted_forward),
        redirect_stdout(ClosesAfter(shown)),
        redirect_stderr(err),
    ):
        code = run_command(main, argv, prog="minirt.generate")
    groups = -(-n // batch_size)  # static groups of batch_size, each `tokens` rounds long
    if shown >= n:  # the reader stayed to the end
        assert code == EXIT_OK and len(rounds) == groups * tokens
        return
    assert code == EXIT_STDOUT_CLOSED
    assert f"closed after {shown} of {n} completions reached it" in one_error_line(err.getvalue())
    if with_output:  # the run went on: every record is in the file
        assert len(rounds) == groups * tokens and [r["index"] for r in whole_jsonl(out)] == list(
            range(n)
        )
    else:  # it stopped at the end of the group whose completion found no reader
        assert len(rounds) == (shown // batch_size + 1) * tokens


def test_run_command_does_not_call_a_broken_pipe_success():
    def main(argv):
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    err = io.StringIO()
    # Standard output a StringIO: run_command then mutes no file descriptor of pytest's own
    # capture (pointing it at /dev/null broke pytest's read of it at teardown under pytest 9).
    # The real descriptor's muting is tested through `| head` in subprocesses above.
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        assert run_command(main, [], prog="minirt.x") == EXIT_STDOUT_CLOSED
    assert "standard output was closed" in one_error_line(err.getvalue())


# ---------------------------------------------------------------- SIGTERM and Ctrl-C


@pytest.mark.parametrize("policy", ["static", "continuous"])
@pytest.mark.parametrize(
    "signum, code, word",
    [
        (signal.SIGTERM, EXIT_TERMINATED, "terminated"),
        (signal.SIGINT, EXIT_INTERRUPTED, "interrupted"),
    ],
    ids=["SIGTERM", "SIGINT"],
)
def test_a_signal_keeps_every_final_record(tiny_lm, tmp_path, policy, signum, code, word):
    n = 200
    out = tmp_path / "out.jsonl"
    out.write_bytes(OLD)
    proc = popen(
        [
            "--model",
            str(tiny_lm),
            "--prompts",
            str(prompts_file(tmp_path, n)),
            "--policy",
            policy,
            "--batch-size",
            "3",
            "--max-new-tokens",
            "40",
            "--ignore-eos",
            "--output",
            str(out),
        ]
    )
    assert proc.stdout.readline().startswith("### [0]")
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code
    final = int(
        re.fullmatch(
            rf"minirt.generate: {word}; (\d+) of {n} records were final and written",
            one_error_line(err),
        ).group(1)
    )
    records = whole_jsonl(out)
    assert 1 <= len(records) == final < n  # every final record, and only those, each a whole line
    assert len({r["index"] for r in records}) == final
    assert all(r["error"] is None and len(r["token_ids"]) == 40 for r in records)
    assert not list(tmp_path.glob(".*partial"))


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_an_interruption_keeps_records_finished_but_not_yet_reported(tiny_lm, tmp_path, policy):
    """Ctrl-C after a round finished two requests, before the engine handed them on: both are still written."""
    out = tmp_path / "out.jsonl"

    def interrupted(self, active):
        if any(r.finished for r in active):
            raise KeyboardInterrupt
        return []

    with mock.patch.object(Engine, "release_finished", interrupted):
        code, _, err = run_in_process(
            [
                "--model",
                str(tiny_lm),
                "--prompts",
                str(prompts_file(tmp_path, 4)),
                "--policy",
                policy,
                "--batch-size",
                "2",
                "--max-new-tokens",
                "3",
                "--ignore-eos",
                "--output",
                str(out),
                "--quiet",
            ]
        )
    assert code == EXIT_INTERRUPTED
    assert (
        one_error_line(err) == "minirt.generate: interrupted; 2 of 4 records were final and written"
    )
    assert [(r["index"], len(r["token_ids"])) for r in whole_jsonl(out)] == [(0, 3), (1, 3)]


def test_the_signal_handlers_are_main_s_only(tiny_lm, tmp_path):
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    prompts = prompts_file(tmp_path, 1)
    for extra in ([], ["--seed", "-1"], ["--model", "/no/such/model"]):
        run_in_process(
            ["--model", str(tiny_lm), "--prompts", str(prompts), "--max-new-tokens", "1", *extra]
        )
        assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


@pytest.mark.parametrize(
    "signum, raised", [(signal.SIGTERM, Terminated), (signal.SIGINT, KeyboardInterrupt)]
)
def test_a_signal_waits_for_the_held_block_to_end(signum, raised):
    # A runner started in the background (`cmd &`, nohup) inherits an ignored SIGINT, which StopSignals rightly
    # keeps ignored; this test is about a handled signal, so it starts from Python's own handler.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    steps = []
    try:
        with StopSignals() as signals:
            with pytest.raises(raised):
                with signals.held():
                    signal.raise_signal(signum)
                    steps.append("the block ran to its end")
            with pytest.raises(raised):
                signal.raise_signal(signum)
                steps.append("not reached outside a held block")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert steps == ["the block ran to its end"]


# ---------------------------------------------------------------- the model's own files, in a hub cache too


def tree_state(root: Path) -> dict:
    """Every entry below `root`: a symlink's target, or a file's bytes (hashed), or 'dir'."""
    return {
        str(p.relative_to(root)): (
            f"-> {os.readlink(p)}"
            if p.is_symlink()
            else hashlib.sha256(p.read_bytes()).hexdigest()
            if p.is_file()
            else "dir"
        )
        for p in sorted(root.rglob("*"))
    }


HUB_OUTPUTS = {  # where --output points, relative to the test's folder
    "a snapshot's config.json": "hub/models--someone--tiny/snapshots/abc123/config.json",
    "a new file in the snapshot": "hub/models--someone--tiny/snapshots/abc123/records.jsonl",
    "a blob": "hub/models--someone--tiny/blobs/blob-config.json",
    "a new file in the repo folder": "hub/models--someone--tiny/records.jsonl",
    "a symlink to a snapshot file": "link.jsonl",
    "a hard link to a blob": "hard.jsonl",
}


@pytest.mark.parametrize("model_as", ["hub id", "snapshot folder"])
@pytest.mark.parametrize("where", HUB_OUTPUTS)
def test_output_on_a_hub_cache_entry_s_files_is_refused(
    tiny_lm, tmp_path, monkeypatch, where, model_as
):
    repo, snapshot = fake_hub_cache(tmp_path, tiny_lm)
    (tmp_path / "link.jsonl").symlink_to(snapshot / "config.json")
    os.link(repo / "blobs" / "blob-config.json", tmp_path / "hard.jsonl")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    prompts = prompts_file(tmp_path, 2)
    before = tree_state(tmp_path)
    code, stdout, err = run_in_process(
        [
            "--model",
            "someone/tiny" if model_as == "hub id" else str(snapshot),
            "--prompts",
            str(prompts),
            "--output",
            str(tmp_path / HUB_OUTPUTS[where]),
        ]
    )
    assert code == EXIT_USAGE and stdout == ""
    assert "inside the model folder" in one_error_line(err)
    assert (
        tree_state(tmp_path) == before
    )  # nothing written, created or replaced, no partial file anywhere


@pytest.mark.parametrize(
    "where", ["the shared file", "the model's symlink to it", "another symlink to it"]
)
def test_output_on_shared_storage_a_model_file_links_to_is_refused(tiny_lm, tmp_path, where):
    """A plain model folder whose files are symlinks to shared storage."""
    shared, model = tmp_path / "shared", tmp_path / "model"
    shutil.copytree(tiny_lm, shared)
    model.mkdir()
    for file in shared.iterdir():
        (model / file.name).symlink_to(file)
    (tmp_path / "elsewhere.jsonl").symlink_to(shared / "config.json")
    output = {
        "the shared file": shared / "config.json",
        "the model's symlink to it": model / "config.json",
        "another symlink to it": tmp_path / "elsewhere.jsonl",
    }[where]
    prompts = prompts_file(tmp_path, 2)
    before = tree_state(tmp_path)
    code, stdout, err = run_in_process(
        ["--model", str(model), "--prompts", str(prompts), "--output", str(output)]
    )
    assert code == EXIT_USAGE and stdout == "" and "inside the model folder" in one_error_line(err)
    assert tree_state(tmp_path) == before


def test_output_beside_a_hub_cache_entry_is_fine(tiny_lm, tmp_path, monkeypatch):
    fake_hub_cache(tmp_path, tiny_lm)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    out = tmp_path / "hub" / "records.jsonl"  # in the cache, but outside the entry's repo folder
    code, _, _ = run_in_process(
        [
            "--model",
            "someone/tiny",
            "--prompts",
            str(prompts_file(tmp_path, 2)),
            "--output",
            str(out),
            "--max-new-tokens",
            "2",
            "--quiet",
        ]
    )
    assert code == EXIT_OK and [r["index"] for r in whole_jsonl(out)] == [0, 1]


# ---------------------------------------------------------------- streams, pipes and FIFOs are written directly


def records_in(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.split(b"\n") if line.startswith(b"{")]


def generate_argv(tiny_lm, prompts: Path, *flags: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "minirt.generate",
        "--backend",
        "numpy",
        "--no-progress",
        "--model",
        str(tiny_lm),
        "--prompts",
        str(prompts),
        "--max-new-tokens",
        "2",
        *flags,
    ]


@pytest.mark.parametrize(
    "stream", ["stdout, a pipe", "stdout, a file (>)", "stdout, a file (>>)", "stderr, a pipe"]
)
def test_output_on_standard_output_or_error_is_written_there(tiny_lm, tmp_path, stream):
    """`--output /dev/stdout`: the records go where standard output goes, between the completions, and a
    file the shell redirected it to is neither replaced nor cut (a `>>` file keeps what it had)."""
    n, earlier = 3, b"earlier content\n"
    prompts = prompts_file(tmp_path, n)
    if stream.startswith("stderr"):
        result = subprocess.run(
            generate_argv(tiny_lm, prompts, "--output", "/dev/stderr"),
            cwd=ROOT,
            capture_output=True,
            check=False,
        )
        assert result.returncode == EXIT_OK, result.stderr
        assert [r["index"] for r in records_in(result.stderr)] == list(range(n))
        return
    if stream == "stdout, a pipe":
        result = subprocess.run(
            generate_argv(tiny_lm, prompts, "--output", "/dev/stdout", "--quiet"),
            cwd=ROOT,
            capture_output=True,
            check=False,
        )
        assert result.returncode == EXIT_OK, result.stderr
        assert [r["index"] for r in whole_jsonl_bytes(result.stdout)] == list(range(n))
        return
    shell_file = tmp_path / "shell.out"
    shell_file.write_bytes(earlier)
    inode = shell_file.stat().st_ino
    with open(shell_file, "ab" if ">>" in stream else "wb") as redirect:
        result = subprocess.run(
            generate_argv(tiny_lm, prompts, "--output", "/dev/stdout"),
            cwd=ROOT,
            stdout=redirect,
            stderr=subprocess.PIPE,
            check=False,
        )
    assert result.returncode == EXIT_OK, result.stderr
    data = shell_file.read_bytes()
    assert shell_file.stat().st_ino == inode and not list(tmp_path.glob(".*partial"))
    assert data.startswith(earlier) if ">>" in stream else not data.startswith(earlier)
    assert [r["index"] for r in records_in(data)] == list(range(n))
    marks = [data.index(f"### [{i}]".encode()) for i in range(n)] + [len(data)]
    for i in range(n):  # completion i, then its record, then completion i + 1
        assert f'"index": {i},'.encode() in data[marks[i] : marks[i + 1]]


def whole_jsonl_bytes(data: bytes) -> list[dict]:
    assert data.endswith(b"\n"), data[-80:]
    return [json.loads(line) for line in data.split(b"\n")[:-1]]


@pytest.mark.parametrize("kind", ["/dev/fd/N, a pipe", "a FIFO"])
def test_output_on_a_pipe_or_fifo_is_written_directly(tiny_lm, tmp_path, kind):
    n = 3
    prompts = prompts_file(tmp_path, n)
    if kind == "a FIFO":
        fifo = tmp_path / "fifo"
        os.mkfifo(fifo)
        received = []
        reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
        reader.start()
        result = subprocess.run(
            generate_argv(tiny_lm, prompts, "--output", str(fifo), "--quiet"),
            cwd=ROOT,
            capture_output=True,
            check=False,
            timeout=60,
        )
        reader.join(timeout=10)
        data = received[0]
        assert stat.S_ISFIFO(fifo.lstat().st_mode)  # still a FIFO: nothing renamed over it
    else:
        read_end, write_end = os.pipe()
        result = subprocess.run(
            generate_argv(tiny_lm, prompts, "--output", f"/dev/fd/{write_end}", "--quiet"),
            cwd=ROOT,
            capture_output=True,
            check=False,
            timeout=60,
            pass_fds=(write_end,),
        )
        os.close(write_end)
        with os.fdopen(read_end, "rb") as pipe:
            data = pipe.read()
    assert result.returncode == EXIT_OK, result.stderr
    assert [r["index"] for r in whole_jsonl_bytes(data)] == list(range(n))
    assert not list(tmp_path.glob(".*partial"))


# ---------------------------------------------------------------- the partial file


@settings(max_examples=40, deadline=None)
@given(
    length=st.integers(1, 255),
    lines=st.lists(st.text(max_size=20), max_size=4),
    exists=st.booleans(),
)
def test_the_partial_file_is_new_short_named_and_renamed_with_the_mode(
    tmp_path_factory, length, lines, exists
):
    """Any name the file system takes (up to 255 bytes) works; the partial file's name is short and fresh."""
    folder = tmp_path_factory.mktemp("partial")
    target = folder / ("r" * length)
    if exists:
        target.write_bytes(OLD)
        target.chmod(0o604)
    file = OutputFile(str(target))
    partial = Path(file.partial)
    assert partial.parent == folder and re.fullmatch(r"\.minirt-\w+\.partial", partial.name)
    records = [json.dumps(x) + "\n" for x in lines]
    for line in records:
        file.write(line)
    file.keep()
    umask = os.umask(0)
    os.umask(umask)
    assert target.read_text() == "".join(records) and not list(folder.glob(".*partial"))
    assert target.stat().st_mode & 0o777 == (0o604 if exists else 0o666 & ~umask)


def test_a_symlink_planted_at_a_guessable_partial_name_is_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    shared = tmp_path / "shared"  # a folder others may write to
    shared.mkdir()
    for pid in (os.getpid(), os.getpid() + 1):  # the old, predictable name
        (shared / f".out.jsonl.{pid}.partial").symlink_to(victim)
    file = OutputFile(str(shared / "out.jsonl"))
    file.write('{"a": 1}\n')
    file.keep()
    assert victim.read_bytes() == b"precious\n"
    assert (shared / "out.jsonl").read_bytes() == b'{"a": 1}\n' and not (
        shared / "out.jsonl"
    ).is_symlink()


def test_discarding_a_partial_file_that_is_already_gone_does_not_raise(tmp_path):
    file = OutputFile(str(tmp_path / "out.jsonl"))
    os.unlink(file.partial)
    file.discard()
    file.discard()  # twice, even: the error that brought us here is the one to tell
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- standard output that fails


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
@pytest.mark.parametrize("with_output", [False, True], ids=["stdout only", "with --output"])
def test_a_full_standard_output_exits_74_in_one_line(tiny_lm, tmp_path, with_output):
    n = 3
    out = tmp_path / "out.jsonl"
    flags = ["--output", str(out)] if with_output else []
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            generate_argv(tiny_lm, prompts_file(tmp_path, n), *flags),
            cwd=ROOT,
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
            timeout=60,
        )
    assert result.returncode == EXIT_OUTPUT_FAILED
    line = one_error_line(result.stderr)
    assert "cannot write standard output (No space left on device)" in line
    if with_output:
        assert "holds every record" in line and [r["index"] for r in whole_jsonl(out)] == list(
            range(n)
        )


class FailsAfter(io.StringIO):
    """A standard output that fails (a full disk, an I/O error) after `blocks` completions (each one write)."""

    def __init__(self, blocks: int, errno_: int):
        super().__init__()
        self.left, self.errno = blocks, errno_

    def write(self, text: str) -> int:
        if self.left == 0:
            raise OSError(self.errno, os.strerror(self.errno))
        self.left -= 1
        return super().write(text)


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(1, 5),
    shown=st.integers(0, 5),
    with_output=st.booleans(),
    errno_=st.sampled_from([errno.ENOSPC, errno.EIO, errno.EFBIG, errno.EBADF]),
)
def test_a_failing_standard_output_exits_74_and_output_still_gets_every_record(
    tiny_lm, tmp_path_factory, n, shown, with_output, errno_
):
    folder = tmp_path_factory.mktemp("failing")
    out, err = folder / "out.jsonl", io.StringIO()
    argv = [
        "--backend",
        "numpy",
        "--model",
        str(tiny_lm),
        "--prompts",
        str(prompts_file(folder, n)),
        "--max-new-tokens",
        "2",
        "--batch-size",
        "2",
    ] + (["--output", str(out)] if with_output else [])
    with redirect_stdout(FailsAfter(shown, errno_)), redirect_stderr(err):
        code = run_command(main, argv, prog="minirt.generate")
    if shown >= n:
        assert code == EXIT_OK
        return
    assert code == EXIT_OUTPUT_FAILED
    line = one_error_line(err.getvalue())
    assert (
        f"cannot write standard output ({os.strerror(errno_)}) after {shown} of {n} completions"
        in line
    )
    if with_output:
        assert [r["index"] for r in whole_jsonl(out)] == list(range(n))


@pytest.mark.parametrize(
    "error, code",
    [
        (OSError(errno.ENOSPC, "No space left on device"), EXIT_OUTPUT_FAILED),
        (BrokenPipeError(errno.EPIPE, "Broken pipe"), EXIT_STDOUT_CLOSED),
    ],
)
def test_run_command_s_last_flush_of_standard_output_fails_in_one_line(error, code):
    class FailsToFlush(io.StringIO):
        def flush(self):
            raise error

    def main(argv):
        print("a result")
        return EXIT_OK

    err = io.StringIO()
    with redirect_stdout(FailsToFlush()), redirect_stderr(err):
        assert run_command(main, [], prog="minirt.x") == code
    assert "standard output" in one_error_line(err.getvalue())


# ---------------------------------------------------------------- signals while standard output is blocked


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="F_SETPIPE_SZ is Linux's")
def test_sigterm_ends_a_run_whose_standard_output_nobody_reads(tiny_lm, tmp_path):
    n = 200
    out = tmp_path / "out.jsonl"
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, getattr(fcntl, "F_SETPIPE_SZ", 1031), 4096)  # a small pipe, quickly full
    proc = subprocess.Popen(
        generate_argv(
            tiny_lm,
            prompts_file(tmp_path, n),
            "--output",
            str(out),
            "--max-new-tokens",
            "20",
            "--ignore-eos",
        ),
        cwd=ROOT,
        stdout=write_end,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(write_end)
    try:
        sizes, deadline = [], time.monotonic() + 20
        while (
            len(sizes) < 4 or len(set(sizes[-4:])) > 1 or sizes[-1] == 0
        ):  # the records stopped growing
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
            sizes.append(sum(p.stat().st_size for p in tmp_path.glob(".*partial")))
        proc.send_signal(signal.SIGTERM)
        start = time.monotonic()
        assert proc.wait(timeout=10) == EXIT_TERMINATED and time.monotonic() - start < 5
        err = proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
        os.close(read_end)
    final = int(
        re.fullmatch(
            rf"minirt.generate: terminated; (\d+) of {n} records were final and written",
            one_error_line(err),
        ).group(1)
    )
    assert 1 <= len(whole_jsonl(out)) == final < n


# ---------------------------------------------------------------- an interruption before any record


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(1, 4),
    batch_size=st.integers(1, 2),
    stop_at=st.integers(0, 8),
    signalled=st.sampled_from([Terminated, KeyboardInterrupt]),
    policy=st.sampled_from(["static", "continuous"]),
)
def test_an_interruption_before_any_record_leaves_the_output_file_as_it_was(
    tiny_lm, tmp_path_factory, n, batch_size, stop_at, signalled, policy
):
    folder = tmp_path_factory.mktemp("early")
    out = folder / "out.jsonl"
    out.write_bytes(OLD)
    calls, real_forward = [], GPT2.forward

    def interrupted_forward(self, *args, **kwargs):
        calls.append(1)
        if len(calls) > stop_at:
            raise signalled
        return real_forward(self, *args, **kwargs)

    with mock.patch.object(GPT2, "forward", interrupted_forward):
        code, _, err = run_in_process(
            [
                "--model",
                str(tiny_lm),
                "--prompts",
                str(prompts_file(folder, n)),
                "--batch-size",
                str(batch_size),
                "--policy",
                policy,
                "--max-new-tokens",
                "2",
                "--ignore-eos",
                "--output",
                str(out),
                "--quiet",
            ]
        )
    assert not list(folder.glob(".*partial"))
    if code == EXIT_OK:
        assert len(whole_jsonl(out)) == n
        return
    assert code == (EXIT_TERMINATED if signalled is Terminated else EXIT_INTERRUPTED)
    final = int(re.search(r"; (\d+) of", one_error_line(err)).group(1))
    if final == 0:
        assert out.read_bytes() == OLD  # the run produced nothing: the earlier records stay
    else:
        assert len(whole_jsonl(out)) == final
