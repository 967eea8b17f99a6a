"""Rounds without a model: requests of known lengths run through the engine's own schedulers.

Owns: `simulate` (each request finishes after its output length, through the engine's schedulers,
their KV owner, `Request` records and stop rule; the KV owner allocates positions without numbers,
and its prefix cache keeps only its bookkeeping), `Simulation` (one policy's run: rounds,
utilization, who waited) and `long_tailed_workload`. A round is one forward pass; a request with
output length L is active for L consecutive rounds, the first being its prefill (and in C - 1 rounds
before those when continuous batching chunks its prompt over C rounds, as the engine does).
Utilization = active row-rounds / held row-rounds.

Must not know: models, arrays or text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable
import numpy as np

from ..engine.engine import DEFAULT_ROUND_TOKENS
from ..engine.kv_manager import KVManager, PositionsOnly
from ..engine.params import SamplingParams
from ..engine.prefix_cache import PrefixCache
from ..engine.request import Request, add_token
from ..engine.scheduler import SCHEDULERS, RoundPlan, Scheduler
from ..errors import MinirtError
from .plural import plural


UNLIMITED = 10**12  # a context / KV budget that never binds


@dataclass
class Simulation:
    """One policy's run over a workload."""

    policy: str
    rows: int
    requests: list[Request]  # each asks for its output length as max_new_tokens
    scheduler: Scheduler

    @property
    def total_rounds(self) -> int:
        return len(self.scheduler.active_rows)

    @property
    def utilization(self) -> float:
        """Active row-rounds / held row-rounds, as generate's summary counts them."""
        held = max(1, sum(self.scheduler.held_rows))
        return sum(self.scheduler.active_rows) / held

    def row_held_until(self, request: Request) -> int | None:
        """The last round a request's row was held: its group's end (static) or its own finish
        (continuous)."""
        if request.group is not None:
            return self.scheduler.groups[request.group - 1].last_round
        return request.finish_round

    def summary(self) -> dict:
        requests = [
            {
                "index": r.index,
                "output_len": r.params.max_new_tokens,
                "rounds_waited": r.rounds_waited,
                "first_round": r.first_round,
                "finish_round": r.finish_round,
                "cached_prompt_tokens": r.cached_prompt_tokens,
                "prefill_rounds": r.prefill_rounds,
            }
            for r in self.requests
        ]
        return {
            "total_rounds": self.total_rounds,
            "utilization": round(self.utilization, 6),
            "requests": requests,
        }


def simulate(
    output_lens: list[int],
    policy: str,
    rows: int,
    prompt_lens: list[int] | None = None,
    kv_budget: int = UNLIMITED,
    round_tokens: int = DEFAULT_ROUND_TOKENS,
    on_plan: Callable[[Scheduler, RoundPlan], None] | None = None,
    chunked_prefill: bool = True,
    shared_prefix: int = 0,
    prefix_cache: bool = False,
) -> Simulation:
    """Run requests with the given output (and prompt) lengths through the engine's scheduler
    (whose continuous policy chunks long prompts, as the engine's does, unless told not to).
    Each prompt starts with the same `shared_prefix` tokens, the rest its own; with
    `prefix_cache`, the engine's prefix cache (its bookkeeping, without numbers) serves them."""
    prompt_lens = prompt_lens or [1] * len(output_lens)
    check_lengths(output_lens, prompt_lens)
    requests = made_requests(output_lens, prompt_lens, shared_prefix)
    # The engine's KV owner, allocating positions without numbers.
    kv = KVManager(kv_budget, PositionsOnly, PrefixCache() if prefix_cache else None)
    scheduler = SCHEDULERS[policy](
        rows, kv_budget, UNLIMITED, round_tokens, chunked_prefill=chunked_prefill, kv=kv
    )
    for request in requests:
        reason = scheduler.refusal(request)
        if reason is not None:
            raise MinirtError(f"request {request.index} can never run: {reason}")
        scheduler.submit(request)
    round_number = 0
    while scheduler.has_work():
        round_number += 1
        plan = scheduler.plan(round_number)
        if on_plan:
            on_plan(scheduler, plan)
        run_round(scheduler, plan, round_number)
        scheduler.complete(plan)
    return Simulation(policy, rows, requests, scheduler)


def check_lengths(output_lens: list[int], prompt_lens: list[int]) -> None:
    """As many prompt lengths as output lengths, each at least 1, or a one-line error."""
    if len(prompt_lens) != len(output_lens):
        raise MinirtError(
            f"got {plural(len(output_lens), 'output length')} but "
            f"{plural(len(prompt_lens), 'prompt length')}"
        )
    if any(n < 1 for n in output_lens) or any(p < 1 for p in prompt_lens):
        raise MinirtError("every output and prompt length must be at least 1")


def run_round(scheduler: Scheduler, plan: RoundPlan, round_number: int) -> None:
    """The "forward pass": every active row feeds its tokens (a prompt all in gives the prefix
    cache its blocks), and each whose prompt is then all in produces one token (id 0)."""
    scheduler.note_prefills(plan)
    for request in plan.active:
        if request.prompt_done:
            add_token(request, 0, None, round_number, None, UNLIMITED)


def made_requests(
    output_lens: list[int], prompt_lens: list[int], shared_prefix: int = 0
) -> list[Request]:
    """A request per length pair, its output that many tokens, its prompt that many tokens: the
    first `shared_prefix` of them (0) the same for every request, the rest its own (its index
    + 1)."""
    requests = []
    for i, (n, p) in enumerate(zip(output_lens, prompt_lens, strict=True)):
        shared = min(shared_prefix, p)
        request = Request(
            index=i,
            id=str(i),
            prompt=None,
            prompt_ids=[0] * shared + [i + 1] * (p - shared),
            params=SamplingParams(max_new_tokens=n, ignore_eos=True),
        )
        requests.append(request)
    return requests


def long_tailed_workload(n: int, seed: int) -> tuple[list[int], list[int]]:
    """(output lengths, prompt lengths): log-normal, so most are short and a few are very long."""
    rng = np.random.default_rng(seed)
    output_draws = rng.lognormal(mean=np.log(24), sigma=1.0, size=n)
    prompt_draws = rng.lognormal(mean=np.log(32), sigma=0.8, size=n)
    outputs = np.clip(np.round(output_draws), 1, 512).astype(int)
    prompts = np.clip(np.round(prompt_draws), 1, 512).astype(int)
    return outputs.tolist(), prompts.tolist()
