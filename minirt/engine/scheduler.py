"""Who runs in each round: static groups, or continuous batching.

Owns: one scheduler class per policy, behind the small interface that the engine and
`python -m minirt.rounds` both drive:

    refusal(request)  why no round could ever take it (None if one can)
    submit(request)   queue it in arrival order; nothing else
    has_work()        whether anyone waits or runs
    plan(round)       who runs, who is admitted, and the KV shape (rows x positions) when a group or pool starts
    complete(plan)    after the round: free the rows of finished requests (the static group, once it has ended)
and keeps `waiting`, `active_rows` and `held_rows` (rows that ran, and rows whose KV slots were held, per round:
the static group's members, or the continuous pool's rows) and `groups` (static groups) for reports.

  StaticScheduler      Fixed groups: when none is running, the next waiting requests in arrival order, up to
                       max_rows and within the KV budget; nobody else until every member has finished.
  ContinuousScheduler  Every round, finished rows are freed and waiting requests admitted (arrival order,
                       skipping any that do not fit) while the rows, the round's token budget (a prefill costs
                       its prompt, a decode row one token) and the KV budget allow.  Its pool gives every row
                       a slot as long as the longest need, and has no more rows than requests (the budget may cap them).

A request reserves its prompt plus every output token but the last (which is never fed back).  When the KV
budget holds a group or the pool below max_rows, the plan says so (`kv_limited`).

Must not know: models, arrays, sampling or text.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .request import Request, Status


@dataclass
class GroupRecord:
    """What one static group did."""

    number: int  # 1-based
    members: list[Request]
    first_round: int
    last_round: int = 0
    active_rows: list[int] = field(default_factory=list)  # per round of this group


@dataclass
class RoundPlan:
    """Who runs in one round."""

    round_number: int
    active: list[Request]  # every row that runs, in row order; admitted ones included
    admitted: list[Request]  # those whose prefill is this round
    new_kv: tuple[int, int] | None = (
        None  # (rows, positions per row): a new group or pool starts; allocate it
    )
    kv_limited: bool = False  # the KV budget held that new group or pool below max_rows


def mark_admitted(request: Request, group: int | None, round_number: int) -> None:
    """Stamp the request as running from this round on (its first round is its prefill)."""
    request.status, request.group = Status.RUNNING, group
    request.first_round, request.rounds_waited = round_number, round_number - 1


class Scheduler:
    """What both policies share: the queue, the KV reservation rule, and the count of active rows per round."""

    policy = ""

    def __init__(
        self,
        max_rows: int,
        kv_budget_positions: int,
        n_positions: int,
        round_token_budget: int | None = None,
    ):
        self.max_rows = max_rows
        self.kv_budget = kv_budget_positions
        self.n_positions = n_positions
        self.token_budget = (
            round_token_budget  # tokens one round may process (continuous batching only)
        )
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.active_rows: list[int] = []  # rows that ran, per round
        self.held_rows: list[
            int
        ] = []  # rows whose KV slots were held, per round (utilization: active / held)
        self.groups: list[
            GroupRecord
        ] = []  # static: every group so far (continuous batching has none)

    def kv_positions_needed(self, request: Request) -> int:
        """KV positions a request reserves: its prompt plus every output token but the last."""
        prompt_len = request.prompt_len
        return min(
            max(prompt_len + request.params.max_new_tokens - 1, prompt_len), self.n_positions
        )

    def refusal(self, request: Request) -> str | None:
        if self.kv_positions_needed(request) > self.kv_budget:
            return (
                f"needs {self.kv_positions_needed(request)} KV cache positions, over the budget of {self.kv_budget}; "
                "lower max_new_tokens or raise the KV budget"
            )
        return None

    def submit(self, request: Request) -> None:
        self.waiting.append(request)

    def plan(self, round_number: int) -> RoundPlan:
        """Who runs in this round: each policy says."""
        raise NotImplementedError

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def complete(self, plan: RoundPlan) -> GroupRecord | None:
        """After the round: count its rows; finished requests give up their rows (policy by policy)."""
        self.active_rows.append(len(plan.active))
        self.held_rows.append(self.rows_held())
        return None

    def rows_held(self) -> int:
        """Rows whose KV slots this round held: each policy says."""
        raise NotImplementedError


class StaticScheduler(Scheduler):
    policy = "static"

    def plan(self, round_number: int) -> RoundPlan:
        if self.running:  # a group is running: its unfinished members, and nobody else
            return RoundPlan(
                round_number, active=[r for r in self.running if not r.finished], admitted=[]
            )
        members, kv_limited = self.choose_group()
        group = GroupRecord(number=len(self.groups) + 1, members=members, first_round=round_number)
        self.groups.append(group)
        for request in members:
            mark_admitted(request, group.number, round_number)
        self.running = list(members)
        new_kv = (
            len(members),
            max(self.kv_positions_needed(r) for r in members),
        )  # one slot per member, each the longest need
        return RoundPlan(round_number, list(members), list(members), new_kv, kv_limited)

    def rows_held(self) -> int:
        return len(self.groups[-1].members)  # a member's slot is held until its whole group ends

    def choose_group(self) -> tuple[list[Request], bool]:
        """Arrival order, up to max_rows, while members x the longest member's need fits the KV budget."""
        members: list[Request] = []
        longest = 0
        while self.waiting and len(members) < self.max_rows:
            candidate = self.waiting[0]
            if (
                members
                and (len(members) + 1) * max(longest, self.kv_positions_needed(candidate))
                > self.kv_budget
            ):
                return members, True  # full by memory: the candidate heads the next group
            members.append(self.waiting.popleft())
            longest = max(longest, self.kv_positions_needed(candidate))
        return members, False

    def complete(self, plan: RoundPlan) -> GroupRecord | None:
        """Returns the group when its last member has just finished: only then may the next one start."""
        super().complete(plan)
        group = self.groups[-1]
        group.active_rows.append(len(plan.active))
        if all(r.finished for r in group.members):
            group.last_round, self.running = plan.round_number, []
            return group
        return None


