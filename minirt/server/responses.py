"""What a client gets back: completions in OpenAI's shapes, whole or as server-sent events.

Owns: the JSON of a completion (`completion_body`), of each streamed chunk (`token_chunk`,
`finish_chunk`, `usage_chunk`, and `CompletionChunks`, which words a stream's chunks for
minirt/server/completion_flow.py), OpenAI's `logprobs` object (`Logprobs`: tokens, token_logprobs,
top_logprobs, text_offset), the `usage` count, minirt's own per-choice fields under "minirt"
(`batching_fields`: the static group, the first and last round, the rounds waited, the token
ids; chat's answers use them too, minirt/server/chat_responses.py), and the server-sent event
framing (`sse`, `DONE`).

A token's string is its own (`Tokenizer.token_string`: a SentencePiece piece with its leading
space, a piece of a character as U+FFFD; without a tokenizer, vLLM's "token_id:N"); its
text_offset is where its string starts in the choice's text: the text as streamed after the
prompt, or, with echo, in the prompt as sent followed by the completion, where a token the
tokenizer added (a BOS) is not in the text and sits where the text after it starts.  A
log-probability of -inf (a token the model gives probability 0) is written -9999.0, as vLLM
writes it, since JSON has no infinity.

Must not know: the web framework, or the engine beyond its client's events.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Callable, Sequence

from ..loading.tokenizer import Tokenizer
from ..engine.client import Finished, Token

DONE = "data: [DONE]\n\n"

# JSON has no -inf.
NO_PROBABILITY = -9999.0


def sse(payload: dict) -> str:
    """One server-sent event."""
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def json_logprob(value: float | None) -> float | None:
    if value is None:
        return None
    if math.isfinite(value):
        return value
    return NO_PROBABILITY


class Logprobs:
    """OpenAI's logprobs object of one choice, built token by token."""

    def __init__(
        self,
        tokenizer: Tokenizer | None,
        text_offset: int,
        prompt_ids: Sequence[int] | None = None,
    ):
        self.tokenizer = tokenizer
        # Offsets count characters of the text as streamed: a decoder of its own (none without
        # a tokenizer: there is no text, and every offset is where it starts).
        self.decoder = completion_decoder(tokenizer, prompt_ids)
        self.offset = text_offset
        self.tokens: list[str] = []
        self.token_logprobs: list[float | None] = []
        self.top_logprobs: list[dict | None] = []
        self.text_offset: list[int] = []

    def add(self, token_id: int, logprob: float | None, top) -> None:
        """One token: its string, its logprob, the most likely tokens there with itself (as
        OpenAI gives them: up to logprobs + 1), and where its text starts.  A logprob of None
        is the prompt's first token's, which nothing comes before."""
        token_text = self.token_string(token_id)
        self.tokens.append(token_text)
        self.token_logprobs.append(json_logprob(logprob))
        if logprob is None:
            self.top_logprobs.append(None)
        else:
            alternatives = {self.token_string(t): json_logprob(lp) for t, lp in top or ()}
            alternatives.setdefault(token_text, json_logprob(logprob))
            self.top_logprobs.append(alternatives)
        self.text_offset.append(self.place(token_id, token_text))

    def place(self, token_id: int, token_text: str) -> int:
        """Where the token's string starts: where the text so far ends, or, when the text it
        completes ends with its string (the bytes of a character held back before it came
        first), that far into that text."""
        start = self.offset
        if self.decoder is not None:
            new_text = self.decoder.push(token_id)
            if token_text and new_text.endswith(token_text):
                start += len(new_text) - len(token_text)
            self.offset += len(new_text)
        return start

    def token_string(self, token_id: int) -> str:
        """The token's own string; without a tokenizer, vLLM's "token_id:N"."""
        if self.tokenizer is None:
            return f"token_id:{token_id}"
        return self.tokenizer.token_string(token_id)

    def add_prompt(self, prompt_ids, prompt_logprobs, prompt_text: str) -> None:
        """Echo: the prompt's tokens first, each with its logprob given those before it (the
        first has none); minirt scores only the prompt's own tokens, so each position's
        alternatives are that token alone.  Their offsets index the prompt as sent (the echoed
        `prompt_text`), not its ids' text: the completion's follow it."""
        first = len(self.text_offset)
        self.decoder = None if self.tokenizer is None else self.tokenizer.stream()
        self.offset = 0
        for token_id, logprob in zip(prompt_ids, prompt_logprobs, strict=True):
            self.add(token_id, logprob, None)
        if self.tokenizer is not None:
            to_sent = sent_offset(self.tokenizer.decode(list(prompt_ids)), prompt_text)
            self.text_offset[first:] = [to_sent(o) for o in self.text_offset[first:]]
        self.decoder = completion_decoder(self.tokenizer, prompt_ids)
        self.offset = len(prompt_text)

    def body(self, start: int = 0) -> dict:
        """The object, of every token from `start` on."""
        return {
            "tokens": self.tokens[start:],
            "token_logprobs": self.token_logprobs[start:],
            "top_logprobs": self.top_logprobs[start:],
            "text_offset": self.text_offset[start:],
        }


