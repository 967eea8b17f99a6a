"""The engine's refusals in the client's words (minirt/server/handover.py `refusal_error`): each
kind's status, param and message, held byte for byte to what the server answered before refusals
were values (the reference below is the old server's wording: the engine's English rewritten)."""

from __future__ import annotations

import pytest
from serving import serve_tests

from minirt.engine.request import (
    FAULT,
    KV_BUDGET,
    QUEUE_FULL,
    REFUSAL_KINDS,
    ROUND_TOKENS,
    SHUTTING_DOWN,
    TOO_MANY_CHOICES,
    Refusal,
)

pytestmark = serve_tests


def old_budget_refusal(reason: str) -> tuple[int, str, str]:
    """How the server worded a budget refusal when the engine gave it as English."""
    if "round token budget" in reason:
        return 400, f"{reason} (the server's --max-round-tokens)", "prompt"
    return 400, reason.replace("max_new_tokens", "max_tokens"), "max_tokens"


EXPECTED = {
    KV_BUDGET: old_budget_refusal(
        "needs 14 KV cache positions, over the budget of 4; lower max_tokens or raise the KV budget"
    ),
    ROUND_TOKENS: old_budget_refusal(
        "its prompt of 14 tokens exceeds the round token budget of 4; raise the budget, or let "
        "its prefill be chunked"
    ),
    TOO_MANY_CHOICES: (
        400,
        "this completion asks for 14 choices (prompts x n), more than the 4 the server queues "
        "(--max-queue); send fewer at a time",
        "n",
    ),
    QUEUE_FULL: (
        503,
        "the queue is full (3 requests wait, 4 at most: --max-queue); retry later",
        None,
    ),
    SHUTTING_DOWN: (503, "the server is shutting down; send it to another server", None),
    FAULT: (500, "the server failed to queue it (KeyError: 'x')", None),
}


@pytest.mark.parametrize("kind", REFUSAL_KINDS)
def test_each_refusal_is_worded_as_the_server_always_answered_it(kind):
    from minirt.server.handover import refusal_error

    refusal = Refusal(kind, None, needed=14, limit=4, waiting=3, detail="KeyError: 'x'")
    error = refusal_error(refusal)
    assert (error.status, error.message, error.param) == EXPECTED[kind]
    # The default code, as before: the status.
    assert error.body()["error"]["code"] == error.status