class ContinuousScheduler(Scheduler):
    policy = "continuous"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pool: tuple[int, int] | None = (
            None  # (rows, positions per row), fixed when the first round is planned
        )

    def refusal(self, request: Request) -> str | None:
        too_big = super().refusal(request)
        if (
            too_big is None
            and self.pool is not None
            and self.kv_positions_needed(request) > self.pool[1]
        ):
            return f"needs {self.kv_positions_needed(request)} KV cache positions, more than each slot of the running pool holds"
        if (
            too_big is None
            and self.token_budget is not None
            and request.prompt_len > self.token_budget
        ):
            return (
                f"its prompt of {request.prompt_len} tokens exceeds the round token budget of "
                f"{self.token_budget}; raise the budget"
            )
        return too_big

    def plan(self, round_number: int) -> RoundPlan:
        new_kv, kv_limited = None, False
        if (
            self.pool is None
        ):  # rows: as many as fit the budget at the longest need, never more than wait
            longest = max(self.kv_positions_needed(r) for r in self.waiting)
            rows = max(1, min(self.max_rows, len(self.waiting), self.kv_budget // longest))
            self.pool = new_kv = (rows, longest)
            kv_limited = rows < min(
                self.max_rows, len(self.waiting)
            )  # the budget, not the queue, held it down
        reserved = sum(
            self.kv_positions_needed(r) for r in self.running
        )  # KV positions held by running requests
        tokens = len(self.running)  # each running request decodes one token
        admitted: list[Request] = []
        for candidate in list(
            self.waiting
        ):  # arrival order; one that does not fit is skipped, not blocking
            if len(self.running) + len(admitted) >= self.pool[0]:
                break
            if self.fits(candidate, reserved, tokens):
                reserved, tokens = (
                    reserved + self.kv_positions_needed(candidate),
                    tokens + candidate.prompt_len,
                )
                admitted.append(candidate)
        for request in admitted:
            self.waiting.remove(request)
            mark_admitted(request, None, round_number)
        self.running += admitted
        return RoundPlan(round_number, list(self.running), admitted, new_kv, kv_limited)

    def rows_held(self) -> int:
        assert self.pool is not None  # made in the first round's plan
        return self.pool[0]  # the pool's rows, each with its slot, from the first round to the last

    def fits(self, candidate: Request, reserved_positions: int, round_tokens: int) -> bool:
        """Would `candidate` fit beside what is already running or admitted?"""
        if reserved_positions + self.kv_positions_needed(candidate) > self.kv_budget:
            return False
        return self.token_budget is None or round_tokens + candidate.prompt_len <= self.token_budget

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
