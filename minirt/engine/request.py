"""One request's own state, from arrival to its finished record, and the rules of its progress.

Owns: `Request`, a plain record of everything that is one request's own (identity, prompt, parameters,
random stream, output, status, KV slot, rounds), and the two things that happen to a record: `fail_request` (an
error of its own; it never runs) and `add_token`, which appends a chosen token and applies every stop rule:
EOS, stop token ids, stop strings (found in the decoded text even when they span tokens), max_new_tokens and
a full context.  `unshown_text` hands out, for streaming, the text that no later token can change.

The engine makes the record, gives it a slot and a text decoder, and calls `add_token` each round; the
scheduler stamps when it was admitted.  A batch shares a forward pass, never a request's progress or its
reason to stop.

Must not know: the layers, the batch layout, sampling, or how requests are grouped.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from .params import SamplingParams
from ..loading.tokenizer import StreamDecoder


class Status(enum.Enum):
    WAITING = "waiting"  # in the queue, no KV slot yet
    RUNNING = "running"  # admitted: it has a row and produces a token every round
    FINISHED = "finished"  # done (or refused with an error); its record is final


@dataclass
class Request:
    """A request and everything that is its own."""

    index: int  # position in the input, 0-based; output order follows it
    id: str  # the user's id, or the index as a string
    prompt: str | None  # the prompt text (None when given as token ids)
    prompt_ids: list[int]  # what the model is fed first (BOS alone for an empty prompt)
    params: SamplingParams
    rng: np.random.Generator | None = None  # the request's own random stream
    want_logprobs: bool = False
    sample: int = 0  # which of the prompt's n samples (0 when n is 1)
    # Its place among the run's requests, samples counted: where its record comes in the output.
    # Left at -1, it is the request's index (a run without samples): __post_init__ fills it in.
    output_index: int = -1

    token_ids: list[int] = field(default_factory=list)  # every token produced, in order
    logprobs: list[float] = field(
        default_factory=list
    )  # log p(token) under the raw model, if wanted
    top_logprobs: list[list[tuple[int, float]]] = field(
        default_factory=list
    )  # per token: the N most likely
    prompt_logprobs: list[float | None] | None = (
        None  # per prompt token, given those before it (if asked)
    )
    text: str | None = (
        None  # the completion text (cut before a stop string); None without a tokenizer
    )
    status: Status = Status.WAITING
    finish_reason: str | None = None  # "stop", "length", or "error"
    error: str | None = None  # why the request was refused, in one line

    group: int | None = (
        None  # which static group served it (1-based; None under continuous batching)
    )
    slot: int | None = None  # its KV slot while it runs
    first_round: int | None = None  # the round that produced its first token (its prefill)
    finish_round: int | None = None  # the round that produced its last token
    rounds_waited: int | None = None  # rounds that ran before its first round
    arrival_s: float | None = None  # seconds from the run's start: when it was queued (or refused)
    first_token_s: float | None = None  # ... when its first token was produced
    finish_s: float | None = None  # ... when its record became final

    decoder: StreamDecoder | None = field(
        default=None, repr=False
    )  # turns its tokens into text as they come
    decoded: str = field(default="", repr=False)  # all text so far, before stop-string cutting
    shown: int = field(
        default=0, repr=False
    )  # how much of `text` a stream has handed out (`unshown_text`)

    def __post_init__(self) -> None:
        if self.output_index < 0:
            self.output_index = self.index

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED


def fail_request(request: Request, message: str, round_number: int | None = None) -> None:
    """Finish with an error of its own: before it runs, or in `round_number` (its logits were not finite).
    Its peers are untouched; the tokens it had are kept, and no more text comes."""
    request.status, request.finish_reason, request.error = Status.FINISHED, "error", message
    request.finish_round, request.decoder = round_number, None


def add_token(
    request: Request,
    token: int,
    logprob: float | None,
    round_number: int,
    eos_token_id: int | None,
    n_positions: int,
    top: list[tuple[int, float]] | None = None,
) -> None:
    """Append this round's token (and its logprobs, if wanted) to the record and apply every stop rule, in order."""
    request.token_ids.append(token)
    if request.want_logprobs and logprob is not None:
        request.logprobs.append(logprob)
    if top is not None:
        request.top_logprobs.append(top)
    params = request.params
    if (token == eos_token_id and not params.ignore_eos) or token in params.stop_token_ids:
        finish(
            request, "stop", round_number
        )  # the token is kept in token_ids, its text is not added
    elif request.decoder is not None and found_stop_string(request, request.decoder.push(token)):
        finish(request, "stop", round_number, text_was_cut=True)
    elif len(request.token_ids) >= params.max_new_tokens:
        finish(request, "length", round_number)
    elif request.prompt_len + len(request.token_ids) >= n_positions:
        finish(
            request, "length", round_number
        )  # prompt + output fill the context (Hugging Face's max_length)


def found_stop_string(request: Request, new_text: str) -> bool:
    """Add new text; if a stop string now appears, cut the text just before it."""
    before = len(request.decoded)
    request.decoded += new_text
    stops = request.params.stop
    if not stops or not new_text:
        request.text = request.decoded
        return False
    search_from = max(
        0, before - max(len(s) for s in stops) + 1
    )  # a stop string may straddle old and new text
    hits = [pos for s in stops if (pos := request.decoded.find(s, search_from)) != -1]
    request.text = request.decoded[: min(hits)] if hits else request.decoded
    return bool(hits)


def unshown_text(request: Request) -> str:
    """The text not handed out yet that can no longer change, and mark it handed out: all of it once the request
    is finished; while it runs, all but the last (longest stop string - 1) characters, which a stop string
    completed by a later token could still cut away."""
    if request.text is None:
        return ""
    stops = request.params.stop
    held_back = 0 if request.finished or not stops else max(len(s) for s in stops) - 1
    end = max(request.shown, len(request.text) - held_back)
    new, request.shown = request.text[request.shown : end], end
    return new


def finish(request: Request, reason: str, round_number: int, text_was_cut: bool = False) -> None:
    """The request is done: its status and reason are final, and so is its text."""
    request.status, request.finish_reason, request.finish_round = (
        Status.FINISHED,
        reason,
        round_number,
    )
    if request.decoder is not None and not text_was_cut:
        request.decoded += request.decoder.flush()  # an unfinished character becomes U+FFFD
        request.text = request.decoded
    request.decoder = None
