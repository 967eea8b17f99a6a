"""The exceptions minirt raises for problems a user can fix.

Owns: one base class, `MinirtError`, whose message is a single line that says
what went wrong, where, and what to do about it.  Command-line entry points
print that line (no traceback) and exit non-zero.

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
