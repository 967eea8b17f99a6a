"""The static batch window (`Scheduler.window_left_s`, what `minirt serve --batch-window` waits):
by hand, from arrival times."""

import pytest

from minirt import SamplingParams
from minirt.engine.request import Request
from minirt.engine.scheduler import ContinuousScheduler, StaticScheduler


def waiting(n: int, arrival_s: float, new_tokens: int = 4) -> list[Request]:
    requests = []
    for i in range(n):
        request = Request(
            index=i,
            id=str(i),
            prompt=None,
            prompt_ids=[1, 2],
            params=SamplingParams(max_tokens=new_tokens, ignore_eos=True, temperature=0.0),
        )
        request.arrival_s = arrival_s
        requests.append(request)
    return requests


def scheduler_with(policy, requests, max_rows=4, kv_budget=1000):
    scheduler = policy(max_rows, kv_budget, 64)
    for request in requests:
        scheduler.submit(request)
    return scheduler


def test_a_group_short_of_members_waits_out_the_rest_of_its_window():
    scheduler = scheduler_with(StaticScheduler, waiting(2, arrival_s=1.0))
    # 20 ms after the first arrival less the 5 ms waited so far.
    assert scheduler.window_left_s(1.005, 0.020) == pytest.approx(0.015)
    assert scheduler.window_left_s(1.030, 0.020) == 0.0  # waited it out
    assert scheduler.window_left_s(1.005, 0.0) == 0.0  # no window


def test_a_full_group_starts_at_once_by_rows_or_by_memory():
    assert scheduler_with(StaticScheduler, waiting(4, 1.0)).window_left_s(1.0, 0.02) == 0.0
    # Each needs 2 + 4 - 1 = 5 positions: a budget of 10 holds two of the three.
    by_memory = scheduler_with(StaticScheduler, waiting(3, 1.0), kv_budget=10)
    assert by_memory.window_left_s(1.0, 0.02) == 0.0
    # With one fewer waiting, the same budget is not yet full: it waits.
    assert scheduler_with(StaticScheduler, waiting(1, 1.0), kv_budget=10).window_left_s(
        1.0, 0.02
    ) == pytest.approx(0.02)


def test_no_wait_while_a_group_runs_or_nobody_waits_or_under_continuous_batching():
    running = scheduler_with(StaticScheduler, waiting(2, 1.0))
    running.plan(1)
    running.submit(waiting(1, 1.5)[0])
    assert running.running and running.window_left_s(1.5, 0.02) == 0.0
    assert scheduler_with(StaticScheduler, []).window_left_s(1.0, 0.02) == 0.0
    assert scheduler_with(ContinuousScheduler, waiting(2, 1.0)).window_left_s(1.005, 0.02) == 0.0
