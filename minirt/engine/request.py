"""One request's own state, from arrival to its finished record, and the rules of its progress.

Owns: `Request`, a plain record of everything that is one request's own (identity, prompt,
parameters, random stream, output, status, KV slot, rounds), and the things that happen to a
record:
  * `add_token` appends a chosen token and applies every stop rule: EOS, stop token ids, stop
    strings (found in the decoded text even when they span tokens), max_tokens and a full
    context;
  * `fail_request` ends it with an error of its own: before it runs, or mid-run when its logits
    are not finite;
  * `abort_request` ends it because its caller no longer wants it (finish_reason "abort");
  * `unshown_text` hands out, for streaming, the text that no later token can change.

Also `Refusal`: why a request (or a submission of several) is not taken, as values (its kind,
the field it is about, the numbers it is about), never as English to be parsed; `message` words
it for the offline API and the command line, and the server words each kind in its own terms.

The engine makes the record, gives it a slot and a text decoder, and calls `add_token` each
round; the scheduler stamps when it was admitted.  A batch shares a forward pass, never a
request's progress or its reason to stop.

Must not know: the layers, the batch layout, sampling, or how requests are grouped.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Collection, NamedTuple

import numpy as np

from .detokenizer import TextDecoder
from .params import SamplingParams


# The kinds of refusal.  The scheduler's: a request no round could ever take.
KV_BUDGET = "kv_budget"  # needs `needed` KV positions, over the budget of `limit`
ROUND_TOKENS = "round_tokens"  # a prompt of `needed` tokens, over the round budget of `limit`
# A serving client's (minirt/engine/client.py): a submission it will not queue.
TOO_MANY_CHOICES = "too_many_choices"  # `needed` requests at once, over the queue's `limit`
QUEUE_FULL = "queue_full"  # `waiting` wait already, and `needed` more pass the queue's `limit`
SHUTTING_DOWN = "shutting_down"  # it accepts nothing more
FAULT = "fault"  # queueing it raised (a bug): `detail` says what
REFUSAL_KINDS = (KV_BUDGET, ROUND_TOKENS, TOO_MANY_CHOICES, QUEUE_FULL, SHUTTING_DOWN, FAULT)


@dataclass(frozen=True)
class Refusal:
    """Why a request, or a submission of several, is not taken: its kind (REFUSAL_KINDS), the
    request field it is about in the engine's names (None: the whole submission), and the
    numbers it is about."""

    kind: str
    field: str | None = None
    needed: int = 0
    limit: int = 0
    waiting: int = 0
    detail: str = ""

    @property
    def message(self) -> str:
        """The refusal in one line, in the engine's terms (what the offline API and the command
        line say: a request refused is failed with this error)."""
        if self.kind == KV_BUDGET:
            return (
                f"needs {self.needed} KV cache positions, over the budget of {self.limit}; "
                "lower max_tokens or raise the KV budget"
            )
        if self.kind == ROUND_TOKENS:
            return (
                f"its prompt of {self.needed} tokens exceeds the round token budget of "
                f"{self.limit}; raise the budget, or let its prefill be chunked"
            )
        if self.kind == TOO_MANY_CHOICES:
            return f"{self.needed} requests at once, more than the {self.limit} the queue holds"
        if self.kind == QUEUE_FULL:
            return f"the queue is full ({self.waiting} requests wait, {self.limit} at most)"
        if self.kind == SHUTTING_DOWN:
            return "shutting down: nothing more is queued"
        return f"queueing it failed ({self.detail})"

    def __str__(self) -> str:
        return self.message


class Choice(NamedTuple):
    """What the sampler chose for a request in a round: the token; its log-probability under
    the raw model and its rank there (1: the most likely), when the request wants logprobs (else
    None); and the N most likely tokens with theirs, when it asked for N (else None)."""

    token: int
    logprob: float | None = None
    top: list[tuple[int, float]] | None = None
    rank: int | None = None


class Status(enum.Enum):
    # In the queue, with no KV slot yet.
    WAITING = "waiting"
    # Admitted: it has a row and produces a token every round.
    RUNNING = "running"
    # Done (stopped, ran out, failed or aborted): its record is final.
    FINISHED = "finished"


# eq=False: two requests are the same request only if they are the same object, however alike
# their fields (the scheduler finds and removes requests in its queue by identity).
@dataclass(eq=False)
class Request:
    """A request and everything that is its own."""

    # Identity.  `index` is the prompt's place in the input, 0-based (a prompt's n samples share
    # it); `output_index` is the request's own place among the run's requests, samples counted,
    # which is where its record comes in the output.  Left at -1, it is the index.
    index: int
    id: str  # the user's id, or the index as a string
    prompt: str | None  # the prompt text (None when given as token ids)
    prompt_ids: list[int]  # what the model is fed first (BOS alone for an empty prompt)
    params: SamplingParams
    rng: np.random.Generator | None = None  # the request's own random stream
    want_logprobs: bool = False
    sample: int = 0  # which of the prompt's n samples (0 when n is 1)
    output_index: int = -1

    # What it produced.  `logprobs` are under the raw model, kept when wanted, with each
    # token's rank there in `logprob_ranks` (1: the most likely); `top_logprobs` holds, per
    # token, the N most likely; `prompt_logprobs`, per prompt token, its logprob
    # given the tokens before it (when asked).  `text` is the completion cut before a stop
    # string, None without a tokenizer.
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    logprob_ranks: list[int] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    prompt_logprobs: list[float | None] | None = None
    text: str | None = None
    status: Status = Status.WAITING
    finish_reason: str | None = None  # "stop", "length", "error" or "abort"
    error: str | None = None  # why the request failed, in one line

    # Where and when it ran.  `group` is the static group that served it (1-based; None under
    # continuous batching); rounds are numbered across the run, the first being its prefill.
    # `arrival_round` is how many rounds the run had run when it arrived (0 offline), and
    # `rounds_waited` how many ran while it waited.  Times are seconds from the run's start.
    group: int | None = None
    slot: int | None = None  # its KV slot while it runs
    first_round: int | None = None
    finish_round: int | None = None
    arrival_round: int = 0
    rounds_waited: int | None = None
    arrival_s: float | None = None  # when it was queued (or refused)
    first_token_s: float | None = None
    finish_s: float | None = None  # when its record became final
    admitted_s: float | None = None  # when its first round (its prefill's first) began

    # Its prompt's way into its KV slot: `prefilled` prompt tokens are there (all of them once
    # its prompt is in), `cached_prompt_tokens` of those were copied from the prefix cache, and
    # `prefill_rounds` rounds fed it prompt tokens (1, or more when its prefill was chunked; the
    # last of them gave its first token).
    prefilled: int = 0
    cached_prompt_tokens: int = 0
    prefill_rounds: int = 0

    # Streaming text: the decoder turns its tokens into text as they come; `decoded` is all
    # text so far, before stop-string cutting; `shown` is how much of `text` a stream has
    # handed out (`unshown_text`).
    decoder: TextDecoder | None = field(default=None, repr=False)
    decoded: str = field(default="", repr=False)
    shown: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        if self.output_index < 0:
            self.output_index = self.index

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    @property
    def prompt_done(self) -> bool:
        """Whether its whole prompt is in its slot: from then on it gets a token each round."""
        return self.prefilled >= self.prompt_len


def note_prefill(request: Request, prefilled_to: int) -> None:
    """A round fed it prompt tokens up to position `prefilled_to` (its whole prompt, or a chunk
    of it)."""
    request.prefilled = prefilled_to
    request.prefill_rounds += 1


def fail_request(request: Request, message: str, round_number: int | None = None) -> None:
    """Finish with an error of its own: before it runs, or in `round_number` (its logits were
    not finite).  Its peers are untouched; the tokens it had are kept, and no more text comes."""
    request.status = Status.FINISHED
    request.finish_reason = "error"
    request.error = message
    request.finish_round = round_number
    request.decoder = None


def abort_request(request: Request) -> None:
    """Finish because the caller no longer wants it: waiting (it never runs) or running (the
    tokens and text it had are kept; its last round is the one that gave its last token)."""
    if request.status is Status.RUNNING and request.token_ids:
        assert request.first_round is not None  # it ran, so it was admitted in some round
        # Its prompt's rounds, the last of which gave its first token, then a token a round.
        first_token_round = request.first_round + request.prefill_rounds - 1
        request.finish_round = first_token_round + len(request.token_ids) - 1
    request.status = Status.FINISHED
    request.finish_reason = "abort"
    request.decoder = None


def add_token(
    request: Request,
    choice: Choice,
    round_number: int,
    eos_token_ids: Collection[int],
    n_positions: int,
) -> None:
    """Append this round's chosen token (and its logprobs, if wanted) to the record and apply
    every stop rule, in order: any of `eos_token_ids` stops it (unless it ignores EOS)."""
    token = choice.token
    request.token_ids.append(token)
    if request.want_logprobs and choice.logprob is not None:
        request.logprobs.append(choice.logprob)
        if choice.rank is not None:
            request.logprob_ranks.append(choice.rank)
    if choice.top is not None:
        request.top_logprobs.append(choice.top)
    params = request.params
    is_eos = token in eos_token_ids and not params.ignore_eos
    if is_eos or token in params.stop_token_ids:
        # The token is kept in token_ids; its text is not added.
        finish(request, "stop", round_number)
    elif request.decoder is not None and found_stop_string(request, request.decoder.push(token)):
        finish(request, "stop", round_number, text_was_cut=True)
    elif len(request.token_ids) >= params.max_tokens:
        finish(request, "length", round_number)
    elif request.prompt_len + len(request.token_ids) >= n_positions:
        # Prompt and output fill the context (Hugging Face's max_length).
        finish(request, "length", round_number)


def found_stop_string(request: Request, new_text: str) -> bool:
    """Add new text; if a stop string now appears, cut the text just before it."""
    before = len(request.decoded)
    request.decoded += new_text
    stops = request.params.stop
    if not stops or not new_text:
        request.text = request.decoded
        return False
    # A stop string may straddle the old text and the new.
    search_from = max(0, before - max(len(s) for s in stops) + 1)
    hits = [pos for s in stops if (pos := request.decoded.find(s, search_from)) != -1]
    if hits:
        request.text = request.decoded[: min(hits)]
    else:
        request.text = request.decoded
    return bool(hits)


def unshown_text(request: Request) -> str:
    """The text not handed out yet that can no longer change, and mark it handed out: all of it
    once the request is finished; while it runs, all but the last (longest stop string - 1)
    characters, which a stop string completed by a later token could still cut away."""
    if request.text is None:
        return ""
    stops = request.params.stop
    if request.finished or not stops:
        held_back = 0
    else:
        held_back = max(len(s) for s in stops) - 1
    end = max(request.shown, len(request.text) - held_back)
    new = request.text[request.shown : end]
    request.shown = end
    return new


def finish(request: Request, reason: str, round_number: int, text_was_cut: bool = False) -> None:
    """The request is done: its status and reason are final, and so is its text."""
    request.status = Status.FINISHED
    request.finish_reason = reason
    request.finish_round = round_number
    if request.decoder is not None and not text_was_cut:
        # An unfinished character becomes U+FFFD.
        request.decoded += request.decoder.flush()
        request.text = request.decoded
    request.decoder = None


def slot_of(request: Request) -> int:
    """The KV slot of an admitted request (every row of a round holds one): the order of a
    round's rows."""
    assert request.slot is not None
    return request.slot
