"""Who runs in each round: static groups, or continuous batching.

Owns: one scheduler class per policy, behind the small interface that the engine and
`python -m minirt.rounds` both drive:

    refusal(request)  why no round could ever take it, a `Refusal` value (None if one can)
    submit(request)   queue it in arrival order, at any time; nothing else
    remove(request)   take an aborted request out of the queue or the running rows
    has_work()        whether anyone waits or runs
    plan(round)       who runs, who is admitted (each with its KV slot), how far each
                      prefilling row's prompt goes this round, and the KV shape when a group or
                      pool starts or grows (allocated by then)
    note_prefills(plan)  after the round's forward pass: how far each prefilling row's prompt
                      now is in its slot (a prompt all in gives the prefix cache its blocks)
    complete(plan)    after the round: free the rows of finished requests (the static group,
                      once it has ended)
    window_left_s(now, window)  how much longer a new static group waits for members online
                      (a server's --batch-window); continuous batching never waits

and keeps `waiting`, `active_rows` and `held_rows` (rows that ran, and rows whose KV slots were
held, per round: the static group's members, or the continuous pool's rows) and `groups`
(static groups) for reports.  `LongestNeed` keeps the longest KV need in the queue as requests
join and leave it (through `submit` and `leave_queue` alone), so that a round's plan never
passes over a queue of thousands to size the continuous pool.

  StaticScheduler      Fixed groups: when none is running, the next waiting requests in arrival
                       order, up to max_rows and within the KV budget; nobody else until every
                       member has finished.
  ContinuousScheduler  Every round, finished rows are freed and waiting requests admitted
                       (arrival order, skipping any that do not fit) while the rows, the round's
                       token budget (a prefill costs the prompt tokens it feeds, a decode row one
                       token) and the KV budget allow.

Chunked prefill (continuous only, on unless turned off).  The decode rows go first, a token
each; then the rows still prefilling, and then new admissions, take what the round's token
budget leaves, in arrival order: a prompt that does not fit what is left is fed in chunks over
several rounds (vLLM's order).  A row still prefilling gets at least one token a round, so that
its rounds are consecutive; it gets its first token in the round its prompt ends.  Without
chunking, a prompt is fed whole in its first round (and one over the budget is refused); static
groups always prefill in one round, since that is the lesson they teach.

The scheduler owns the KV owner (`self.kv`, minirt/engine/kv_manager.py), as vLLM's scheduler
owns its KV cache manager: a plan that chooses a new KV shape allocates it there, before it asks
what is cached (the manager makes room in the prefix cache first, so what the plan counts on is
still there at admission), and each admitted request takes a slot of it, with the cached start of
its prompt copied in (`KVManager.admit`): a prefill then costs only the rest.  Finished and aborted
requests give their slots back, and a static group's cache goes when the group ends.
Continuous batching also waits for a prefix in flight: a waiting request whose prompt starts with
more whole blocks of a prompt still being fed (running, or admitted this round) than the cache
holds for it is not admitted yet (`KVManager.shared_in_flight`): once that prompt is in, its
blocks are cached and the request prefills only the rest.  A row may stay free a round or two;
the prefill it saves is the shared prefix, computed once instead of once per request (a system
prompt, a document asked about many times).  The wait ends when that prompt is in, which it
always is a round or more later (it is fed at least one token a round).

The continuous pool grows.  Requests may arrive while it runs (`Engine.add_request`), so it
cannot be sized once by the first requests it sees.  It starts as the requests then waiting
need: a row each (up to max_rows, and as many as the KV budget holds), each row as long as the
longest of them needs.  When later requests need more rows or longer rows, the pool is made
larger (the rows at least twofold, within max_rows and the budget), and the KV owner copies the
running requests' slots into it, keeping their numbers; while it does, the old pool and the
new one are both held.  When the pool's rows, at the length a waiting request needs, would not
fit the KV budget, admission pauses until the pool has drained, and the pool is then made anew
at the shape the waiting requests need.  The pool never shrinks while requests run, nor when
it empties with requests still waiting (an offline run's schedule is fixed by its first pool).
Growing beats sizing from the model's context: a pool of max_rows x n_positions would reserve
memory that short requests never use, and could not honour a KV budget smaller than that.

A request reserves its prompt plus every output token but the last (which is never fed back).
When the KV budget holds a new group, or a new or grown pool, below the rows its requests
want, the plan says so (`kv_limited`).

Must not know: models, arrays, sampling or text.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter, deque
from dataclasses import dataclass, field

from .kv_manager import KVManager
from .request import KV_BUDGET, ROUND_TOKENS, Refusal, Request, Status, note_prefill, slot_of


@dataclass
class GroupRecord:
    """What one static group did."""

    number: int  # 1-based
    members: list[Request]
    first_round: int
    last_round: int = 0
    active_rows: list[int] = field(default_factory=list)  # per round of this group


@dataclass(frozen=True)
class KVShape:
    """The shape of a KV cache: rows (one slot each) and positions per row."""

    rows: int
    capacity: int


@dataclass
class RoundPlan:
    """Who runs in one round."""

    round_number: int
    # Every row that runs, in row order (the admitted ones included).
    active: list[Request]
    # Those whose prefill is this round.
    admitted: list[Request]
    # A new group or pool starts, or the pool grows: allocate the KV cache at this shape.
    kv_shape: KVShape | None = None
    # The KV budget held that new group or pool below max_rows.
    kv_limited: bool = False
    # Each row that feeds prompt tokens this round, and the prompt position its feeding ends at
    # (its prompt's length, unless the prefill is chunked); the other rows decode a token.
    prefill_to: dict[Request, int] = field(default_factory=dict)


class LongestNeed:
    """The longest KV need among the requests in a queue, kept as requests join and leave it,
    so that planning a round does not pass over the whole queue (a server or an offline run
    may queue thousands).  A max-heap of needs (negated, for heapq's min-heap) beside a count of
    the queued requests at each need: an entry whose need no queued request has any more is
    dropped when it reaches the top."""

    def __init__(self) -> None:
        self.heap: list[int] = []
        self.queued: Counter[int] = Counter()

    def add(self, need: int) -> None:
        if self.queued[need] == 0:
            heapq.heappush(self.heap, -need)
        self.queued[need] += 1

    def discard(self, need: int) -> None:
        assert self.queued[need] > 0, "a need that no queued request has"
        self.queued[need] -= 1

    def longest(self) -> int:
        """The longest need queued (the queue must not be empty)."""
        while self.queued[-self.heap[0]] == 0:
            heapq.heappop(self.heap)
        return -self.heap[0]


def mark_admitted(request: Request, group: int | None, round_number: int) -> None:
    """Stamp the request as running from this round on (its first round is its prefill)."""
    request.status = Status.RUNNING
    request.group = group
    request.first_round = round_number
    # The rounds that ran between its arrival and its first round.
    request.rounds_waited = round_number - 1 - request.arrival_round


class Scheduler:
    """What both policies share: the queue, the KV reservation rule, the rows per round."""

    policy = ""

    def __init__(
        self,
        max_rows: int,
        kv_budget_positions: int,
        n_positions: int,
        round_token_budget: int | None = None,
        chunked_prefill: bool = False,
        kv: KVManager | None = None,
    ):
        """`kv`: the KV owner of the run (the engine's, whose cache holds numbers); by default one
        of positions alone, with no prefix cache, for a scheduler that only plans."""
        self.max_rows = max_rows
        self.kv_budget = kv_budget_positions
        self.n_positions = n_positions
        # Tokens one round may process (continuous batching only).
        self.token_budget = round_token_budget
        # Continuous batching: may a prompt be fed over several rounds?
        self.chunked_prefill = chunked_prefill
        # The KV budget's owner: the cache, its slots and the prefix cache.
        self.kv = kv if kv is not None else KVManager(kv_budget_positions)
        assert self.kv.budget_positions == kv_budget_positions
        self.waiting: deque[Request] = deque()
        # The longest KV need in `waiting`: requests join and leave the queue through `submit`
        # and `leave_queue` alone, which keep it.
        self.waiting_need = LongestNeed()
        self.running: list[Request] = []
        # Per round: rows that ran, and rows whose KV slots were held (utilization: active / held).
        self.active_rows: list[int] = []
        self.held_rows: list[int] = []
        # Static: every group so far (continuous batching has none).
        self.groups: list[GroupRecord] = []

    def kv_positions_needed(self, request: Request) -> int:
        """KV positions a request reserves: its prompt plus every output token but the last."""
        prompt_len = request.prompt_len
        wanted = prompt_len + request.params.max_tokens - 1
        return min(max(wanted, prompt_len), self.n_positions)

    def refusal(self, request: Request) -> Refusal | None:
        """Why no round could ever take this request (a value: its `message` words it), or None
        when one could: over the KV budget (it is max_tokens that the caller lowers)."""
        needed = self.kv_positions_needed(request)
        if needed > self.kv_budget:
            return Refusal(KV_BUDGET, "max_tokens", needed=needed, limit=self.kv_budget)
        return None

    def submit(self, request: Request) -> None:
        self.waiting.append(request)
        self.waiting_need.add(self.kv_positions_needed(request))

    def leave_queue(self, request: Request) -> None:
        """Take a waiting request out of the queue (admitted, or aborted)."""
        self.waiting.remove(request)
        self.waiting_need.discard(self.kv_positions_needed(request))

    def remove(self, request: Request) -> GroupRecord | None:
        """An aborted (already finished) request leaves the queue, or its running row (policy
        by policy), and gives its KV slot back.  Returns the static group that this ends, if it
        was its last member."""
        if request in self.waiting:
            self.leave_queue(request)
        self.kv.free(request)
        return None

    def admit(self, requests: list[Request], group: int | None, round_number: int) -> None:
        """Stamp each as running from this round on, each in a KV slot of its own."""
        for request in requests:
            mark_admitted(request, group, round_number)
            self.kv.admit(request)

    def note_prefills(self, plan: RoundPlan) -> None:
        """After the round's forward pass: each prefilling row's slot holds its prompt up to
        the plan's end; a row whose whole prompt is now in gives the prefix cache its blocks, in
        slot order (as the round's rows run: which blocks a full cache keeps can depend on it)."""
        for request in sorted(plan.prefill_to, key=slot_of):
            note_prefill(request, plan.prefill_to[request])
            if request.prompt_done:
                self.kv.insert_prompt(request)

    def plan(self, round_number: int) -> RoundPlan:
        """Who runs in this round: each policy says."""
        raise NotImplementedError

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def window_left_s(self, now_s: float, window_s: float) -> float:
        """How much longer the next round should wait for more requests to batch (0.0: run it
        now), at `now_s` seconds into the run, with a batch window of `window_s` (a server's
        --batch-window): only a static group waits (below); continuous batching never does."""
        return 0.0

    def complete(self, plan: RoundPlan) -> GroupRecord | None:
        """After the round: count its rows; finished requests give their KV slots back, and
        their rows (each policy)."""
        self.active_rows.append(len(plan.active))
        self.held_rows.append(self.rows_held())
        for request in plan.active:
            if request.finished:
                self.kv.free(request)
        return None

    def rows_held(self) -> int:
        """Rows whose KV slots this round held: each policy says."""
        raise NotImplementedError


class StaticScheduler(Scheduler):
    policy = "static"

    def plan(self, round_number: int) -> RoundPlan:
        if self.running:
            # A group is running: its unfinished members, and nobody else.
            unfinished = [r for r in self.running if not r.finished]
            return RoundPlan(round_number, active=unfinished, admitted=[])
        members, kv_limited = self.choose_group()
        group = GroupRecord(number=len(self.groups) + 1, members=members, first_round=round_number)
        self.groups.append(group)
        # One slot per member, each as long as the longest member needs.
        longest = max(self.kv_positions_needed(r) for r in members)
        shape = KVShape(rows=len(members), capacity=longest)
        self.kv.allocate(shape.rows, shape.capacity)
        self.admit(members, group.number, round_number)
        self.running = list(members)
        # The whole group prefills in its first round.
        prefill_to = {r: r.prompt_len for r in members}
        return RoundPlan(round_number, list(members), list(members), shape, kv_limited, prefill_to)

    def remove(self, request: Request) -> GroupRecord | None:
        """A running member that is aborted keeps its row until the group ends, as a finished
        one does; if it was the last unfinished member, the group ends now."""
        super().remove(request)
        if request not in self.running or not all(r.finished for r in self.running):
            return None
        group = self.groups[-1]
        # The last round the group ran.
        group.last_round = group.first_round + len(group.active_rows) - 1
        self.end_group()
        return group

    def end_group(self) -> None:
        """The group is over: its rows and its KV cache go (only now may the next start)."""
        self.running = []
        self.kv.release()

    def rows_held(self) -> int:
        # A member's slot is held until its whole group ends.
        return len(self.groups[-1].members)

    def choose_group(self) -> tuple[list[Request], bool]:
        """Arrival order, up to max_rows, while members x the longest need fits the KV budget."""
        count, kv_limited = self.next_group_size()
        members = list(itertools.islice(self.waiting, count))
        for member in members:
            self.leave_queue(member)
        return members, kv_limited

    def next_group_size(self) -> tuple[int, bool]:
        """How many of the waiting requests the next group would take now, and whether the KV
        budget (not max_rows or the queue) stops it there.  Changes nothing."""
        count = 0
        longest = 0
        for candidate in self.waiting:
            if count == self.max_rows:
                break
            longest_with_it = max(longest, self.kv_positions_needed(candidate))
            if count and (count + 1) * longest_with_it > self.kv_budget:
                # Full by memory: the candidate heads the next group.
                return count, True
            count += 1
            longest = longest_with_it
        return count, False

    def window_left_s(self, now_s: float, window_s: float) -> float:
        """A new static group waits for members until `window_s` after its first waiting
        request arrived, while no group runs and the waiting requests do not fill it (by rows or
        by the KV budget): once it starts, nobody joins until it ends."""
        if window_s <= 0 or self.running or not self.waiting:
            return 0.0
        if self.next_group_is_full():
            # Full by rows, or by memory: waiting longer could add nobody.
            return 0.0
        first_arrival = self.waiting[0].arrival_s or 0.0
        waited = now_s - first_arrival
        return max(0.0, window_s - waited)

    def next_group_is_full(self) -> bool:
        """Whether waiting longer could add no member to the next group: it has max_rows, or
        the KV budget holds no more (later arrivals queue behind the one that does not fit)."""
        count, kv_limited = self.next_group_size()
        return kv_limited or count >= self.max_rows

    def complete(self, plan: RoundPlan) -> GroupRecord | None:
        """Returns the group when its last member has just finished: only then may the next
        one start."""
        super().complete(plan)
        group = self.groups[-1]
        group.active_rows.append(len(plan.active))
        if all(r.finished for r in group.members):
            group.last_round = plan.round_number
            self.end_group()
            return group
        return None


class ContinuousScheduler(Scheduler):
    policy = "continuous"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # The KV pool's shape: made when the first round is planned, grown as requests come.
        self.pool: KVShape | None = None
        # True while admission waits for the pool to empty, so that it can be made anew.
        self.draining = False

    def refusal(self, request: Request) -> Refusal | None:
        """Also a prompt over the round's token budget, when its prefill may not be chunked."""
        too_big = super().refusal(request)
        over_round = self.token_budget is not None and request.prompt_len > self.token_budget
        if too_big is None and over_round and not self.chunked_prefill:
            assert self.token_budget is not None  # over_round says so
            return Refusal(
                ROUND_TOKENS, "prompt", needed=request.prompt_len, limit=self.token_budget
            )
        return too_big

    def remove(self, request: Request) -> GroupRecord | None:
        super().remove(request)
        if request in self.running:
            self.running.remove(request)
        return None

    def shape_for(self, requests: list[Request]) -> tuple[KVShape, bool]:
        """The pool these requests need, and whether the KV budget (not their number) held its
        rows below max_rows: a row each, up to max_rows and as many as the budget holds at the
        longest need, each row as long as that need."""
        longest = max(self.kv_positions_needed(r) for r in requests)
        wanted_rows = min(self.max_rows, len(requests))
        rows = max(1, min(wanted_rows, self.kv_budget // longest))
        return KVShape(rows=rows, capacity=longest), rows < wanted_rows

    def next_pool(self) -> tuple[KVShape | None, bool]:
        """(the pool's new shape, or None if it stays; whether the budget held it down)."""
        self.draining = False
        if self.pool is None:
            return self.shape_for(list(self.waiting))
        longest_waiting = self.waiting_need.longest()
        capacity = max(self.pool.capacity, longest_waiting)
        wanted_rows = min(self.max_rows, len(self.running) + len(self.waiting))
        rows_in_budget = max(1, self.kv_budget // capacity)
        if capacity > self.pool.capacity and rows_in_budget < self.pool.rows:
            # Longer rows do not fit the budget beside the rows it has: drain, then make anew.
            self.draining = bool(self.running)
            if self.draining:
                return None, False
            return self.shape_for(list(self.waiting))
        rows = min(wanted_rows, rows_in_budget)
        if rows > self.pool.rows:
            # Grow the rows at least twofold (within max_rows and the budget), so that a stream
            # of arrivals reallocates the pool a few times, not once per request.
            rows = min(max(rows, 2 * self.pool.rows), self.max_rows, rows_in_budget)
        # Never fewer rows than it has: running requests hold slots by number.
        rows = max(rows, self.pool.rows)
        grown = KVShape(rows=rows, capacity=capacity)
        if grown == self.pool:
            return None, False
        return grown, rows_in_budget < wanted_rows

    def plan(self, round_number: int) -> RoundPlan:
        shape = None
        kv_limited = False
        if self.waiting:
            shape, kv_limited = self.next_pool()
        if shape is not None:
            self.kv.allocate(shape.rows, shape.capacity)
            self.pool = shape
        prefill_to: dict[Request, int] = {}
        tokens = self.running_tokens(prefill_to)
        admitted = self.admissions(tokens, prefill_to)
        for request in admitted:
            self.leave_queue(request)
        self.admit(admitted, None, round_number)
        self.running += admitted
        return RoundPlan(round_number, list(self.running), admitted, shape, kv_limited, prefill_to)

    def running_tokens(self, prefill_to: dict[Request, int]) -> int:
        """This round's tokens of the rows already running: the decode rows first, one each;
        then each row still prefilling (a chunked prompt) its next chunk, as much of the budget
        as is left, at least one token.  Their chunks go into `prefill_to`."""
        decoding = [r for r in self.running if r.prompt_done]
        tokens = len(decoding)
        for request in self.running:
            if request.prompt_done:
                continue
            chunk = max(1, self.prompt_chunk(request.prompt_len - request.prefilled, tokens))
            prefill_to[request] = request.prefilled + chunk
            tokens += chunk
        return tokens

    def admissions(self, tokens: int, prefill_to: dict[Request, int]) -> list[Request]:
        """Waiting requests that fit beside the running ones this round, in arrival order; one
        that does not fit is skipped, not blocking (none while the pool drains).  `tokens`: what
        the running rows take of the round's budget.  Each admitted prompt's end this round goes
        into `prefill_to`."""
        assert self.pool is not None  # made in the first round's plan
        if self.draining:
            return []
        # KV positions held by running requests.
        reserved = sum(self.kv_positions_needed(r) for r in self.running)
        admitted: list[Request] = []
        for candidate in self.waiting:
            if len(self.running) + len(admitted) >= self.pool.rows:
                break
            # A request needing longer rows than the pool has waits for it to grow.
            needed = self.kv_positions_needed(candidate)
            if needed > self.pool.capacity or reserved + needed > self.kv_budget:
                continue
            # Its prompt after what the prefix cache holds of it.
            start = self.kv.cached_tokens(candidate)
            in_flight = [r for r in self.running if not r.prompt_done] + admitted
            if self.kv.shared_in_flight(candidate, in_flight) > start:
                # More of its prefix is on its way into the cache: it waits for it.
                continue
            chunk = self.prompt_chunk(candidate.prompt_len - start, tokens)
            if chunk == 0:
                continue
            reserved += needed
            tokens += chunk
            prefill_to[candidate] = start + chunk
            admitted.append(candidate)
        return admitted

    def prompt_chunk(self, remaining: int, tokens: int) -> int:
        """How many of a prompt's `remaining` tokens this round can feed, with `tokens` of its
        budget taken: all of them if they fit; else, chunked, what is left, and unchunked none
        (the prompt waits for a round with room)."""
        if self.token_budget is None:
            return remaining
        left = max(0, self.token_budget - tokens)
        if remaining <= left:
            return remaining
        if self.chunked_prefill:
            return left
        return 0

    def rows_held(self) -> int:
        assert self.pool is not None  # made in the first round's plan
        # The pool's rows, each with its slot, from the first round to the last.
        return self.pool.rows

    def complete(self, plan: RoundPlan) -> GroupRecord | None:
        """Finished requests leave at once: their rows take waiting requests next round."""
        super().complete(plan)
        self.running = [r for r in self.running if not r.finished]
        return None


SCHEDULERS: dict[str, type[Scheduler]] = {
    "static": StaticScheduler,
    "continuous": ContinuousScheduler,
}
POLICIES = tuple(SCHEDULERS)
