"""What a client may send, checked: the request bodies of the HTTP API, as pydantic models.

Owns: `CompletionRequest` (the body of `POST /v1/completions`, OpenAI's fields and vLLM's extras),
`ChatCompletionRequest` (the body of `POST /v1/chat/completions`: its messages are checked as
the template sees them, minirt/chat_template.py), `TokenizeRequest`, `DetokenizeRequest` and
`ExerciseRequest` (the round-grid page's exercise);
`parse_body`, which turns raw bytes into one of them or an `APIError` naming the field;
`prompts_of`, the prompts a completion asks for; and
`sampling_params`, a prompt's `SamplingParams` from the body (`sampling_fields`, or
`chat_sampling_fields`), with OpenAI's defaults where it is silent and every refusal naming its
field as the API spells it.

Types are strict: "5" is not 5, and true is not 1.  A field minirt does not know, or knows but
does not support (`suffix`, `best_of` > 1, `min_tokens` > 0), is a 400 naming it, never ignored.

Must not know: the web framework, the engine's thread, or how responses are written.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from ..engine.params import DEFAULT_MAX_TOKENS, FIELD_NAMES, SamplingParams, first_refused_field
from ..errors import RequestError
from .api_errors import APIError

# OpenAI's bounds, tighter than minirt's own.
MAX_N = 128
MAX_LOGPROBS = 20
# Stop sequences (OpenAI: "up to 4").
MAX_STOP = 4
# logit_bias entries (OpenAI refuses more than 300).
MAX_LOGIT_BIAS_ENTRIES = 300

# minirt's own, where OpenAI sets none.  Each is paid for on the engine's one thread, every round
# the request runs, so each is bounded: a stop string is searched for in each new piece of text
# (and a stream holds back its length - 1 characters); a stop token id is looked up for each new
# token.
MAX_STOP_CHARS = 1000
MAX_STOP_TOKEN_IDS = 300

# OpenAI's defaults where a body is silent, which are SamplingParams' (vLLM's): 16 tokens,
# temperature 1.  (vLLM's server fills them from the model's generation_config.json instead;
# docs/api.md, "Defaults", says why minirt's does not.)
DEFAULT_TEMPERATURE = SamplingParams().temperature

# A SamplingParams field whose name the API spells otherwise.
API_NAMES = {"prompt_logprobs": "echo"}

# The fields that hold objects of their own fields, which an error names by their dotted path.
NESTED_BODIES = ("stream_options",)

# A lone surrogate can come only from a JSON escape \ud800-\udfff (the body's own bytes are UTF-8,
# which cannot hold one): a body without such an escape is text throughout, and is not walked.
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")

PROMPT_SHAPES = "a string, a list of strings, a list of token ids, or a list of token-id lists"


class Strict(BaseModel):
    """No unknown field, and no conversion between types."""

    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(Strict):
    include_usage: bool = False


@dataclass(frozen=True)
class ItemLimits:
    """What a body's lists may hold, known to the server: the prompts it queues (--max-queue),
    and the model's context in token ids."""

    most_prompts: int
    most_ids: int


class Body(Strict):
    """A request body: each names the model it is for (or leaves it out)."""

    model: str | None = None

    @classmethod
    def refuse_by_count(cls, body: dict, limits: ItemLimits) -> None:
        """Refuse a body whose lists are longer than their bounds, from their lengths alone,
        before any item of them is checked (a body's kind adds its own)."""


