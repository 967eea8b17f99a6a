"""The ingress's side of `minirt serve --replicas N`: the engine client's interface, over replicas.

Owns: `ReplicaClient`, which the one-process server's app takes in place of an `EngineClient`
(minirt/engine/client.py: `start`, `add`, `abort`, `begin_shutdown`, `stop`, `is_alive`,
`snapshot`, `max_queue`, `round_delay_s`, `batch_window_s`), so that the routes, bodies, errors,
key, limits, streaming and metrics are the one-process server's own code.  Each `add` becomes one
call of the replicas' streaming `serve_order` through a Ray Serve handle (its request router
picks the replica: power of two choices, or minirt/distributed/prefix_router.py); a `Relay`
task hands each event it yields to its submission's callback, as the engine's thread would.

    abort            the relay's stream is cancelled (the replica aborts the requests, and
                     frees their rows before its next round); each choice still open is told
                     `Finished` with finish_reason "abort" here, as the engine would tell it
    a replica dies   its streams raise: each choice still open ends with an error that says so
                     (a stream gets an error event and [DONE], a whole answer a 500), counted
                     here as finished with an error (the replica never will); a submission
                     never accepted is refused (500).  Requests on the other replicas are
                     untouched; Ray Serve starts a new replica
    a full fleet     with every replica's rows and queue taken, a submission is refused here
                     as the engine refuses one past --max-queue (503), rather than waiting
                     unbounded in Ray Serve's router
    shutdown         `begin_shutdown` accepts no more (503) and lets what runs finish within
                     the grace period; past it, every relay is cancelled and its choices told
                     that the shutdown cut them off.  The command then shuts Ray Serve down
    metrics          a thread reads the board (minirt/distributed/engine_replica.py) and replays
                     each replica's observer calls to this client's observer (the server's
                     metrics), then tells it the fleet's sums and each live replica's snapshot

Must not know: HTTP, the web framework, the response shapes, or the layers.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace

import ray

from ..engine.client import (
    SHUTDOWN_ABORT,
    Accepted,
    EngineObserver,
    EngineSnapshot,
    Event,
    Finished,
    Refused,
    Submission,
    finished_event,
    nothing,
)
from ..engine.prefix_cache import prompt_block_keys
from ..engine.request import (
    FAULT,
    QUEUE_FULL,
    SHUTTING_DOWN,
    Refusal,
    abort_request,
    fail_request,
)
from .engine_replica import REPLICA_SILENT_S, REPORT_EVERY_S, Order, OrderedSubmission, Report

# An order whose call failed before any event came back is sent this many times in all.
SEND_ATTEMPTS = 2

# How often the shutdown's deadline is looked at.
DEADLINE_CHECK_S = 0.1

# The snapshot's counts, summed over the live replicas.  (The counters of /metrics are not
# read from here: they are the replicas' observer calls, replayed, so a replica that is gone
# keeps its counts there.)
SUMMED = (
    "running",
    "waiting",
    "kv_positions_reserved",
    "kv_budget_positions",
    "kv_slots_used",
    "prefix_cache_positions",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "rounds",
)


def replica_lost(exc: BaseException) -> str:
    """A choice's error when its replica failed under it."""
    what = (str(exc).splitlines() or [type(exc).__name__])[0][:160]
    return f"the replica serving it stopped ({type(exc).__name__}: {what}); retry it"


class Relay:
    """One `serve_order` call: its submissions, each one's choices still open, and its stream."""

    def __init__(self, submissions: tuple[Submission, ...]):
        self.submissions = submissions
        self.accepted = [False] * len(submissions)
        self.open = [set(range(len(s.requests))) for s in submissions]
        self.task: asyncio.Task | None = None
        # Whether a replica has answered (accepted or refused) any of it.
        self.answered = False
        # Why the ingress cancelled it (None: it was not).
        self.cancelled_because: str | None = None

    def hand_on(self, index: int, event: Event) -> None:
        """An event from the replica, to its submission's callback."""
        submission = self.submissions[index]
        self.answered = True
        if isinstance(event, Accepted):
            self.accepted[index] = True
        elif isinstance(event, Refused):
            self.open[index].clear()
        elif isinstance(event, Finished):
            self.open[index].discard(event.choice)
        submission.on_event(event)

    def close_open(self, error: str | None, observer: EngineObserver) -> None:
        """Tell each choice still open its end here: aborted (`error` None, or the shutdown's
        message: the replica aborts it too, and counts it), or failed with `error` (its replica
        is gone or broke off, so `observer` hears it finish here); a submission not yet
        accepted is refused."""
        for index, submission in enumerate(self.submissions):
            if not self.open[index]:
                continue
            if not self.accepted[index]:
                detail = error or "aborted before a replica took it"
                self.hand_on(index, Refused(Refusal(FAULT, detail=detail)))
                continue
            for choice in sorted(self.open[index]):
                # The ingress's own request: a copy went to the replica, this one ran nowhere.
                request = submission.requests[choice]
                if error is None or error == SHUTDOWN_ABORT:
                    abort_request(request)
                    request.error = error
                    self.hand_on(index, finished_event(request, choice))
                    continue
                fail_request(request, error)
                final = finished_event(request, choice)
                observer.finished(final.output, time.perf_counter() - submission.received_s)
                self.hand_on(index, final)

    def requests_open(self) -> int:
        """Its requests not yet finished (all of a submission not yet answered)."""
        return sum(len(still_open) for still_open in self.open)


