"""The engine's side of serving: its own thread, and the small interface a server talks to.

Owns: `EngineClient`, the one thread that drives the `Engine` (minirt/engine/engine.py): one
round after another while any request waits or runs, asleep on its inbox when none does.  A
server holds nothing else of the engine's; it calls

    start()                     start the thread
    add(*submissions)           queue these submissions (each a completion's requests) in one
                                step, in this order, all or none: each is told `Accepted`, or
                                each `Refused`
    abort(submission_id)        end a submission's requests: their rows and KV slots are freed
                                before the next round
    begin_shutdown(grace_s)     accept no more; what runs may finish within `grace_s`
    stop(timeout_s)             abort whatever is left, and end the thread
    is_alive()                  whether the thread runs (it should for as long as the server)
    snapshot()                  the counts after the last iteration, and the fixed settings
                                (`EngineSnapshot`, a frozen value)

Also the hand-over records: `Submission` (one completion's requests, made by the server with
RequestMaker.make: the client numbers and makes nothing, and the callback its events go to) and
the events that come back (`Accepted`, `Refused` with its `Refusal` value, `Token`, `Finished`).
Refusals are values (minirt/engine/request.py): the server words each kind in its own terms.

How requests and tokens cross, and why it is safe:

    server -> engine    `add`, `abort`, `begin_shutdown` and `stop` put a command on `inbox`,
                        a queue.SimpleQueue (made for threads, and safe to put to even from
                        a signal handler that interrupts another put).  Only the engine thread
                        takes commands off it, and only the engine thread ever calls the Engine
                        or reads or writes a `Request` once it is handed over: there is no lock
                        to forget, because nothing of the engine's is shared.
    engine -> server    after each round the engine thread turns each request's news into a
                        frozen event of plain values (ints, floats, strings, tuples: copies,
                        never the Request) and calls its submission's `on_event` with it, on
                        the engine thread.  The callback must only hand it over: the server's
                        does `loop.call_soon_threadsafe(queue.put_nowait, event)`, the one
                        asyncio method made to be called from another thread, so that the
                        asyncio queue, which is not thread-safe, is only ever touched by the
                        event loop that owns it (this package needs no asyncio).
    snapshot            written by the engine thread after each iteration as one new frozen
                        value (one attribute assignment), read by any thread.

A submission's events come in order: `Accepted` (or `Refused`) first, then `Token` events as
rounds run, then one `Finished` per request.  The budget is asked once per request
(`Engine.add_requests`, all or none).

When no request is left, the client starts a new run (`Engine.start_run`): round numbers count
from 1 again.  A server that is never idle drops the run's report-only history instead, every
FORGET_EVERY_ROUNDS rounds (`Engine.forget_history`): either way the per-round records and the
static groups' member lists do not grow for as long as the server lives.

What else the server gives it, all called on the engine thread: `on_round` gets every round's
record (`StepOutput.round_record`, for the round-grid page's feed), `on_shutdown` is called once
when it stops accepting (so that open feeds end), and `observer` hears plain values for metrics
(`EngineObserver`: a first token with its waits and prompt counts, a finished output with its
latency, a round's new tokens, the snapshot).

Two teaching and batching knobs shape when rounds run:

    round_delay_s    a pause after each round (`--round-delay`), so that a person can watch a
                     small model's grid fill; commands are applied as they come meanwhile, and
                     a shutdown ends the pause
    batch_window_s   static groups only (`--batch-window`): when no group runs, the next one
                     waits up to this long, from its first request's arrival, for the queue
                     to fill to the batch size (`Scheduler.window_left_s`); a full group starts
                     at once.  Requests reach a server one at a time, so without a window nearly
                     every group would start with one member (the idea of Triton's dynamic
                     batcher's max_queue_delay)

Must not know: HTTP, asyncio, the web framework, or the shape of a response.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from .engine import Engine, StepOutput
from .output import CompletionOutput
from .request import (
    FAULT,
    QUEUE_FULL,
    SHUTTING_DOWN,
    TOO_MANY_CHOICES,
    Refusal,
    Request,
    fail_request,
    unshown_text,
)
from .round_record import RoundRecord

# How long the sleeping loop waits on its inbox before it looks at the shutdown deadline again.
IDLE_WAKE_S = 0.25

# A run that never ends (the server is never idle) drops its report-only history this often.
FORGET_EVERY_ROUNDS = 1000

SHUTDOWN_ABORT = (
    "the server shut down before this completion finished (its --shutdown-timeout grace "
    "period ran out); retry it"
)


@dataclass(frozen=True)
class Accepted:
    """Every request of the submission is queued."""


@dataclass(frozen=True)
class Refused:
    """Nothing is queued: why, as a value."""

    refusal: Refusal


@dataclass(frozen=True)
class Token:
    """One new token of one request (`choice`: its place in its submission), with the text that
    is now final ("" while a character is incomplete or a stop string might still cut it)."""

    choice: int
    token_id: int
    text: str
    logprob: float | None
    top_logprobs: tuple[tuple[int, float], ...] | None


@dataclass(frozen=True)
class PlainLogprobs:
    """A finished request's log-probabilities as plain values, for a server to word in its own
    API's shape: each token's, the N most likely at each step (None unless it asked for N >= 1),
    and each prompt token's given those before it (None unless asked; the first None)."""

    tokens: tuple[float, ...]
    top: tuple[tuple[tuple[int, float], ...], ...] | None
    prompt: tuple[float | None, ...] | None


