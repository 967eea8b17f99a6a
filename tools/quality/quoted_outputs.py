"""Quoted command outputs in README.md and docs/*.md, made by the real commands and checked against them.

A quoted output is a fenced block (or an image of an SVG) right after a marker naming the command:

    <!-- output: python -m minirt.rounds --lengths 2,5,8,4 --batch-size 3 -->
    ```
    static: 4 requests, 3 rows, 12 rounds, utilization 67.9%   (...)
    ...
    ```

Options go before the colon, space-separated:

    stream=stderr     quote standard error (default: standard output)
    head=N            the first N lines, then a line "..."
    keep=REGEX        only the lines that match (Python's re.search), in order
    svg=PATH          the command writes the SVG at PATH (a path in the repository, which the marker's
                      image shows): the command runs with --svg to a scratch file, and PATH must hold
                      the same bytes (no fenced block follows this kind of marker)

A block that quotes no command says so with `<!-- not output: why -->` before it (a sketch of code, a map
of files); any other fenced block without a language (or marked `text` or `console`), the kind an
output is quoted in, is an error, so that no quote can go unchecked. Blocks of code (`bash`,
`python`, ...) are commands and examples, not outputs.

Each command runs from a scratch folder holding links to the repository's examples/ and weights/, with no
terminal (no progress bar, no colour) and no GPU in sight (CUDA_VISIBLE_DEVICES empty), exactly as the marker writes it after a leading `python -m` or `minirt`
is run with this interpreter. Lines that measure time (a summary's `speed`, `first token`, `wall time`) are
compared with their numbers blanked; everything else must match, line for line (trailing spaces aside).

    python tools/quality/quoted_outputs.py            # check every quote; exit 1 and list the stale ones
    python tools/quality/quoted_outputs.py --write    # rewrite every quote from its command's output now

tests/project/test_quoted_outputs.py runs the check.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The files whose quotes are checked.
DOCUMENTS = ("README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")))

MARKER = re.compile(r"^<!-- output(?P<options>[^:]*): (?P<command>.+?) -->$")
NOT_OUTPUT = re.compile(r"^<!-- not output: .+ -->$")
FENCE = re.compile(r"^```(?P<language>\S*)$")

# Summary lines whose numbers are timings, blanked before comparing.
TIMED_LINE = re.compile(r"^(speed|first token|wall time) ")
NUMBER = re.compile(r"\d+(\.\d+)?")


@dataclass
class Quote:
    """One marker and what it quotes: the lines of its fenced block (start and end: the block's first line and
    its closing fence, 0-based, in the file's lines), or for `svg=` the file it names."""

    document: str
    line: int  # the marker's, 1-based
    command: str
    stream: str
    head: int | None
    keep: str | None
    svg: str | None
    block_start: int | None
    block_end: int | None

    @property
    def where(self) -> str:
        return f"{self.document}:{self.line}"


def parse_options(text: str, where: str) -> dict[str, str]:
    options = {}
    for item in text.split():
        name, sep, value = item.partition("=")
        if not sep or name not in ("stream", "head", "keep", "svg"):
            raise SystemExit(
                f"{where}: unknown marker option {item!r} (stream=, head=, keep=, svg=)"
            )
        options[name] = value
    return options


def quotes_in(document: str) -> tuple[list[Quote], list[str]]:
    """The quotes of one document, and the problems found (an unlabelled block, a marker with no block)."""
    lines = (ROOT / document).read_text(encoding="utf-8").splitlines()
    quotes, problems = [], []
    i = 0
    labelled_next = None  # "output" or "not output" for the next fence
    pending: Quote | None = None
    while i < len(lines):
        line = lines[i]
        marker = MARKER.match(line)
        if marker:
            where = f"{document}:{i + 1}"
            options = parse_options(marker.group("options"), where)
            pending = Quote(
                document,
                i + 1,
                marker.group("command"),
                options.get("stream", "stdout"),
                int(options["head"]) if "head" in options else None,
                options.get("keep"),
                options.get("svg"),
                None,
                None,
            )
            if pending.svg is not None:
                quotes.append(pending)
                pending = None
            else:
                labelled_next = "output"
            i += 1
            continue
        if NOT_OUTPUT.match(line):
            labelled_next = "not output"
            i += 1
            continue
        fence = FENCE.match(line)
        if fence:
            end = next((j for j in range(i + 1, len(lines)) if lines[j] == "```"), None)
            if end is None:
                problems.append(f"{document}:{i + 1}: a fenced block that never closes")
                break
            if labelled_next == "output" and pending is not None:
                pending.block_start, pending.block_end = i + 1, end
                quotes.append(pending)
                pending = None
            elif labelled_next is None and fence.group("language") in ("", "text", "console"):
                problems.append(
                    f"{document}:{i + 1}: a fenced block with no marker: quote a command's output with "
                    "<!-- output: COMMAND -->, or say <!-- not output: why -->"
                )
            labelled_next = None
            i = end + 1
            continue
        if line.strip() and labelled_next is not None:
            problems.append(f"{document}:{i + 1}: a marker not followed by its fenced block")
            labelled_next, pending = None, None
        i += 1
    return quotes, problems


def all_quotes() -> tuple[list[Quote], list[str]]:
    quotes, problems = [], []
    for document in DOCUMENTS:
        found, trouble = quotes_in(document)
        quotes += found
        problems += trouble
    return quotes, problems


def argv_of(command: str) -> list[str]:
    """The command's words, run with this interpreter: `python -m X` and `minirt X` as `sys.executable -m`."""
    words = shlex.split(command)
    if words[:2] == ["python", "-m"]:
        return [sys.executable, "-m", *words[2:]]
    if words[0] == "minirt":
        return [sys.executable, "-m", "minirt", *words[1:]]
    raise SystemExit(f"{command!r}: a quoted command starts with `python -m` or `minirt`")


def run(command: str, extra: list[str] | None = None) -> subprocess.CompletedProcess:
    """The command, from a scratch folder linking examples/ and weights/, without a terminal."""
    with tempfile.TemporaryDirectory(prefix="quoted-") as scratch:
        for name in ("examples", "weights"):
            os.symlink(ROOT / name, Path(scratch) / name)
        # No GPU is seen, so that `--backend auto` picks NumPy as on the machine that made the
        # quotes, whatever this one has.
        env = {
            **os.environ,
            "NO_COLOR": "1",
            "COLUMNS": "100",
            "PYTHONPATH": str(ROOT),
            "CUDA_VISIBLE_DEVICES": "",
        }
        return subprocess.run(
            argv_of(command) + (extra or []),
            cwd=scratch,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )


def quoted_lines(quote: Quote) -> list[str]:
    """What the block should hold now: the command's stream, cut as the marker says."""
    result = run(quote.command)
    if result.returncode not in (0, 1):
        raise SystemExit(
            f"{quote.where}: `{quote.command}` exited {result.returncode}:\n{result.stderr}"
        )
    text = result.stdout if quote.stream == "stdout" else result.stderr
    lines = [line.rstrip() for line in text.splitlines()]
    if quote.keep is not None:
        lines = [line for line in lines if re.search(quote.keep, line)]
    if quote.head is not None and len(lines) > quote.head:
        lines = lines[: quote.head] + ["..."]
    return lines


def blanked(lines: list[str]) -> list[str]:
    """Timing lines with their numbers blanked; trailing spaces dropped."""
    return [NUMBER.sub("N", line) if TIMED_LINE.match(line) else line.rstrip() for line in lines]


def svg_is_current(quote: Quote) -> bool:
    assert quote.svg is not None
    with tempfile.TemporaryDirectory(prefix="quoted-svg-") as scratch:
        drawn = Path(scratch) / "drawn.svg"
        result = run(quote.command, ["--svg", str(drawn)])
        if result.returncode != 0:
            raise SystemExit(f"{quote.where}: `{quote.command} --svg` exited {result.returncode}")
        return drawn.read_bytes() == (ROOT / quote.svg).read_bytes()


def write_svg(quote: Quote) -> None:
    assert quote.svg is not None
    result = run(quote.command, ["--svg", str(ROOT / quote.svg)])
    if result.returncode != 0:
        raise SystemExit(f"{quote.where}: `{quote.command} --svg` exited {result.returncode}")


def stale(quote: Quote) -> str | None:
    """Why the quote differs from its command's output now, or None when it does not."""
    if quote.svg is not None:
        return (
            None
            if svg_is_current(quote)
            else f"{quote.svg} is not what `{quote.command}` draws now"
        )
    lines = (ROOT / quote.document).read_text(encoding="utf-8").splitlines()
    shown = lines[quote.block_start : quote.block_end]
    now = quoted_lines(quote)
    if blanked(shown) == blanked(now):
        return None
    first = next(
        (k for k, (a, b) in enumerate(zip(blanked(shown), blanked(now), strict=False)) if a != b),
        min(len(shown), len(now)),
    )
    shown_line = shown[first] if first < len(shown) else "(nothing)"
    now_line = now[first] if first < len(now) else "(nothing)"
    return f"line {first + 1} of the block shows {shown_line!r}; the command prints {now_line!r}"


def rewrite(document: str, quotes: list[Quote]) -> None:
    """Replace each quote's block in the document with its command's output now (last first, so that the
    earlier blocks' line numbers still hold)."""
    path = ROOT / document
    lines = path.read_text(encoding="utf-8").splitlines()
    for quote in sorted(quotes, key=lambda q: q.line, reverse=True):
        if quote.svg is not None:
            write_svg(quote)
            continue
        lines[quote.block_start : quote.block_end] = quoted_lines(quote)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="examples:\n  python tools/quality/quoted_outputs.py\n"
        "  python tools/quality/quoted_outputs.py --write",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--write", action="store_true", help="rewrite every quote from its command now"
    )
    args = parser.parse_args(argv)
    quotes, problems = all_quotes()
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        return 1
    if args.write:
        for document in DOCUMENTS:
            mine = [q for q in quotes if q.document == document]
            if mine:
                rewrite(document, mine)
                print(f"{document}: {len(mine)} quotes rewritten")
        return 0
    bad = 0
    for quote in quotes:
        why = stale(quote)
        if why is not None:
            bad += 1
            print(f"{quote.where}: stale: {why}", file=sys.stderr)
    print(f"{len(quotes) - bad} of {len(quotes)} quoted outputs are what their commands print now")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
