"""The HTTP API of `minirt serve`: routes, limits and errors, on Starlette.

Owns: `build_app`, the ASGI application, and `ServerSettings`, what it is configured with.

    POST /v1/completions       a completion (OpenAI's shape), whole or streamed (`stream`)
    POST /v1/chat/completions  a chat completion, whole or streamed (minirt/server/chat.py); 400
                               for a model with no chat template
    GET  /v1/models            the one model served
    GET  /health               200 while the server runs (never behind the API key)
    GET  /metrics              Prometheus metrics (minirt/server/metrics.py)
    POST /tokenize             text -> token ids (vLLM's shape)
    POST /detokenize           token ids -> text (vLLM's shape)
    GET  /, /rounds            the round-grid page, and its feeds under /rounds/ (rounds_page.py)

A completion's way: the body is read (at most `max_body_bytes`: 413 past it) and checked
(minirt/server/protocol.py: 400 naming the field), each prompt is turned into token ids and
its SamplingParams, its requests are made and handed to the engine's client
(minirt/server/handover.py, minirt/engine/client.py: the one interface the server has to the
engine), and the handler waits for the answer: `Accepted` (or `Refused`, a refusal value worded
as a 400/503 by handover.py), then the choice's tokens and final records, which it writes whole
or as server-sent events (minirt/server/responses.py).  A model check's refusal names its field
as a value (`FieldError.field`), never by its wording.  While it waits, a watcher listens for
the client leaving: a client gone, mid-stream or still queued, has its completion aborted, which
frees its rows and KV slots before the next round.  From the hand-over on, a chat completion
goes the same way: minirt/server/completion_flow.py is that way, for both routes.

Every error, ours or the framework's (an unknown path, a wrong method), is OpenAI's error
object; a fault of the server is a 500 with one line, its traceback in the server's log only.

Why Starlette and not FastAPI: each route reads its body itself, so that a body past the limit
is refused before it is parsed and a bad one is a 400 naming its field, not FastAPI's 422.  With
that, what FastAPI would add is routing and dependency injection, and Starlette (which FastAPI is
built on) routes just as well; pydantic still checks every body.

Must not know: how rounds are computed, the engine beyond its client (never `llm.engine`), or
how the process starts and stops (run.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import sys
import time
import traceback
import uuid
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..llm import LLM
from ..errors import InputError, RequestError
from .api_errors import APIError, error_body
from .bodies import read_body
from ..engine.client import EngineClient, Finished
from ..engine.request import TOO_MANY_CHOICES, Refusal
from .chat import ChatCompletions
from .completion_flow import CompletionFlow
from .handover import ChoiceSpec, Completion, Handover, refusal_error
from .http_rules import HostRule
from .metrics import ServerMetrics
from .origin import SameOriginGuard
from .round_feed import RoundFeed
from .rounds_page import RoundsPage
from .protocol import (
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    check_text,
    ItemLimits,
    parse_body,
    prompt_count,
    prompts_of,
    refuse_unsupported,
    sampling_fields,
    sampling_params,
)
from .responses import CompletionChunks, Logprobs, choice_body, completion_body, header

# A body larger than this is refused with 413 (`--max-body-bytes`).
DEFAULT_MAX_BODY_BYTES = 2 * 2**20


@dataclass(frozen=True)
class ServerSettings:
    """What the app serves, and its limits."""

    model_name: str
    model_path: str
    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # Listening on this machine's loopback alone: a Host that is not a loopback name is refused.
    loopback_only: bool = False


@dataclass
class Prompted:
    """The prompts of one completion, checked: per prompt its text and ids; all choices."""

    texts: list[str]
    ids: list[list[int]]
    choices: list[ChoiceSpec]


def build_app(
    llm: LLM,
    client: EngineClient,
    metrics: ServerMetrics,
    settings: ServerSettings,
    feed: RoundFeed,
):
    """The ASGI app: the routes, the API key's guard, and errors in OpenAI's shape.  `client`
    is the engine's (not started: the app's lifespan starts and stops it); `feed` the one its
    rounds are published to."""
    handover = Handover(client, llm.request_maker)
    api = CompletionsAPI(llm, client, handover, metrics, settings)
    chat = ChatCompletions(api)
    rounds = RoundsPage(llm, client, handover, feed, settings)
    routes = [
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/chat/completions", chat.create, methods=["POST"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/health", api.health, methods=["GET"]),
        Route("/metrics", api.metrics_text, methods=["GET"]),
        Route("/tokenize", api.tokenize, methods=["POST"]),
        Route("/detokenize", api.detokenize, methods=["POST"]),
        Route("/", rounds.page, methods=["GET"]),
        Route("/rounds", rounds.page, methods=["GET"]),
        Route("/rounds/events", rounds.events, methods=["GET"]),
        Route("/rounds/recent", rounds.recent, methods=["GET"]),
        Route("/rounds/exercise", rounds.exercise, methods=["POST"]),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app):
        client.start()
        try:
            yield
        finally:
            # Whatever is left is aborted and told so; then the thread ends.
            await asyncio.to_thread(client.stop)

    handlers = {
        APIError: api_error_response,
        HTTPException: http_error_response,
        Exception: server_error_response,
    }
    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan)
    guarded = SameOriginGuard(APIKeyGuard(app, settings.api_key), settings.loopback_only)
    return HostRule(guarded)


# Paths beyond /v1 that spend compute, and so need the key too.
GUARDED_PATHS = ("/rounds/exercise",)


class APIKeyGuard:
    """ASGI middleware: every /v1 path (and GUARDED_PATHS) needs `Authorization: Bearer KEY` when
    a key is set."""

    def __init__(self, app, api_key: str | None):
        self.app = app
        self.expected = None if api_key is None else f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        guarded = scope["type"] == "http" and (path.startswith("/v1") or path in GUARDED_PATHS)
        if self.expected is not None and guarded:
            given = dict(scope["headers"]).get(b"authorization", b"")
            # In constant time: a key is not guessed a character at a time.
            if not hmac.compare_digest(given, self.expected):
                message = "a missing or wrong API key: send Authorization: Bearer KEY"
                response = JSONResponse(error_body(401, message), status_code=401)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def api_error_response(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return JSONResponse(exc.body(), status_code=exc.status)


async def http_error_response(request: Request, exc: Exception) -> Response:
    """The framework's own refusals (no such path, a wrong method) in OpenAI's shape."""
    assert isinstance(exc, HTTPException)
    path = request.url.path
    if exc.status_code == 404:
        message = f"no route {path}: see GET /v1/models, POST /v1/completions"
    elif exc.status_code == 405:
        message = f"{request.method} is not allowed on {path}"
    else:
        message = str(exc.detail)
    return JSONResponse(
        error_body(exc.status_code, message), status_code=exc.status_code, headers=exc.headers
    )


async def server_error_response(request: Request, exc: Exception) -> Response:
    """A fault of the server: one line for the client, the traceback for the log."""
    traceback.print_exception(exc, file=sys.stderr)
    message = f"the server failed on this request ({type(exc).__name__}); see its log"
    return JSONResponse(error_body(500, message), status_code=500)


class CompletionsAPI:
    """The routes' handlers, sharing the engine's client (and the hand-over to it), the metrics
    and the settings."""

    def __init__(
        self,
        llm: LLM,
        client: EngineClient,
        handover: Handover,
        metrics,
        settings: ServerSettings,
    ):
        self.llm = llm
        self.client = client
        self.handover = handover
        self.metrics = metrics
        self.settings = settings
        self.created = int(time.time())
        # The way every completion goes once its choices are made (chat's too).
        self.flow = CompletionFlow(handover)

    async def body_of(self, request: Request, model_class):
        raw = await read_body(request, self.settings.max_body_bytes)
        limits = ItemLimits(self.client.max_queue, self.llm.model.config.n_positions)
        body = parse_body(raw, model_class, limits)
        self.check_model(body.model)
        return body

    def check_model(self, name: str | None) -> None:
        """A body's `model` names the model served (or is left out)."""
        if name is not None and name != self.settings.model_name:
            message = (
                f"the model {name!r} does not exist here; this server serves "
                f"{self.settings.model_name!r} (GET /v1/models)"
            )
            raise APIError(404, message, param="model", code="model_not_found")

    # ------------------------------------------------------------------ completions

    async def completions(self, request: Request) -> Response:
        received = time.perf_counter()
        body = await self.body_of(request, CompletionRequest)
        assert isinstance(body, CompletionRequest)
        refuse_unsupported(body)
        # Counted before any prompt is tokenized: a body of 100,000 prompts is refused by its size.
        self.refuse_too_many_choices(prompt_count(body) * body.n)
        if body.stream and body.echo and body.logprobs is not None:
            message = "echo with logprobs is not streamed; ask for it with stream: false"
            raise APIError(400, message, param="echo")
        # Encoding is work that grows with the prompts: off the event loop (the tokenizer lets
        # go of Python's lock), which meanwhile answers everyone else.
        prompted = await asyncio.to_thread(self.prompted, body)
        completion_id = f"cmpl-{uuid.uuid4().hex}"
        completion = Completion(completion_id, prompted.choices, received)
        watcher = await self.flow.start(request, completion)
        head = header(completion_id, int(time.time()), self.settings.model_name)
        if body.stream:
            options = body.stream_options
            shape = CompletionChunks(
                head,
                prompted.texts,
                [len(ids) for ids in prompted.ids],
                body.n,
                body.echo,
                self.stream_logprobs(body, prompted, len(completion.choices)),
                include_usage=options is not None and options.include_usage,
            )
            return self.flow.streamed(completion, shape, watcher)
        finals = await self.flow.finals(completion, watcher)
        # Off the event loop: a reply of 128 choices with their logprobs takes a second to build.
        return await asyncio.to_thread(self.whole, finals, body, prompted, head)

    def refuse_too_many_choices(self, choices: int) -> None:
        """A completion of more choices than the queue could ever hold, refused at once."""
        if choices > self.client.max_queue:
            refusal = Refusal(TOO_MANY_CHOICES, "n", needed=choices, limit=self.client.max_queue)
            raise refusal_error(refusal)

    def prompted(self, body: CompletionRequest) -> Prompted:
        """Each prompt's ids and SamplingParams, checked against the model; n choices each."""
        prompts = prompts_of(body)
        n_positions = self.llm.model.config.n_positions
        prompted = Prompted(texts=[], ids=[], choices=[])
        for number, prompt in enumerate(prompts):
            if len(prompts) > 1:
                where = f"prompt {number}: "
            else:
                where = ""
            try:
                ids = self.llm.prompt_ids(prompt)
            except (RequestError, InputError) as exc:
                raise APIError(400, f"{where}{exc}", param="prompt") from None
            params = sampling_params(sampling_fields(body, len(ids), n_positions))
            try:
                self.llm.check_params(params)
            except (RequestError, InputError) as exc:
                raise APIError(400, str(exc), param=exc.field) from None
            prompted.texts.append(self.prompt_text(prompt))
            prompted.ids.append(ids)
            for sample in range(body.n):
                prompted.choices.append(ChoiceSpec(tuple(ids), params, sample))
        return prompted

    def prompt_text(self, prompt) -> str:
        """The prompt as text (for echo): as given, or its ids decoded."""
        if isinstance(prompt, str):
            return prompt
        tokenizer = self.llm.tokenizer
        if tokenizer is None:
            return ""
        return tokenizer.decode(prompt)

    def whole(self, finals: list[Finished], body, prompted: Prompted, head: dict) -> Response:
        """The whole completion, of its choices' final records (none failed)."""
        choices = []
        for final in finals:
            prompt = final.choice // body.n
            text = prompted.texts[prompt]
            ids = prompted.ids[prompt]
            choices.append(choice_body(final, text, ids, body.echo, self.llm.tokenizer))
        lengths = [len(ids) for ids in prompted.ids]
        return JSONResponse(completion_body(head, choices, lengths, finals))

    def stream_logprobs(self, body, prompted: Prompted, n_choices: int) -> list:
        """Each choice's logprobs builder, or None each when logprobs were not asked for."""
        tokenizer = self.llm.tokenizer
        if body.logprobs is None:
            return [None] * n_choices
        builders = []
        for choice in range(n_choices):
            prompt = choice // body.n
            start = len(prompted.texts[prompt]) if body.echo else 0
            # Its decoder starts from the prompt's last ids, as the choice's text does.
            builders.append(Logprobs(tokenizer, start, prompted.ids[prompt]))
        return builders

    # ------------------------------------------------------------------ the rest

    async def models(self, request: Request) -> Response:
        card = {
            "id": self.settings.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "minirt",
            "root": self.settings.model_path,
            "parent": None,
            "max_model_len": self.llm.model.config.n_positions,
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def health(self, request: Request) -> Response:
        """200 while the engine's thread runs (it never should stop while the server does)."""
        if not self.client.is_alive():
            message = "the engine's thread has stopped"
            return JSONResponse(error_body(503, message), status_code=503)
        return Response(status_code=200)

    async def metrics_text(self, request: Request) -> Response:
        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    async def tokenize(self, request: Request) -> Response:
        body = await self.body_of(request, TokenizeRequest)
        assert isinstance(body, TokenizeRequest)
        tokenizer = self.require_tokenizer()
        check_text(body.prompt, "prompt")
        try:
            # A text no encoding could fit in the context is refused by its length, as a
            # completion's is; the rest is encoded off the event loop.
            self.llm.request_maker.refuse_too_long_to_encode(body.prompt)
            tokens = await asyncio.to_thread(tokenizer.encode, body.prompt)
        except RequestError as exc:
            raise APIError(400, str(exc), param="prompt") from None
        n_positions = self.llm.model.config.n_positions
        return JSONResponse({"count": len(tokens), "max_model_len": n_positions, "tokens": tokens})

    async def detokenize(self, request: Request) -> Response:
        body = await self.body_of(request, DetokenizeRequest)
        assert isinstance(body, DetokenizeRequest)
        tokenizer = self.require_tokenizer()
        vocab_size = self.llm.model.config.vocab_size
        for token in body.tokens:
            if not 0 <= token < vocab_size:
                message = f"token id {token} is outside the vocabulary [0, {vocab_size})"
                raise APIError(400, message, param="tokens")
        # Off the event loop: the work grows with the ids (as many as the context).
        text = await asyncio.to_thread(tokenizer.decode, body.tokens)
        return JSONResponse({"prompt": text})

    def require_tokenizer(self):
        if self.llm.tokenizer is None:
            raise APIError(400, "this model has no tokenizer; send token ids")
        return self.llm.tokenizer
