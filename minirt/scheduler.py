"""Who runs in each round: static groups, or continuous batching.

Owns: the two admission policies, over the same request metadata (arrival
order, prompt length, the KV positions a request reserves, finished or not):

  static       Fixed groups.  When no group is running, take waiting requests
               in arrival order, up to max_rows and within the KV budget, as
               the next group; admit nobody else until every member has
               finished.  A group's rounds are set by its longest member.
  continuous   Every round, first free the rows of requests that finished,
               then admit waiting requests (in arrival order, skipping any that
               do not fit) into free rows while three limits hold: max_rows,
               the round's token budget (a prefill costs its prompt tokens, a
               decode row one token), and the KV budget (the positions each
               running request reserves).  Because minirt's KV pool gives each
               row a slot as long as the longest request needs, the rows are
               also capped at budget // longest need.

The engine asks a scheduler for each round's plan and reports back after the
round; `python -m minirt.rounds` drives the very same objects with requests
that finish after known lengths, so its grids are the engine's.

Must not know: models, arrays, sampling or text.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .request import Request, Status

POLICIES = ("static", "continuous")


@dataclass
class GroupRecord:
    """What one static group did (continuous batching has a single, open-ended group)."""

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
    new_group: GroupRecord | None = None  # static: the group that starts this round


class Scheduler:
    """Admission under one policy.  Budgets are in KV positions and tokens; the engine converts bytes."""

    def __init__(self, policy: str, max_rows: int, kv_budget_positions: int, n_positions: int,
                 round_token_budget: int | None = None):
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}: choose static or continuous")
        if max_rows < 1:
            raise ValueError(f"max_rows must be at least 1, got {max_rows}")
        self.policy = policy
        self.max_rows = max_rows
        self.kv_budget = kv_budget_positions
        self.n_positions = n_positions
        self.token_budget = round_token_budget
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.free_slots = list(range(max_rows))  # continuous: rows not held by a running request
        self.groups: list[GroupRecord] = []  # static: every group so far
        self.active_rows: list[int] = []  # rows that ran, per round

    # ------------------------------------------------------------------ shared facts

    def need(self, request: Request) -> int:
        """KV positions a request reserves: its prompt plus every output token but the last."""
        return request.kv_capacity_needed(self.n_positions)

    def submit(self, requests: list[Request]) -> list[Request]:
        """Queue requests in arrival order; return those no round could ever take (refused here)."""
        refused = []
        for request in requests:
            if request.status is not Status.WAITING:
                continue
            if self.need(request) > self.kv_budget:
                request.refuse(f"needs {self.need(request)} KV cache positions, over the budget of {self.kv_budget}; "
                               "lower max_new_tokens or raise the KV budget")
                refused.append(request)
            elif self.policy == "continuous" and self.token_budget is not None and request.prompt_len > self.token_budget:
                request.refuse(f"its prompt of {request.prompt_len} tokens exceeds the round token budget of "
                               f"{self.token_budget}; raise the budget")
                refused.append(request)
            else:
                self.waiting.append(request)
        if self.policy == "continuous" and self.waiting:
            # The KV pool gives every row a slot as long as the longest request needs, so the
            # budget also caps the rows: rows x longest need <= budget.
            longest = max(self.need(r) for r in self.waiting)
            self.max_rows = max(1, min(self.max_rows, self.kv_budget // longest))
            self.free_slots = list(range(self.max_rows))
        return refused

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ------------------------------------------------------------------ one round

    def plan(self, round_number: int) -> RoundPlan:
        """Decide who runs in this round (admitting whoever the policy lets in)."""
        if self.policy == "static":
            return self._plan_static(round_number)
        return self._plan_continuous(round_number)

    def _plan_static(self, round_number: int) -> RoundPlan:
        new_group = None
        if not self.running:  # the last group was released: choose the next one
            members = self._choose_group()
            if members:
                new_group = GroupRecord(number=len(self.groups) + 1, members=members, first_round=round_number)
                self.groups.append(new_group)
                for slot, request in enumerate(members):
                    request.admit(group=new_group.number, slot=slot, first_round=round_number)
                self.running = list(members)
        active = [r for r in self.running if not r.finished]  # finished members leave the compute
        admitted = list(new_group.members) if new_group else []
        return RoundPlan(round_number, active=active, admitted=admitted, new_group=new_group)

    def _choose_group(self) -> list[Request]:
        """Arrival order, up to max_rows, while members x the longest member's need fits the KV budget."""
        members: list[Request] = []
        longest = 0
        while self.waiting and len(members) < self.max_rows:
            candidate = self.waiting[0]
            if members and (len(members) + 1) * max(longest, self.need(candidate)) > self.kv_budget:
                break  # full by memory: the candidate heads the next group
            members.append(self.waiting.popleft())
            longest = max(longest, self.need(candidate))
        return members

    def _plan_continuous(self, round_number: int) -> RoundPlan:
        reserved = sum(self.need(r) for r in self.running)  # KV positions held by running requests
        tokens = len(self.running)  # each running request decodes one token
        admitted = []
        for candidate in list(self.waiting):  # arrival order; one that does not fit is skipped, not blocking
            if len(self.running) + len(admitted) >= self.max_rows:
                break
            if not self.fits(candidate, reserved, tokens):
                continue
            reserved += self.need(candidate)
            tokens += candidate.prompt_len
            admitted.append(candidate)
        for request in admitted:
            self.waiting.remove(request)
            request.admit(group=None, slot=self.free_slots.pop(0), first_round=round_number)
        self.running += admitted
        return RoundPlan(round_number, active=list(self.running), admitted=admitted)

    def fits(self, candidate: Request, reserved_positions: int, round_tokens: int) -> bool:
        """Would `candidate` fit beside what is already running or admitted (continuous limits)?"""
        if reserved_positions + self.need(candidate) > self.kv_budget:
            return False
        return self.token_budget is None or round_tokens + candidate.prompt_len <= self.token_budget

    def complete(self, plan: RoundPlan) -> GroupRecord | None:
        """After the round: free finished rows.  Returns a static group that has just ended, if any."""
        self.active_rows.append(len(plan.active))
        if self.policy == "continuous":
            for request in plan.active:
                if request.finished:
                    self.free_slots.append(request.slot)
                    self.free_slots.sort()
            self.running = [r for r in self.running if not r.finished]
            return None
        group = self.groups[-1]
        group.active_rows.append(len(plan.active))
        if all(r.finished for r in group.members):
            group.last_round = plan.round_number
            self.running = []
            return group
        return None
