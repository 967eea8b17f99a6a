"""What a chat client gets back: chat completions in OpenAI's shapes, whole or streamed.

Owns: the JSON of a chat completion (`chat_body`: object "chat.completion", each choice's
`message` {"role": "assistant", "content": ...}), of its streamed chunks (`ChatChunks`, which
words them for minirt/server/completion_flow.py: object "chat.completion.chunk", first each
choice's delta {"role": "assistant", "content": ""} as OpenAI and vLLM send it, then each
token's delta {"content": ...}, then each choice's finish and, when asked, the usage), and
chat's `logprobs` object (`chat_logprob`: {"content": [{token, logprob, bytes, top_logprobs}]},
the `top_logprobs` the N most likely tokens there, as OpenAI gives them: N, not N + 1).

A token's string and bytes are its own (`Tokenizer.token_string`, `token_bytes`: GPT-2's bytes,
or a SentencePiece piece with its leading space, a byte piece its one byte; a piece of a
character shows as U+FFFD in its string, and whole in its bytes), so that the chosen tokens'
bytes, joined, are the content's (an end token's aside).  The usage, minirt's own per-choice
fields under "minirt" and the -inf of a token of probability 0 (-9999.0) are the completions'
(minirt/server/responses.py).

Must not know: the web framework, the template, or the engine beyond its client's events.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.client import Finished, Token
from ..loading.tokenizer import Tokenizer
from .responses import batching_fields, json_logprob
from .responses import usage as token_usage


def chat_header(completion_id: str, created: int, model: str, chunk: bool) -> dict:
    kind = "chat.completion.chunk" if chunk else "chat.completion"
    return {"id": completion_id, "object": kind, "created": created, "model": model}


def token_entry(tokenizer: Tokenizer, token_id: int, logprob: float | None) -> dict:
    """One token as chat's logprobs give it: its string, its logprob and its bytes."""
    return {
        "token": tokenizer.token_string(token_id),
        "logprob": json_logprob(logprob),
        "bytes": list(tokenizer.token_bytes(token_id)),
    }


def chat_logprob(tokenizer: Tokenizer, token_id: int, logprob: float | None, top) -> dict:
    """A chosen token's entry in `logprobs.content`, with the most likely tokens there."""
    entry = token_entry(tokenizer, token_id, logprob)
    entry["top_logprobs"] = [token_entry(tokenizer, t, lp) for t, lp in top or ()]
    return entry


def chat_choice(final: Finished, tokenizer: Tokenizer) -> dict:
    """One choice of a whole chat completion."""
    output = final.output
    plain = final.logprobs
    if plain is None:
        logprobs = None
    else:
        content = []
        for k, token_id in enumerate(output.token_ids):
            top = None if plain.top is None else plain.top[k]
            content.append(chat_logprob(tokenizer, token_id, plain.tokens[k], top))
        logprobs = {"content": content}
    return {
        "index": final.choice,
        "message": {"role": "assistant", "content": output.text or ""},
        "logprobs": logprobs,
        "finish_reason": output.finish_reason,
        "minirt": batching_fields(final),
    }


def chat_body(head: dict, finals: list[Finished], prompt_length: int, tokenizer) -> dict:
    """A whole chat completion: its choices, and the usage (the prompt counted once)."""
    choices = [chat_choice(final, tokenizer) for final in finals]
    return {**head, "choices": choices, "usage": token_usage([prompt_length], finals)}


@dataclass
class ChatChunks:
    """A chat completion's streamed chunks (completion_flow.py's `ChunkShape`).  With
    include_usage, every chunk has a `usage`, null until the last (OpenAI's)."""

    head: dict
    n_choices: int
    prompt_length: int
    tokenizer: Tokenizer
    # Whether each token comes with its logprobs.
    logprobs: bool
    include_usage: bool

    def __post_init__(self):
        if self.include_usage:
            self.head = {**self.head, "usage": None}

    def choice(self, index: int, delta: dict, logprobs=None, finish_reason=None) -> dict:
        entry = {"index": index, "delta": delta, "logprobs": logprobs}
        return {**entry, "finish_reason": finish_reason}

    def opening(self):
        for index in range(self.n_choices):
            opening = self.choice(index, {"role": "assistant", "content": ""})
            yield {**self.head, "choices": [opening]}

    def token(self, event: Token) -> dict | None:
        """A token's text (held-back text shows nothing, unless its logprobs)."""
        if not self.logprobs:
            if not event.text:
                return None
            return {**self.head, "choices": [self.choice(event.choice, {"content": event.text})]}
        entry = chat_logprob(self.tokenizer, event.token_id, event.logprob, event.top_logprobs)
        logprobs = {"content": [entry]}
        choice = self.choice(event.choice, {"content": event.text}, logprobs)
        return {**self.head, "choices": [choice]}

    def finish(self, final: Finished) -> dict:
        """A choice's last chunk: the rest of its text (none: an empty delta) and why it ended."""
        delta = {"content": final.unshown_text} if final.unshown_text else {}
        choice = self.choice(final.choice, delta, None, final.output.finish_reason)
        choice["minirt"] = batching_fields(final)
        return {**self.head, "choices": [choice]}

    def usage(self, finals: list[Finished]) -> dict | None:
        if not self.include_usage:
            return None
        return {**self.head, "choices": [], "usage": token_usage([self.prompt_length], finals)}
