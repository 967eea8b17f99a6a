"""What every minirt command shares: one-line errors and documented exit codes.

Owns: `run_command`, which calls a command's main function and turns a MinirtError into one line on
standard error (never a traceback), the exit codes below (each error in minirt/errors.py carries its own),
and `add_version_flag`.

Must not know: what any particular command does.
"""

from __future__ import annotations

import sys
from typing import Callable

from .stdout import flush_stdout, mute_stdout
from ..errors import MinirtError, OutputError, StdoutClosed, Terminated


EXIT_OK = 0  # everything asked for was done


EXIT_REQUEST_FAILED = 1  # the run finished, but at least one request got an error of its own


EXIT_USAGE = (
    MinirtError.exit_code
)  # 2: a bad flag, file, model or backend: nothing was run (as argparse)


EXIT_OUTPUT_FAILED = (
    OutputError.exit_code
)  # 74: writing an output file failed; what was whole is kept


EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT); whatever was finished has been kept


EXIT_STDOUT_CLOSED = (
    StdoutClosed.exit_code
)  # 141: standard output was closed by its reader, as in `| head`


EXIT_TERMINATED = 143  # SIGTERM (128 + SIGTERM); whatever was finished has been kept


def add_version_flag(parser) -> None:
    """`--version` on a command's parser: prints `minirt X.Y.Z` and exits 0."""
    from .. import __version__  # noqa: PLC0415 (here: the package is whole by the time a parser is built)

    parser.add_argument("--version", action="version", version=f"minirt {__version__}")


def run_command(
    main: Callable[[list[str] | None], int], argv: list[str] | None = None, prog: str = "minirt"
) -> int:
    """Run `main(argv)`, mapping user-fixable problems to one line and an exit code."""
    try:
        code = main(argv)
        flush_stdout()  # a closed or failing standard output shows here, not as noise at exit
        return code
    except MinirtError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Terminated:
        print(f"{prog}: terminated", file=sys.stderr)
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except MemoryError:  # a model or batch bigger than this machine: one line, not a traceback
        print(
            f"{prog}: error: out of memory; try a smaller --batch-size or --kv-budget, or a smaller model",
            file=sys.stderr,
        )
        return EXIT_USAGE
    except (
        BrokenPipeError
    ):  # e.g. piped into `head`: not worth a traceback, but not a success either
        mute_stdout()
        print(
            f"{prog}: error: standard output was closed before everything was written",
            file=sys.stderr,
        )
        return EXIT_STDOUT_CLOSED
