"""The server's side of the hand-over to the engine's client: completions in, events back.

Owns: `Completion` (one HTTP completion: its choices, each a prompt's token ids, its
SamplingParams and its sample number, and the asyncio queue its events come back on), `Handover`
(which makes each completion's requests, numbered across the server's life, and hands them to
the engine's client, minirt/engine/client.py, as one `Submission`), and `refusal_error`: a
refusal of the engine's (a `Refusal` value: its kind, field and numbers) worded in the client's
terms (max_tokens, --max-round-tokens, --max-queue), with its HTTP status and param.

How an event comes back: the client calls the submission's callback on the engine's thread; the
callback (`Completion.deliver`) hands it to the completion's asyncio.Queue with
`loop.call_soon_threadsafe(queue.put_nowait, event)`, the one asyncio method made to be called
from another thread, so that the queue is only ever touched by the event loop that owns it.  A
closed event loop (nobody is left to read) is not an error.

Requests are made here, on the event loop's thread, before the hand-over (RequestMaker.make:
an unseeded request's random stream comes from its number); after it, only the engine's thread
touches them.

    refusal                    status  param       message
    kv_budget                  400     max_tokens  needs N KV cache positions, over the budget
                                                   of B; lower max_tokens or raise the KV budget
    round_tokens               400     prompt      its prompt of N tokens exceeds the round
                                                   token budget of B; ... (the server's
                                                   --max-round-tokens)
    too_many_choices           400     n           this completion asks for N choices ...
    queue_full                 503     -           the queue is full (W requests wait, ...)
    shutting_down              503     -           the server is shutting down; ...
    fault                      500     -           the server failed to queue it (...)

Must not know: how rounds are computed, the engine itself, or the web framework.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ..engine.client import EngineClient, Event, Submission
from ..engine.params import SamplingParams
from ..engine.request import (
    KV_BUDGET,
    QUEUE_FULL,
    ROUND_TOKENS,
    SHUTTING_DOWN,
    TOO_MANY_CHOICES,
    Refusal,
)
from ..request_maker import RequestMaker
from .api_errors import APIError
from .protocol import too_many_choices


@dataclass(frozen=True)
class ChoiceSpec:
    """One choice of a completion: what the model is fed first, and how it samples."""

    prompt_ids: tuple[int, ...]
    params: SamplingParams
    sample: int


class Completion:
    """One HTTP completion: its choices, and the queue its events come back on (read by the
    handler, on the event loop's thread)."""

    def __init__(self, completion_id: str, choices: list[ChoiceSpec], received_s: float):
        self.id = completion_id
        self.choices = choices
        # When the handler had its body: queue time and time to first token count from here.
        self.received_s = received_s
        self.loop = asyncio.get_running_loop()
        self.events: asyncio.Queue = asyncio.Queue()

    def deliver(self, event: Event) -> None:
        """From the engine's thread: hand an event to this completion's queue, on its event
        loop's thread."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:
            # The event loop has closed: nobody is left to read it.
            pass


class Handover:
    """Makes the completions' requests and hands them to the engine's client."""

    def __init__(self, client: EngineClient, request_maker: RequestMaker):
        self.client = client
        self.request_maker = request_maker
        # Requests are numbered across the server's life: an unseeded one draws its own stream.
        self.requests_made = 0

    def submit(self, *completions: Completion) -> None:
        """Queue these completions in one step, in this order: each is accepted, or each is
        refused (the answer comes back as each completion's first event)."""
        self.client.add(*(self.submission(completion) for completion in completions))

    def submission(self, completion: Completion) -> Submission:
        requests = []
        for spec in completion.choices:
            self.requests_made += 1
            request = self.request_maker.make(
                self.requests_made,
                list(spec.prompt_ids),
                spec.params,
                request_id=completion.id,
                sample=spec.sample,
            )
            requests.append(request)
        return Submission(completion.id, tuple(requests), completion.received_s, completion.deliver)

    def abort(self, completion_id: str) -> None:
        self.client.abort(completion_id)


def refusal_error(refusal: Refusal) -> APIError:
    """A refusal in the client's words, with its status and the field it names."""
    if refusal.kind == KV_BUDGET:
        message = (
            f"needs {refusal.needed} KV cache positions, over the budget of {refusal.limit}; "
            "lower max_tokens or raise the KV budget"
        )
        return APIError(400, message, param="max_tokens")
    if refusal.kind == ROUND_TOKENS:
        message = (
            f"its prompt of {refusal.needed} tokens exceeds the round token budget of "
            f"{refusal.limit}; raise the budget, or let its prefill be chunked (the server's "
            "--max-round-tokens)"
        )
        return APIError(400, message, param="prompt")
    if refusal.kind == TOO_MANY_CHOICES:
        return too_many_choices(refusal.needed, refusal.limit)
    if refusal.kind == QUEUE_FULL:
        message = (
            f"the queue is full ({refusal.waiting} requests wait, {refusal.limit} at most: "
            "--max-queue); retry later"
        )
        return APIError(503, message)
    if refusal.kind == SHUTTING_DOWN:
        return APIError(503, "the server is shutting down; send it to another server")
    return APIError(500, f"the server failed to queue it ({refusal.detail})")
