"""What one round did, as plain values: the record a round grid is drawn from.

Owns: `RoundRecord` (one round: its number within its run, each KV row and the request that
held it, active or held, the waiting queue, the KV cache in use, who finished) and
`record_round`, which the engine calls once a round has picked its tokens, before the
scheduler frees any row (and for a step that ran no round but reported aborts, so that whoever
draws the grid hears that they ended).  A record holds copies (strings, ints, floats,
tuples), never a `Request`, so that another thread may read it while the engine runs the next
round.

A row of the KV cache is in one of four states in a round:

    active   the request that holds it produced a token this round
    prefill  the request that holds it was fed a chunk of its prompt that did not end it, so
             it produced no token (continuous batching with chunked prefill)
    held     its request has finished (or was aborted), but its static group still runs, so
             the row and its KV slot stay reserved until the group ends
    free     no request holds it (a row is listed only when a request holds it)

Rows, waiters and notes are named tuples, the cheapest objects with names: a round makes dozens.
The records are the engine's own truth: the rows are the KV slots the round's batch used, and
the rounds are the engine's round numbers.  Building one costs a few tuples per row and per
waiting request (at most WAITING_SHOWN of those), nothing next to the round's GEMMs.

Must not know: HTTP, JSON, pages, or how records are shown.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import NamedTuple, Sequence

from .request import Request

# A record names at most this many waiting requests, the first in the queue; it counts them all.
WAITING_SHOWN = 16


class RowCell(NamedTuple):
    """One KV row in one round: the request holding it, and whether it ran."""

    row: int
    request_id: str
    sample: int  # which of its completion's samples (n > 1 gives several rows one id)
    state: str  # "active", "prefill" or "held"


class Waiter(NamedTuple):
    """A request still in the queue after this round was planned."""

    request_id: str
    sample: int
    rounds_waited: int  # rounds run since it arrived, this one included


class FinishedNote(NamedTuple):
    """A request whose record became final in this round (or was aborted just before it)."""

    request_id: str
    sample: int
    tokens: int
    finish_reason: str
    rounds_waited: int | None  # None: it never ran
    first_token_seconds: float | None  # from its arrival; None: it got no token


@dataclass(frozen=True)
class RoundRecord:
    """One round of one run, as the engine ran it."""

    run: int  # the engine's runs are numbered from 1; round numbers start again in each
    round_number: int  # with ran_round False: the last round that ran
    # False for a step that ran no round but reported aborts: only `finished` and the queue
    # are news.
    ran_round: bool
    seconds: float  # since the run started, when the round ended
    rows: int  # rows (KV slots) of the cache this round used
    cells: tuple[RowCell, ...]  # each row a request held, in row order
    waiting: tuple[Waiter, ...]  # the first WAITING_SHOWN waiting, in queue order
    waiting_count: int
    kv_positions_allocated: int  # rows x positions per row of the round's cache
    kv_positions_budget: int
    finished: tuple[FinishedNote, ...]


def record_round(
    run: int,
    round_number: int,
    ran_round: bool,
    seconds: float,
    rows: int,
    positions_per_row: int,
    kv_budget_positions: int,
    holding: Sequence[Request],
    active: Sequence[Request],
    waiting: Sequence[Request],
    finished: Sequence[Request],
) -> RoundRecord:
    """The record of a round.  `holding`: every request whose slot the round's cache held
    (a static group's members, or the continuous pool's running requests); `active`: those
    that ran; `waiting`: the queue after the plan; `finished`: those final since the last step."""
    ran = set(map(id, active))
    cells = []
    for request in holding:
        assert request.slot is not None  # a request holds a row once it is admitted
        if id(request) in ran and not request.prompt_done:
            state = "prefill"
        elif id(request) in ran:
            state = "active"
        else:
            state = "held"
        cells.append(RowCell(request.slot, request.id, request.sample, state))
    cells.sort(key=lambda cell: cell.row)
    waiters = []
    for request in itertools.islice(waiting, WAITING_SHOWN):
        waited = round_number - request.arrival_round
        waiters.append(Waiter(request.id, request.sample, waited))
    notes = tuple(finished_note(request) for request in finished)
    return RoundRecord(
        run=run,
        round_number=round_number,
        ran_round=ran_round,
        seconds=seconds,
        rows=rows,
        cells=tuple(cells),
        waiting=tuple(waiters),
        waiting_count=len(waiting),
        kv_positions_allocated=rows * positions_per_row,
        kv_positions_budget=kv_budget_positions,
        finished=notes,
    )


def finished_note(request: Request) -> FinishedNote:
    """What a grid says of a finished request: its tokens, why it ended, how long it waited."""
    if request.first_token_s is not None and request.arrival_s is not None:
        first_token_seconds = request.first_token_s - request.arrival_s
    else:
        first_token_seconds = None
    return FinishedNote(
        request_id=request.id,
        sample=request.sample,
        tokens=len(request.token_ids),
        finish_reason=request.finish_reason or "error",
        rounds_waited=request.rounds_waited,
        first_token_seconds=first_token_seconds,
    )
