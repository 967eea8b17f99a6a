"""What every minirt command shares: one-line errors and documented exit codes.

Owns: `run_command`, which calls a command's main function and turns a
MinirtError into one line on standard error (never a traceback), and the
exit codes below.

Must not know: what any particular command does.
"""

from __future__ import annotations

import sys
from typing import Callable

from .errors import MinirtError

EXIT_OK = 0  # everything asked for was done
EXIT_REQUEST_FAILED = 1  # the run finished, but at least one request got an error of its own
EXIT_USAGE = 2  # a bad flag, file, model or backend: nothing was run (argparse uses 2 as well)
EXIT_INTERRUPTED = 130  # Ctrl-C; whatever was finished has been kept


def run_command(main: Callable[[list[str] | None], int], argv: list[str] | None = None, prog: str = "minirt") -> int:
    """Run `main(argv)`, mapping user-fixable problems to one line and an exit code."""
    try:
        return main(argv)
    except MinirtError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # e.g. piped into `head`; not an error worth a traceback
        return EXIT_OK