@dataclass(frozen=True)
class Finished:
    """One request's final record: its `CompletionOutput` (minirt/engine/output.py, as the
    offline API returns it), what was left of its text to stream (the held-back tail, when it
    stopped), and its logprobs as plain values (None unless it asked for them)."""

    choice: int
    output: CompletionOutput
    unshown_text: str
    logprobs: PlainLogprobs | None


Event = Accepted | Refused | Token | Finished


@dataclass(frozen=True, eq=False)
class Submission:
    """One completion's requests, queued together or not at all: `id` is their id (what `abort`
    names), `received_s` when its server had it (time.perf_counter: waits count from here), and
    `on_event` is called with each of its events, on the engine thread."""

    id: str
    requests: tuple[Request, ...]
    received_s: float
    on_event: Callable[[Event], None]


@dataclass(frozen=True)
class EngineSnapshot:
    """The engine's counts after an iteration, and the settings it was made with."""

    # Requests that hold a row (unfinished), and requests queued for one.
    running: int
    waiting: int
    # KV positions the running requests reserve, and the budget they count against.
    kv_positions_reserved: int
    kv_budget_positions: int
    # KV slots held by running requests.
    kv_slots_used: int
    # KV positions the prefix cache holds now; over the client's life, the prompt tokens looked
    # up in it (queries) and found (hits), counted at each request's first token.
    prefix_cache_positions: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    # Rounds run over the client's life.
    rounds: int
    # Fixed: how the engine batches, and the model's context.
    policy: str
    batch_size: int
    round_token_budget: int
    chunked_prefill: bool
    prefix_cache: bool
    context_length: int


class EngineObserver:
    """What a client tells its observer (a server's metrics), in plain values; this one ignores
    it all.  Every call comes on the engine thread."""

    def first_token(
        self,
        seconds: float,
        queued_seconds: float,
        prompt_tokens: int,
        looked_up_tokens: int,
        cached_tokens: int,
    ) -> None:
        """A request's first token came `seconds` after it arrived, having waited
        `queued_seconds` for its first round; its prompt's tokens, those looked up in the prefix
        cache (none without one), and those the prefix cache gave it."""

    def finished(self, output: CompletionOutput, seconds: float) -> None:
        """A request's record is final, `seconds` after it arrived."""

    def round_ran(self, new_tokens: int) -> None:
        """A round ran, and gave this many tokens."""

    def observe(self, snapshot: EngineSnapshot) -> None:
        """The counts after an iteration."""

    def observe_replicas(self, snapshots: dict[str, EngineSnapshot], pids: dict[str, int]) -> None:
        """Served by replicas (minirt/distributed/replica_client.py): each live replica's latest
        counts and its process id, by its label, beside the fleet's sums that `observe` hears.
        Never called in one process."""


@dataclass(frozen=True)
class Add:
    # Queued in one step, in this order, before any round runs: all of them, or none.
    submissions: tuple[Submission, ...]


@dataclass(frozen=True)
class Abort:
    submission_id: str


@dataclass(frozen=True)
class Shutdown:
    deadline: float  # time.monotonic()


@dataclass(frozen=True)
class Stop:
    pass


