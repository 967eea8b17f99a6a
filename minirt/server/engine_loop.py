"""The engine's own thread, and how requests and tokens cross between it and the HTTP handlers.

Owns: `EngineLoop`, the one thread that drives the `Engine` (minirt/engine/engine.py): one round
after another while any request waits or runs, asleep on its inbox when none does.  Also the
hand-over records: `Completion` (one HTTP completion: its choices, each a prompt's token ids,
its SamplingParams and its sample number) and the events that come back (`Accepted`, `Refused`,
`Token`, `Finished`).

How requests and tokens cross, and why it is safe:

    handler -> engine   `submit`, `abort`, `begin_shutdown` and `stop` put a command on `inbox`,
                        a queue.SimpleQueue (made for threads, and safe to put to even from
                        a signal handler that interrupts another put).  Only the engine thread
                        takes commands off it, and only the engine thread ever calls the Engine
                        or reads or writes a `Request`: there is no lock to forget, because
                        nothing of the engine's is shared.
    engine -> handler   after each round the engine thread turns each request's news into a
                        frozen event of plain values (ints, floats, strings, tuples: copies,
                        never the Request) and hands it to the completion's asyncio.Queue with
                        `loop.call_soon_threadsafe(queue.put_nowait, event)`.  That call is the
                        one asyncio method made to be called from another thread: the put itself
                        runs on the event loop's thread, so the asyncio queue, which is not
                        thread-safe, is only ever touched by the loop that owns it.

A handler reads only the events of its own completion, in order: `Accepted` (or `Refused`) first,
then `Token` events as rounds run, then one `Finished` per choice.  Before submitting, handlers
call only the engine's pure checks (`Engine.prompt_ids`, `Engine.check_params`), which read the
tokenizer and the model's config, never anything this thread writes.

When no request is left, the loop starts a new run (`Engine.start_run`): round numbers count from
1 again.  A server that is never idle drops the run's report-only history instead, every
FORGET_EVERY_ROUNDS rounds (`Engine.forget_history`): either way the per-round records and the
static groups' member lists do not grow for as long as the server lives.

Every round's record (`StepOutput.round_record`) goes to the round feed
(minirt/server/round_feed.py), for the round-grid page.

Two teaching and batching knobs shape when rounds run:

    round_delay_s    a pause after each round (`--round-delay`), so that a person can watch a
                     small model's grid fill; commands are applied as they come meanwhile, and
                     a shutdown ends the pause
    batch_window_s   static groups only (`--batch-window`): when no group runs, the next one
                     waits up to this long, from its first request's arrival, for the queue
                     to fill to the batch size; a full group starts at once.  Requests reach a
                     server one at a time, so without a window nearly every group would start
                     with one member (the idea of Triton's dynamic batcher's max_queue_delay)

Must not know: HTTP, the web framework, or the shape of a response.
"""

from __future__ import annotations

import asyncio
import queue
import sys
import threading
import time
import traceback
from dataclasses import dataclass

from ..engine.engine import Engine, StepOutput
from ..engine.output import RequestOutput
from ..engine.params import SamplingParams
from ..engine.request import Request, fail_request, unshown_text
from ..request_maker import RequestMaker
from .metrics import ServerMetrics
from .round_feed import RoundFeed

# How long the sleeping loop waits on its inbox before it looks at the shutdown deadline again.
IDLE_WAKE_S = 0.25

# A run that never ends (the server is never idle) drops its report-only history this often.
FORGET_EVERY_ROUNDS = 1000

SHUTDOWN_ABORT = (
    "the server shut down before this completion finished (its --shutdown-timeout grace "
    "period ran out); retry it"
)


@dataclass(frozen=True)
class ChoiceSpec:
    """One choice of a completion: what the model is fed first, and how it samples."""

    prompt_ids: tuple[int, ...]
    params: SamplingParams
    sample: int


class Completion:
    """One HTTP completion, handed to the engine thread: its choices, and the queue its events
    come back on (read by the handler, on the event loop's thread)."""

    def __init__(self, completion_id: str, choices: list[ChoiceSpec], received_s: float):
        self.id = completion_id
        self.choices = choices
        # When the handler had its body: queue time and time to first token count from here.
        self.received_s = received_s
        self.loop = asyncio.get_running_loop()
        self.events: asyncio.Queue = asyncio.Queue()


@dataclass(frozen=True)
class Accepted:
    """Every choice is queued."""


@dataclass(frozen=True)
class Refused:
    """Nothing is queued: the status and the one line to answer with."""

    status: int
    message: str
    param: str | None = None


@dataclass(frozen=True)
class Token:
    """One new token of one choice, with the text that is now final ("" while a character is
    incomplete or a stop string might still cut it)."""

    choice: int
    token_id: int
    text: str
    logprob: float | None
    top_logprobs: tuple[tuple[int, float], ...] | None


