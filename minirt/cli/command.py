"""What every minirt command shares: one-line errors and documented exit codes.

Owns: `run_command`, which calls a command's main function and turns a MinirtError into one line on
standard error (never a traceback), the exit codes below (each error in minirt/errors.py carries its
own), `add_version_flag`, and `parse_command_line` and `print_help_text`, which print help and
--version so that a reader who stops early (`| head`) ends them quietly, with exit status 0.

Must not know: what any particular command does.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from .stdout import flush_stdout, mute_stdout
from ..errors import MinirtError, OutputError, StdoutClosed, Terminated

# Everything asked for was done.
EXIT_OK = 0

# The run finished, but at least one request got an error of its own.
EXIT_REQUEST_FAILED = 1

# 2: a bad flag, file, model or backend: nothing was run (as argparse).
EXIT_USAGE = MinirtError.exit_code

# 74: writing an output file failed; what was whole is kept.
EXIT_OUTPUT_FAILED = OutputError.exit_code

# Ctrl-C (128 + SIGINT); whatever was finished has been kept.
EXIT_INTERRUPTED = 130

# 141: standard output was closed by its reader, as in `| head`.
EXIT_STDOUT_CLOSED = StdoutClosed.exit_code

# SIGTERM (128 + SIGTERM); whatever was finished has been kept.
EXIT_TERMINATED = 143


def add_version_flag(parser) -> None:
    """`--version` on a command's parser: prints `minirt X.Y.Z` and exits 0."""
    # Imported here: the package is whole by the time a parser is built.
    from .. import __version__  # noqa: PLC0415 (see above)

    parser.add_argument("--version", action="version", version=f"minirt {__version__}")


def parse_command_line(parser: argparse.ArgumentParser, argv: list[str] | None):
    """`parser.parse_args(argv)`; its --help and --version end with exit status 0 even when standard
    output's reader stops early (`| head`): help is read as far as it was wanted.  A flag argparse
    cannot parse is one line on standard error, as every other error is (`one_line_usage_error`)."""
    words = sys.argv[1:] if argv is None else list(argv)
    parser.error = one_line_usage_error(parser, words)  # type: ignore[method-assign]
    try:
        return parser.parse_args(argv)
    except BrokenPipeError:
        # While parsing, only help and --version write to standard output.
        mute_stdout()
        raise SystemExit(EXIT_OK) from None
    except SystemExit as exc:
        if exc.code in (0, None):
            quiet_flush()
        raise


def one_line_usage_error(parser: argparse.ArgumentParser, words: list[str]):
    """argparse's `error` for this parser: one line and exit 2, instead of the whole usage block
    and then the error.  A flag given a negative number in scientific notation (`-1e308`), which
    argparse takes for a flag, is told to write it with `=`."""

    def error(message: str):
        hint = f"; see {parser.prog} --help"
        if message.endswith("expected one argument"):
            for flag, value in zip(words, words[1:], strict=False):
                looks_negative = value.startswith("-") and value[1:2].isdigit()
                if flag in message and looks_negative:
                    hint = f"; a negative value is written {flag}={value}"
        parser.exit(EXIT_USAGE, f"{parser.prog}: error: {message}{hint}\n")

    return error


def print_help_text(text: str) -> int:
    """Print help (or the version) on standard output; a reader that stops early is no error."""
    try:
        print(text)
    except BrokenPipeError:
        mute_stdout()
        return EXIT_OK
    quiet_flush()
    return EXIT_OK


def quiet_flush() -> None:
    """Flush standard output; if its reader has gone, send the rest nowhere, without an error."""
    try:
        sys.stdout.flush()
    except OSError:
        mute_stdout()


def run_command(
    main: Callable[[list[str] | None], int],
    argv: list[str] | None = None,
    prog: str = "minirt",
    quiet_when_cut: bool = False,
) -> int:
    """Run `main(argv)`, mapping user-fixable problems to one line and an exit code.
    `quiet_when_cut`: a report (`rounds`, `inspect`) whose reader stops early (`| head`) exits
    141 without a word, as GNU tools do; a run of completions says how far it got."""
    try:
        code = main(argv)
        # A closed or failing standard output shows here, not as noise at exit.
        flush_stdout()
        return code
    except (StdoutClosed, BrokenPipeError) as exc:
        mute_stdout()
        if not quiet_when_cut:
            if isinstance(exc, BrokenPipeError):
                exc = StdoutClosed("standard output was closed before everything was written")
            print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_STDOUT_CLOSED
    except MinirtError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Terminated:
        print(f"{prog}: terminated", file=sys.stderr)
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except MemoryError:
        # A model or batch bigger than this machine: one line, not a traceback.
        print(
            f"{prog}: error: out of memory; try a smaller --batch-size or --kv-budget, "
            "or a smaller model",
            file=sys.stderr,
        )
        return EXIT_USAGE
