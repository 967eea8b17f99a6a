"""Counts in words: "1 group", "3 groups".

Owns: `plural`, a count and its noun, singular for exactly one and plural otherwise, and `noun_for`,
the noun alone (for "3/8 requests").

Must not know: what is counted, or what any command does.
"""

from __future__ import annotations


def noun_for(count: int | None, noun: str, many: str | None = None) -> str:
    """'group' for exactly one, else 'groups' (or `many`, an irregular plural); None, a count not
    known, is plural too."""
    if count == 1:
        return noun
    return many or noun + "s"


def plural(count: int | None, noun: str, many: str | None = None, spec: str = "") -> str:
    """'1 group', '0 groups', '3 groups' (`many`: an irregular plural; `spec`: the count's format,
    such as ',')."""
    return f"{count:{spec}} {noun_for(count, noun, many)}"
