"""What a request asks for: `SamplingParams`, validated.

Owns: `SamplingParams`, everything a request says about how it wants to be generated and
stopped (max_tokens, temperature, top_k, top_p, min_p, penalties, logit_bias, seed, stop
strings, stop token ids, ignore_eos, logprobs, prompt_logprobs, n), each value checked when it
is made, and `FIELD_NAMES`, the fields a JSONL line or a flag may set.

The names and defaults are vLLM's (docs/api.md, "Coming from vLLM"): `SamplingParams()` samples
at temperature 1 and stops after 16 tokens, as vLLM's does and as OpenAI's completions endpoint
does.  `max_new_tokens` (Hugging Face's name, and minirt's before) is the same field as
`max_tokens`, accepted wherever `max_tokens` is.

Must not know: models, logits, batches, scheduling or text.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields

import numpy as np

from ..errors import RequestError

# Temperatures under this are treated as 0 (greedy).
GREEDY_BELOW = 1e-5

# vLLM's and OpenAI's: a request that says nothing gets 16 new tokens at most.
DEFAULT_MAX_TOKENS = 16

# The other name of max_tokens: Hugging Face's, and minirt's before it took vLLM's.
MAX_TOKENS_ALIAS = "max_new_tokens"

# The most alternatives a request may ask for at each step.
MAX_TOP_LOGPROBS = 100

# The most samples (n) one prompt may ask for.
MAX_SAMPLES = 1000

# The largest logit_bias either way, OpenAI's: +100 makes a token all but certain, -100 all but
# impossible, and a bias this size cannot overflow the arithmetic that follows.
MAX_LOGIT_BIAS = 100.0

# The largest presence or frequency penalty either way (OpenAI's and vLLM's bound).  Times a count
# of at most the context, it stays far inside float64.
MAX_PRESENCE_OR_FREQUENCY = 2.0

# repetition_penalty lies in [1 / this, this].  transformers takes any positive value, but past
# these a seen token's logit is pushed so far that dividing it by a small temperature overflows;
# 100 already all but bans (or forces) every token seen.
MAX_REPETITION_PENALTY = 100.0


@dataclass(frozen=True)
class SamplingParams:
    """How one request is generated and when it stops."""

    # Stop with finish_reason "length" after this many tokens (`max_new_tokens` is the same
    # field: see `MAX_TOKENS_ALIAS`).
    max_tokens: int = DEFAULT_MAX_TOKENS

    # Choosing a token.  `temperature` 0 (or below 1e-5) means greedy (argmax); otherwise the
    # logits are divided by it.  `top_k` keeps only the k most likely tokens (0 or -1: no limit;
    # -1 is vLLM's word for it, kept as 0); `top_p` the smallest set of tokens whose probability
    # reaches it (1: no limit).  `min_p`, further down, filters too.
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    # The request's own random stream; None: derived from the run's seed and the request's index.
    seed: int | None = None

    # Stopping.  `stop` holds stop strings (the text is cut just before the first one);
    # `stop_token_ids` the token ids that end the request (finish_reason "stop"); `ignore_eos`
    # keeps going past the end-of-text token.
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    # Penalties.  `repetition_penalty` (> 0) divides a seen token's logit (prompt or output) by
    # it if positive, multiplies it if not; `presence_penalty` is subtracted from the logit of
    # every token the output holds, `frequency_penalty` once per time the output holds it.
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # Keep the tokens at least min_p x the most likely one's probability (0: off).
    min_p: float = 0.0
    # {token id: bias} as sorted pairs, added to the logits first.
    logit_bias: tuple[tuple[int, float], ...] = ()

    # Recording.  `logprobs` records each token's logprob (0), and the N most likely at each
    # step (N >= 1); `prompt_logprobs` (0) each prompt token's logprob given the tokens before
    # it.  None records nothing.  (vLLM's prompt_logprobs N >= 1, the top N at each prompt
    # position, is not offered.)
    logprobs: int | None = None
    prompt_logprobs: int | None = None

    # Independent samples of the prompt: sample k draws from its own stream (`sample_seed`).
    n: int = 1

    def __post_init__(self):
        # vLLM's "no top-k limit" is -1; minirt's is 0.
        if is_int(self.top_k) and self.top_k == -1:
            object.__setattr__(self, "top_k", 0)
        # A bare `stop` string, lists (from JSON) and None become tuples (hashable); validate
        # refuses anything else.
        if isinstance(self.stop, str):
            stop = (self.stop,)
        else:
            stop = self.stop
        for name, raw in (("stop", stop), ("stop_token_ids", self.stop_token_ids)):
            if isinstance(raw, (list, tuple, type(None))):
                value = tuple(raw or ())
            else:
                value = raw
            object.__setattr__(self, name, value)
        object.__setattr__(self, "logit_bias", bias_pairs(self.logit_bias))
        self.validate()

    def validate(self) -> None:
        """Refuse, in one line naming the field, the first value that cannot be used: how many
        and how chosen here, then how it stops (`validate_stopping`) and what changes or
        records its logits (`validate_logits`)."""
        if not is_int(self.n) or not 1 <= self.n <= MAX_SAMPLES:
            raise RequestError(f"n must be an integer from 1 to {MAX_SAMPLES}, got {self.n!r}")
        if not is_int(self.max_tokens) or self.max_tokens < 1:
            raise RequestError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not is_number(self.temperature) or self.temperature < 0:
            raise RequestError(
                f"temperature must be a number >= 0 (0 is greedy), got {self.temperature!r}"
            )
        if not is_int(self.top_k) or self.top_k < 0:
            raise RequestError(
                f"top_k must be an integer >= 0 (0 or -1 turns it off), got {self.top_k!r}"
            )
        if not is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (not is_int(self.seed) or self.seed < 0):
            raise RequestError(f"seed must be an integer >= 0, got {self.seed!r}")
        self.validate_stopping()
        self.validate_logits()

    def validate_stopping(self) -> None:
        """Stop strings, stop token ids, ignore_eos and prompt_logprobs."""
        if not isinstance(self.stop, tuple) or not all(isinstance(s, str) and s for s in self.stop):
            if isinstance(self.stop, tuple):
                shown = list(self.stop)
            else:
                shown = self.stop
            raise RequestError(f"stop must be a list of non-empty strings, got {shown!r}")
        token_ids_ok = isinstance(self.stop_token_ids, tuple) and all(
            is_int(t) and t >= 0 for t in self.stop_token_ids
        )
        if not token_ids_ok:
            raise RequestError(
                f"stop_token_ids must be a list of token ids, got {self.stop_token_ids!r}"
            )
        if not isinstance(self.ignore_eos, bool):
            raise RequestError(f"ignore_eos must be true or false, got {self.ignore_eos!r}")
        if self.prompt_logprobs is not None and not (
            is_int(self.prompt_logprobs) and self.prompt_logprobs == 0
        ):
            raise RequestError(
                "prompt_logprobs must be 0 (each prompt token's logprob) or None/null (none), "
                f"got {self.prompt_logprobs!r}"
            )

    def validate_logits(self) -> None:
        """The penalties, min_p, logprobs and logit_bias.  Each value is bounded so that no step
        of the arithmetic in the sampler can overflow: the logits stay finite, and a token is
        never drawn from non-finite probabilities."""
        low_repetition = 1 / MAX_REPETITION_PENALTY
        repetition_ok = is_number(self.repetition_penalty) and (
            low_repetition <= self.repetition_penalty <= MAX_REPETITION_PENALTY
        )
        if not repetition_ok:
            raise RequestError(
                f"repetition_penalty must be a number from {low_repetition:g} to "
                f"{MAX_REPETITION_PENALTY:g} (1 turns it off), got {self.repetition_penalty!r}"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if (
                not is_number(value)
                or not -MAX_PRESENCE_OR_FREQUENCY <= value <= MAX_PRESENCE_OR_FREQUENCY
            ):
                raise RequestError(
                    f"{name} must be a number from {-MAX_PRESENCE_OR_FREQUENCY:g} to "
                    f"{MAX_PRESENCE_OR_FREQUENCY:g} (0 turns it off), got {value!r}"
                )
        if not is_number(self.min_p) or not 0 <= self.min_p <= 1:
            raise RequestError(f"min_p must be in [0, 1] (0 turns it off), got {self.min_p!r}")
        if self.logprobs is not None and (
            not is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_TOP_LOGPROBS
        ):
            raise RequestError(
                f"logprobs must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {self.logprobs!r}"
            )
        self.validate_logit_bias()

    def validate_logit_bias(self) -> None:
        """logit_bias: token ids (>= 0) to numbers in [-100, 100]."""
        pairs_ok = isinstance(self.logit_bias, tuple) and all(
            isinstance(pair, tuple) and is_int(pair[0]) and pair[0] >= 0 and is_number(pair[1])
            for pair in self.logit_bias
        )
        if not pairs_ok:
            raise RequestError(
                f"logit_bias must map token ids to numbers from {-MAX_LOGIT_BIAS:g} to "
                f"{MAX_LOGIT_BIAS:g}, got {self.logit_bias!r}"
            )
        # "38" and "038" (or 38 twice in pairs) name one token: adding the two biases would pass
        # the range, and keeping one would pick; refused.
        # In one pass (a set), never a count per token: a server checks this on its event loop.
        seen: set[int] = set()
        for token, _ in self.logit_bias:
            if token in seen:
                raise RequestError(
                    f"logit_bias names token {token} twice; give each token one bias"
                )
            seen.add(token)
        for token, bias in self.logit_bias:
            if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
                raise RequestError(
                    f"logit_bias for token {token} must be from {-MAX_LOGIT_BIAS:g} to "
                    f"{MAX_LOGIT_BIAS:g} (OpenAI's range: 100 all but forces a token, -100 all "
                    f"but bans it), got {bias!r}"
                )

    def updated(self, **overrides) -> SamplingParams:
        """A copy with some fields replaced (validated again); `max_new_tokens` replaces
        max_tokens."""
        current = {name: getattr(self, name) for name in FIELD_NAMES}
        if MAX_TOKENS_ALIAS in overrides:
            # Given to the constructor as it was written, so that a refusal names it.
            check_one_max_tokens(overrides)
            del current["max_tokens"]
        unknown = set(overrides) - set(FIELD_NAMES) - {MAX_TOKENS_ALIAS}
        if unknown:
            noun = "field" if len(unknown) == 1 else "fields"
            raise RequestError(
                f"unknown sampling {noun} {', '.join(sorted(unknown))}; "
                f"known: {', '.join(FIELD_NAMES)}"
            )
        return SamplingParams(**{**current, **overrides})

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

    @property
    def max_new_tokens(self) -> int:
        """max_tokens, by its other name (Hugging Face's)."""
        return self.max_tokens


def taking_max_new_tokens(made_init):
    """The dataclass's own __init__, taking `max_new_tokens` too, as the same field as
    max_tokens: given alone it sets it; given beside a max_tokens of another value (or type), one
    of the two would be silently dropped, so that is refused.  None means not given.  Kept out
    of the fields, so that `dataclasses.replace` and equality see max_tokens alone."""

    @functools.wraps(made_init)
    def __init__(self, *args, max_new_tokens=None, **kwargs):
        if max_new_tokens is not None:
            refuse_bad_max_new_tokens(max_new_tokens)
            if args:
                given = args[0]
                args = (max_new_tokens, *args[1:])
            else:
                given = kwargs.get("max_tokens")
                kwargs["max_tokens"] = max_new_tokens
            if given is not None and not (is_int(given) and given == max_new_tokens):
                raise RequestError(
                    f"max_tokens ({given!r}) and max_new_tokens ({max_new_tokens!r}) name one "
                    "field; give one of them"
                )
        made_init(self, *args, **kwargs)

    return __init__


setattr(  # noqa: B010 (after the dataclass wrote it: see taking_max_new_tokens)
    SamplingParams, "__init__", taking_max_new_tokens(SamplingParams.__init__)
)

# What a JSONL line or a flag may set (and max_new_tokens, the same field as max_tokens).
FIELD_NAMES = tuple(f.name for f in fields(SamplingParams))


def refuse_bad_max_new_tokens(value) -> None:
    """Refuse, in the name its caller wrote, a max_new_tokens that max_tokens would refuse."""
    if not is_int(value) or value < 1:
        raise RequestError(
            f"max_new_tokens (max_tokens by its other name) must be an integer >= 1, got {value!r}"
        )


def check_one_max_tokens(overrides: dict) -> None:
    """Refuse overrides whose max_new_tokens is bad (None too: given, it must say how many), or
    that give max_tokens and max_new_tokens (one field) different values."""
    alias_value = overrides[MAX_TOKENS_ALIAS]
    refuse_bad_max_new_tokens(alias_value)
    if "max_tokens" in overrides and overrides["max_tokens"] != alias_value:
        raise RequestError(
            f"max_tokens ({overrides['max_tokens']!r}) and max_new_tokens ({alias_value!r}) "
            "name one field; give one of them"
        )


def first_refused_field(base: SamplingParams, overrides: dict) -> tuple[str, str] | None:
    """(the first field of `overrides` that `base.updated` refuses on its own, the rule it breaks),
    or None when each passes alone.  The rule is the refusal without its ", got VALUE" end, which
    every message here has, so that a caller can show the value as its user wrote it: in JSON
    for a prompts-file line, in the flag's own words on a command line."""
    for name, value in overrides.items():
        try:
            base.updated(**{name: value})
        except RequestError as refusal:
            return name, str(refusal).partition(", got ")[0]
    return None


def bias_pairs(raw):
    """A logit_bias as sorted (token id, bias) pairs: from a dict (JSON's keys are strings of
    digits), pairs or None; anything else is left for `validate` to refuse."""
    if raw is None:
        return ()
    if isinstance(raw, dict):
        pairs_from_dict = []
        try:
            for key, bias in raw.items():
                # JSON's keys are strings: "50256", in ASCII digits alone (not " 5", "+5" or a
                # digit of another script); anything else stays a string, for validate to refuse.
                if isinstance(key, str) and key.isascii() and key.isdigit():
                    key = int(key)
                pairs_from_dict.append((key, bias))
        except ValueError:
            return raw
        raw = pairs_from_dict
    is_pairs = isinstance(raw, (list, tuple)) and all(
        isinstance(p, (list, tuple)) and len(p) == 2 for p in raw
    )
    if is_pairs:
        pairs = [tuple(p) for p in raw]
        try:
            return tuple(sorted(pairs))
        except TypeError:
            return tuple(pairs)
    return raw


def is_int(value) -> bool:
    """An integer (a NumPy one too), but not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def is_number(value) -> bool:
    """A finite real number (an int, a float or a NumPy number), but not a bool or a complex."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        return False
    # np.complex128 is an np.number too; float() of it would drop the imaginary part.
    if isinstance(value, np.complexfloating):
        return False
    try:
        return bool(np.isfinite(float(value)))
    except OverflowError:
        # An integer past float's range (10**400).
        return False
