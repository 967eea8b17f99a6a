"""The rounds the engine runs, handed to whoever watches them: the round-grid page's feed.

Owns: `RoundFeed`, the last RECENT_ROUNDS round records (minirt/engine/round_record.py) and the
watchers of `GET /rounds/events`, and `round_json`, a record as the page reads it.

How a record crosses from the engine's thread to a watcher, and why it is safe:

    publish    the engine's thread, after each round, appends the record (frozen, plain values)
               to `recent` and, only if someone watches, turns it into one server-sent event
               once (its JSON and framing, shared by every watcher) and hands it to the
               watchers' event loop with one `loop.call_soon_threadsafe` for them all, as the
               completions' tokens are handed over (minirt/server/handover.py).  With nobody
               watching, a round costs one deque append; with many, one encoding.
    subscribe  a handler, on the event loop's thread, adds its watcher and copies `recent`
               under the same lock that `publish` holds while it appends, so that a new watcher
               gets every round exactly once: those before it in the backlog, those after it
               through its queue.

At most MAX_WATCHERS watch at once (`subscribe` refuses the next with `TooManyWatchers`): each
costs the event loop a write per round.  A watcher that falls SUBSCRIBER_BACKLOG rounds behind
(a page in a background tab, a stalled client) is dropped rather than let its queue grow: it
gives up its place at the next round, its stream ends once its stalled write does, and the
page's EventSource reconnects and starts again from the backlog.  On
shutdown `close` ends every stream, so that an open page never holds up the server's exit.

Must not know: the web framework, the routes, or how rounds are computed.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque

from ..engine.round_record import RoundRecord
from .responses import sse

# Rounds `GET /rounds/recent` and a new watcher's backlog may hold.
RECENT_ROUNDS = 512

# Rounds a watcher may fall behind before it is dropped.
SUBSCRIBER_BACKLOG = 2048

# Pages that may watch the rounds at once.
MAX_WATCHERS = 32

# What a watcher's queue holds last, when its stream must end.
END = None


class Watcher:
    """One open `GET /rounds/events` stream: its event loop and its queue of rounds."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.dropped = False

    def offer(self, event: str | None) -> None:
        """On the event loop's thread: queue an event, or drop a watcher that is too far behind."""
        if self.dropped:
            return
        if event is not END and self.queue.qsize() >= SUBSCRIBER_BACKLOG:
            self.dropped = True
            event = END
        self.queue.put_nowait(event)


class RoundFeed:
    """The last rounds, and the watchers who hear of each new one."""

    def __init__(self, keep: int = RECENT_ROUNDS):
        # (when it was published, unix seconds; the record), oldest first.
        self.recent: deque[tuple[float, RoundRecord]] = deque(maxlen=keep)
        self.watchers: list[Watcher] = []
        self.lock = threading.Lock()
        self.closed = False

    def publish(self, record: RoundRecord) -> None:
        """From the engine's thread: a round has run."""
        published = time.time()
        with self.lock:
            self.recent.append((published, record))
            # A watcher dropped for falling behind leaves its place at once, though its stream
            # ends only when its stalled write does: it is sent nothing more.
            self.watchers = [watcher for watcher in self.watchers if not watcher.dropped]
            watchers = list(self.watchers)
        if not watchers:
            return
        # Encoded once, for every watcher.
        hand_over(watchers, sse(round_json(published, record)))

    def subscribe(self) -> tuple[Watcher, list[dict]]:
        """On the event loop: a new watcher, and the rounds before it (oldest first); a
        `TooManyWatchers` when MAX_WATCHERS already watch."""
        watcher = Watcher(asyncio.get_running_loop())
        with self.lock:
            backlog = list(self.recent)
            if self.closed:
                watcher.offer(END)
            elif len(self.watchers) >= MAX_WATCHERS:
                raise TooManyWatchers(len(self.watchers))
            else:
                self.watchers.append(watcher)
        return watcher, [round_json(published, record) for published, record in backlog]

    def unsubscribe(self, watcher: Watcher) -> None:
        with self.lock:
            if watcher in self.watchers:
                self.watchers.remove(watcher)

    def last(self, count: int) -> list[dict]:
        """The last `count` rounds, oldest first."""
        with self.lock:
            chosen = list(self.recent)[-count:] if count > 0 else []
        return [round_json(published, record) for published, record in chosen]

    def close(self) -> None:
        """The server is stopping: every stream ends, and no new one starts."""
        with self.lock:
            self.closed = True
            watchers = list(self.watchers)
            self.watchers.clear()
        hand_over(watchers, END)


class TooManyWatchers(Exception):
    """MAX_WATCHERS pages watch already."""


def hand_over(watchers: list[Watcher], event: str | None) -> None:
    """Queue an event for these watchers, each on its event loop's thread: one call to each
    loop for all its watchers (a server has one)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[Watcher]] = {}
    for watcher in watchers:
        by_loop.setdefault(watcher.loop, []).append(watcher)
    for loop, its_watchers in by_loop.items():
        try:
            loop.call_soon_threadsafe(offer_each, its_watchers, event)
        except RuntimeError:
            # Its event loop has closed: nobody is left to read it.
            pass


def offer_each(watchers: list[Watcher], event: str | None) -> None:
    for watcher in watchers:
        watcher.offer(event)


def round_json(published: float, record: RoundRecord) -> dict:
    """A round as the page reads it: request ids are the completions' ids, as clients got them."""
    cells = [
        {"row": cell.row, "request": cell.request_id, "sample": cell.sample, "state": cell.state}
        for cell in record.cells
    ]
    waiting = [
        {"request": w.request_id, "sample": w.sample, "waited": w.rounds_waited}
        for w in record.waiting
    ]
    finished = [
        {
            "request": note.request_id,
            "sample": note.sample,
            "tokens": note.tokens,
            "finish_reason": note.finish_reason,
            "rounds_waited": note.rounds_waited,
            "ttft_s": note.first_token_seconds,
        }
        for note in record.finished
    ]
    return {
        "type": "round",
        "run": record.run,
        "round": record.round_number,
        "ran_round": record.ran_round,
        "time": published,
        "seconds": record.seconds,
        "rows": record.rows,
        "cells": cells,
        "waiting": waiting,
        "waiting_count": record.waiting_count,
        "kv": {
            "allocated": record.kv_positions_allocated,
            "budget": record.kv_positions_budget,
        },
        "finished": finished,
    }
