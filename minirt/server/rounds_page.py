"""The round-grid page of `minirt serve`: batching, watched live.

Owns the routes of the page and its feed:

    GET  /  and  /rounds    the page (minirt/server/static/rounds.html: one file, its script
                            and styles inside, nothing fetched from elsewhere)
    GET  /rounds/events     server-sent events: first a "hello" (the server's policy, batch
                            size, KV budget and knobs, and the rounds run before it, up to
                            RECENT_ROUNDS), then one "round" event per round the engine runs
    GET  /rounds/recent     the last K rounds as JSON (?rounds=K, default DEFAULT_RECENT)
    POST /rounds/exercise   {"lengths": [2, 5, 8, 4]}: one greedy completion per length, each of
                            exactly that many tokens (ignore_eos) from the empty prompt, queued in
                            one step and in that order, so that they arrive in the same instant
                            as in the offline lesson; answers with their completion ids

Each round event is the engine's own record (minirt/engine/round_record.py, turned into JSON by
minirt/server/round_feed.py): the page draws rounds and rows as the engine ran them.  The page
and its feeds are open like /metrics (they show ids and counts, never text); the exercise
spends compute, so with --api-key it needs the key, like every /v1 path.

Must not know: how rounds are computed, the engine beyond its client (never `llm.engine`), or
how the process starts and stops.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from importlib import resources

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse

from ..llm import LLM
from ..engine.params import SamplingParams
from .api_errors import APIError
from .bodies import exceeds, read_body
from ..engine.client import EngineClient, Refused
from .handover import ChoiceSpec, Completion, Handover, refusal_error
from .protocol import ExerciseRequest, parse_body
from .responses import sse
from .round_feed import END, MAX_WATCHERS, RECENT_ROUNDS, RoundFeed, TooManyWatchers

# Rounds `GET /rounds/recent` gives when not told how many.
DEFAULT_RECENT = 64

# An idle feed writes a comment this often (a server-sent event's comment: the page ignores it).
HEARTBEAT_S = 15.0
# The page's headers that keep every other site from showing it in a frame.
NOT_IN_A_FRAME = {"X-Frame-Options": "DENY", "Content-Security-Policy": "frame-ancestors 'none'"}
HEARTBEAT = ": heartbeat\n\n"

# The exercise: at most this many requests, each of at most this many tokens.
MAX_EXERCISE_REQUESTS = 16
MAX_EXERCISE_LENGTH = 256


def page_html() -> str:
    """The page, as shipped inside the package."""
    return resources.files("minirt.server").joinpath("static/rounds.html").read_text("utf-8")


class RoundsPage:
    """The page's handlers, sharing the engine's client (and the hand-over to it), its feed and
    the server's facts."""

    def __init__(
        self, llm: LLM, client: EngineClient, handover: Handover, feed: RoundFeed, settings
    ):
        self.llm = llm
        self.client = client
        self.handover = handover
        self.feed = feed
        self.settings = settings
        self.html = page_html()

    def server_facts(self) -> dict:
        """What the page says beside the grid, and how many lines it draws: the engine's fixed
        settings, from its client's snapshot."""
        engine = self.client.snapshot()
        return {
            "model": self.settings.model_name,
            "policy": engine.policy,
            "batch_size": engine.batch_size,
            "kv_budget_positions": engine.kv_budget_positions,
            "context_length": engine.context_length,
            "max_round_tokens": engine.round_token_budget,
            "chunked_prefill": engine.chunked_prefill,
            "prefix_cache": engine.prefix_cache,
            "round_delay_ms": round(1000 * self.client.round_delay_s, 3),
            "batch_window_ms": round(1000 * self.client.batch_window_s, 3),
            "api_key_required": self.settings.api_key is not None,
        }

    async def page(self, request: Request) -> Response:
        # Never inside another site's frame: a click there would be this page's own, and pass
        # the Origin check (clickjacking).
        return HTMLResponse(self.html, headers=NOT_IN_A_FRAME)

    async def recent(self, request: Request) -> Response:
        text = request.query_params.get("rounds", str(DEFAULT_RECENT))
        # ASCII digits only: str.isdigit() also takes '²', which int() refuses.
        digits = text.isascii() and text.isdigit()
        # Compared by its digits first: one of thousands is out of range, not a fault.
        if not digits or exceeds(text, RECENT_ROUNDS) or int(text.lstrip("0") or "0") < 1:
            shown = text if len(text) <= 20 else f"{text[:20]}... ({len(text)} characters)"
            message = f"rounds must be an integer from 1 to {RECENT_ROUNDS}, got {shown!r}"
            raise APIError(400, message, param="rounds")
        rounds = self.feed.last(int(text.lstrip("0")))
        return JSONResponse({"server": self.server_facts(), "rounds": rounds})

    async def events(self, request: Request) -> Response:
        no_buffering = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        if request.method == "HEAD":
            # The headers alone, and the answer ends: a stream that never ends would hold the
            # connection, and every request after it on that connection would wait for ever.
            return Response(media_type="text/event-stream", headers=no_buffering)
        try:
            watcher, backlog = self.feed.subscribe()
        except TooManyWatchers:
            message = (
                f"{MAX_WATCHERS} pages watch the rounds already, the most at once; retry later"
            )
            raise APIError(503, message) from None
        hello = {"type": "hello", "server": self.server_facts(), "rounds": backlog}

        async def stream():
            try:
                yield sse(hello)
                while True:
                    try:
                        event = await asyncio.wait_for(watcher.queue.get(), HEARTBEAT_S)
                    except TimeoutError:
                        # An idle server still writes now and then: a proxy keeps the stream
                        # open, and a page that went away is found (the write fails) and let go.
                        yield HEARTBEAT
                        continue
                    if event is END:
                        return
                    # Already a server-sent event: encoded once, for every watcher.
                    yield event
            finally:
                self.feed.unsubscribe(watcher)

        return StreamingResponse(stream(), media_type="text/event-stream", headers=no_buffering)

    async def exercise(self, request: Request) -> Response:
        received = time.perf_counter()
        raw = await read_body(request, self.settings.max_body_bytes)
        body = parse_body(raw, ExerciseRequest)
        assert isinstance(body, ExerciseRequest)
        lengths = self.checked_lengths(body.lengths)
        # The empty prompt: the beginning-of-text token alone, as in `minirt rounds`' lesson.
        prompt_ids = tuple(self.llm.prompt_ids([]))
        completions = []
        for length in lengths:
            params = SamplingParams(max_tokens=length, ignore_eos=True)
            choice = ChoiceSpec(prompt_ids, params, sample=0)
            completions.append(Completion(f"cmpl-{uuid.uuid4().hex}", [choice], received))
        self.handover.submit(*completions)
        answers = await asyncio.gather(*(c.events.get() for c in completions))
        for answer in answers:
            if isinstance(answer, Refused):
                raise refusal_error(answer.refusal)
        ids = [completion.id for completion in completions]
        engine = self.client.snapshot()
        facts = {"policy": engine.policy, "batch_size": engine.batch_size}
        return JSONResponse({"ids": ids, "lengths": lengths, **facts})

    def checked_lengths(self, lengths: list[int]) -> list[int]:
        """1 to MAX_EXERCISE_REQUESTS lengths (at most --max-queue), each a number of tokens the
        model can make."""
        most = min(MAX_EXERCISE_REQUESTS, self.client.max_queue)
        if not 1 <= len(lengths) <= most:
            message = f"lengths must hold 1 to {most} output lengths, got {len(lengths)}"
            if most < MAX_EXERCISE_REQUESTS:
                message += " (the server queues at most --max-queue requests)"
            raise APIError(400, message, param="lengths")
        # The prompt takes one position of the model's context.
        longest = min(MAX_EXERCISE_LENGTH, self.llm.model.config.n_positions - 1)
        for length in lengths:
            if not 1 <= length <= longest:
                message = f"every length must be from 1 to {longest} tokens, got {length}"
                raise APIError(400, message, param="lengths")
        return lengths
