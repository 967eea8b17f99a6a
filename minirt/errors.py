"""The exceptions minirt raises for problems a user can fix, and the one check every layer shares.

Owns: `MinirtError`, whose message is one line saying what went wrong, where, and what to do (command lines
print it, never a traceback), its subclasses, and `require_at_least_one`, the check on a count (batch size,
token budget) that the API and the command lines share.  The errors that mean "a bad value" (`RequestError`,
`InputError`) are also `ValueError`s.

Must not know: anything about models, files or arrays.
"""


class MinirtError(Exception):
    """A problem with the user's input or environment, told in one line."""


class CheckpointError(MinirtError):
    """A model folder, config or weights file that minirt cannot use."""


class BackendError(MinirtError):
    """An array backend (numpy, cupy) that cannot be used here."""


class TokenizerError(MinirtError):
    """Tokenizer files that are missing or unreadable."""


class RequestError(MinirtError, ValueError):
    """A request that cannot be served as asked (bad parameters, a prompt too long, a budget too small)."""


class InputError(MinirtError, ValueError):
    """Token ids the model cannot take (out of vocabulary, too long, not integers)."""


def require_at_least_one(value: int, name: str) -> int:
    """`value` when it is an integer >= 1, else a RequestError naming it (`--batch-size`, `batch size`, ...)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RequestError(f"{name} must be at least 1, got {value}")
    return value