def finished_event(request: Request, choice: int) -> Finished:
    """The final event of a finished request: its output (copies of its values, never the
    Request), as the offline API makes it, and its logprobs as plain values."""
    return Finished(
        choice,
        CompletionOutput.from_request(request),
        unshown_text(request),
        plain_logprobs(request),
    )


def plain_logprobs(request: Request) -> PlainLogprobs | None:
    """A finished request's logprobs as plain values (copies), or None when it wanted none."""
    if not request.want_logprobs:
        return None
    if request.params.logprobs:
        top = tuple(tuple(step) for step in request.top_logprobs)
    else:
        top = None
    if request.prompt_logprobs is None:
        prompt = None
    else:
        prompt = tuple(request.prompt_logprobs)
    return PlainLogprobs(tuple(request.logprobs), top, prompt)


def token_event(request: Request, choice: int) -> Token:
    """The event of the token a request got this round."""
    if request.want_logprobs and request.logprobs:
        logprob = request.logprobs[-1]
    else:
        logprob = None
    if request.params.logprobs and request.top_logprobs:
        top = tuple(request.top_logprobs[-1])
    else:
        top = None
    return Token(
        choice=choice,
        token_id=request.token_ids[-1],
        text=unshown_text(request),
        logprob=logprob,
        top_logprobs=top,
    )


def no_round(record: RoundRecord) -> None:
    """The default `on_round`: nobody watches."""


def nothing() -> None:
    """The default `on_shutdown`."""


