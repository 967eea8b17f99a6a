"""What a request asks for: `SamplingParams`, validated.

Owns: `SamplingParams`, everything a request says about how it wants to be generated and stopped
(max_new_tokens, temperature, top_k, top_p, min_p, penalties, logit_bias, seed, stop strings, stop token
ids, ignore_eos, logprobs, prompt_logprobs, n), each value checked when it is made, and `FIELD_NAMES`, the
fields a JSONL line or a flag may set.

Must not know: models, logits, batches, scheduling or text.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
import numpy as np

from ..errors import RequestError


GREEDY_BELOW = 1e-5  # temperatures under this are treated as 0 (greedy)


MAX_TOP_LOGPROBS = 100  # the most alternatives a request may ask for at each step


MAX_SAMPLES = 1000  # the most samples (n) one prompt may ask for


@dataclass(frozen=True)
class SamplingParams:
    """How one request is generated and when it stops."""

    max_new_tokens: int = 64  # stop with finish_reason "length" after this many tokens
    temperature: float = (
        0.0  # 0 (or below 1e-5) means greedy (argmax); otherwise logits are divided by it
    )
    top_k: int = 0  # keep only the k most likely tokens (0: no limit)
    top_p: float = (
        1.0  # keep the smallest set of tokens whose probability reaches top_p (1: no limit)
    )
    seed: int | None = (
        None  # the request's own stream; None: derived from the run's seed and the request's index
    )
    stop: tuple[str, ...] = ()  # stop strings; the text is cut just before the first one
    stop_token_ids: tuple[int, ...] = ()  # token ids that end the request (finish_reason "stop")
    ignore_eos: bool = False  # keep going past the end-of-text token
    repetition_penalty: float = (
        1.0  # > 0; a seen token's logit (prompt or output): / it if positive, * it if not
    )
    presence_penalty: float = 0.0  # subtracted from the logit of every token the output holds
    frequency_penalty: float = 0.0  # subtracted once per time the output holds the token
    min_p: float = 0.0  # keep tokens at least min_p x the most likely one's probability (0: off)
    logit_bias: tuple[tuple[int, float], ...] = ()  # {token id: bias} as sorted pairs, added first
    logprobs: int | None = (
        None  # record each token's logprob (0), and the N most likely at each step (N >= 1)
    )
    prompt_logprobs: bool = False  # record each prompt token's logprob given the tokens before it
    n: int = (
        1  # independent samples of the prompt: sample k draws from its own stream (`sample_seed`)
    )

    def __post_init__(self):
        # A bare `stop` string, lists (from JSON) and None become tuples (hashable); validate refuses anything else.
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        for name, raw in (("stop", stop), ("stop_token_ids", self.stop_token_ids)):
            object.__setattr__(
                self, name, tuple(raw or ()) if isinstance(raw, (list, tuple, type(None))) else raw
            )
        object.__setattr__(self, "logit_bias", bias_pairs(self.logit_bias))
        self.validate()

    def validate(self) -> None:
        def is_int(value) -> bool:
            return isinstance(value, (int, np.integer)) and not isinstance(value, bool)

        def is_number(value) -> bool:
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
                return False
            try:
                return bool(np.isfinite(float(value)))
            except OverflowError:  # an integer past float's range (10**400)
                return False

        if not is_int(self.n) or not 1 <= self.n <= MAX_SAMPLES:
            raise RequestError(f"n must be an integer from 1 to {MAX_SAMPLES}, got {self.n!r}")
        if not is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise RequestError(
                f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}"
            )
        if not is_number(self.temperature) or self.temperature < 0:
            raise RequestError(
                f"temperature must be a number >= 0 (0 is greedy), got {self.temperature!r}"
            )
        if not is_int(self.top_k) or self.top_k < 0:
            raise RequestError(
                f"top_k must be an integer >= 0 (0 turns it off), got {self.top_k!r}"
            )
        if not is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (not is_int(self.seed) or self.seed < 0):
            raise RequestError(f"seed must be an integer >= 0, got {self.seed!r}")
        if not isinstance(self.stop, tuple) or not all(isinstance(s, str) and s for s in self.stop):
            shown = list(self.stop) if isinstance(self.stop, tuple) else self.stop
            raise RequestError(f"stop must be a list of non-empty strings, got {shown!r}")
        if not isinstance(self.stop_token_ids, tuple) or not all(
            is_int(t) and t >= 0 for t in self.stop_token_ids
        ):
            raise RequestError(
                f"stop_token_ids must be a list of token ids, got {self.stop_token_ids!r}"
            )
        for flag in ("ignore_eos", "prompt_logprobs"):
            if not isinstance(getattr(self, flag), bool):
                raise RequestError(f"{flag} must be true or false, got {getattr(self, flag)!r}")
        if not is_number(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise RequestError(
                f"repetition_penalty must be a number > 0 (1 turns it off), "
                f"got {self.repetition_penalty!r}"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            if not is_number(getattr(self, name)):
                raise RequestError(
                    f"{name} must be a finite number (0 turns it off), got {getattr(self, name)!r}"
                )
        if not is_number(self.min_p) or not 0 <= self.min_p <= 1:
            raise RequestError(f"min_p must be in [0, 1] (0 turns it off), got {self.min_p!r}")
        if self.logprobs is not None and (
            not is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_TOP_LOGPROBS
        ):
            raise RequestError(
                f"logprobs must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {self.logprobs!r}"
            )
        if not isinstance(self.logit_bias, tuple) or not all(
            isinstance(pair, tuple) and is_int(pair[0]) and pair[0] >= 0 and is_number(pair[1])
            for pair in self.logit_bias
        ):
            raise RequestError(
                f"logit_bias must map token ids to finite numbers, got {self.logit_bias!r}"
            )

    def updated(self, **overrides) -> SamplingParams:
        """A copy with some fields replaced (validated again)."""
        unknown = set(overrides) - set(FIELD_NAMES)
        if unknown:
            raise RequestError(
                f"unknown sampling field(s) {', '.join(sorted(unknown))}; "
                f"known: {', '.join(FIELD_NAMES)}"
            )
        return replace(self, **overrides)

    @property
    def changes_logits(self) -> bool:
        """Whether a bias or a penalty changes the logits before a token is chosen."""
        return (
            bool(self.logit_bias)
            or self.repetition_penalty != 1.0
            or bool(self.presence_penalty)
            or bool(self.frequency_penalty)
        )

    @property
    def greedy(self) -> bool:
        """Temperature 0, or so small that logits / T would overflow: take the argmax."""
        return self.temperature < GREEDY_BELOW


FIELD_NAMES = tuple(f.name for f in fields(SamplingParams))  # what a JSONL line or a flag may set


def bias_pairs(raw):
    """A logit_bias as sorted (token id, bias) pairs: from a dict (JSON's keys are strings of digits), pairs or
    None; anything else is left for `validate` to refuse."""
    if raw is None:
        return ()
    if isinstance(raw, dict):
        try:
            raw = [
                (int(k) if isinstance(k, str) and k.strip().isdigit() else k, v)
                for k, v in raw.items()
            ]
        except ValueError:
            return raw
    if isinstance(raw, (list, tuple)) and all(
        isinstance(p, (list, tuple)) and len(p) == 2 for p in raw
    ):
        pairs = [tuple(p) for p in raw]
        try:
            return tuple(sorted(pairs))
        except TypeError:
            return tuple(pairs)
    return raw
