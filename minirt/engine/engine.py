"""The engine: requests in at any time, one round per `step()`, results out.

Owns: a request's way through the runtime, in one place.  It takes requests of token ids, made
outside it (minirt/request_maker.py: a bad one comes back failed, with an error of its own), and
a detokenizer for their text (minirt/engine/detokenizer.py).  Then the calls, the interface
online serving needs:

    add_request(request)  queue it, at any time, also while others run; a request no round
                          could ever take fails at once
    add_requests(requests)  queue all of them or none: the `Refusal` of the first no round
                          could take (a server's client, minirt/engine/client.py, uses this)
    step()                run one round and return what it produced (`StepOutput`)
    abort(request_id)     end a waiting or running request, whose finish_reason is "abort":
                          it leaves the compute before the next round and frees its KV slot
    has_unfinished()      whether any request waits or runs

One step is one round, plan -> run -> update (nano-vllm's schedule -> run -> postprocess):

    plan                 who runs (the scheduler, minirt/engine/scheduler.py: static groups or
                         continuous batching); a new group, or a new or grown pool, gets its
                         KV cache from the scheduler's KV owner (minirt/engine/kv_manager.py),
                         and each admitted request a slot of its own, zeroed, with the start of
                         its prompt copied in when the prefix cache holds it
    admit                each admitted request's time, its text decoder and, if it asked for
                         prompt logprobs, the scoring pass of its prompt (one pass for the
                         requests of one prompt queued or running together: a completion's n
                         choices)
    run                  the model runner (minirt/engine/runner.py): each active row's new
                         tokens (its prompt, or the chunk of it the plan gives; else its last
                         token), its slot and the keys it holds, the rows in slot order (a
                         full cache is then read as one view); one forward pass
    prefill done         each row whose prompt is now all in its slot gives the prefix cache
                         its blocks (the scheduler)
    pick tokens          each row whose prompt is in picks its token from its own logits and
                         its own stream, appends it and checks its own stop rules (a row fed
                         a chunk that does not end its prompt gets no token this round)
    free finished rows   a finished request leaves the compute and frees its slot; a static
                         group that has ended releases its cache (only now may the next start)
    record               what the round did, row by row (`StepOutput.round_record`): the round
                         grid of minirt/engine/round_record.py, for whoever draws it

An offline run (`LLM.generate`, `minirt generate`) is the loop over `step()` in minirt/llm.py
(`run_steps`): `offline_run(requests)` holds the engine and adds every request, then the loop
steps while any is unfinished.  A run ends when that loop ends (or is interrupted), or when a
round raises: the engine then starts a new one, with round numbers from 1 again.  Rounds are
numbered across a run; a request that produces L tokens is active in L consecutive rounds, the
first being its prefill (and in C - 1 more before them when its prefill was chunked into C
rounds).  A finished request costs no compute later and never stops or alters the others.

Must not know: the layers' arithmetic, text on the way in (tokenizing, prompts), files,
command-line flags or output formats.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from ..errors import ReentryError, RequestError, require_at_least_one
from ..model.kv_cache import KVCache
from .detokenizer import Detokenizer
from .kv_manager import KVManager
from .prefix_cache import PrefixCache
from .request import Refusal, Request, Status, abort_request, fail_request
from .round_record import RoundRecord, record_round
from .runner import Runner
from .scheduler import POLICIES, SCHEDULERS, GroupRecord, RoundPlan, Scheduler
from .stats import RunStats

DEFAULT_KV_BUDGET_MIB = 4096
# Continuous batching: tokens one round may process (a prefill counts its whole prompt).
DEFAULT_ROUND_TOKENS = 2048


@dataclass
class StepOutput:
    """What one round produced."""

    # The round's number within the run; None when no round ran (nobody waited or ran).
    round_number: int | None
    # Every request that produced a token this round, in row order: its newest token is
    # `request.token_ids[-1]`.
    new_tokens: list[Request] = field(default_factory=list)
    # Every request whose record became final since the last step: aborted ones first, then
    # those that stopped, ran out or failed in this round (in row order).
    finished: list[Request] = field(default_factory=list)
    # The static groups that ended: by an abort since the last step, or in this round.
    ended_groups: list[GroupRecord] = field(default_factory=list)
    # What the round did, row by row (minirt/engine/round_record.py); None when no round ran.
    round_record: RoundRecord | None = None
    # When a static group ended in this round: every request then waiting, in order (what the
    # next group forms from); else empty.
    waiting: list[Request] = field(default_factory=list)


@dataclass
class ScoredPrompt:
    """The unfinished requests that want one prompt's logprobs (queued or running), and those
    logprobs once the first of them is admitted (None from a runner without a model)."""

    holders: list[Request] = field(default_factory=list)
    scored: bool = False
    logprobs: list[float | None] | None = None


class Engine:
    """Serves requests on one model, in static groups or with continuous batching."""

    def __init__(
        self,
        runner: Runner,
        detokenizer: Detokenizer | None,
        batch_size: int = 8,
        kv_budget_mib: float = DEFAULT_KV_BUDGET_MIB,
        policy: str = "static",
        round_token_budget: int = DEFAULT_ROUND_TOKENS,
        kv_budget_tokens: int | None = None,
        prefix_cache: bool = False,
        chunked_prefill: bool = True,
        round_records: bool = True,
    ):
        """`runner` computes the rounds (a `ModelRunner` of a model, or a model-free one);
        `detokenizer` turns tokens into text (None: token ids only), and its EOS ids, when it
        has any, are what stop a request.  The KV budget is `kv_budget_mib` of memory, or
        `kv_budget_tokens` positions (one token's keys and values in every layer) when that is
        given.  `prefix_cache`: reuse the keys and values of prompt prefixes across requests
        (and runs), within that budget (off by default: its copies cost a few percent where no
        prompt shares a prefix, as docs/performance.md measures); `chunked_prefill`: continuous
        batching may feed a long prompt over several rounds; `round_records`: each step's output
        carries its round's record (`StepOutput.round_record`, for a round grid), which a run
        that shows no grid (`minirt rounds`, a replay) may spare itself."""
        if policy not in POLICIES:
            choices = ", ".join(POLICIES)
            raise RequestError(f"unknown policy {policy!r}: choose one of {choices}")
        self.batch_size = require_at_least_one(batch_size, "batch size")
        self.round_token_budget = require_at_least_one(round_token_budget, "the round token budget")
        # The forward pass and the picking of tokens, round by round (it stops a request at EOS).
        self.runner = runner
        self.detokenizer = detokenizer
        self.round_records = round_records
        if detokenizer is not None:
            # The tokenizer's EOS ids (which may be its <|endoftext|> where the config has none).
            runner.eos_token_ids = tuple(detokenizer.eos_token_ids)
        self.policy = policy
        self.kv_bytes_per_position = runner.kv_bytes_per_position
        self.kv_budget_positions = self.budget_in_positions(kv_budget_mib, kv_budget_tokens)
        # Held while an offline run goes (`offline_run`) or `step` runs a round (and while
        # `start_run` starts one), so that a callback or another thread cannot start a second
        # run, or step this one behind its back: taken without waiting, or a ReentryError.
        self.busy = threading.Lock()
        # Runs are numbered across the engine's life (round numbers start again in each).
        self.run_number = 0
        self.chunked_prefill = chunked_prefill
        # Kept across runs: a prefix cached by one run serves the next.
        self.prefix_cache: PrefixCache | None = PrefixCache() if prefix_cache else None
        self.reset_run()

    def budget_in_positions(self, kv_budget_mib: float, kv_budget_tokens: int | None) -> int:
        """The KV budget in positions: `kv_budget_tokens`, or what `kv_budget_mib` holds."""
        # A number of MiB: inf and NaN are refused too.
        is_number = isinstance(kv_budget_mib, (int, float, np.number))
        if not is_number or not 0 < kv_budget_mib < 2**40:
            raise RequestError(
                f"the KV budget must be a positive number of MiB below 2**40, got {kv_budget_mib!r}"
            )
        if kv_budget_tokens is None:
            return int(kv_budget_mib * 2**20) // self.kv_bytes_per_position
        return require_at_least_one(kv_budget_tokens, "the KV budget in tokens")

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """The end-of-text tokens that stop a request (unless it ignores EOS): the runner's."""
        return self.runner.eos_token_ids

    @eos_token_ids.setter
    def eos_token_ids(self, tokens: tuple[int, ...]) -> None:
        self.runner.eos_token_ids = tuple(tokens)

    @property
    def eos_token_id(self) -> int | None:
        """The primary end-of-text token (the first of `eos_token_ids`), the one reports name;
        setting it makes it the only one."""
        ids = self.runner.eos_token_ids
        return ids[0] if ids else None

    @eos_token_id.setter
    def eos_token_id(self, token: int | None) -> None:
        self.runner.eos_token_ids = () if token is None else (token,)

    # ------------------------------------------------------------------ a run

    def start_run(self) -> None:
        """A new run, for a caller that steps the engine itself: see `reset_run`.  Refused while
        the engine serves a run or a round."""
        with self.held_for("Engine.start_run"):
            self.reset_run()

    def reset_run(self) -> None:
        """A new run: a fresh queue, round numbers from 1, counts from 0, times from now."""
        self.run_number += 1
        self.scheduler: Scheduler = SCHEDULERS[self.policy](
            self.batch_size,
            self.kv_budget_positions,
            self.runner.n_positions,
            self.round_token_budget,
            chunked_prefill=self.chunked_prefill,
            kv=KVManager(self.kv_budget_positions, self.runner.new_kv_cache, self.prefix_cache),
        )
        # The run's counts; the scheduler's per-round lists grow as it runs.
        self.stats = RunStats(
            batch_size=self.batch_size,
            policy=self.policy,
            groups=self.scheduler.groups,
            active_rows_per_round=self.scheduler.active_rows,
            held_rows_per_round=self.scheduler.held_rows,
        )
        self.round_number = 0
        # Requests' times count from the run's start.
        self.run_start = time.perf_counter()
        # Aborted requests, and static groups their abort ended, for the next step to report.
        self.aborted_since_step: list[Request] = []
        self.groups_ended_by_abort: list[GroupRecord] = []
        # Prompt logprobs by prompt, kept while a request that wants them is unfinished.
        self.scored_prompts: dict[tuple[int, ...], ScoredPrompt] = {}

    def forget_history(self) -> None:
        """Drop what a run keeps only for its reports: the rows each round ran and held, the
        times to first token, the KV-limited rows, and the member lists of static groups that
        have ended.  A run that never ends (a server that is never idle) calls this now and
        then, so that it does not grow; counts, round numbers and the running group stay."""
        del self.scheduler.active_rows[:]
        del self.scheduler.held_rows[:]
        del self.stats.first_token_seconds[:]
        del self.stats.kv_limited_rows[:]
        running = set(map(id, self.scheduler.running))
        for group in self.scheduler.groups:
            if not any(id(member) in running for member in group.members):
                group.members = []
                group.active_rows = []

    @property
    def kv_cache(self) -> KVCache | None:
        """The running group's (or the continuous pool's) KV buffers, held by the scheduler's KV
        owner (None between groups)."""
        return self.scheduler.kv.cache  # type: ignore[return-value]

    @property
    def free_slots(self) -> list[int]:
        """The slots of that cache no running request holds."""
        return self.scheduler.kv.free_slots

    def seconds(self) -> float:
        """Seconds since the run started."""
        return time.perf_counter() - self.run_start

    def check_new(self, request: Request) -> None:
        """A request may be added once: made by a RequestMaker (perhaps failed already), and
        not yet queued, run or finished by a run."""
        if request.status is Status.RUNNING:
            # Half-served by an interrupted run: its slot is gone.
            raise RequestError(
                f"request {request.index} has already started running; make it anew to rerun it"
            )
        if request.finish_s is not None or request.arrival_s is not None:
            raise RequestError(
                f"request {request.index} was added to a run already; make it anew to run it again"
            )

    def add_request(
        self, request: Request, arrival_s: float | None = None, arrival_round: int | None = None
    ) -> None:
        """Queue a request, at any time.  One that is already failed, or that no round could
        ever take (over the KV budget, a prompt over the round's token budget: the scheduler's
        refusal, asked once), is final at once, failed with the refusal's message:
        `request.finished` tells the caller, and no step reports it."""
        self.check_new(request)
        if not request.finished:
            refusal = self.scheduler.refusal(request)
            if refusal is not None:
                fail_request(request, refusal.message)
        self.enter(request, arrival_s, arrival_round)

    def add_requests(self, requests: list[Request]) -> Refusal | None:
        """Queue every one of these requests, or none (a server's completion of n choices, or
        several completions that arrive together): the refusal of the first that no round could
        ever take, each asked once, and then nothing is queued; else None, and each is queued as
        `add_request` would (one failed already is final at once)."""
        for request in requests:
            self.check_new(request)
        for request in requests:
            if request.finished:
                continue
            refusal = self.scheduler.refusal(request)
            if refusal is not None:
                return refusal
        for request in requests:
            self.enter(request, None, None)
        return None

    def enter(self, request: Request, arrival_s: float | None, arrival_round: int | None) -> None:
        """Stamp a checked request's arrival and queue it; one that is finished already (failed)
        is counted, and its record is final now."""
        self.stats.requests += 1
        if arrival_s is None:
            arrival_s = self.seconds()
        request.arrival_s = arrival_s
        # Rounds that ran before it arrived: it did not wait through those.  A replay (the Ray
        # path's) may say when it arrived in the run it replays.
        if arrival_round is None:
            arrival_round = self.round_number
        request.arrival_round = arrival_round
        if not request.finished:
            self.scheduler.submit(request)
            if request.params.prompt_logprobs is not None:
                self.hold_prompt(request)
            return
        self.stats.failed += int(request.error is not None)
        request.finish_s = self.seconds()

    def has_unfinished(self) -> bool:
        """Whether a request waits or runs, or an abort is still to be reported by a step."""
        return self.scheduler.has_work() or bool(self.aborted_since_step)

    def abort(self, request_id: str) -> list[Request]:
        """End every unfinished request with this id (a prompt's n samples share one).  Waiting,
        it never runs; running, it leaves the compute before the next round and frees its slot
        (under continuous batching the next admission may take it; a static group holds its
        row until the group ends).  Returns them, finished with finish_reason "abort" ([] when
        no unfinished request has the id); the next step lists them in its `finished` too, so
        that a loop over `step()` hears of every final record once."""
        unfinished = [*self.scheduler.waiting, *self.scheduler.running]
        aborted = [r for r in unfinished if r.id == request_id and not r.finished]
        for request in aborted:
            abort_request(request)
            request.finish_s = self.seconds()
            self.stats.aborted += 1
            self.aborted_since_step.append(request)
            # Its slot goes back; if it was a static group's last member, the group is over,
            # and so is its cache.
            ended_group = self.scheduler.remove(request)
            if ended_group is not None:
                self.groups_ended_by_abort.append(ended_group)
        return aborted

    def step(self) -> StepOutput:
        """Run one round: plan, admit, batch metadata, forward, pick tokens, free finished rows.
        An exception inside a round abandons the run (`start_run`): a half-run round leaves no
        state that a next round could trust.  Refused while an offline run goes (its loop steps
        the engine itself), or while another thread steps."""
        with self.held_for("Engine.step"):
            return self.take_step()

    def take_step(self) -> StepOutput:
        """`step`'s work, for `step` and for the loop of an offline run (`offline_run`), which
        holds the engine already."""
        output = StepOutput(round_number=None)
        output.finished = self.aborted_since_step
        output.ended_groups = self.groups_ended_by_abort
        if output.ended_groups:
            output.waiting = list(self.scheduler.waiting)
        self.aborted_since_step = []
        self.groups_ended_by_abort = []
        self.drop_scored_prompts()
        if not self.scheduler.has_work():
            if output.finished and self.round_records:
                # Aborts that no round follows: the grid still hears that they ended.
                holding = list(self.scheduler.running)
                output.round_record = self.record(holding, [], output.finished, self.kv_rows())
            return output
        try:
            self.run_round(output)
        except BaseException:
            self.reset_run()
            raise
        return output

    def run_round(self, output: StepOutput) -> None:
        """The round itself, its results added to `output`."""
        self.round_number += 1
        plan = self.scheduler.plan(self.round_number)
        # Someone waits or runs, so someone runs: a round of no rows would loop for ever.
        assert plan.active, "the scheduler chose no rows while requests wait"
        self.admit(plan)
        # One forward pass of the active rows (in slot order): logits [B', V] of those that
        # give a token.
        active, logits = self.runner.forward(plan, self.kv_cache)
        # How far each prefilling row's prompt is in (a whole one enters the prefix cache).
        self.scheduler.note_prefills(plan)
        new_tokens = self.runner.pick_tokens(active, logits, self.round_number)
        for request in new_tokens:
            if len(request.token_ids) == 1:
                request.first_token_s = self.seconds()
        # Every request whose row this round's cache held, and the cache's shape, before the
        # scheduler frees any (a static group that ends releases its cache: only then may the
        # next start).
        holding = list(self.scheduler.running)
        kv_rows = self.kv_rows()
        ended_group = self.scheduler.complete(plan)
        finished = self.release_finished(active)
        self.count_round(plan, new_tokens, finished)
        if self.round_records:
            output.round_record = self.record(holding, active, output.finished + finished, kv_rows)
        if ended_group is not None:
            output.ended_groups.append(ended_group)
            output.waiting = list(self.scheduler.waiting)
        output.round_number = self.round_number
        output.new_tokens = new_tokens
        output.finished += finished
        self.drop_scored_prompts()

    @contextmanager
    def offline_run(self, requests: list[Request], call: str) -> Iterator[list[Request]]:
        """Hold the engine for an offline run of these requests, which the caller steps
        (`take_step`) while any is unfinished: the loop of `minirt/llm.py`'s `run_steps`.  It
        starts a new run and adds every request (all there at its start, arrival 0 s): those
        that failed already, then the rest in input order.  Yields those that became final on
        adding (failed already, or no round could ever take them), in that order.  However the
        run ends (an interrupt too), no KV cache outlives it, and the half-served requests of an
        interrupted run cannot resume (adding one again is refused).  `call` names the caller in
        a refusal: the engine is held already (by this run's own callback, or another thread)."""
        with self.held_for(call):
            if self.has_unfinished():
                raise RequestError(
                    "the engine is still serving requests; finish or abort them first"
                )
            for request in requests:
                self.check_new(request)
            self.reset_run()
            try:
                final_at_once = []
                for request in sorted(requests, key=lambda r: not r.finished):
                    self.add_request(request, arrival_s=0.0)
                    if request.finished:
                        final_at_once.append(request)
                yield final_at_once
            finally:
                self.reset_run()

    @contextmanager
    def held_for(self, call: str) -> Iterator[None]:
        """Hold the engine for `call` (an offline run, step, start_run), taking it without
        waiting: a ReentryError if it is held already, by this run's own callback or by another
        thread."""
        if not self.busy.acquire(blocking=False):
            raise self.reentry_error(call)
        try:
            yield
        finally:
            self.busy.release()

    def refuse_reentry(self, call: str) -> None:
        """The same refusal, early, for a caller about to start a run (LLM.generate)."""
        if self.busy.locked():
            raise self.reentry_error(call)

    def reentry_error(self, call: str) -> ReentryError:
        """What a refused call is told."""
        return ReentryError(
            f"{call}() was called while this engine is serving a run or a round (from one of "
            "the run's own callbacks, such as on_token, or from another thread); the run goes on "
            "untouched: call it after the run returns, or use a second LLM"
        )

    # ------------------------------------------------------------------ one round's steps

    def admit(self, plan: RoundPlan) -> None:
        """What the engine adds to an admission (the scheduler gave each admitted request its
        KV slot, with the cached start of its prompt copied in): its time, its prompt scored if
        it asked, its own text decoder."""
        if plan.kv_limited:
            assert plan.kv_shape is not None  # only a new group or pool is limited
            self.stats.kv_limited_rows.append(plan.kv_shape.rows)
        for request in plan.admitted:
            request.admitted_s = self.seconds()
            if request.params.prompt_logprobs is not None:
                self.score_prompt(request)
            if self.detokenizer is not None:
                request.decoder = self.detokenizer.stream(request.prompt_ids)
                request.text = ""
        self.stats.prompt_tokens += sum(r.prompt_len for r in plan.admitted)
        self.stats.cached_prompt_tokens += sum(r.cached_prompt_tokens for r in plan.admitted)

    def hold_prompt(self, request: Request) -> ScoredPrompt:
        """Note a queued request that wants its prompt's logprobs: its prompt's record (made
        now if none is held) is kept until it finishes."""
        scored = self.scored_prompts.setdefault(tuple(request.prompt_ids), ScoredPrompt())
        scored.holders.append(request)
        return scored

    def score_prompt(self, request: Request) -> None:
        """Its prompt logprobs, at admission: a copy of those its prompt's record holds (the
        numbers depend on the prompt alone: a completion's n choices, admitted together or one
        group after another, share one pass), else the runner's scoring pass, kept there."""
        scored = self.scored_prompts.get(tuple(request.prompt_ids)) or self.hold_prompt(request)
        if not scored.scored:
            self.runner.score_prompt(request)
            scored.scored = True
            if request.prompt_logprobs is not None:
                # Its own copy: the request's list is its own to change.
                scored.logprobs = list(request.prompt_logprobs)
        elif scored.logprobs is not None:
            request.prompt_logprobs = list(scored.logprobs)

    def drop_scored_prompts(self) -> None:
        """Forget the finished requests that shared a prompt's logprobs, and the logprobs of a
        prompt whose requests have all finished."""
        for key, scored in list(self.scored_prompts.items()):
            scored.holders = [r for r in scored.holders if not r.finished]
            if not scored.holders:
                del self.scored_prompts[key]

    def release_finished(self, active: list[Request]) -> list[Request]:
        """Each row that finished this round (the scheduler has freed its slot: continuous, the
        next admission takes it) has its record final.  Returns those requests, in row order."""
        finished = [r for r in active if r.finished]
        for request in finished:
            request.finish_s = self.seconds()
        return finished

    def count_round(self, plan: RoundPlan, new_tokens: list[Request], finished: list[Request]):
        """The run's counts after a round."""
        self.stats.rounds = self.round_number
        self.stats.generated_tokens += len(new_tokens)
        self.stats.failed += sum(1 for r in finished if r.error is not None)
        for request in new_tokens:
            if len(request.token_ids) == 1:
                # Its time to first token, from when it arrived.
                arrived = request.arrival_s or 0.0
                assert request.first_token_s is not None  # set with its first token
                self.stats.first_token_seconds.append(request.first_token_s - arrived)
        self.stats.wall_seconds = self.seconds()

    def kv_rows(self) -> tuple[int, int]:
        """(rows, positions per row) of the KV cache allocated now; (0, 0) without one."""
        if self.kv_cache is None:
            return 0, 0
        return len(self.kv_cache.lengths), self.kv_cache.capacity

    def record(self, holding, active, finished, kv_rows: tuple[int, int]) -> RoundRecord:
        """The round's record: who held each row of its cache (`kv_rows`: its rows and
        positions per row), who ran, who waits.  Without a cache (aborts reported by a step
        that ran no round), it holds no row."""
        rows, positions_per_row = kv_rows
        return record_round(
            run=self.run_number,
            round_number=self.round_number,
            ran_round=bool(active),
            seconds=self.seconds(),
            rows=rows,
            positions_per_row=positions_per_row,
            kv_budget_positions=self.kv_budget_positions,
            holding=holding,
            active=active,
            waiting=self.scheduler.waiting,
            finished=finished,
        )
