"""One replica of `minirt serve --replicas N`: an engine and its thread, as a Ray Serve deployment.

Owns: `Order` (what the ingress hands a replica: one or more completions' requests, as the
ingress made them, and the block keys the router matched the prompt by), `EngineReplica` (the
deployment's class: the model loaded from `minirt serve`'s own flags, one `EngineClient` thread,
and `serve_order`, a streaming method that queues an order and yields its events as they come),
`ObserverRelay` (what the engine tells its observer, kept as plain values) and `MetricsBoard`
(a small Ray actor the replicas report to and the ingress reads: minirt/distributed/
replica_client.py turns it into the ingress's /metrics).

What crosses between the ingress and a replica, and nothing else (vLLM v1's seam: add, abort,
outputs):

    ingress -> replica   `serve_order(order)`: the requests (token ids, parameters, random
                         stream), through Ray Serve's handle and its request router
    replica -> ingress   the same events a one-process server hears (`Accepted`/`Refused`,
                         `Token`, `Finished`: frozen plain values), yielded in batches of
                         whatever came since the last one, through Ray Serve's streaming
                         response
    abort                the ingress cancels the stream: Ray Serve cancels `serve_order` here,
                         and its `finally` aborts the order's requests in the engine, whose rows
                         and KV slots are free before the next round
    metrics              every REPORT_EVERY_S the replica sends the board its observer calls
                         since the last report and its latest `EngineSnapshot` (a heartbeat even
                         when idle: a replica not heard from for REPLICA_SILENT_S is gone)

A request's tokens are those of one process: the ingress made it (its random stream seeded from
its own seed, or from its number across the ingress's life) and the engine computes each row
alone (batch invariance), so which replica runs it changes nothing.

Must not know: HTTP, the web framework, the response shapes, or how replicas are chosen
(minirt/distributed/prefix_router.py).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path

from ray import serve

from ..cli.serving_flags import llm_from_flags
from ..engine.client import (
    EngineObserver,
    EngineSnapshot,
    Event,
    Finished,
    Refused,
    Submission,
)
from ..engine.output import CompletionOutput
from ..engine.request import Request

# How often a replica reports to the board, and how long a silent one is taken for gone.
REPORT_EVERY_S = 0.2
REPLICA_SILENT_S = 3.0


@dataclass(frozen=True)
class OrderedSubmission:
    """One completion's requests, as the ingress made them; `age_s`: how long the ingress had
    held it when it was sent, and `sent_at`: the wall clock then (its waits count from the
    ingress's arrival, router and transit included, not from the replica's)."""

    id: str
    requests: tuple[Request, ...]
    age_s: float
    sent_at: float


@dataclass(frozen=True)
class Order:
    """What one `serve_order` call queues, all or none: its submissions, and the block keys of
    its first prompt (minirt/engine/prefix_cache.py `prompt_block_keys`), which the prefix
    router reads."""

    submissions: tuple[OrderedSubmission, ...]
    prefix_keys: tuple[int, ...] = ()


@dataclass(frozen=True)
class Report:
    """A replica's report to the board: its observer calls since the last report (each a name
    and its arguments), its latest snapshot, and its process id (tests find its process)."""

    calls: tuple[tuple[str, tuple], ...]
    snapshot: EngineSnapshot
    pid: int


class ObserverRelay(EngineObserver):
    """The engine's observer in a replica: each call kept as plain values, taken by the reporter
    thread.  Calls come on the engine's thread; `take` runs on the reporter's."""

    def __init__(self, snapshot: EngineSnapshot):
        self.lock = threading.Lock()
        self.calls: list[tuple[str, tuple]] = []
        self.latest = snapshot

    def keep(self, name: str, arguments: tuple) -> None:
        with self.lock:
            self.calls.append((name, arguments))

    def first_token(self, seconds, queued_seconds, prompt_tokens, looked_up_tokens, cached_tokens):
        arguments = (seconds, queued_seconds, prompt_tokens, looked_up_tokens, cached_tokens)
        self.keep("first_token", arguments)

    def finished(self, output: CompletionOutput, seconds: float) -> None:
        self.keep("finished", (output, seconds))

    def round_ran(self, new_tokens: int) -> None:
        self.keep("round_ran", (new_tokens,))

    def observe(self, snapshot: EngineSnapshot) -> None:
        self.latest = snapshot

    def take(self) -> tuple[tuple[tuple[str, tuple], ...], EngineSnapshot]:
        """The calls since the last take, and a snapshot no newer than the last of them: the
        engine's thread makes its calls before it replaces the snapshot, so the snapshot read
        first has all its calls among those read after it."""
        snapshot = self.latest
        with self.lock:
            calls = tuple(self.calls)
            self.calls = []
        return calls, snapshot


class MetricsBoard:
    """Where replicas report and the ingress reads: each replica's reports since the last read,
    and when it was last heard from.  A Ray actor (`ray.remote(MetricsBoard)`), needing no CPU."""

    def __init__(self):
        self.reports: dict[str, list[Report]] = {}
        self.heard_s: dict[str, float] = {}

    def report(self, label: str, report: Report) -> None:
        self.reports.setdefault(label, []).append(report)
        self.heard_s[label] = time.monotonic()

    def heard(self) -> list[str]:
        """The replicas heard from so far."""
        return list(self.heard_s)

    def take(self) -> tuple[dict[str, list[Report]], dict[str, float]]:
        """The reports since the last take, and how many seconds ago each replica was heard."""
        reports = self.reports
        self.reports = {}
        now = time.monotonic()
        return reports, {label: now - heard for label, heard in self.heard_s.items()}


class EngineReplica:
    """A Ray Serve replica: the model and one engine thread, made from `minirt serve`'s flags."""

    def __init__(self, args: Namespace, folder: str, board):
        llm = llm_from_flags(args, Path(folder))
        self.label = serve.get_replica_context().replica_id.unique_id
        self.board = board
        self.relay = ObserverRelay(llm.engine_client(args.max_queue).snapshot())
        self.client = llm.engine_client(
            args.max_queue,
            observer=self.relay,
            round_delay_s=args.round_delay / 1000,
            batch_window_s=args.batch_window / 1000,
        )
        self.client.start()
        self.stopping = threading.Event()
        self.reporter = threading.Thread(target=self.report_forever, daemon=True)
        self.reporter.start()

    def report_forever(self) -> None:
        """Every REPORT_EVERY_S: the observer's calls and the snapshot, to the board."""
        while not self.stopping.wait(REPORT_EVERY_S):
            calls, snapshot = self.relay.take()
            self.board.report.remote(self.label, Report(calls, snapshot, os.getpid()))

    async def serve_order(self, order: Order):
        """Queue the order's submissions in one step, then yield their events, in batches of
        whatever came since the last yield, until every request's final record (or the order's
        refusal) is out.  Cancelled (the ingress aborted it, or its stream was dropped), the
        order's requests still open are aborted in the engine."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        now = time.perf_counter()
        submissions = []
        for index, ordered in enumerate(order.submissions):
            deliver = Deliver(loop, events, index)
            received_s = now - ordered.age_s - time_in_transit(ordered.sent_at)
            submissions.append(Submission(ordered.id, ordered.requests, received_s, deliver))
        still_open = [len(ordered.requests) for ordered in order.submissions]
        self.client.add(*submissions)
        try:
            while any(still_open):
                batch = [await events.get()]
                while not events.empty():
                    batch.append(events.get_nowait())
                for index, event in batch:
                    still_open[index] -= count_closed(event, still_open[index])
                yield batch
        finally:
            for index, submission in enumerate(submissions):
                if still_open[index]:
                    self.client.abort(submission.id)

    def check_health(self) -> None:
        """Ray Serve's health check: the engine's thread must run, or the replica is replaced."""
        if not self.client.is_alive():
            raise RuntimeError("the engine's thread has stopped")

    def __del__(self) -> None:
        stopping = getattr(self, "stopping", None)
        if stopping is not None:
            stopping.set()
            self.client.stop()


def time_in_transit(sent_at: float) -> float:
    """Seconds since the ingress sent an order (its wait in Ray Serve's router and the trip):
    by the wall clock, the one clock two processes share; exact on one machine, off by the
    clocks' skew across machines, and never below 0."""
    return max(0.0, time.time() - sent_at)


def count_closed(event: Event, still_open: int) -> int:
    """How many of a submission's requests an event closes: a final record one, a refusal all."""
    if isinstance(event, Refused):
        return still_open
    if isinstance(event, Finished):
        return 1
    return 0


class Deliver:
    """A submission's `on_event` in a replica: from the engine's thread, its events onto the
    replica's event loop, tagged with the submission's place in its order."""

    def __init__(self, loop: asyncio.AbstractEventLoop, events: asyncio.Queue, index: int):
        self.loop = loop
        self.events = events
        self.index = index

    def __call__(self, event: Event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (self.index, event))
        except RuntimeError:
            # The event loop has closed: nobody is left to read it.
            pass
