"""A runner without a model: the engine's rounds with every number left out.

Owns: `ModelFreeRunner`, the `Runner` (minirt/engine/runner.py) that `minirt rounds` and the
Ray path's replay give the engine, so that they run the engine's own scheduler, KV owner and
loop over `step()` instead of copies of them.  Each round, every active row feeds its tokens
(nothing is computed: the KV owner's slots hold positions without numbers, `PositionsOnly`),
and each row whose prompt is then all in gets token 0.  A request ends by the engine's own stop
rules (max_tokens, the context), or as its `Ending` says: the replay of a request that
stopped after N tokens stops after N, and of one that failed after N tokens fails in the round
after its Nth, as the engine's own failure did.

Must not know: models, arrays, sampling, text or files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .kv_manager import PositionsOnly
from .request import Choice, Request, add_token, fail_request, finish, slot_of
from .scheduler import RoundPlan

# A context that never binds.
UNLIMITED = 10**12

# The message of a scripted failure (the replay knows only that one happened).
REPLAYED_FAILURE = "failed in this round"


@dataclass(frozen=True)
class Ending:
    """How a replayed request ends: after `tokens` tokens, stopped, or failed in the round
    after its last token."""

    tokens: int
    fails: bool = False


class ModelFreeRunner:
    """Rounds without a model.  `endings` says, for the requests it holds, how each ends (the
    others end by their own stop rules); `on_plan`, if given, sees each round's plan before the
    round (a test's window into the scheduler)."""

    # No token is end-of-text.
    eos_token_ids: tuple[int, ...] = ()
    # A position costs nothing: budgets are given in positions.
    kv_bytes_per_position = 1

    def __init__(
        self,
        n_positions: int = UNLIMITED,
        on_plan: Callable[[RoundPlan], None] | None = None,
    ):
        self.n_positions = n_positions
        self.on_plan = on_plan
        self.endings: dict[Request, Ending] = {}

    def new_kv_cache(self, rows: int, capacity: int) -> PositionsOnly:
        """Slots and their lengths, without numbers."""
        return PositionsOnly(rows, capacity)

    def score_prompt(self, request: Request) -> None:
        """Nothing to score without a model."""

    def forward(self, plan: RoundPlan, kv_cache: Any) -> tuple[list[Request], None]:
        """The round's rows in slot order, as the model runner gives them; no logits."""
        if self.on_plan is not None:
            self.on_plan(plan)
        return sorted(plan.active, key=slot_of), None

    def pick_tokens(self, active: list[Request], logits: None, round_number: int) -> list[Request]:
        """Each row whose prompt is in gets token 0; a row whose `Ending` is reached stops (or,
        one round later, fails).  Returns the requests that got a token."""
        got_token = []
        for request in active:
            if not request.prompt_done:
                continue
            ending = self.endings.get(request)
            if ending is not None and ending.fails and len(request.token_ids) == ending.tokens:
                fail_request(request, REPLAYED_FAILURE, round_number)
                continue
            add_token(request, Choice(0), round_number, self.eos_token_ids, self.n_positions)
            got_token.append(request)
            if ending is None or ending.fails or request.finished:
                continue
            if len(request.token_ids) == ending.tokens:
                finish(request, "stop", round_number)
        return got_token
