"""What a caller gets back: each request's result, and each token as it is produced.

Owns: the public, read-only shape of a result (`RequestOutput`, what `LLM.generate` returns and
what one line of `--output` holds, field for field) and of a streamed token (`TokenEvent`, what
`LLM.generate(on_token=...)` hands out).  Both are made from a `Request`, the runtime's own
working record, which callers never see.

Must not know: how requests are served, files or command-line flags.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .detokenizer import Detokenizer
from .request import Request, unshown_text


@dataclass(frozen=True)
class RequestOutput:
    """One request's final result, as `LLM.generate` returns it (in input order)."""

    # Identity.  `index` is its position in the input, 0-based; `id` the id it was given, or its
    # index as a string; `sample` which of the prompt's n samples (SamplingParams.n), 0-based,
    # and 0 when n is 1.
    index: int
    id: str
    sample: int

    # The prompt text (a token-id prompt's decoded text), and what the model was fed first (BOS
    # alone for an empty prompt; [] if refused).  The text is None without a tokenizer.
    prompt: str | None
    prompt_token_ids: list[int]

    # The completion (without an EOS's text, cut before a stop string; None without a
    # tokenizer), and every token produced, in order (an EOS or stop token included).
    text: str | None
    token_ids: list[int]

    # Why it ended: "stop" (EOS, stop token or stop string), "length" (max_new_tokens or
    # context), "error" (it failed: `error` says why, in one line; None when it did not) or
    # "abort" (its caller ended it with `Engine.abort`; the tokens it had are kept).
    finish_reason: str
    error: str | None

    # Log-probabilities, when asked for (else None): each token's under the raw model; per
    # token, the N most likely (SamplingParams.logprobs); per prompt token, given those before
    # it (the first: None).
    logprobs: list[float] | None
    top_logprobs: list[list[tuple[int, float]]] | None
    prompt_logprobs: list[float | None] | None

    # Where it ran.  `group` is the static group that served it (1-based; None under continuous
    # batching, or if refused); `first_round` the round it was admitted in, its prefill (None if
    # it never ran), which gave its first token unless its prompt was chunked over several
    # rounds; `finish_round` the round that gave its last token; `rounds_waited` the rounds
    # that ran before its first.
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
        """True unless the request failed (its `error` says why)."""
        return self.error is None

    @classmethod
    def from_request(
        cls, request: Request, detokenizer: Detokenizer | None = None
    ) -> RequestOutput:
        """The result of a finished request; a token-id prompt gets its text decoded when a
        detokenizer (the model's tokenizer) is given."""
        assert request.finish_reason is not None, "only a finished request has a result"
        if request.want_logprobs:
            logprobs = list(request.logprobs)
        else:
            logprobs = None
        if request.params.logprobs:
            top_logprobs = list(request.top_logprobs)
        else:
            top_logprobs = None
        return cls(
            index=request.index,
            id=request.id,
            sample=request.sample,
            prompt=prompt_text(request, detokenizer),
            prompt_token_ids=list(request.prompt_ids),
            text=request.text,
            token_ids=list(request.token_ids),
            finish_reason=request.finish_reason,
            error=request.error,
            logprobs=logprobs,
            top_logprobs=top_logprobs,
            prompt_logprobs=copied(request.prompt_logprobs),
            group=request.group,
            first_round=request.first_round,
            finish_round=request.finish_round,
            rounds_waited=request.rounds_waited,
            cached_prompt_tokens=request.cached_prompt_tokens,
            arrival_s=request.arrival_s,
            first_token_s=request.first_token_s,
            finish_s=request.finish_s,
        )

    def record(self, prompt_was_ids: bool = False, samples: int = 1) -> dict:
        """The JSON-ready line of `--output`: these fields, `prompt_tokens` (None for a refused
        request), and `prompt_token_ids` only for a prompt given as token ids; logprobs only
        when asked for, rounded to 6 places, a -inf (a token the raw model gave probability 0)
        as null, as strict JSON needs."""
        if self.ok:
            prompt_tokens = len(self.prompt_token_ids)
        else:
            prompt_tokens = None
        timing_fields = (
            ("arrival_s", self.arrival_s),
            ("first_token_s", self.first_token_s),
            ("finish_s", self.finish_s),
        )
        timing = {name: None if value is None else round(value, 6) for name, value in timing_fields}
        out: dict = {
            "index": self.index,
            "id": self.id,
            "prompt": self.prompt,
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "group": self.group,
            "rounds_waited": self.rounds_waited,
            "first_round": self.first_round,
            "finish_round": self.finish_round,
            "prompt_tokens": prompt_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "error": self.error,
            **timing,
        }
        # One record per sample, each with the prompt's index and id.
        if samples > 1:
            out["sample"] = self.sample
        if prompt_was_ids:
            out["prompt_token_ids"] = self.prompt_token_ids
        if self.logprobs is not None:
            out["logprobs"] = [json_logprob(lp) for lp in self.logprobs]
        if self.top_logprobs is not None:
            out["top_logprobs"] = [
                [[token, json_logprob(lp)] for token, lp in step] for step in self.top_logprobs
            ]
        if self.prompt_logprobs is not None:
            out["prompt_logprobs"] = [
                None if lp is None else json_logprob(lp) for lp in self.prompt_logprobs
            ]
        return out


@dataclass(frozen=True)
class TokenEvent:
    """One token of one request, the moment it is produced (`LLM.generate(..., on_token=...)`)."""

    # Which request (its position in the input, and its id).
    index: int
    id: str
    # The token just produced.
    token_id: int
    # New text that is now final: "" while a character is incomplete or a stop string may still
    # cut it.
    text: str
    # None while the request runs; its final reason ("stop" or "length") on its last token.
    # A request that fails mid-run, or is ended by `Engine.abort` (finish_reason "abort"),
    # ends without producing a token, so no event says "error" or "abort": its last event
    # says None, and its RequestOutput gives the reason.
    finish_reason: str | None

    @classmethod
    def from_request(cls, request: Request) -> TokenEvent:
        """The event for the token just appended; takes the request's text not yet handed out
        (`unshown_text`)."""
        return cls(
            index=request.index,
            id=request.id,
            token_id=request.token_ids[-1],
            text=unshown_text(request),
            finish_reason=request.finish_reason,
        )


def copied(values: list | None) -> list | None:
    """A copy of a list the request goes on holding (None stays None)."""
    if values is None:
        return None
    return list(values)


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
