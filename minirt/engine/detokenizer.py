"""What the engine needs of a tokenizer: ids back into text, and the tokens that end a request.

Owns: `Detokenizer` and `TextDecoder`, the two small protocols the engine is given a tokenizer
as (minirt/loading/tokenizer.py's `Tokenizer` is one).  The engine never encodes text: prompts
arrive as token ids (minirt/request_maker.py makes them).  It decodes: each running request's
new tokens into text as they come, after its prompt (its stop strings are found there), and a
token-id prompt's text for its final output.

Must not know: how a tokenizer is read from a folder, or which library runs it.
"""

from __future__ import annotations

from typing import Protocol, Sequence


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

    # The end-of-text token reports name (None: the model has none), and every token that stops
    # a request, that one first (a model may have several: Llama 3's <|end_of_text|>,
    # <|eom_id|> and <|eot_id|>).
    eos_token_id: int | None
    eos_token_ids: tuple[int, ...]

    def decode(self, token_ids: list[int]) -> str:
        """The text of these ids."""
        ...

    def stream(self, prompt_ids: Sequence[int] = ()) -> TextDecoder:
        """A new decoder, for one request's output after its prompt's ids: the text it gives is
        what the prompt's text grows by (a SentencePiece decoder strips the leading space of a
        text's first token only, so a completion's first token keeps its space)."""
        ...