def completion_decoder(tokenizer: Tokenizer | None, prompt_ids: Sequence[int] | None):
    """The decoder a choice's offsets are counted with: after its prompt's ids, as the engine
    decodes its text.  A streamed choice's builder is not told them: its BOS stands in for the
    prompt (any text but a space reads a SentencePiece completion's first token with its leading
    space, as a prompt does).  None without a tokenizer."""
    if tokenizer is None:
        return None
    if prompt_ids is None:
        bos = tokenizer.bos_token_id
        prompt_ids = () if bos is None else (bos,)
    return tokenizer.stream(prompt_ids)


def sent_offset(decoded: str, sent: str) -> Callable[[int], int]:
    """Maps an offset into the text of a prompt's ids (`decoded`: "<s> Hello") to one into the
    prompt as sent ("Hello"): past the end the two share, by the difference in their lengths;
    before it, to no further than where that end starts (BOS at 0).  Nondecreasing.  Exact when
    the two differ in front only (a BOS, SentencePiece's prepended space); where a normalizer
    changed the text further in, the offsets before the change are only clamped."""
    shared = len(os.path.commonprefix([decoded[::-1], sent[::-1]]))
    shift = len(decoded) - len(sent)

    def mapped(offset: int) -> int:
        if offset >= len(decoded) - shared:
            return offset - shift
        return min(offset, len(sent) - shared)

    return mapped


def batching_fields(final: Finished) -> dict:
    """minirt's own per-choice fields: where the choice ran, in rounds, and the token ids it
    produced (an EOS or stop token included)."""
    output = final.output
    return {
        "group": output.group,
        "first_round": output.first_round,
        "finish_round": output.finish_round,
        "rounds_waited": output.rounds_waited,
        "cached_prompt_tokens": output.cached_prompt_tokens,
        "token_ids": list(output.token_ids),
    }


def usage(prompt_lengths: list[int], finals: list[Finished]) -> dict:
    """Tokens of each prompt once (whatever n is), and every token each choice produced.  Of
    the prompt tokens, `prompt_tokens_details.cached_tokens` came from the prefix cache, as
    OpenAI reports it: per prompt, the fewest that any of its n choices took from the cache
    (choice i is prompt i // n's)."""
    prompt_tokens = sum(prompt_lengths)
    completion_tokens = sum(len(final.output.token_ids) for final in finals)
    n = max(1, len(finals) // max(1, len(prompt_lengths)))
    cached_per_prompt: dict[int, int] = {}
    for final in finals:
        prompt = final.choice // n
        cached = final.output.cached_prompt_tokens
        cached_per_prompt[prompt] = min(cached, cached_per_prompt.get(prompt, cached))
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": sum(cached_per_prompt.values())},
    }


