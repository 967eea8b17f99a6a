"""What a caller gets back: each prompt's results, and each token as it is produced.

Owns the public, read-only shapes, vLLM's where vLLM has one (docs/api.md, "Coming from vLLM"):
  * `RequestOutput`: one prompt's result, what `LLM.generate` returns one of per prompt: the
    prompt, its ids and logprobs, and its n completions in `outputs`;
  * `CompletionOutput`: one completion (one of the n samples): its text, token ids, logprobs
    and finish reason, as vLLM's, and where it ran (group, rounds, cached prompt tokens, times),
    which minirt alone records;
  * `Logprob`: one token's log-probability, rank and text;
  * `TokenEvent`: one token the moment it is produced (`LLM.generate(on_token=...)`).
All are made from `Request`s, the runtime's own working records, which callers never see.

Must not know: how requests are served, files or command-line flags.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .detokenizer import Detokenizer
from .request import Request, unshown_text


@dataclass(frozen=True)
class Logprob:
    """One token's log-probability under the raw model (vLLM's `Logprob`): `rank` 1 is the
    most likely token (None for a prompt token: not computed), `decoded_token` its text (None
    without a tokenizer)."""

    logprob: float
    rank: int | None
    decoded_token: str | None


# One entry per token: {token id: Logprob}, the chosen token first, then the N most likely in
# rank order (SamplingParams.logprobs N), as vLLM orders it.
TokenLogprobs = dict[int, Logprob]


@dataclass(frozen=True)
class CompletionOutput:
    """One completion of a prompt: one of its n samples (vLLM's `CompletionOutput`, with
    minirt's round fields after vLLM's)."""

    # Which of the prompt's n samples (SamplingParams.n), 0-based.
    index: int

    # The completion (without an EOS's text, cut before a stop string; None without a
    # tokenizer), and every token produced, in order (an EOS or stop token included).
    text: str | None
    token_ids: list[int]

    # Log-probabilities under the raw model, when SamplingParams.logprobs is set (else None):
    # their sum (None too when it produced no token), and one {token id: Logprob} per token
    # (`TokenLogprobs`).
    cumulative_logprob: float | None
    logprobs: list[TokenLogprobs] | None

    # Why it ended: "stop" (EOS, stop token or stop string), "length" (max_tokens or
    # context), "error" (it failed: `error` says why, in one line; None when it did not) or
    # "abort" (its caller ended it with `Engine.abort`; the tokens it had are kept).
    finish_reason: str
    error: str | None

    # Where it ran (minirt's own).  `group` is the static group that served it (1-based; None
    # under continuous batching, or if refused); `first_round` the round it was admitted in,
    # its prefill's first (None if it never ran), which gave its first token unless its prompt
    # was chunked over several rounds; `finish_round` the round that gave its last token;
    # `rounds_waited` the rounds that ran before its first.
    group: int | None
    first_round: int | None
    finish_round: int | None
    rounds_waited: int | None

    # How many of its prompt tokens were copied from the prefix cache instead of computed (0
    # when none were, or the cache is off).
    cached_prompt_tokens: int

    # Seconds from the start of the run: when it was queued, when its first token came (None if
    # it never ran), and when its record became final.
    arrival_s: float | None
    first_token_s: float | None
    finish_s: float | None

    @property
    def ok(self) -> bool:
        """True unless it failed (its `error` says why)."""
        return self.error is None

    def finished(self) -> bool:
        """vLLM's: whether it has ended (always, in a final output)."""
        return True

    @classmethod
    def from_request(
        cls, request: Request, detokenizer: Detokenizer | None = None
    ) -> CompletionOutput:
        """The completion of a finished request; each logprob's token text comes from the
        detokenizer (the model's tokenizer), when one is given."""
        assert request.finish_reason is not None, "only a finished request has a result"
        logprobs = None
        cumulative = None
        if request.params.logprobs is not None:
            logprobs = token_logprobs(request, detokenizer)
            # No tokens (refused before it ran): no sum, rather than a log-probability of 0.
            if request.logprobs:
                cumulative = math.fsum(request.logprobs)
        return cls(
            index=request.sample,
            text=request.text,
            token_ids=list(request.token_ids),
            cumulative_logprob=cumulative,
            logprobs=logprobs,
            finish_reason=request.finish_reason,
            error=request.error,
            group=request.group,
            first_round=request.first_round,
            finish_round=request.finish_round,
            rounds_waited=request.rounds_waited,
            cached_prompt_tokens=request.cached_prompt_tokens,
            arrival_s=request.arrival_s,
            first_token_s=request.first_token_s,
            finish_s=request.finish_s,
        )


