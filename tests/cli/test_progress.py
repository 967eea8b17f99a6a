"""The progress bar on standard error: it never shares a line with a completion, on a terminal or not."""

from __future__ import annotations

import io
import os
import pty
import select
import subprocess
import sys

from conftest import ROOT, finished_request

from minirt.cli.command import EXIT_OK
from minirt.cli.progress import Progress
from minirt.cli.records import OrderedOutput
from minirt.engine.stats import RunStats


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
