"""The scheduler's queue: the longest KV need among the waiting requests (`LongestNeed`), kept as
requests join and leave the queue, which is what a continuous pool grows to.  Expected values
come from a pass over the queue (what the scheduler computed before it kept the need) and from
pool shapes counted by hand."""

from conftest import stub_request as stub
from hypothesis import given, settings
from hypothesis import strategies as st

from minirt.engine.engine import Engine
from minirt.engine.model_free_runner import ModelFreeRunner
from minirt.engine.scheduler import KVShape, LongestNeed


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 12), st.integers(0, 30)), max_size=60))
def test_the_longest_need_is_the_maximum_of_the_needs_queued(moves):
    """Joins and leaves in any order (a leave takes the queued need at a drawn place): after
    each, the longest is the maximum of what is queued."""
    longest = LongestNeed()
    queued: list[int] = []
    for joins, need, place in moves:
        if joins or not queued:
            longest.add(need)
            queued.append(need)
        else:
            longest.discard(queued.pop(place % len(queued)))
        if queued:
            assert longest.longest() == max(queued)


def test_a_need_that_leaves_and_joins_again_counts_once_per_request():
    longest = LongestNeed()
    for need in (9, 9, 4):
        longest.add(need)
    longest.discard(9)
    assert longest.longest() == 9  # the other request of need 9 still waits
    longest.discard(9)
    assert longest.longest() == 4
    longest.add(9)
    assert longest.longest() == 9


def test_an_aborted_waiting_request_does_not_grow_the_pool():
    """Continuous, 2 rows.  Round 1: A (prompt 1, 4 tokens: needs 4) makes the pool 1 x 4.  Then
    L (needs 20) and C (needs 4) arrive and L is aborted while it waits: round 2 grows the pool
    to 2 rows of 4 for C, not to rows of L's 20."""
    plans = []
    engine = Engine(ModelFreeRunner(on_plan=plans.append), None, batch_size=2, policy="continuous")
    first, long, short = stub(0, 1, 4), stub(1, 1, 20), stub(2, 1, 4)
    engine.start_run()
    engine.add_request(first)
    engine.step()
    engine.add_request(long)
    engine.add_request(short)
    engine.abort(long.id)
    engine.step()
    assert [plan.kv_shape for plan in plans] == [KVShape(1, 4), KVShape(2, 4)]
    assert engine.kv_rows() == (2, 4)


@settings(max_examples=40, deadline=None)
@given(
    policy=st.sampled_from(["static", "continuous"]),
    arrivals=st.lists(
        st.tuples(st.integers(1, 9), st.integers(1, 9), st.integers(0, 3), st.booleans()),
        min_size=1,
        max_size=14,
    ),
    budget=st.integers(18, 60),
)
def test_every_round_sees_the_longest_need_of_the_queue_as_a_pass_over_it_finds(
    policy, arrivals, budget
):
    """Requests arrive a few at a time, some aborted while they wait, under both policies and a
    budget that drains and remakes the pool: before each round the kept need equals a pass
    over the queue, and every request ends, served or aborted."""
    checked = []

    def check(plan):
        scheduler = engine.scheduler
        if scheduler.waiting:
            passed = max(scheduler.kv_positions_needed(r) for r in scheduler.waiting)
            assert scheduler.waiting_need.longest() == passed
            checked.append(passed)

    engine = Engine(
        ModelFreeRunner(on_plan=check),
        None,
        batch_size=3,
        policy=policy,
        kv_budget_tokens=budget,
    )
    engine.start_run()
    requests = []
    for index, (prompt_len, max_new, steps_after, aborted) in enumerate(arrivals):
        request = stub(index, prompt_len, max_new)
        requests.append(request)
        engine.add_request(request)
        if aborted:
            engine.abort(request.id)
        for _ in range(steps_after):
            engine.step()
    while engine.has_unfinished():
        engine.step()
    assert all(r.finished for r in requests)
    served = [r for r in requests if r.finish_reason != "abort"]
    assert all(len(r.token_ids) == r.params.max_new_tokens for r in served)


def test_a_run_without_round_records_runs_the_same_rounds():
    """`round_records=False` (what `minirt rounds` and the replay ask) leaves each step's record
    out and changes nothing else: the same tokens, rounds and rows."""

    def run(round_records):
        requests = [stub(i, 1 + i % 3, 2 + i % 4) for i in range(7)]
        engine = Engine(
            ModelFreeRunner(), None, batch_size=3, policy="continuous", round_records=round_records
        )
        engine.start_run()
        for request in requests:
            engine.add_request(request)
        records = []
        while engine.has_unfinished():
            records.append(engine.step().round_record)
        rounds = [(r.first_round, r.finish_round, r.slot, r.token_ids) for r in requests]
        return rounds, records, engine.stats.active_rows_per_round

    kept_rounds, kept_records, kept_rows = run(True)
    spared_rounds, spared_records, spared_rows = run(False)
    assert spared_rounds == kept_rounds and spared_rows == kept_rows
    assert all(record is not None for record in kept_records)
    assert spared_records == [None] * len(kept_records)