class ReplicaClient:
    """The engine client's interface, served by Ray Serve replicas of the engine."""

    def __init__(
        self,
        handle,
        board,
        max_queue: int,
        first_snapshot: EngineSnapshot,
        replicas: int,
        observer: EngineObserver | None = None,
        on_shutdown: Callable[[], None] = nothing,
        round_delay_s: float = 0.0,
        batch_window_s: float = 0.0,
    ):
        self.handle = handle.options(stream=True)
        self.board = board
        self.max_queue = max_queue
        # What the fleet holds at once: every replica's rows, and every replica's queue.
        self.fleet_rows = replicas * first_snapshot.batch_size
        self.fleet_queue = replicas * max_queue
        self.observer = observer if observer is not None else EngineObserver()
        self.on_shutdown = on_shutdown
        self.round_delay_s = round_delay_s
        self.batch_window_s = batch_window_s
        self.relays: dict[str, Relay] = {}
        self.accepting = True
        self.deadline: float | None = None
        self.stopped = threading.Event()
        self.empty = replace(first_snapshot, prefix_cache_queries=0, prefix_cache_hits=0, rounds=0)
        self.latest = self.empty
        # Each live replica's latest snapshot, and its process id.
        self.replicas: dict[str, EngineSnapshot] = {}
        self.pids: dict[str, int] = {}
        self.reader = threading.Thread(target=self.read_board, name="minirt-board", daemon=True)
        self.watchdog: asyncio.Task | None = None

    # ------------------------------------------------------------------ the server's calls

    def start(self) -> None:
        """Start reading the board, and (on the event loop) watching the shutdown's deadline."""
        # Once now, so that the replicas are known (and /health is 200) from the first request.
        self.read_once()
        self.reader.start()
        self.watchdog = asyncio.get_running_loop().create_task(self.watch_deadline())

    def add(self, *submissions: Submission) -> None:
        """Send these submissions to one replica in one order (all or none, as one process);
        refused at once while shutting down or with the fleet full.  Called on the event loop."""
        refusal = self.fleet_refusal(submissions)
        if refusal is not None:
            for submission in submissions:
                submission.on_event(Refused(refusal))
            return
        relay = Relay(submissions)
        sent_at = time.time()
        ordered = tuple(
            OrderedSubmission(s.id, s.requests, time.perf_counter() - s.received_s, sent_at)
            for s in submissions
        )
        first_prompt = submissions[0].requests[0].prompt_ids if submissions[0].requests else []
        order = Order(ordered, prompt_block_keys(first_prompt))
        for submission in submissions:
            self.relays[submission.id] = relay
        relay.task = asyncio.get_running_loop().create_task(self.run_relay(relay, order))

    def fleet_refusal(self, submissions: tuple[Submission, ...]) -> Refusal | None:
        """Why these submissions are refused here: shutting down, or the fleet full.  Full is
        the one-process rule over the fleet: more requests than every replica's rows and queue
        hold (a replica's engine still refuses what its own queue cannot take)."""
        if not self.accepting:
            return Refusal(SHUTTING_DOWN)
        count = sum(len(submission.requests) for submission in submissions)
        in_flight = sum(relay.requests_open() for relay in set(self.relays.values()))
        if in_flight + count <= self.fleet_rows + self.fleet_queue:
            return None
        waiting = max(0, in_flight - self.fleet_rows)
        return Refusal(QUEUE_FULL, needed=count, limit=self.fleet_queue, waiting=waiting)

    async def run_relay(self, relay: Relay, order: Order) -> None:
        """The order's stream, each batch of events handed on; its end told to whoever waits.
        An order whose call failed before any event came back (its replica died, or the call
        broke: nothing of it reached a client) is sent again, up to SEND_ATTEMPTS times in all;
        the failed call was cancelled first, so it runs on one replica at most."""
        try:
            for attempt in range(1, SEND_ATTEMPTS + 1):
                try:
                    await self.stream_once(relay, order)
                except Exception as exc:  # noqa: BLE001 (a replica's failure, told to its clients)
                    print(f"minirt serve: {replica_lost(exc)}", file=sys.stderr, flush=True)
                    if relay.answered or attempt == SEND_ATTEMPTS:
                        relay.close_open(replica_lost(exc), self.observer)
                        return
                else:
                    relay.close_open("the replica ended the stream early", self.observer)
                    return
        except asyncio.CancelledError:
            relay.close_open(relay.cancelled_because, self.observer)
        finally:
            for submission in relay.submissions:
                self.relays.pop(submission.id, None)

    async def stream_once(self, relay: Relay, order: Order) -> None:
        """One `serve_order` call, its events handed on as they come; cancelled or failed, the
        replica's side is cancelled too (a replica still alive aborts the order's requests)."""
        stream = self.handle.serve_order.remote(order)
        try:
            async for batch in stream:
                for index, event in batch:
                    relay.hand_on(index, event)
        except BaseException:
            stream.cancel()
            raise

    def abort(self, submission_id: str) -> None:
        """Its client has gone: the replica's stream is cancelled (which aborts the requests
        there), and its open choices are told they were aborted."""
        relay = self.relays.get(submission_id)
        if relay is not None and relay.task is not None:
            relay.task.cancel()

    def begin_shutdown(self, grace_s: float) -> None:
        """Accept no more; what runs may finish within `grace_s` (safe from a signal handler:
        it only sets values the watchdog reads)."""
        self.accepting = False
        self.deadline = time.monotonic() + grace_s

    async def watch_deadline(self) -> None:
        """On the event loop: once shutting down, open round-grid feeds end; past the deadline,
        every relay still open is cancelled, its choices told the shutdown cut them off."""
        while self.deadline is None:
            await asyncio.sleep(DEADLINE_CHECK_S)
        self.on_shutdown()
        while time.monotonic() < self.deadline and self.relays:
            await asyncio.sleep(DEADLINE_CHECK_S)
        self.cancel_all(SHUTDOWN_ABORT)

    def cancel_all(self, because: str | None) -> None:
        for relay in set(self.relays.values()):
            relay.cancelled_because = because
            if relay.task is not None:
                relay.task.cancel()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop reading the board (the relays end with the event loop's tasks)."""
        self.accepting = False
        self.stopped.set()
        self.reader.join(timeout_s)

    def is_alive(self) -> bool:
        """While some replica reports, and the client has not stopped."""
        return not self.stopped.is_set() and bool(self.replicas)

    def snapshot(self) -> EngineSnapshot:
        return self.latest

    # ------------------------------------------------------------------ the board

    def read_board(self) -> None:
        """Every REPORT_EVERY_S: each replica's reports, replayed to the observer."""
        while not self.stopped.wait(REPORT_EVERY_S):
            self.read_once()

    def read_once(self) -> None:
        try:
            reports, silent_s = ray.get(self.board.take.remote(), timeout=10)
        except Exception as exc:  # noqa: BLE001 (the metrics wait for the next read)
            print(f"minirt serve: cannot read the replicas' metrics ({exc})", file=sys.stderr)
            return
        self.take_reports(reports, silent_s)

    def take_reports(self, reports: dict[str, list[Report]], silent_s: dict[str, float]) -> None:
        for label, their_reports in reports.items():
            for report in their_reports:
                self.replay(report)
                self.replicas[label] = report.snapshot
                self.pids[label] = report.pid
        for label, silent in silent_s.items():
            if silent > REPLICA_SILENT_S:
                self.replicas.pop(label, None)
        self.latest = self.fleet()
        self.observer.observe(self.latest)
        self.observer.observe_replicas(self.replicas, self.pids)

    def replay(self, report: Report) -> None:
        """A replica's observer calls, made again to this client's observer."""
        for name, arguments in report.calls:
            getattr(self.observer, name)(*arguments)

    def fleet(self) -> EngineSnapshot:
        """The fleet's counts: every live replica's summed; the settings are every replica's
        (their flags are the command's)."""
        totals = {name: sum(getattr(s, name) for s in self.replicas.values()) for name in SUMMED}
        if not self.replicas:
            totals["kv_budget_positions"] = self.empty.kv_budget_positions
        return replace(self.empty, **totals)
