"""Rounds without a model: requests of known lengths run through the engine itself.

Owns: `simulate` (each request finishes after its output length, served by the engine, its
schedulers, their KV owner, `Request` records and stop rule, and the loop over `step()`, with a
runner that computes nothing: minirt/engine/model_free_runner.py; the KV owner allocates
positions without numbers, and its prefix cache keeps only its bookkeeping), `Simulation` (one
policy's run: rounds, utilization, who waited) and `long_tailed_workload`.  A round is one
forward pass; a request with output length L is active for L consecutive rounds, the first being
its prefill (and in C - 1 rounds before those when continuous batching chunks its prompt over C
rounds, as the engine does).  Utilization = active row-rounds / held row-rounds.

Must not know: models, arrays or text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable
import numpy as np

from ..engine.engine import DEFAULT_ROUND_TOKENS, Engine
from ..engine.model_free_runner import UNLIMITED, ModelFreeRunner
from ..engine.params import SamplingParams
from ..engine.request import Request
from ..engine.scheduler import RoundPlan, Scheduler
from ..engine.stats import RunStats
from ..errors import MinirtError
from ..llm import run_steps
from .plural import plural


@dataclass
class Simulation:
    """One policy's run over a workload."""

    policy: str
    rows: int
    requests: list[Request]  # each asks for its output length as max_tokens
    stats: RunStats  # the run's counts, as the engine kept them

    @property
    def total_rounds(self) -> int:
        return len(self.stats.active_rows_per_round)

    @property
    def utilization(self) -> float:
        """Active row-rounds / held row-rounds, as generate's summary counts them."""
        held = max(1, sum(self.stats.held_rows_per_round))
        return sum(self.stats.active_rows_per_round) / held

    def row_held_until(self, request: Request) -> int | None:
        """The last round a request's row was held: its group's end (static) or its own finish
        (continuous)."""
        if request.group is not None:
            return self.stats.groups[request.group - 1].last_round
        return request.finish_round

    def summary(self) -> dict:
        requests = [
            {
                "index": r.index,
                "output_len": r.params.max_tokens,
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
    """Run requests with the given output (and prompt) lengths through the engine, with a
    runner that computes nothing (whose continuous policy chunks long prompts, as the engine's
    does, unless told not to).  Each prompt starts with the same `shared_prefix` tokens, the
    rest its own; with `prefix_cache`, the engine's prefix cache (its bookkeeping, without
    numbers) serves them.  `on_plan(scheduler, plan)` sees each round's plan before it runs."""
    prompt_lens = prompt_lens or [1] * len(output_lens)
    check_lengths(output_lens, prompt_lens)
    requests = made_requests(output_lens, prompt_lens, shared_prefix)
    runner = ModelFreeRunner()
    engine = Engine(
        runner,
        None,
        batch_size=rows,
        policy=policy,
        round_token_budget=round_tokens,
        kv_budget_tokens=kv_budget,
        prefix_cache=prefix_cache,
        chunked_prefill=chunked_prefill,
        # No round grid is drawn from its steps.
        round_records=False,
    )
    if on_plan is not None:
        watch = on_plan
        runner.on_plan = lambda plan: watch(engine.scheduler, plan)
    with run_steps(engine, requests, "simulate") as steps:
        stats = engine.stats
        for _step in steps:
            pass
    for request in requests:
        if request.error is not None:
            raise MinirtError(f"request {request.index} can never run: {request.error}")
    return Simulation(policy, rows, requests, stats)


def check_lengths(output_lens: list[int], prompt_lens: list[int]) -> None:
    """As many prompt lengths as output lengths, each at least 1, or a one-line error."""
    if len(prompt_lens) != len(output_lens):
        raise MinirtError(
            f"got {plural(len(output_lens), 'output length')} but "
            f"{plural(len(prompt_lens), 'prompt length')}"
        )
    if any(n < 1 for n in output_lens) or any(p < 1 for p in prompt_lens):
        raise MinirtError("every output and prompt length must be at least 1")


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
            params=SamplingParams(max_tokens=n, ignore_eos=True),
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