def header(completion_id: str, created: int, model: str) -> dict:
    return {"id": completion_id, "object": "text_completion", "created": created, "model": model}


def token_chunk(head: dict, event: Token, logprobs: Logprobs | None) -> dict:
    """A streamed token: the text it made final, and its logprobs when asked."""
    if logprobs is None:
        shown = None
    else:
        logprobs.add(event.token_id, event.logprob, event.top_logprobs)
        # This token's alone.
        shown = logprobs.body(start=-1)
    choice = {"index": event.choice, "text": event.text, "logprobs": shown, "finish_reason": None}
    return {**head, "choices": [choice]}


def finish_chunk(head: dict, final: Finished) -> dict:
    """A choice's last chunk: the rest of its text, why it ended, and where it ran."""
    choice = {
        "index": final.choice,
        "text": final.unshown_text,
        "logprobs": None,
        "finish_reason": final.output.finish_reason,
        "minirt": batching_fields(final),
    }
    return {**head, "choices": [choice]}


def usage_chunk(head: dict, prompt_lengths: list[int], finals: list[Finished]) -> dict:
    return {**head, "choices": [], "usage": usage(prompt_lengths, finals)}


@dataclass
class CompletionChunks:
    """A completion's streamed chunks (completion_flow.py's `ChunkShape`): with echo, each
    choice's prompt first; each token's final text, with its logprobs when asked (a token whose
    text is held back sends nothing, unless its logprobs); the usage when asked, in which case
    every chunk has a `usage`, null until the last (OpenAI's)."""

    head: dict
    # Each prompt's text (echoed) and length; choice i is prompt i // n's.
    prompt_texts: list[str]
    prompt_lengths: list[int]
    n: int
    echo: bool
    # Each choice's Logprobs builder, or None each when logprobs were not asked for.
    logprobs: list[Logprobs | None]
    include_usage: bool

    def __post_init__(self):
        if self.include_usage:
            self.head = {**self.head, "usage": None}

    def opening(self):
        if not self.echo:
            return
        for choice in range(len(self.logprobs)):
            text = self.prompt_texts[choice // self.n]
            chunk = {"index": choice, "text": text, "logprobs": None, "finish_reason": None}
            yield {**self.head, "choices": [chunk]}

    def token(self, event: Token) -> dict | None:
        logprobs = self.logprobs[event.choice]
        if event.text or logprobs is not None:
            return token_chunk(self.head, event, logprobs)
        return None

    def finish(self, final: Finished) -> dict:
        return finish_chunk(self.head, final)

    def usage(self, finals: list[Finished]) -> dict | None:
        if not self.include_usage:
            return None
        return usage_chunk(self.head, self.prompt_lengths, finals)


def choice_body(final: Finished, prompt_text: str, prompt_ids, echo: bool, tokenizer) -> dict:
    """One choice of a whole completion."""
    output = final.output
    # None only for a model without a tokenizer, whose choices have no text.
    completion_text = output.text or ""
    if echo:
        text = prompt_text + completion_text
    else:
        text = completion_text
    plain = final.logprobs
    if plain is None:
        logprobs = None
    else:
        built = Logprobs(tokenizer, 0, prompt_ids)
        if echo:
            assert plain.prompt is not None  # asked for with echo and logprobs
            built.add_prompt(prompt_ids, plain.prompt, prompt_text)
        for k, token_id in enumerate(output.token_ids):
            if plain.top is None:
                top = None
            else:
                top = plain.top[k]
            built.add(token_id, plain.tokens[k], top)
        logprobs = built.body()
        # A token past a stop string, or an end token, starts where the text ends.
        logprobs["text_offset"] = [min(o, len(text)) for o in logprobs["text_offset"]]
    return {
        "index": final.choice,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": output.finish_reason,
        "minirt": batching_fields(final),
    }


def completion_body(head: dict, choices: list[dict], prompt_lengths, finals) -> dict:
    return {**head, "choices": choices, "usage": usage(prompt_lengths, finals)}
