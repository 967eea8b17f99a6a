"""The exceptions minirt raises for problems a user can fix, and the one check every layer shares.

Owns: `MinirtError`, whose message is one line saying what went wrong, where, and what to do
(command lines print it, never a traceback, and exit with its `exit_code`), its subclasses
(`FieldError`'s name the request field they are about),
`Terminated` (SIGTERM), and `require_at_least_one`, the count check the API and command lines
share.  Bad values are also `ValueError`s.

Must not know: anything about models, files or arrays.
"""

import operator


class MinirtError(Exception):
    """A problem with the user's input or environment, told in one line."""

    # A bad flag, file, model or backend: nothing was run.
    exit_code = 2


class CheckpointError(MinirtError):
    """A model folder, config or weights file that minirt cannot use."""


class BackendError(MinirtError, ValueError):
    """An array backend (numpy, cupy) that cannot be used here."""


class TokenizerError(MinirtError):
    """Tokenizer files that are missing or unreadable."""


class FieldError(MinirtError, ValueError):
    """A refusal about one field of a request: `field` names it, as a value (None: the request
    as a whole), so that a caller (the server's 400 naming its param) never parses the message."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class RequestError(FieldError):
    """A request that cannot be served as asked (bad parameters, a prompt too long, a budget too
    small)."""


class InputError(FieldError):
    """Token ids the model cannot take (out of vocabulary, too long, not integers)."""


class ReentryError(MinirtError, RuntimeError):
    """A call that would start or advance a run of an engine (an LLM) already inside one: from
    one of its own callbacks, or from another thread.  The run in progress goes on untouched."""


class OutputError(MinirtError):
    """Writing results failed (a full disk, /dev/full); the records already written are kept
    whole."""

    # sysexits' EX_IOERR.
    exit_code = 74


class StdoutClosed(OutputError):
    """Standard output's reader went away, as in `| head`."""

    # 128 + SIGPIPE.
    exit_code = 141


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C's KeyboardInterrupt so that the same clean-up runs (exit 143)."""


def require_at_least_one(value, name: str) -> int:
    """`value` as an int when it is an integer >= 1 (NumPy's too), else a RequestError naming it
    (`--batch-size`)."""
    # 2.0 and True are no counts.
    is_integer = not isinstance(value, bool) and hasattr(value, "__index__")
    if not is_integer or operator.index(value) < 1:
        raise RequestError(f"{name} must be at least 1, got {value!r}")
    return operator.index(value)