@dataclass(frozen=True)
class Finished:
    """One choice's final record: its `RequestOutput` (minirt/engine/output.py, as the offline
    API returns it), and what was left of its text to stream (the held-back tail, when the
    choice stopped)."""

    choice: int
    output: RequestOutput
    unshown_text: str


@dataclass(frozen=True)
class Submit:
    # Queued in one step, in this order, before any round runs: all of them, or none.
    completions: tuple[Completion, ...]


@dataclass(frozen=True)
class Abort:
    completion_id: str


@dataclass(frozen=True)
class Shutdown:
    deadline: float  # time.monotonic()


@dataclass(frozen=True)
class Stop:
    pass


def budget_refusal(reason: str) -> Refused:
    """A request no round could take, in the client's words: over the KV budget (max_tokens is
    the client's to lower), or a prompt over the round's token budget (a server flag)."""
    if "round token budget" in reason:
        return Refused(400, f"{reason} (the server's --max-round-tokens)", param="prompt")
    return Refused(400, reason.replace("max_new_tokens", "max_tokens"), param="max_tokens")


def finished_event(request: Request, choice: int) -> Finished:
    """The final event of a finished request: its output (copies of its values, never the
    Request), as the offline API makes it."""
    return Finished(choice, RequestOutput.from_request(request), unshown_text(request))


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


