"""`generate --output` and standard output lose nothing and clobber nothing (issue #10, family 6).

A run refused at the start leaves an existing --output untouched; --output may not be the prompts file
or anything inside the model folder; a failed write (a full disk, /dev/full, a size limit) exits 74 with
only whole records kept; a closed standard output (`| head`) exits 141; SIGTERM (143) and Ctrl-C (130)
keep every final record.  Each failure is one line on standard error, never a traceback.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import ROOT
from minirt.cli import (EXIT_INTERRUPTED, EXIT_OK, EXIT_OUTPUT_FAILED, EXIT_STDOUT_CLOSED, EXIT_TERMINATED, EXIT_USAGE,
                        OutputFile, StopSignals, run_command)
from minirt.errors import OutputError, Terminated
from minirt.engine import Engine
from minirt.generate import main
from minirt.model import GPT2

OLD = b'{"an": "existing record"}\n'


def run_in_process(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = run_command(main, ["--backend", "numpy", "--no-progress", *argv], prog="minirt.generate")
    return code, out.getvalue(), err.getvalue()


def popen(argv: list[str], fsize: int | None = None) -> subprocess.Popen:
    """`python -m minirt.generate ARGV`, with pipes; `fsize` limits the size of any file it writes."""
    def child_setup():
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C works even if the test runner ignores it
        if fsize is not None:  # past the limit a write fails (EFBIG) instead of killing the process
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return subprocess.Popen([sys.executable, "-m", "minirt.generate", "--backend", "numpy", "--no-progress", *argv],
                            cwd=ROOT, preexec_fn=child_setup, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err and "Exception ignored" not in err
    return lines[0]


def whole_jsonl(path: Path) -> list[dict]:
    """The records, after checking the file is JSONL line by line and ends with a whole line."""
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n"), data[-80:]
    return [json.loads(line) for line in data.split(b"\n")[:-1]]  # not splitlines(): JSON may hold U+2028


def folder_state(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def prompts_file(folder: Path, n: int) -> Path:
    path = folder / "p.txt"
    path.write_text("".join(f"prompt number {i}\n" for i in range(n)))
    return path


# ---------------------------------------------------------------- a run refused at the start

@pytest.mark.parametrize("case, flags, fragment", [
    ("missing model", ["--model", "/no/such/model"], "does not exist"),
    ("broken model", ["--model", "{broken}"], "config.json"),
    ("bad flag", ["--kv-budget-mib", "nan"], "--kv-budget-mib"),
    ("bad sampling flag", ["--temperature", "-1"], "temperature"),
    ("missing prompts", ["--prompts", "/no/such/prompts.txt"], "does not exist"),
    ("empty prompts", ["--prompts", "{empty}"], "holds no prompts"),
    ("stop token out of vocabulary", ["--stop-token-id", "100000"], "--stop-token-id"),
])
def test_a_run_refused_at_the_start_leaves_the_output_file_as_it_was(tiny_lm, tmp_path, case, flags, fragment):
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


@pytest.mark.parametrize("where", ["config.json", "weights file", "new file", "through a symlinked folder",
                                   "symlink to config.json", "prompts file", "symlink to the prompts file"])
def test_output_on_the_prompts_file_or_inside_the_model_folder_is_refused(tiny_lm, tmp_path, where):
    model = shutil.copytree(tiny_lm, tmp_path / "model")
    prompts = prompts_file(tmp_path, 2)
    (tmp_path / "link").symlink_to(model, target_is_directory=True)
    (tmp_path / "config_link.jsonl").symlink_to(model / "config.json")
    (tmp_path / "prompts_link.jsonl").symlink_to(prompts)
    output = {"config.json": model / "config.json", "weights file": model / "model.safetensors",
              "new file": model / "records.jsonl", "through a symlinked folder": tmp_path / "link" / "config.json",
              "symlink to config.json": tmp_path / "config_link.jsonl", "prompts file": prompts,
              "symlink to the prompts file": tmp_path / "prompts_link.jsonl"}[where]
    before, model_before = folder_state(tmp_path), folder_state(model)
    code, stdout, err = run_in_process(["--model", str(model), "--prompts", str(prompts), "--output", str(output)])
    assert code == EXIT_USAGE
    line = one_error_line(err)
    assert ("prompts file" in line) if "prompts" in where else ("inside the model folder" in line)
    assert stdout == "" and folder_state(tmp_path) == before and folder_state(model) == model_before


def test_a_finished_run_replaces_the_output_and_keeps_its_mode(tiny_lm, tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_bytes(OLD)
    out.chmod(0o640)
    code, _, _ = run_in_process(["--model", str(tiny_lm), "--prompts", str(prompts_file(tmp_path, 3)),
                                 "--output", str(out), "--max-new-tokens", "2", "--quiet"])
    assert code == EXIT_OK
    assert [r["index"] for r in whole_jsonl(out)] == [0, 1, 2]
    assert out.stat().st_mode & 0o777 == 0o640 and not list(tmp_path.glob(".*partial"))


# ---------------------------------------------------------------- write failures

@settings(max_examples=60, deadline=None)
@given(lines=st.lists(st.dictionaries(st.text(max_size=5), st.text(max_size=30), max_size=3), max_size=8),
       limit=st.integers(0, 600), chunk=st.integers(1, 64))
def test_a_write_that_fails_part_way_is_cut_back_to_the_last_whole_record(tmp_path_factory, lines, limit, chunk):
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
    with mock.patch("minirt.cli.os.write", full_disk):
        try:
            for line in records:
                file.write(line)
                kept += 1
        except OutputError as exc:
            assert exc.exit_code == EXIT_OUTPUT_FAILED and "No space left" in str(exc) and "\n" not in str(exc)
            assert sum(len(r.encode()) for r in records[:kept + 1]) > limit  # it failed only when out of room
    file.keep()
    assert target.read_text(encoding="utf-8") == "".join(records[:kept])
    assert [json.loads(x) for x in target.read_bytes().split(b"\n")[:-1]] == lines[:kept]
    assert not list(folder.glob(".*partial"))


def full_run(tiny_lm, folder: Path, prompts: Path) -> bytes:
    out = folder / "full.jsonl"
    code, _, _ = run_in_process(["--model", str(tiny_lm), "--prompts", str(prompts), "--output", str(out),
                                 "--max-new-tokens", "3", "--quiet"])
    assert code == EXIT_OK
    return out.read_bytes()


@pytest.mark.parametrize("limit", [1, 300, 700])
def test_a_file_size_limit_exits_74_with_whole_records(tiny_lm, tmp_path, limit):
    prompts = prompts_file(tmp_path, 6)
    full = full_run(tiny_lm, tmp_path, prompts)
    assert len(full) > limit and not full[:limit].endswith(b"\n")  # the limit falls inside a record
    out = tmp_path / "out.jsonl"
    argv = ["--model", str(tiny_lm), "--prompts", str(prompts), "--output", str(out), "--max-new-tokens", "3",
            "--quiet"]
    proc = popen(argv, fsize=limit)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_OUTPUT_FAILED
    assert "cannot write --output" in one_error_line(err) and "File too large" in err
    kept = out.read_bytes()
    assert full.startswith(kept) and len(kept) <= limit and (kept == b"" or kept.endswith(b"\n"))
    assert len(whole_jsonl(out)) == full[:limit].count(b"\n")  # every record that fitted whole is there


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
def test_dev_full_exits_74_in_one_line(tiny_lm, tmp_path):
    proc = popen(["--model", str(tiny_lm), "--prompts", str(prompts_file(tmp_path, 2)), "--output", "/dev/full",
                  "--max-new-tokens", "2"])
    stdout, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_OUTPUT_FAILED
    assert "cannot write --output /dev/full (No space left on device)" in one_error_line(err)
    assert stdout.startswith("### [0]")  # the completion was shown before its record failed


# ---------------------------------------------------------------- a closed standard output

@pytest.mark.parametrize("with_output", [False, True], ids=["stdout only", "with --output"])
def test_a_closed_standard_output_exits_141_and_says_how_far_it_got(tiny_lm, tmp_path, with_output):
    n = 150
    out = tmp_path / "out.jsonl"
    argv = ["--model", str(tiny_lm), "--prompts", str(prompts_file(tmp_path, n)), "--batch-size", "4",
            "--max-new-tokens", "30", "--ignore-eos"] + (["--output", str(out)] if with_output else [])
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
@given(n=st.integers(1, 7), batch_size=st.integers(1, 3), shown=st.integers(0, 7), with_output=st.booleans())
def test_a_closed_standard_output_stops_the_run_unless_output_wants_the_rest(tiny_lm, tmp_path_factory, n,
                                                                              batch_size, shown, with_output):
    folder = tmp_path_factory.mktemp("closed")
    out, tokens = folder / "out.jsonl", 3
    argv = ["--backend", "numpy", "--model", str(tiny_lm), "--prompts", str(prompts_file(folder, n)),
            "--batch-size", str(batch_size), "--max-new-tokens", str(tokens), "--ignore-eos"]
    argv += ["--output", str(out)] if with_output else []
    rounds, real_forward, err = [], GPT2.forward, io.StringIO()

    def counted_forward(self, *args, **kwargs):
        rounds.append(1)
        return real_forward(self, *args, **kwargs)

    with mock.patch.object(GPT2, "forward", counted_forward), redirect_stdout(ClosesAfter(shown)), \
            redirect_stderr(err):
        code = run_command(main, argv, prog="minirt.generate")
    groups = -(-n // batch_size)  # static groups of batch_size, each `tokens` rounds long
    if shown >= n:  # the reader stayed to the end
        assert code == EXIT_OK and len(rounds) == groups * tokens
        return
    assert code == EXIT_STDOUT_CLOSED
    assert f"closed after {shown} of {n} completions reached it" in one_error_line(err.getvalue())
    if with_output:  # the run went on: every record is in the file
        assert len(rounds) == groups * tokens and [r["index"] for r in whole_jsonl(out)] == list(range(n))
    else:  # it stopped at the end of the group whose completion found no reader
        assert len(rounds) == (shown // batch_size + 1) * tokens


def test_run_command_does_not_call_a_broken_pipe_success():
    def main(argv):
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    err = io.StringIO()
    with redirect_stderr(err):
        assert run_command(main, [], prog="minirt.x") == EXIT_STDOUT_CLOSED
    assert "standard output was closed" in one_error_line(err.getvalue())


# ---------------------------------------------------------------- SIGTERM and Ctrl-C

@pytest.mark.parametrize("policy", ["static", "continuous"])
@pytest.mark.parametrize("signum, code, word", [(signal.SIGTERM, EXIT_TERMINATED, "terminated"),
                                                (signal.SIGINT, EXIT_INTERRUPTED, "interrupted")],
                         ids=["SIGTERM", "SIGINT"])
def test_a_signal_keeps_every_final_record(tiny_lm, tmp_path, policy, signum, code, word):
    n = 200
    out = tmp_path / "out.jsonl"
    out.write_bytes(OLD)
    proc = popen(["--model", str(tiny_lm), "--prompts", str(prompts_file(tmp_path, n)), "--policy", policy,
                  "--batch-size", "3", "--max-new-tokens", "40", "--ignore-eos", "--output", str(out)])
    assert proc.stdout.readline().startswith("### [0]")
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code
    final = int(re.fullmatch(rf"minirt.generate: {word}; (\d+) of {n} records were final and written",
                             one_error_line(err)).group(1))
    records = whole_jsonl(out)
    assert 1 <= len(records) == final < n  # every final record, and only those, each a whole line
    assert len({r["index"] for r in records}) == final
    assert all(r["error"] is None and len(r["token_ids"]) == 40 for r in records)
    assert not list(tmp_path.glob(".*partial"))


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_an_interruption_keeps_records_finished_but_not_yet_reported(tiny_lm, tmp_path, policy):
    """Ctrl-C after a round finished two requests, before the engine handed them on: both are still written."""
    out = tmp_path / "out.jsonl"

    def interrupted(self, active, on_final):
        if any(r.finished for r in active):
            raise KeyboardInterrupt

    with mock.patch.object(Engine, "keep_finished", interrupted):
        code, _, err = run_in_process(["--model", str(tiny_lm), "--prompts", str(prompts_file(tmp_path, 4)),
                                       "--policy", policy, "--batch-size", "2", "--max-new-tokens", "3",
                                       "--ignore-eos", "--output", str(out), "--quiet"])
    assert code == EXIT_INTERRUPTED
    assert one_error_line(err) == "minirt.generate: interrupted; 2 of 4 records were final and written"
    assert [(r["index"], len(r["token_ids"])) for r in whole_jsonl(out)] == [(0, 3), (1, 3)]


def test_the_signal_handlers_are_main_s_only(tiny_lm, tmp_path):
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    prompts = prompts_file(tmp_path, 1)
    for extra in ([], ["--seed", "-1"], ["--model", "/no/such/model"]):
        run_in_process(["--model", str(tiny_lm), "--prompts", str(prompts), "--max-new-tokens", "1", *extra])
        assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


@pytest.mark.parametrize("signum, raised", [(signal.SIGTERM, Terminated), (signal.SIGINT, KeyboardInterrupt)])
def test_a_signal_waits_for_the_held_block_to_end(signum, raised):
    steps = []
    with StopSignals() as signals:
        with pytest.raises(raised):
            with signals.held():
                signal.raise_signal(signum)
                steps.append("the block ran to its end")
        with pytest.raises(raised):
            signal.raise_signal(signum)
            steps.append("not reached outside a held block")
    assert steps == ["the block ran to its end"]