class CompletionRequest(Body):
    """`POST /v1/completions`: OpenAI's fields, then vLLM's extras (None: the default)."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = DEFAULT_MAX_TOKENS
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: int | None = None
    echo: bool = False
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # Known, and refused unless they ask for nothing.
    suffix: str | None = None
    best_of: int | None = None
    # vLLM's extras.
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0

    @classmethod
    def refuse_by_count(cls, body: dict, limits: ItemLimits) -> None:
        """The bounds a field's length alone breaks, counted on the parsed JSON before pydantic
        looks at one item (its work grows with them: half a million prompts took it half a
        second, on the event loop).  A field of the wrong type is left to pydantic."""
        refuse_long_lists(body)
        prompt = body.get("prompt")
        if not isinstance(prompt, list) or not prompt:
            return
        if isinstance(prompt[0], (list, str)):
            # A list of prompts: each is a choice at least (n more).
            if len(prompt) > limits.most_prompts:
                raise too_many_choices(len(prompt), limits.most_prompts)
            id_lists = [item for item in prompt if isinstance(item, list)]
        else:
            id_lists = [prompt]
        for ids in id_lists:
            if len(ids) > limits.most_ids:
                raise APIError(400, prompt_too_long(len(ids), limits.most_ids), "prompt")


class ChatCompletionRequest(Body):
    """`POST /v1/chat/completions`: OpenAI's fields, then vLLM's extras (None: the default).
    Its messages are checked as the template sees them (minirt/chat_template.py), where each
    error names the message and field."""

    messages: list[Any]
    # OpenAI's chat sets no default: as many as the context holds.
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # vLLM's extras.
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None

    @classmethod
    def refuse_by_count(cls, body: dict, limits: ItemLimits) -> None:
        refuse_long_lists(body)


def refuse_long_lists(body: dict) -> None:
    """The bounds of a generating body's lists (stop, logit_bias, stop_token_ids), counted on
    the parsed JSON before pydantic looks at one item."""
    stop = body.get("stop")
    if isinstance(stop, list):
        refuse_too_many_stops(len(stop))
    logit_bias = body.get("logit_bias")
    if isinstance(logit_bias, dict):
        refuse_too_many_biases(len(logit_bias))
    stop_token_ids = body.get("stop_token_ids")
    if isinstance(stop_token_ids, list):
        refuse_too_many_stop_ids(len(stop_token_ids))


class TokenizeRequest(Body):
    """`POST /tokenize` (vLLM's shape)."""

    prompt: str
    add_special_tokens: bool = True


class DetokenizeRequest(Body):
    """`POST /detokenize` (vLLM's shape): at most the context's ids."""

    tokens: list[int]

    @classmethod
    def refuse_by_count(cls, body: dict, limits: ItemLimits) -> None:
        tokens = body.get("tokens")
        if isinstance(tokens, list) and len(tokens) > limits.most_ids:
            message = (
                f"tokens holds {len(tokens)} ids, more than the model's context of "
                f"{limits.most_ids}; detokenize at most that many at a time"
            )
            raise APIError(400, message, "tokens")


class ExerciseRequest(Body):
    """`POST /rounds/exercise`: the output lengths of requests that arrive in one instant."""

    lengths: list[int]


def parse_body(raw: bytes, model_class: type[Body], limits: ItemLimits | None = None) -> Body:
    """The body as `model_class`, or a 400 saying what is wrong and naming the field.  With
    `limits`, a list longer than its bound is refused by its length, before its items are
    checked."""
    if not raw.strip():
        raise APIError(400, "the request has no body: send a JSON object")
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        if "integer string conversion" in str(exc):
            # Python's own guard against quadratic int parsing, not the client's concern.
            raise APIError(400, "the body holds an integer of more than 4300 digits") from None
        raise APIError(400, f"the body is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(body, dict):
        raise APIError(400, f"the body must be a JSON object, got {type(body).__name__}")
    if SURROGATE_ESCAPE.search(raw):
        refuse_non_text(body)
    if limits is not None:
        model_class.refuse_by_count(body, limits)
    try:
        return model_class.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None


def refuse_non_text(body: dict) -> None:
    """Every string in the body, the names of its fields too, must be text: JSON's escapes can
    write a lone surrogate ("\\ud800"), which is not.  One pass over the body, with no recursion
    (a deeply nested body costs no stack).  The refusal names the field where it is: its dotted
    path (`stream_options.include_usage`), list places left out of the param and kept in the
    message (`stop[1]`); a field name that is not text is shown in JSON's escapes."""
    pending: list[tuple[object, str, str]] = [(body, "", "")]
    while pending:
        value, param, where = pending.pop()
        if isinstance(value, str):
            if not is_text(value):
                message = f"{where} holds a lone surrogate, which is not text"
                raise APIError(400, message, param or None)
        elif isinstance(value, dict):
            for key, inner in value.items():
                name = key if is_text(key) else json.dumps(key)
                if not is_text(key) and param and param.split(".")[0] not in NESTED_BODIES:
                    # A key of a map of values (logit_bias): the map's field is the param.
                    message = f"{where} has a key {name} that holds a lone surrogate, not text"
                    raise APIError(400, message, param)
                if not is_text(key):
                    message = f"the field name {name} holds a lone surrogate, which is not text"
                    raise APIError(400, message, f"{param}.{name}" if param else name)
                pending.append(
                    (inner, f"{param}.{key}" if param else key, f"{where}.{key}" if where else key)
                )
        elif isinstance(value, list):
            for place, inner in enumerate(value):
                pending.append((inner, param, f"{where}[{place}]"))


def is_text(value: str) -> bool:
    """Whether a string is Unicode text (no lone surrogate)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def validation_error(exc: ValidationError) -> APIError:
    """pydantic's first complaint, as one line naming the field (its dotted path when nested)."""
    first = exc.errors()[0]
    location = [str(part) for part in first["loc"]]
    field = location[0] if location else None
    if first["type"] == "extra_forbidden":
        # Nested (stream_options.extra): the whole path, which is the field refused.
        path = ".".join(part for part in location if not part.isdigit())
        return APIError(400, f"unknown field {path!r}: minirt does not take it", param=path)
    if first["type"] == "missing":
        return APIError(400, f"{field} is required", param=field)
    if field == "prompt":
        return APIError(400, f"prompt must be {PROMPT_SHAPES}", param="prompt")
    where = ".".join(location)
    if field in NESTED_BODIES and len(location) > 1:
        # A field of a nested object: stream_options.include_usage.
        field = f"{field}.{location[1]}"
    return APIError(400, f"{where}: {first['msg']}", param=field)


def check_text(text: str, field: str) -> None:
    """A JSON string may hold a lone surrogate ("\ud800"), which is no Unicode text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise APIError(400, f"{field} holds a lone surrogate, which is not text", field) from None


def prompts_of(body: CompletionRequest) -> list:
    """The prompts the body asks for: each a string or a list of token ids (an empty list of
    ids, like an empty string, starts from the beginning-of-text token, as offline)."""
    prompt = body.prompt
    if isinstance(prompt, str):
        check_text(prompt, "prompt")
        return [prompt]
    if not prompt:
        raise APIError(400, f"prompt is an empty list; give {PROMPT_SHAPES}", param="prompt")
    # A list of ids is one prompt.
    if isinstance(prompt[0], int):
        return [list(prompt)]
    for text in prompt:
        if isinstance(text, str):
            check_text(text, "prompt")
    return list(prompt)


def refuse_unsupported(body: CompletionRequest) -> None:
    """Fields minirt knows but cannot honour, and bounds that are OpenAI's rather than minirt's."""
    if body.suffix is not None:
        raise APIError(400, "suffix is not supported: GPT-2 does not fill in the middle", "suffix")
    if body.best_of is not None and body.best_of != 1:
        message = f"best_of must be 1 or left out (no best-of search here), got {body.best_of}"
        raise APIError(400, message + "; for more samples ask for n", "best_of")
    if body.logprobs is not None and not 0 <= body.logprobs <= MAX_LOGPROBS:
        message = f"logprobs must be from 0 to {MAX_LOGPROBS}, got {body.logprobs}"
        raise APIError(400, message, "logprobs")
    refuse_unsupported_alike(body)


def refuse_unsupported_chat(body: ChatCompletionRequest) -> None:
    """A chat body's fields minirt cannot honour, and OpenAI's bounds."""
    if body.top_logprobs is not None and not 0 <= body.top_logprobs <= MAX_LOGPROBS:
        message = f"top_logprobs must be from 0 to {MAX_LOGPROBS}, got {body.top_logprobs}"
        raise APIError(400, message, "top_logprobs")
    if body.top_logprobs is not None and not body.logprobs:
        message = "top_logprobs needs logprobs: true (OpenAI's rule)"
        raise APIError(400, message, "top_logprobs")
    refuse_unsupported_alike(body)


def refuse_unsupported_alike(body: CompletionRequest | ChatCompletionRequest) -> None:
    """What completions and chat refuse alike: min_tokens, n out of OpenAI's bounds,
    stream_options without a stream, and the bounds of a field's size."""
    if body.min_tokens != 0:
        raise APIError(400, "min_tokens is not supported; use ignore_eos", "min_tokens")
    if not 1 <= body.n <= MAX_N:
        raise APIError(400, f"n must be from 1 to {MAX_N}, got {body.n}", "n")
    if body.stream_options is not None and not body.stream:
        raise APIError(400, "stream_options is only allowed with stream: true", "stream_options")
    refuse_oversized(body)


def refuse_oversized(body: CompletionRequest | ChatCompletionRequest) -> None:
    """The bounds that a field's size alone breaks, checked by counting, before any work per item
    (each of these is paid for every round, on the engine's thread).  parse_body counts the lists
    before pydantic does; this holds for a body made otherwise too."""
    stops = [body.stop] if isinstance(body.stop, str) else body.stop or []
    refuse_too_many_stops(len(stops))
    for stop in stops:
        if len(stop) > MAX_STOP_CHARS:
            message = (
                f"each stop sequence may be at most {MAX_STOP_CHARS} characters, got one of "
                f"{len(stop)}"
            )
            raise APIError(400, message, "stop")
    if body.logit_bias is not None:
        refuse_too_many_biases(len(body.logit_bias))
    if body.stop_token_ids is not None:
        refuse_too_many_stop_ids(len(body.stop_token_ids))


def refuse_too_many_stops(count: int) -> None:
    if count > MAX_STOP:
        message = f"stop may hold at most {MAX_STOP} sequences (OpenAI's bound), got {count}"
        raise APIError(400, message, "stop")


def refuse_too_many_biases(count: int) -> None:
    if count > MAX_LOGIT_BIAS_ENTRIES:
        message = (
            f"logit_bias may hold at most {MAX_LOGIT_BIAS_ENTRIES} entries (OpenAI's bound), got "
            f"{count}"
        )
        raise APIError(400, message, "logit_bias")


def refuse_too_many_stop_ids(count: int) -> None:
    if count > MAX_STOP_TOKEN_IDS:
        message = f"stop_token_ids may hold at most {MAX_STOP_TOKEN_IDS} ids, got {count}"
        raise APIError(400, message, "stop_token_ids")


def too_many_choices(needed: int, limit: int) -> APIError:
    """A completion of more choices (prompts x n) than the queue could ever hold."""
    message = (
        f"this completion asks for {needed} choices (prompts x n), more than the "
        f"{limit} the server queues (--max-queue); send fewer at a time"
    )
    return APIError(400, message, param="n")


def prompt_too_long(tokens: int, context: int) -> str:
    return f"the prompt has {tokens} tokens, more than the model's context of {context}; shorten it"


def prompt_count(body: CompletionRequest) -> int:
    """How many prompts the body asks for, counted without looking into any (a list of ids is
    one prompt)."""
    prompt = body.prompt
    if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int):
        return 1
    return len(prompt)


def sampling_fields(body: CompletionRequest, prompt_len: int, n_positions: int) -> dict:
    """The body's settings in SamplingParams' names, OpenAI's defaults where it is silent."""
    max_tokens = checked_max_tokens(body.max_tokens, "max_tokens", prompt_len, n_positions)
    # echo with logprobs: the prompt's tokens get theirs too.
    prompt_logprobs = 0 if body.echo and body.logprobs is not None else None
    return shared_fields(body, max_tokens, body.logprobs, prompt_logprobs)


def chat_sampling_fields(body: ChatCompletionRequest, prompt_len: int, n_positions: int) -> dict:
    """A chat body's settings in SamplingParams' names (`chat_api_names` says how the API spells
    them): max_completion_tokens, else max_tokens; top_logprobs alternatives with logprobs."""
    if body.max_completion_tokens is not None:
        asked = checked_max_tokens(
            body.max_completion_tokens, "max_completion_tokens", prompt_len, n_positions
        )
    else:
        asked = checked_max_tokens(body.max_tokens, "max_tokens", prompt_len, n_positions)
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    return shared_fields(body, asked, logprobs, None)


def chat_api_names(body: ChatCompletionRequest) -> dict[str, str]:
    """The chat API's names of SamplingParams' fields, for its refusals."""
    if body.max_completion_tokens is not None:
        return {"max_tokens": "max_completion_tokens", "logprobs": "top_logprobs"}
    return {"logprobs": "top_logprobs"}


def checked_max_tokens(max_tokens: int | None, name: str, prompt_len: int, n_positions: int):
    """The tokens to generate: `max_tokens` (the API's `name`), or as many as the context
    allows when None; more than the context holds beside the prompt is refused."""
    if max_tokens is None:
        # As long as the context allows.
        return max(1, n_positions - prompt_len)
    if max_tokens >= 1 and prompt_len + max_tokens > n_positions:
        # vLLM's answer too: a request that cannot be served as asked is refused, not cut.
        message = (
            f"this model's context is {n_positions} tokens, and this asks for "
            f"{prompt_len} of prompt and {max_tokens} new; lower {name} to at most "
            f"{max(0, n_positions - prompt_len)}, or send null for as many as the context "
            "holds"
        )
        raise APIError(400, message, name)
    return max_tokens


def shared_fields(body, max_tokens: int, logprobs: int | None, prompt_logprobs) -> dict:
    """The settings completions and chat spell alike, OpenAI's defaults where it is silent."""
    fields = {
        "max_tokens": max_tokens,
        "temperature": DEFAULT_TEMPERATURE if body.temperature is None else body.temperature,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        # vLLM's -1 turns top_k off, as minirt's 0 does.
        "top_k": 0 if body.top_k in (None, -1) else body.top_k,
        "min_p": 0.0 if body.min_p is None else body.min_p,
        "seed": body.seed,
        "stop": body.stop,
        "stop_token_ids": body.stop_token_ids,
        "ignore_eos": body.ignore_eos,
        "presence_penalty": body.presence_penalty or 0.0,
        "frequency_penalty": body.frequency_penalty or 0.0,
        "repetition_penalty": 1.0 if body.repetition_penalty is None else body.repetition_penalty,
        "logit_bias": body.logit_bias,
        "logprobs": logprobs,
        "prompt_logprobs": prompt_logprobs,
        "n": body.n,
    }
    assert set(fields) <= set(FIELD_NAMES)
    return fields


def sampling_params(fields: dict, api_names: dict[str, str] | None = None) -> SamplingParams:
    """SamplingParams of these fields; a refusal names the field as the API spells it
    (`api_names`: a route's own spellings, default completions')."""
    names = API_NAMES if api_names is None else api_names
    refused = first_refused_field(SamplingParams(), fields)
    if refused is not None:
        name, rule = refused
        api_name = names.get(name, name)
        shown = json.dumps(fields[name])
        message = f"{rule.replace(name, api_name, 1)}, got {shown}"
        raise APIError(400, message, param=api_name)
    try:
        return SamplingParams(**fields)
    except RequestError as exc:
        # Refusals of two fields together (none today): the field that opens the message.
        named = str(exc).split(" ")[0]
        param = names.get(named, named if named in fields else None)
        raise APIError(400, str(exc), param=param) from None