@dataclass(frozen=True)
class RequestOutput:
    """One prompt's result, as `LLM.generate` returns it (one per prompt, in input order;
    vLLM's `RequestOutput`, with the prompt's `index`)."""

    # Identity: the id it was given (or its index, as a string), and its place in the input,
    # 0-based.
    request_id: str
    index: int

    # The prompt text (a token-id prompt's decoded text; None without a tokenizer), and what
    # the model was fed first (BOS alone for an empty prompt; [] when its ids were refused).
    prompt: str | None
    prompt_token_ids: list[int]

    # When SamplingParams.prompt_logprobs is 0: per prompt token, {its id: its Logprob} given
    # the tokens before it (the first: None, as nothing comes before it).  Else None.
    prompt_logprobs: list[TokenLogprobs | None] | None

    # Its n completions (SamplingParams.n), by sample number.
    outputs: list[CompletionOutput]

    # Whether every completion has ended (always, in what `generate` returns).
    finished: bool

    @property
    def ok(self) -> bool:
        """True unless a completion failed (its `error` says why)."""
        return all(output.ok for output in self.outputs)

    @classmethod
    def from_requests(
        cls, requests: list[Request], detokenizer: Detokenizer | None = None
    ) -> RequestOutput:
        """The result of one prompt's requests (its n samples, in sample order), all
        finished."""
        first = requests[0]
        assert all(r.index == first.index for r in requests), "one prompt's samples"
        return cls(
            request_id=first.id,
            index=first.index,
            prompt=prompt_text(first, detokenizer),
            prompt_token_ids=list(first.prompt_ids),
            prompt_logprobs=prompt_token_logprobs(first, detokenizer),
            outputs=[CompletionOutput.from_request(r, detokenizer) for r in requests],
            finished=all(r.finished for r in requests),
        )


@dataclass(frozen=True)
class TokenEvent:
    """One token of one request, the moment it is produced (`LLM.generate(..., on_token=...)`)."""

    # Which request: its prompt's position in the input and id, and which of the prompt's n
    # samples (0 when n is 1).
    index: int
    id: str
    sample: int
    # The token just produced.
    token_id: int
    # New text that is now final: "" while a character is incomplete or a stop string may still
    # cut it.
    text: str
    # None while the request runs; its final reason ("stop" or "length") on its last token.
    # A request that fails mid-run, or is ended by `Engine.abort` (finish_reason "abort"),
    # ends without producing a token, so no event says "error" or "abort": its last event
    # says None, and its CompletionOutput gives the reason.
    finish_reason: str | None

    @classmethod
    def from_request(cls, request: Request) -> TokenEvent:
        """The event for the token just appended; takes the request's text not yet handed out
        (`unshown_text`)."""
        return cls(
            index=request.index,
            id=request.id,
            sample=request.sample,
            token_id=request.token_ids[-1],
            text=unshown_text(request),
            finish_reason=request.finish_reason,
        )


def token_logprobs(request: Request, detokenizer: Detokenizer | None) -> list[TokenLogprobs]:
    """Per token of a request that asked for logprobs: {token id: Logprob}, the chosen token
    first, then its N most likely (when it asked for N >= 1), in rank order."""
    steps = []
    for step, token in enumerate(request.token_ids):
        if step >= len(request.logprobs):
            # A token a replay made (minirt/engine/model_free_runner.py) has no logprob.
            break
        entry = {token: Logprob(request.logprobs[step], request.logprob_ranks[step], None)}
        if request.top_logprobs:
            for rank, (top_token, logprob) in enumerate(request.top_logprobs[step], start=1):
                if top_token != token:
                    entry[top_token] = Logprob(logprob, rank, None)
        steps.append(with_text(entry, detokenizer))
    return steps


def prompt_token_logprobs(
    request: Request, detokenizer: Detokenizer | None
) -> list[TokenLogprobs | None] | None:
    """Per prompt token, {its id: its Logprob} (no rank) given the tokens before it; the first
    None.  None when the request did not ask for them."""
    if request.prompt_logprobs is None:
        return None
    entries: list[TokenLogprobs | None] = []
    for token, logprob in zip(request.prompt_ids, request.prompt_logprobs, strict=True):
        if logprob is None:
            entries.append(None)
        else:
            entries.append(with_text({token: Logprob(logprob, None, None)}, detokenizer))
    return entries


def with_text(entry: TokenLogprobs, detokenizer: Detokenizer | None) -> TokenLogprobs:
    """The entry with each token's text (its own decoding, alone), when there is a
    detokenizer."""
    if detokenizer is None:
        return entry
    return {
        token: Logprob(value.logprob, value.rank, detokenizer.decode([token]))
        for token, value in entry.items()
    }


def json_logprob(logprob: float) -> float | None:
    """Rounded to 6 places; a -inf (a token the raw model gave probability 0) as None, as strict
    JSON needs."""
    if math.isfinite(logprob):
        return round(logprob, 6)
    return None


def prompt_text(request: Request, detokenizer: Detokenizer | None) -> str | None:
    """The prompt as text: as given, or a token-id prompt decoded (None when there is no
    tokenizer, or no valid ids)."""
    if request.prompt is not None or detokenizer is None or not request.prompt_ids:
        return request.prompt
    return detokenizer.decode(request.prompt_ids)