class EngineLoop:
    """The engine's thread: it alone steps the engine and touches its requests."""

    def __init__(
        self,
        engine: Engine,
        request_maker: RequestMaker,
        metrics: ServerMetrics,
        max_queue: int,
        feed: RoundFeed | None = None,
        round_delay_s: float = 0.0,
        batch_window_s: float = 0.0,
    ):
        self.engine = engine
        self.request_maker = request_maker
        self.metrics = metrics
        self.max_queue = max_queue
        if feed is None:
            feed = RoundFeed()
        self.feed = feed
        self.round_delay_s = round_delay_s
        self.batch_window_s = batch_window_s
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        # Each queued or running request: its completion, and which choice it is.
        self.tracked: dict[Request, tuple[Completion, int]] = {}
        # Requests are numbered across the server's life: an unseeded one draws its own stream.
        self.requests_made = 0
        self.accepting = True
        self.deadline: float | None = None
        self.stopped = False
        self.thread = threading.Thread(target=self.run, name="minirt-engine", daemon=True)

    # ------------------------------------------------------------------ called by handlers

    def start(self) -> None:
        self.thread.start()

    def submit(self, completion: Completion) -> None:
        self.inbox.put(Submit((completion,)))

    def submit_together(self, completions: list[Completion]) -> None:
        """Queue several completions in one step, in this order, so that they arrive in the same
        instant (the round-grid page's exercise): each is accepted, or each is refused."""
        self.inbox.put(Submit(tuple(completions)))

    def abort(self, completion_id: str) -> None:
        """The client has gone, or no longer wants it: its rows and KV slots are freed before
        the next round."""
        self.inbox.put(Abort(completion_id))

    def begin_shutdown(self, grace_s: float) -> None:
        """Accept no more; what runs may finish within `grace_s`, and is aborted then."""
        self.inbox.put(Shutdown(time.monotonic() + grace_s))

    def stop(self, timeout_s: float = 10.0) -> None:
        """Abort whatever is left, and end the thread."""
        self.inbox.put(Stop())
        self.thread.join(timeout_s)

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
        self.metrics.observe_engine(self.engine)

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
        scheduler's batch window (`Scheduler.window_left_s`), while the server still accepts
        requests."""
        if not self.accepting:
            return 0.0
        return self.engine.scheduler.window_left_s(self.engine.seconds(), self.batch_window_s)

    def fail_everything(self, exc: Exception) -> None:
        """After a fault of the server: every request held ends with an error, and the engine
        starts a new run (whatever a half-done iteration left in it is dropped)."""
        message = f"the server failed ({type(exc).__name__}: {exc}); retry it"
        for request, (completion, choice) in self.tracked.items():
            fail_request(request, message)
            self.send(completion, finished_event(request, choice))
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
        if isinstance(command, Submit):
            try:
                self.admit(command.completions)
            except Exception as exc:  # noqa: BLE001 (told to its clients, and logged)
                traceback.print_exc(file=sys.stderr)
                message = f"the server failed to queue it ({type(exc).__name__}: {exc})"
                for completion in command.completions:
                    self.send(completion, Refused(500, message))
        elif isinstance(command, Abort):
            self.engine.abort(command.completion_id)
        elif isinstance(command, Shutdown):
            self.accepting = False
            self.deadline = command.deadline
            # Open round-grid pages must not hold up the exit.
            self.feed.close()
        elif isinstance(command, Stop):
            self.accepting = False
            self.feed.close()
            self.abort_all()
            self.stopped = True

    def admit(self, completions: tuple[Completion, ...]) -> None:
        """Queue every choice of these completions, or none (each told `Refused`): shutting
        down, the queue full, or a choice no round could ever take."""
        waiting = len(self.engine.scheduler.waiting)
        choices = sum(len(completion.choices) for completion in completions)
        if not self.accepting:
            refusal = Refused(503, "the server is shutting down; send it to another server")
        elif choices > self.max_queue:
            message = (
                f"this completion asks for {choices} choices (prompts x n), more than the "
                f"{self.max_queue} the server queues (--max-queue); send fewer at a time"
            )
            refusal = Refused(400, message, param="n")
        elif waiting + choices > self.max_queue:
            message = (
                f"the queue is full ({waiting} requests wait, {self.max_queue} at most: "
                "--max-queue); retry later"
            )
            refusal = Refused(503, message)
        else:
            refusal = None
        made: list[list[Request]] = []
        if refusal is None:
            made = [
                [self.make_request(completion, spec) for spec in completion.choices]
                for completion in completions
            ]
            refusal = self.first_budget_refusal(made)
        if refusal is not None:
            for completion in completions:
                self.send(completion, refusal)
            return
        for completion, requests in zip(completions, made, strict=True):
            self.send(completion, Accepted())
            for choice, request in enumerate(requests):
                self.engine.add_request(request)
                if request.finished:
                    # Final at once (no step will report it): the handlers' checks let none
                    # through that would be, but its client must hear of it either way.
                    self.send(completion, finished_event(request, choice))
                else:
                    self.tracked[request] = (completion, choice)

    def first_budget_refusal(self, made: list[list[Request]]) -> Refused | None:
        """The refusal of the first request no round could ever take, if any."""
        for requests in made:
            for request in requests:
                reason = self.engine.scheduler.refusal(request)
                if reason is not None:
                    return budget_refusal(reason)
        return None

    def make_request(self, completion: Completion, spec: ChoiceSpec) -> Request:
        self.requests_made += 1
        return self.request_maker.make(
            self.requests_made,
            list(spec.prompt_ids),
            spec.params,
            request_id=completion.id,
            sample=spec.sample,
        )

    def run_step(self) -> None:
        """One round, and its news to the handlers.  A round that raises (a fault of the server,
        not of a request) ends every request it held, each told why."""
        try:
            output = self.engine.step()
        except Exception as exc:  # noqa: BLE001 (told to every client, and logged)
            traceback.print_exc(file=sys.stderr)
            self.fail_everything(exc)
            return
        self.deliver(output)
        if output.round_record is not None:
            self.feed.publish(output.round_record)

    def deliver(self, output: StepOutput) -> None:
        """Each new token, then each final record, to its completion's queue."""
        now = time.perf_counter()
        if output.round_number is not None:
            self.metrics.round_ran(len(output.new_tokens))
        for request in output.new_tokens:
            completion, choice = self.tracked[request]
            if len(request.token_ids) == 1:
                # Queued from its arrival to its first round (a chunked prompt's first chunk,
                # which may be rounds before this one): the engine's clock counts from its run's
                # start, on the same perf_counter.
                assert request.admitted_s is not None  # it was admitted, since it got a token
                admitted = self.engine.run_start + request.admitted_s
                waited = admitted - completion.received_s
                self.metrics.first_token(request, now - completion.received_s, waited)
            self.send(completion, token_event(request, choice))
        for request in output.finished:
            entry = self.tracked.pop(request, None)
            if entry is None:
                continue
            completion, choice = entry
            if request.finish_reason == "abort" and not self.accepting:
                # Aborted by the shutdown's deadline: the client is told so.
                request.error = SHUTDOWN_ABORT
            self.metrics.finished(request, now - completion.received_s)
            self.send(completion, finished_event(request, choice))

    def abort_past_deadline(self) -> None:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            self.abort_all()
            self.deadline = None

    def abort_all(self) -> None:
        """Abort every request still held, and tell their handlers now (after Stop, no round
        follows)."""
        for completion_id in {completion.id for completion, _ in self.tracked.values()}:
            self.engine.abort(completion_id)
        if self.engine.has_unfinished():
            # Nothing is left to run: this step only reports the aborts.
            self.deliver(self.engine.step())

    def send(self, completion: Completion, event) -> None:
        """Hand an event to the completion's queue, on its event loop's thread."""
        try:
            completion.loop.call_soon_threadsafe(completion.events.put_nowait, event)
        except RuntimeError:
            # The event loop has closed: nobody is left to read it.
            pass
