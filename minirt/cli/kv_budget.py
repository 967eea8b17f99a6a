"""The one spelling of a KV budget on the command line: `--kv-budget SIZE`.

Owns: `parse_kv_budget`: a number of tokens (20000, 20000tokens) or a memory size (512MiB, 1.5GiB).

Must not know: models, or what any command does with the budget.
"""

from __future__ import annotations

import re

from ..errors import MinirtError


KV_BUDGET = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(tokens?|kib|mib|gib)?\s*", re.IGNORECASE)


def parse_kv_budget(
    text: str, flag: str = "--kv-budget", tokens_only: bool = False
) -> tuple[str, int]:
    """--kv-budget in every command: tokens ('20000', '20000tokens': one token's keys and values in
    every layer) as ('tokens', n), or memory ('512MiB', '1.5GiB', '64KiB') as ('bytes', n) unless
    `tokens_only`."""
    match = KV_BUDGET.fullmatch(text)
    if not match:
        raise MinirtError(
            f"{flag}: expected a number of tokens (20000) or a memory size (512MiB, 2GiB), "
            f"got {text!r}"
        )
    number = float(match[1])
    unit = (match[2] or "tokens").lower()
    if unit.startswith("token"):
        if not number.is_integer() or number < 1:
            raise MinirtError(
                f"{flag}: a number of tokens must be a whole number >= 1, got {text!r}"
            )
        return "tokens", int(number)
    # No model to size a token by.
    if tokens_only:
        raise MinirtError(
            f"{flag}: give a number of tokens (2048) here, not a memory size; got {text!r}"
        )
    size = int(number * {"kib": 2**10, "mib": 2**20, "gib": 2**30}[unit])
    if not 0 < size < 2**60:
        raise MinirtError(
            f"{flag}: a memory size must be above 0 and below 2**60 bytes, got {text!r}"
        )
    return "bytes", size