class EngineClient:
    """The engine's thread: it alone steps the engine and touches its requests."""

    def __init__(
        self,
        engine: Engine,
        max_queue: int,
        observer: EngineObserver | None = None,
        on_round: Callable[[RoundRecord], None] = no_round,
        on_shutdown: Callable[[], None] = nothing,
        round_delay_s: float = 0.0,
        batch_window_s: float = 0.0,
    ):
        self.engine = engine
        self.max_queue = max_queue
        self.observer = observer if observer is not None else EngineObserver()
        self.on_round = on_round
        self.on_shutdown = on_shutdown
        self.round_delay_s = round_delay_s
        self.batch_window_s = batch_window_s
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        # Each queued or running request: its submission, and its place in it.
        self.tracked: dict[Request, tuple[Submission, int]] = {}
        self.accepting = True
        self.deadline: float | None = None
        self.stopped = False
        # Counted over the client's life, for the snapshot.
        self.rounds = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.latest = self.take_snapshot()
        self.thread = threading.Thread(target=self.run, name="minirt-engine", daemon=True)

    # ------------------------------------------------------------------ called by the server

    def start(self) -> None:
        self.thread.start()

    def add(self, *submissions: Submission) -> None:
        """Queue these submissions in one step, in this order, so that they arrive in the same
        instant (the round-grid page's exercise): each is accepted, or each is refused."""
        self.inbox.put(Add(tuple(submissions)))

    def abort(self, submission_id: str) -> None:
        """Its client has gone, or no longer wants it: its rows and KV slots are freed before
        the next round."""
        self.inbox.put(Abort(submission_id))

    def begin_shutdown(self, grace_s: float) -> None:
        """Accept no more; what runs may finish within `grace_s`, and is aborted then."""
        self.inbox.put(Shutdown(time.monotonic() + grace_s))

    def stop(self, timeout_s: float = 10.0) -> None:
        """Abort whatever is left, and end the thread."""
        self.inbox.put(Stop())
        self.thread.join(timeout_s)

    def is_alive(self) -> bool:
        return self.thread.is_alive()

    def snapshot(self) -> EngineSnapshot:
        """The counts after the last iteration (a frozen value the engine thread replaces)."""
        return self.latest

    # ------------------------------------------------------------------ the thread

    def run(self) -> None:
        """Iterations until stopped.  A fault in one (a bug, not a bad request: those are
        refused before they get here) is logged, and every request held is ended and told so;
        the thread itself never dies, or every later completion would wait for ever."""
        while not self.stopped:
            try:
                self.iterate()
            except Exception as exc:  # noqa: BLE001 (told to every client, and logged)
                traceback.print_exc(file=sys.stderr)
                self.fail_everything(exc)

    def iterate(self) -> None:
        """Commands, then a round if there is work; asleep on the inbox while there is none."""
        if not self.engine.has_unfinished() and self.engine.round_number > 0:
            # Nobody is left: a new run, so that the run's records stay small.
            self.engine.start_run()
        elif self.engine.round_number % FORGET_EVERY_ROUNDS == FORGET_EVERY_ROUNDS - 1:
            # Never idle: the run's report-only history is dropped instead.
            self.engine.forget_history()
        for command in self.take_commands():
            self.apply(command)
        self.abort_past_deadline()
        if self.engine.has_unfinished() and self.window_left_s() == 0.0:
            self.run_step()
            if self.round_delay_s > 0 and self.engine.has_unfinished():
                self.pause_between_rounds()
        self.latest = self.take_snapshot()
        self.observer.observe(self.latest)

    def take_snapshot(self) -> EngineSnapshot:
        """The counts now (on the engine thread, or before it starts)."""
        engine = self.engine
        scheduler = engine.scheduler
        running = [r for r in scheduler.running if not r.finished]
        cache = engine.prefix_cache
        return EngineSnapshot(
            running=len(running),
            waiting=len(scheduler.waiting),
            kv_positions_reserved=sum(scheduler.kv_positions_needed(r) for r in running),
            kv_budget_positions=engine.kv_budget_positions,
            kv_slots_used=sum(1 for r in running if r.slot is not None),
            prefix_cache_positions=0 if cache is None else cache.positions,
            prefix_cache_queries=self.prefix_cache_queries,
            prefix_cache_hits=self.prefix_cache_hits,
            rounds=self.rounds,
            policy=engine.policy,
            batch_size=engine.batch_size,
            round_token_budget=engine.round_token_budget,
            chunked_prefill=engine.chunked_prefill,
            prefix_cache=cache is not None,
            context_length=engine.runner.n_positions,
        )

    def pause_between_rounds(self) -> None:
        """--round-delay: wait before the next round, awake to commands all the while (an abort
        is applied at once; a shutdown or stop ends the pause, so it never holds up the exit)."""
        deadline = time.monotonic() + self.round_delay_s
        while self.accepting and not self.stopped:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            try:
                command = self.inbox.get(timeout=left)
            except queue.Empty:
                return
            self.apply(command)

    def window_left_s(self) -> float:
        """How much longer the next static group waits for members (0.0: start it now): the
        scheduler's batch window (`Scheduler.window_left_s`), while the client still accepts
        submissions."""
        if not self.accepting:
            return 0.0
        return self.engine.scheduler.window_left_s(self.engine.seconds(), self.batch_window_s)

    def fail_everything(self, exc: Exception) -> None:
        """After a fault of the server: every request held ends with an error, and the engine
        starts a new run (whatever a half-done iteration left in it is dropped)."""
        message = f"the server failed ({type(exc).__name__}: {exc}); retry it"
        for request, (submission, choice) in self.tracked.items():
            fail_request(request, message)
            self.send(submission, finished_event(request, choice))
        self.tracked.clear()
        self.engine.reset_run()

    def take_commands(self) -> list:
        """Every command waiting; while the engine has no work, wait for one first (and while
        a static group waits for members, wait at most until its window ends)."""
        commands = []
        if not self.engine.has_unfinished():
            timeout = IDLE_WAKE_S
        else:
            timeout = self.window_left_s()
        if timeout > 0:
            try:
                commands.append(self.inbox.get(timeout=timeout))
            except queue.Empty:
                return commands
        while True:
            try:
                commands.append(self.inbox.get_nowait())
            except queue.Empty:
                return commands

    def apply(self, command) -> None:
        if isinstance(command, Add):
            try:
                self.admit(command.submissions)
            except Exception as exc:  # noqa: BLE001 (told to its clients, and logged)
                traceback.print_exc(file=sys.stderr)
                fault = Refusal(FAULT, detail=f"{type(exc).__name__}: {exc}")
                for submission in command.submissions:
                    self.send(submission, Refused(fault))
        elif isinstance(command, Abort):
            self.engine.abort(command.submission_id)
        elif isinstance(command, Shutdown):
            self.accepting = False
            self.deadline = command.deadline
            # Open round-grid pages must not hold up the exit.
            self.on_shutdown()
        elif isinstance(command, Stop):
            self.accepting = False
            self.on_shutdown()
            self.abort_all()
            self.stopped = True

    def queue_refusal(self, submissions: tuple[Submission, ...]) -> Refusal | None:
        """Why these submissions are not queued before any request is asked about: the client
        shutting down, more requests than the queue holds at all, or the queue too full now."""
        waiting = len(self.engine.scheduler.waiting)
        count = sum(len(submission.requests) for submission in submissions)
        if not self.accepting:
            return Refusal(SHUTTING_DOWN)
        if count > self.max_queue:
            return Refusal(TOO_MANY_CHOICES, "n", needed=count, limit=self.max_queue)
        if waiting + count > self.max_queue:
            return Refusal(QUEUE_FULL, needed=count, limit=self.max_queue, waiting=waiting)
        return None

    def admit(self, submissions: tuple[Submission, ...]) -> None:
        """Queue every request of these submissions, or none (each told `Refused`): shutting
        down, the queue full, or a request no round could ever take (`Engine.add_requests`
        asks each once)."""
        refusal = self.queue_refusal(submissions)
        if refusal is None:
            every = [request for submission in submissions for request in submission.requests]
            refusal = self.engine.add_requests(every)
        if refusal is not None:
            for submission in submissions:
                self.send(submission, Refused(refusal))
            return
        for submission in submissions:
            self.send(submission, Accepted())
            for choice, request in enumerate(submission.requests):
                if request.finished:
                    # Final at once (no step will report it): the server's checks let none
                    # through that would be, but its client must hear of it either way.
                    self.send(submission, finished_event(request, choice))
                else:
                    self.tracked[request] = (submission, choice)

    def run_step(self) -> None:
        """One round, and its news to the submitters.  A round that raises (a fault of the
        server, not of a request) ends every request it held, each told why."""
        try:
            output = self.engine.step()
        except Exception as exc:  # noqa: BLE001 (told to every client, and logged)
            traceback.print_exc(file=sys.stderr)
            self.fail_everything(exc)
            return
        self.deliver(output)
        if output.round_record is not None:
            self.on_round(output.round_record)

    def deliver(self, output: StepOutput) -> None:
        """Each new token, then each final record, to its submission."""
        now = time.perf_counter()
        if output.round_number is not None:
            self.rounds += 1
            self.observer.round_ran(len(output.new_tokens))
        for request in output.new_tokens:
            submission, choice = self.tracked[request]
            if len(request.token_ids) == 1:
                self.first_token(request, submission, now)
            self.send(submission, token_event(request, choice))
        for request in output.finished:
            entry = self.tracked.pop(request, None)
            if entry is None:
                continue
            submission, choice = entry
            if request.finish_reason == "abort" and not self.accepting:
                # Aborted by the shutdown's deadline: the client is told so.
                request.error = SHUTDOWN_ABORT
            event = finished_event(request, choice)
            self.observer.finished(event.output, now - submission.received_s)
            self.send(submission, event)

    def first_token(self, request: Request, submission: Submission, now: float) -> None:
        """A request's first token: its waits and prompt counts, to the observer.  Queued from
        its arrival to its first round (a chunked prompt's first chunk, which may be rounds
        before this one): the engine's clock counts from its run's start, on the same
        perf_counter."""
        assert request.admitted_s is not None  # it was admitted, since it got a token
        admitted = self.engine.run_start + request.admitted_s
        waited = admitted - submission.received_s
        # Looked up in the prefix cache: the whole prompt, when there is one.
        looked_up = request.prompt_len if self.engine.prefix_cache is not None else 0
        self.prefix_cache_queries += looked_up
        self.prefix_cache_hits += request.cached_prompt_tokens
        self.observer.first_token(
            now - submission.received_s,
            waited,
            request.prompt_len,
            looked_up,
            request.cached_prompt_tokens,
        )

    def abort_past_deadline(self) -> None:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            self.abort_all()
            self.deadline = None

    def abort_all(self) -> None:
        """Abort every request still held, and tell their submitters now (after Stop, no round
        follows)."""
        for submission_id in {submission.id for submission, _ in self.tracked.values()}:
            self.engine.abort(submission_id)
        if self.engine.has_unfinished():
            # Nothing is left to run: this step only reports the aborts.
            self.deliver(self.engine.step())

    def send(self, submission: Submission, event: Event) -> None:
        """Hand an event to its submitter (its callback hands it on to its own thread)."""
        submission.on_event(event)
