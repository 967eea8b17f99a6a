"""What the engine needs of a tokenizer: ids back into text, and the token that ends a request.

Owns: `Detokenizer` and `TextDecoder`, the two small protocols the engine is given a tokenizer
as (minirt/loading/tokenizer.py's `Tokenizer` is one).  The engine never encodes text: prompts
arrive as token ids (minirt/request_maker.py makes them).  It decodes: each running request's
new tokens into text as they come (its stop strings are found there), and a token-id prompt's
text for its final output.

Must not know: how a tokenizer is read from a folder, or which library runs it.
"""

from __future__ import annotations

from typing import Protocol


class TextDecoder(Protocol):
    """One request's incremental decoder: the text each new token completes."""

    def push(self, token_id: int) -> str:
        """The text this token completes ("" while a character is still incomplete)."""
        ...

    def flush(self) -> str:
        """What is left at the end (an unfinished character becomes U+FFFD)."""
        ...


class Detokenizer(Protocol):
    """A tokenizer, as far as the engine uses one."""

    # The end-of-text token that stops a request (None: the model has none).
    eos_token_id: int | None

    def decode(self, token_ids: list[int]) -> str:
        """The text of these ids."""
        ...

    def stream(self) -> TextDecoder:
        """A new decoder, for one request's output."""
        ...
