"""One completion's way through the engine's client, shared by every route that generates.

Owns: `CompletionFlow`, what `POST /v1/completions` and `POST /v1/chat/completions` do alike
once their choices are made: hand the completion over (minirt/server/handover.py) and wait for
the answer (`Accepted`, or `Refused` worded as a 400/503), watch for the client leaving (a
client gone, mid-stream or still queued, has its completion aborted, which frees its rows and
KV slots before the next round), collect every choice's final record for a whole answer, or
stream the events as server-sent events; `ChunkShape`, what a route gives the stream to word
its chunks in its own API's shape (minirt/server/responses.py for completions,
minirt/server/chat_responses.py for chat); and `choice_failure`, the error a failed or aborted
choice is answered with.

A stream whose choice fails ends with that choice's error event, then each choice still
running, aborted and told (so that none is left without a finish_reason or an error), then
[DONE]; a stream left early (the client went, or a choice failed) aborts the rest.

Must not know: the request bodies, what a chunk looks like, or the engine beyond its client's
events.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import AsyncIterator, Iterable, Protocol

from starlette.requests import Request
from starlette.responses import StreamingResponse

from ..engine.client import Accepted, Finished, Refused, Token
from .api_errors import APIError
from .handover import Completion, Handover, refusal_error
from .responses import DONE, sse

# How long a stream whose choice failed waits for its other choices' final records, once
# aborted (they come back from the engine's next iteration, at most a round away).
REST_OF_TIMEOUT_S = 30.0


class ChunkShape(Protocol):
    """How a route words its streamed chunks (each a JSON object; None: nothing to send)."""

    def opening(self) -> Iterable[dict]:
        """The chunks before any token (completions' echo, chat's assistant role)."""
        ...

    def token(self, event: Token) -> dict | None:
        """A token's chunk, or None when it shows nothing (its text held back)."""
        ...

    def finish(self, final: Finished) -> dict:
        """A choice's last chunk: the rest of its text and why it ended."""
        ...

    def usage(self, finals: list[Finished]) -> dict | None:
        """The usage chunk after every choice's finish, or None when it was not asked for."""
        ...


class CompletionFlow:
    """Completions handed to the engine's client, and their events turned into answers."""

    def __init__(self, handover: Handover):
        self.handover = handover

    async def start(self, request: Request, completion: Completion) -> asyncio.Task:
        """Hand the completion over and wait for its answer: refused, an APIError; accepted,
        the task that watches for its client leaving (cancel it once the answer is written)."""
        self.handover.submit(completion)
        answer = await completion.events.get()
        if isinstance(answer, Refused):
            raise refusal_error(answer.refusal)
        assert isinstance(answer, Accepted)
        return asyncio.create_task(self.watch_disconnect(request, completion.id))

    async def watch_disconnect(self, request: Request, completion_id: str) -> None:
        """Abort the completion once its client has gone (the body is read: the next message
        can only be the disconnect)."""
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                self.handover.abort(completion_id)
                return

    async def finals(self, completion: Completion, watcher: asyncio.Task) -> list[Finished]:
        """Every choice's final record, in choice order; a choice that failed makes the whole
        answer an error (500, or 503 when the server shut down before it finished)."""
        try:
            finals = await self.collect(completion)
        finally:
            watcher.cancel()
        for final in finals:
            if final.output.finish_reason in ("error", "abort"):
                raise choice_failure(final)
        return finals

    async def collect(self, completion: Completion) -> list[Finished]:
        """Every choice's final record, in choice order."""
        finals: dict[int, Finished] = {}
        while len(finals) < len(completion.choices):
            event = await completion.events.get()
            if isinstance(event, Finished):
                finals[event.choice] = event
        return [finals[k] for k in range(len(completion.choices))]

    def streamed(self, completion: Completion, shape: ChunkShape, watcher) -> StreamingResponse:
        """The completion as a response of server-sent events (`stream`)."""
        events = self.stream(completion, shape, watcher)
        # Nothing between here and the client may hold the events back.
        no_buffering = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(events, media_type="text/event-stream", headers=no_buffering)

    async def stream(self, completion: Completion, shape: ChunkShape, watcher):
        """The completion as server-sent events: the shape's opening, each token's chunk, each
        choice's finish, the usage when asked, then [DONE].  A choice that fails ends the stream
        with an error event; a client that leaves aborts it."""
        finals: dict[int, Finished] = {}
        try:
            for chunk in shape.opening():
                yield sse(chunk)
            while len(finals) < len(completion.choices):
                event = await completion.events.get()
                if isinstance(event, Token):
                    shown = shape.token(event)
                    if shown is not None:
                        yield sse(shown)
                    continue
                assert isinstance(event, Finished)
                finals[event.choice] = event
                if event.output.finish_reason in ("error", "abort"):
                    async for event_text in self.ended_by(event, completion, finals, shape):
                        yield event_text
                    return
                yield sse(shape.finish(event))
            usage = shape.usage([finals[k] for k in sorted(finals)])
            if usage is not None:
                yield sse(usage)
            yield DONE
        finally:
            watcher.cancel()
            if len(finals) < len(completion.choices):
                # Left early (the client went, or a choice failed): the rest stop too.
                self.handover.abort(completion.id)

    async def ended_by(
        self, failure: Finished, completion: Completion, finals: dict, shape: ChunkShape
    ) -> AsyncIterator[str]:
        """A stream's end when one of its choices failed (or was aborted): its error, then each
        choice still running, aborted and told (so that none is left without a finish_reason or
        an error), then [DONE]."""
        yield sse(choice_failure(failure).body())
        self.handover.abort(completion.id)
        async for final in self.rest_of(completion, finals, failure.choice):
            if final.output.finish_reason in ("error", "abort"):
                yield sse(choice_failure(final).body())
            else:
                yield sse(shape.finish(final))
        yield DONE

    async def rest_of(self, completion: Completion, finals: dict[int, Finished], failed: int):
        """The final record of each choice not yet final, once its completion is aborted (each
        comes back from the engine's next iteration); tokens still on their way are dropped.
        A choice aborted because another failed says so."""
        while len(finals) < len(completion.choices):
            try:
                event = await asyncio.wait_for(completion.events.get(), REST_OF_TIMEOUT_S)
            except TimeoutError:
                return
            if not isinstance(event, Finished):
                continue
            finals[event.choice] = event
            output = event.output
            if output.finish_reason == "abort" and output.error is None:
                message = f"stopped because choice {failed} of this completion failed"
                event = Finished(event.choice, replace(output, error=message), "", event.logprobs)
            yield event


def choice_failure(final: Finished) -> APIError:
    """The error a failed or aborted choice is answered with."""
    if final.output.finish_reason == "abort":
        message = final.output.error or "the completion was aborted"
        return APIError(503, f"choice {final.choice}: {message}", code="aborted")
    message = final.output.error or "it failed"
    return APIError(500, f"choice {final.choice} failed: {message}", code="request_failed")
