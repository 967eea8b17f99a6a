"""Rounds without a model: requests of known lengths run through the engine's own schedulers.

Owns: `simulate` (each request finishes after its output length, through the engine's schedulers,
`Request` records and stop rule), `Simulation` (one policy's run: rounds, utilization, who waited)
and `long_tailed_workload`.  A round is one forward pass; a request with output length L is active
for L consecutive rounds, the first being its prefill.  Utilization = active row-rounds / held
row-rounds.

Must not know: models, arrays or text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable
import numpy as np

from ..engine.engine import DEFAULT_ROUND_TOKENS
from ..engine.params import SamplingParams
from ..engine.request import Request, add_token
from ..engine.scheduler import RoundPlan, SCHEDULERS, Scheduler
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
) -> Simulation:
    """Run requests with the given output (and prompt) lengths through the engine's scheduler."""
    prompt_lens = prompt_lens or [1] * len(output_lens)
    if len(prompt_lens) != len(output_lens):
        raise MinirtError(
            f"got {plural(len(output_lens), 'output length')} but "
            f"{plural(len(prompt_lens), 'prompt length')}"
        )
    if any(n < 1 for n in output_lens) or any(p < 1 for p in prompt_lens):
        raise MinirtError("every output and prompt length must be at least 1")
    requests = [
        Request(
            index=i,
            id=str(i),
            prompt=None,
            prompt_ids=[0] * p,
            params=SamplingParams(max_new_tokens=n, ignore_eos=True),
        )
        for i, (n, p) in enumerate(zip(output_lens, prompt_lens, strict=True))
    ]
    scheduler = SCHEDULERS[policy](rows, kv_budget, UNLIMITED, round_tokens)
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
        # The "forward pass": every active row produces one token (id 0).
        for request in plan.active:
            add_token(request, 0, None, round_number, None, UNLIMITED)
        scheduler.complete(plan)
    return Simulation(policy, rows, requests, scheduler)


def long_tailed_workload(n: int, seed: int) -> tuple[list[int], list[int]]:
    """(output lengths, prompt lengths): log-normal, so most are short and a few are very long."""
    rng = np.random.default_rng(seed)
    output_draws = rng.lognormal(mean=np.log(24), sigma=1.0, size=n)
    prompt_draws = rng.lognormal(mean=np.log(32), sigma=0.8, size=n)
    outputs = np.clip(np.round(output_draws), 1, 512).astype(int)
    prompts = np.clip(np.round(prompt_draws), 1, 512).astype(int)
    return outputs.tolist(), prompts.tolist()
