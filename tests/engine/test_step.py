"""The engine that steps: add_request() at any time, step() one round, abort(), has_unfinished().

Expected tokens come from outside the engine: greedy tokens from a full recompute of every prefix
with `model.logits` (no KV cache, no batch, no scheduler), sampled tokens from the same request
served alone (the batch-invariance contract: a request's tokens never depend on its peers).
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minirt.llm import run_steps
from minirt.request_maker import RequestMaker
from conftest import make_request, random_model, serve_all
from minirt import LLM, SamplingParams
from minirt.engine.engine import Engine
from minirt.engine.runner import ModelRunner
from minirt.engine.request import Status
from minirt.errors import RequestError
from conftest import completions


@pytest.fixture(scope="module")
def model():
    return random_model(seed=5, vocab_size=60, n_positions=48)


def greedy_by_recompute(model, prompt: list[int], n: int) -> list[int]:
    """n greedy tokens, each from the logits of the whole sequence so far, recomputed."""
    ids = list(prompt)
    for _ in range(n):
        last = model.logits([ids])[0][len(ids) - 1]  # [V]
        ids.append(int(np.argmax(last)))
    return ids[len(prompt) :]


def solo(model, prompt, params, index=0):
    """The request served alone, in a batch of one."""
    engine = Engine(ModelRunner(model), None, batch_size=1)
    request = make_request(engine, index, prompt, params)
    serve_all(engine, [request])
    return request.token_ids


def greedy(n):
    return SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0)


def run_to_end(engine):
    outputs = []
    while engine.has_unfinished():
        outputs.append(engine.step())
    return outputs


# ------------------------------------------------------------------ step and its output


def test_a_step_is_one_round_and_says_what_it_produced(model):
    engine = Engine(ModelRunner(model), None, batch_size=4, policy="continuous")
    short = make_request(engine, 0, [1, 2, 3], greedy(2))
    long = make_request(engine, 1, [4, 5], greedy(3))
    engine.add_request(short)
    engine.add_request(long)
    first = engine.step()
    assert first.round_number == 1
    assert first.new_tokens == [short, long]
    assert first.finished == []
    second = engine.step()
    assert second.round_number == 2
    assert second.finished == [short]
    assert short.finish_reason == "length"
    third = engine.step()
    assert third.new_tokens == [long]
    assert third.finished == [long]
    assert not engine.has_unfinished()
    # Nothing left: a step runs no round.
    assert engine.step().round_number is None
    assert short.token_ids == greedy_by_recompute(model, [1, 2, 3], 2)
    assert long.token_ids == greedy_by_recompute(model, [4, 5], 3)


def test_a_request_no_round_could_take_is_final_when_added(model):
    engine = Engine(ModelRunner(model), None, batch_size=2, kv_budget_tokens=10)
    too_big = make_request(engine, 0, [1, 2, 3], greedy(20))
    engine.add_request(too_big)
    assert too_big.finished and too_big.finish_reason == "error"
    assert "over the budget of 10" in too_big.error
    assert not engine.has_unfinished()


# ------------------------------------------------------------------ requests added between steps


def test_continuous_admits_a_request_added_while_others_run_at_the_next_round(model):
    engine = Engine(ModelRunner(model), None, batch_size=4, policy="continuous")
    early = make_request(engine, 0, [3, 1, 4], greedy(6))
    engine.add_request(early)
    engine.step()
    engine.step()
    late = make_request(engine, 1, [1, 5, 9, 2], greedy(5))
    engine.add_request(late)
    engine.step()
    assert late.first_round == 3
    # It arrived after round 2, so it waited through no round.
    assert late.arrival_round == 2
    assert late.rounds_waited == 0
    run_to_end(engine)
    assert early.token_ids == greedy_by_recompute(model, [3, 1, 4], 6)
    assert late.token_ids == greedy_by_recompute(model, [1, 5, 9, 2], 5)


def test_a_request_added_mid_run_arrives_when_it_is_added(model):
    engine = Engine(ModelRunner(model), None, batch_size=2, policy="continuous")
    early = make_request(engine, 0, [1, 2], greedy(4))
    engine.add_request(early)
    engine.step()
    late = make_request(engine, 1, [3], greedy(2))
    engine.add_request(late)
    run_to_end(engine)
    assert 0 <= early.arrival_s <= early.first_token_s <= late.arrival_s
    assert late.arrival_s <= late.first_token_s <= late.finish_s


def test_a_static_group_admits_nobody_added_while_it_runs_until_it_ends(model):
    engine = Engine(ModelRunner(model), None, batch_size=4, policy="static")
    members = [make_request(engine, i, [i + 1, 2], greedy(2 + 2 * i)) for i in range(2)]
    for request in members:
        engine.add_request(request)
    engine.step()
    # A row of the group is free from round 3 on, but the group still runs to round 4.
    late = make_request(engine, 2, [7, 7, 7], greedy(3))
    engine.add_request(late)
    outputs = run_to_end(engine)
    group_end = max(r.finish_round for r in members)
    assert group_end == 4
    assert late.first_round == group_end + 1
    assert late.group == 2
    assert [g.number for o in outputs for g in o.ended_groups] == [1, 2]
    assert late.token_ids == greedy_by_recompute(model, [7, 7, 7], 3)


def test_a_longer_request_arriving_after_the_pool_started_is_served(model):
    engine = Engine(ModelRunner(model), None, batch_size=3, policy="continuous")
    first = make_request(engine, 0, [1, 2], greedy(2))
    engine.add_request(first)
    engine.step()
    assert engine.kv_cache.capacity == 3  # its prompt of 2 and 2 tokens, but the last
    longer = make_request(engine, 1, [5, 4, 3, 2, 1], greedy(12))
    engine.add_request(longer)
    assert not longer.finished
    run_to_end(engine)
    assert longer.finish_reason == "length"
    assert longer.token_ids == greedy_by_recompute(model, [5, 4, 3, 2, 1], 12)
    assert first.token_ids == greedy_by_recompute(model, [1, 2], 2)


def test_a_pool_the_budget_cannot_grow_drains_then_is_made_anew(model):
    """Two rows of 8 positions in a budget of 16: a request needing 12 cannot join beside a
    running one, so admission waits until the pool is empty; a short request that comes after
    it waits too, though it would fit the row that frees first (else a stream of short
    requests could keep the long one waiting for ever)."""
    engine = Engine(
        ModelRunner(model), None, batch_size=2, policy="continuous", kv_budget_tokens=16
    )
    a = make_request(engine, 0, [1, 2, 3], greedy(2))
    b = make_request(engine, 1, [4, 5, 6], greedy(6))
    engine.add_request(a)
    engine.add_request(b)
    engine.step()
    assert (engine.kv_cache.capacity, len(engine.kv_cache.lengths)) == (8, 2)
    long = make_request(engine, 2, [2] * 6, greedy(7))
    short = make_request(engine, 3, [9], greedy(2))
    engine.add_request(long)
    engine.add_request(short)
    run_to_end(engine)
    assert a.finish_round == 2
    assert long.first_round == b.finish_round + 1
    assert short.first_round > long.first_round
    cases = [(a, [1, 2, 3], 2), (b, [4, 5, 6], 6), (long, [2] * 6, 7), (short, [9], 2)]
    for request, prompt, n in cases:
        assert request.token_ids == greedy_by_recompute(model, prompt, n)


# ------------------------------------------------------------------ abort


def test_a_request_aborted_while_waiting_never_runs(model):
    engine = Engine(ModelRunner(model), None, batch_size=1, policy="continuous")
    running = make_request(engine, 0, [1, 2], greedy(3))
    waiting = make_request(engine, 1, [3, 4], greedy(3), request_id="w")
    engine.add_request(running)
    engine.add_request(waiting)
    engine.step()
    assert engine.abort("w") == [waiting]
    assert waiting.finish_reason == "abort"
    assert waiting.error is None
    assert waiting.token_ids == [] and waiting.first_round is None
    run_to_end(engine)
    assert waiting.slot is None
    assert engine.abort("w") == []  # finished already: nothing to abort


@pytest.mark.parametrize(
    "params", [greedy(5), SamplingParams(max_tokens=5, temperature=1.3, seed=7)]
)
def test_an_aborted_running_request_frees_its_slot_for_the_next_whose_tokens_equal_a_solo_run(
    model, params
):
    engine = Engine(ModelRunner(model), None, batch_size=1, policy="continuous")
    doomed = make_request(engine, 0, [6, 6, 6, 6], greedy(20), request_id="doomed")
    after = make_request(engine, 1, [2, 7, 1], params, request_id="after")
    engine.add_request(doomed)
    engine.add_request(after)
    engine.step()
    engine.step()
    slot = doomed.slot
    assert engine.abort("doomed") == [doomed]
    assert doomed.finish_reason == "abort"
    assert doomed.finish_round == 2
    assert doomed.token_ids == greedy_by_recompute(model, [6, 6, 6, 6], 2)
    output = engine.step()
    # The next round admits the waiting request into the freed slot, which was zeroed.
    assert output.new_tokens == [after] and after.first_round == 3
    assert after.slot == slot
    run_to_end(engine)
    assert after.token_ids == solo(model, [2, 7, 1], params, index=1)


def test_an_aborted_static_member_leaves_the_compute_while_its_group_runs_on(model):
    engine = Engine(ModelRunner(model), None, batch_size=3, policy="static")
    members = [make_request(engine, i, [i + 2, 3], greedy(4), request_id=f"m{i}") for i in range(3)]
    for request in members:
        engine.add_request(request)
    engine.step()
    engine.abort("m1")
    output = engine.step()
    assert output.new_tokens == [members[0], members[2]]
    run_to_end(engine)
    assert [len(r.token_ids) for r in members] == [4, 1, 4]
    assert members[1].finish_reason == "abort"
    for request in (members[0], members[2]):
        assert request.token_ids == greedy_by_recompute(model, request.prompt_ids, 4)


def test_a_static_group_whose_members_are_all_aborted_ends_and_the_next_starts(model):
    engine = Engine(ModelRunner(model), None, batch_size=2, policy="static")
    group = [make_request(engine, i, [i + 1], greedy(9), request_id="group") for i in range(2)]
    nxt = make_request(engine, 2, [4, 4], greedy(3), request_id="next")
    for request in [*group, nxt]:
        engine.add_request(request)
    engine.step()
    engine.step()
    assert engine.abort("group") == group
    assert engine.kv_cache is None  # the group's cache went with its last member
    output = engine.step()
    assert output.round_number == 3 and output.new_tokens == [nxt]
    assert (nxt.group, nxt.first_round) == (2, 3)
    assert engine.scheduler.groups[0].last_round == 2
    run_to_end(engine)
    assert nxt.token_ids == greedy_by_recompute(model, [4, 4], 3)


def test_abort_ends_every_sample_of_a_prompt(model):
    llm_engine = Engine(ModelRunner(model), None, batch_size=4, policy="continuous")
    params = SamplingParams(max_tokens=6, temperature=1.0, seed=3)
    samples = [
        make_request(llm_engine, 0, [1, 2], params, request_id="p", sample=k, output_index=k)
        for k in range(3)
    ]
    for request in samples:
        llm_engine.add_request(request)
    llm_engine.step()
    assert llm_engine.abort("p") == samples
    # The aborts are still to be reported: the next step runs no round and lists them.
    assert llm_engine.has_unfinished()
    output = llm_engine.step()
    assert output.round_number is None and output.finished == samples
    assert not llm_engine.has_unfinished()
    assert llm_engine.stats.aborted == 3


# ------------------------------------------------------------------ the invariant, drawn


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    policy=st.sampled_from(["static", "continuous"]),
    batch_size=st.integers(1, 4),
    arrivals=st.lists(st.integers(0, 6), min_size=1, max_size=6),
    lengths=st.lists(st.integers(1, 8), min_size=6, max_size=6),
    abort_at=st.one_of(st.none(), st.tuples(st.integers(0, 5), st.integers(1, 6))),
)
def test_whenever_requests_arrive_or_one_is_aborted_the_others_get_their_solo_tokens(
    model, policy, batch_size, arrivals, lengths, abort_at
):
    """Request k arrives before step arrivals[k]; one may be aborted before a later step.
    Every request that is not aborted gets exactly its tokens computed alone; the aborted one
    keeps a prefix of them."""
    engine = Engine(ModelRunner(model), None, batch_size=batch_size, policy=policy)
    prompts = [[(3 * k + j) % 60 for j in range(1 + k % 3)] for k in range(len(arrivals))]
    requests = [
        make_request(engine, k, prompts[k], greedy(lengths[k]), request_id=f"r{k}")
        for k in range(len(arrivals))
    ]
    step = 0
    while step <= max(arrivals) or engine.has_unfinished():
        for k, arrival in enumerate(arrivals):
            if arrival == step:
                engine.add_request(requests[k])
        if abort_at is not None and abort_at[1] == step and abort_at[0] < len(requests):
            engine.abort(f"r{abort_at[0]}")
        engine.step()
        step += 1
    for k, request in enumerate(requests):
        expected = greedy_by_recompute(model, prompts[k], lengths[k])
        assert request.status is Status.FINISHED
        if request.finish_reason == "abort":
            assert request.token_ids == expected[: len(request.token_ids)]
        else:
            assert request.token_ids == expected


# ------------------------------------------------------------------ the offline loop over step


def test_an_offline_run_is_refused_while_added_requests_are_unfinished(model):
    engine = Engine(ModelRunner(model), None, batch_size=2)
    engine.add_request(make_request(engine, 0, [1], greedy(3)))
    with pytest.raises(RequestError, match="still serving"):
        serve_all(engine, [make_request(engine, 1, [2], greedy(3))])


def test_llm_generate_equals_a_loop_over_step_by_hand(model):
    llm = LLM.__new__(LLM)  # the engine of an LLM, without a checkpoint on disk
    llm.engine = Engine(ModelRunner(model), None, batch_size=2, policy="continuous")
    llm.tokenizer = None
    llm.request_maker = RequestMaker.for_model(model.config, None)
    llm.defaults = greedy(5)
    llm.last_stats = None
    prompts = [[1, 2, 3], [4], [5, 6], [7, 8, 9, 10]]
    params = [SamplingParams(max_tokens=2 + i, temperature=0.9, seed=i) for i in range(4)]
    outputs = completions(llm.generate(prompts, params))
    engine = Engine(ModelRunner(model), None, batch_size=2, policy="continuous")
    by_hand = [
        make_request(engine, i, p, sp)
        for i, (p, sp) in enumerate(zip(prompts, params, strict=True))
    ]
    for request in by_hand:
        engine.add_request(request)
    run_to_end(engine)
    assert [o.token_ids for o in outputs] == [r.token_ids for r in by_hand]
    assert [o.first_round for o in outputs] == [r.first_round for r in by_hand]
    assert [o.finish_round for o in outputs] == [r.finish_round for r in by_hand]


# ------------------------------------------------------------------ an engine that stays usable


def test_after_an_offline_run_the_engine_steps_a_new_run(model):
    engine = Engine(ModelRunner(model), None, batch_size=2, policy="continuous")
    stats = serve_all(engine, [make_request(engine, i, [1 + i, 2], greedy(3)) for i in range(2)])
    late = make_request(engine, 2, [5], greedy(2))
    engine.add_request(late)
    run_to_end(engine)
    # A new run: round numbers from 1, and the first run's counts are left as they were.
    assert (late.first_round, late.finish_round) == (1, 2)
    assert stats.requests == 2 and stats.rounds == 3
    assert late.token_ids == greedy_by_recompute(model, [5], 2)


def test_a_request_is_added_once(model):
    engine = Engine(ModelRunner(model), None, batch_size=2)
    request = make_request(engine, 0, [1, 2], greedy(4))
    engine.add_request(request)
    with pytest.raises(RequestError, match="added to a run already"):
        engine.add_request(request)
    run_to_end(engine)
    assert request.token_ids == greedy_by_recompute(model, [1, 2], 4)
    with pytest.raises(RequestError, match="added to a run already"):
        serve_all(engine, [request])


def test_an_offline_run_refused_for_one_request_leaves_the_engine_ready(model):
    engine = Engine(ModelRunner(model), None, batch_size=2)
    served = make_request(engine, 0, [1], greedy(2))
    serve_all(engine, [served])
    fresh = make_request(engine, 1, [2], greedy(2))
    with pytest.raises(RequestError):
        serve_all(engine, [fresh, served])
    # Nothing of the refused run stays queued: `fresh` was never added, and serves now.
    assert not engine.has_unfinished() and fresh.arrival_s is None
    serve_all(engine, [fresh])
    assert fresh.token_ids == greedy_by_recompute(model, [2], 2)


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_a_round_that_raises_abandons_the_run_and_the_next_run_is_whole(model, monkeypatch, policy):
    engine = Engine(ModelRunner(model), None, batch_size=2, policy=policy)
    first = [make_request(engine, i, [1 + i, 2], greedy(4)) for i in range(2)]
    for request in first:
        engine.add_request(request)
    engine.step()
    real_forward = model.forward

    def failing_forward(batch, kv_cache=None, logits_at=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(model, "forward", failing_forward)
    with pytest.raises(KeyboardInterrupt):
        engine.step()
    monkeypatch.setattr(model, "forward", real_forward)
    assert not engine.has_unfinished() and engine.kv_cache is None
    with pytest.raises(RequestError, match="already started running"):
        engine.add_request(first[0])
    again = make_request(engine, 0, [1, 2], greedy(4))
    engine.add_request(again)
    run_to_end(engine)
    assert again.token_ids == greedy_by_recompute(model, [1, 2], 4)


def test_an_abort_inside_the_loop_is_heard_as_final_and_ends_its_group(model):
    """An abort while the run's loop reports a step (as a callback would): the next step lists
    the request among its final records, and its group's end."""
    engine = Engine(ModelRunner(model), None, batch_size=1, policy="static")
    requests = [make_request(engine, i, [1 + i], greedy(5), request_id=f"r{i}") for i in range(2)]
    finals = []
    groups = []
    waiting_at_group_ends = []
    with run_steps(engine, requests, "a test's run") as steps:
        for step in steps:
            for request in step.new_tokens:
                if request.id == "r0" and len(request.token_ids) == 2:
                    engine.abort("r0")
            finals += [(r.id, r.finish_reason) for r in step.finished]
            groups += [group.number for group in step.ended_groups]
            if step.ended_groups:
                waiting_at_group_ends.append([r.id for r in step.waiting])
    assert finals == [("r0", "abort"), ("r1", "length")]
    assert groups == [1, 2]
    # The group the abort ended left r1 waiting (the next group's only member); then nobody.
    assert waiting_at_group_ends == [["r1"], []]
    assert requests[1].first_round == 3  # the aborted group ended after its second round


def test_time_to_first_token_counts_from_arrival(model):
    engine = Engine(ModelRunner(model), None, batch_size=2, policy="continuous")
    engine.add_request(make_request(engine, 0, [1], greedy(30)))
    for _ in range(20):
        engine.step()
    late = make_request(engine, 1, [2], greedy(1))
    engine.add_request(late)
    engine.step()
    assert engine.stats.first_token_seconds[-1] == pytest.approx(
        late.first_token_s - late.arrival_s
    )
    assert engine.stats.first_token_seconds[-1] < late.arrival_s


def test_a_pool_the_budget_holds_down_as_it_grows_says_so(model):
    engine = Engine(
        ModelRunner(model), None, batch_size=4, policy="continuous", kv_budget_tokens=12
    )
    engine.add_request(make_request(engine, 0, [1], greedy(2)))
    engine.step()
    assert engine.stats.kv_limited_rows == []
    for i in range(1, 4):
        engine.add_request(make_request(engine, i, [1 + i, 2, 3], greedy(3)))
    engine.step()
    # Rows of 5 positions: the budget of 12 holds two, though four requests want one each.
    assert (len(engine.kv_cache.lengths), engine.kv_cache.capacity) == (2, 5)
    assert engine.stats.kv_limited_rows == [2]


def test_a_stream_of_arrivals_grows_the_pool_twofold_not_row_by_row(model):
    engine = Engine(ModelRunner(model), None, batch_size=8, policy="continuous")
    rows_after_each_arrival = []
    for i in range(5):
        engine.add_request(make_request(engine, i, [1 + i], greedy(40)))
        engine.step()
        rows_after_each_arrival.append(len(engine.kv_cache.lengths))
    assert rows_after_each_arrival == [1, 2, 4, 4, 8]


# ------------------------------------------------------------------ a run that never ends


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_forget_history_drops_what_only_reports_read_and_changes_no_result(model, policy):
    """A server that is never idle never starts a new run; forgetting the run's report-only history every few
    rounds must keep every request's tokens, group and rounds as they were, and leave nothing of ended groups."""

    def served(forget_every: int | None):
        engine = Engine(ModelRunner(model), None, batch_size=2, policy=policy)
        engine.start_run()
        rng = np.random.default_rng(7)
        requests = []
        for step in range(60):
            if step % 4 == 0 and len(requests) < 12:
                prompt = rng.integers(1, 60, size=int(rng.integers(1, 6))).tolist()
                request = make_request(
                    engine, len(requests), prompt, greedy(int(rng.integers(1, 9)))
                )
                engine.add_request(request)
                requests.append(request)
            if forget_every is not None and step % forget_every == forget_every - 1:
                engine.forget_history()
                assert engine.scheduler.active_rows == [] and engine.stats.first_token_seconds == []
                running = set(map(id, engine.scheduler.running))
                for group in engine.scheduler.groups:
                    if not any(id(member) in running for member in group.members):
                        assert group.members == []
            if engine.has_unfinished():
                engine.step()
        run_to_end(engine)
        return [
            (r.token_ids, r.group, r.first_round, r.finish_round, r.rounds_waited) for r in requests
        ]

    kept = served(None)
    assert served(3) == kept and served(1) == kept
    assert all(len(tokens) >= 1 for tokens, *_ in kept)


# ------------------------------------------------------------------ the pool at the budget's edge


@pytest.mark.parametrize(
    "budget, rows, late_first_round, late_rounds_waited",
    [
        # 12 positions hold three rows of 4 exactly: both newcomers join the grown pool at once.
        (12, 3, 2, 0),
        # One position short: the pool grows to two rows, and the last newcomer waits for the
        # first request's row (it finishes in round 3), so it starts in round 4.
        (11, 2, 4, 2),
    ],
)
def test_a_pool_grown_to_exactly_the_budget_admits_every_row_it_holds(
    model, budget, rows, late_first_round, late_rounds_waited
):
    """By hand: every request needs 4 positions (a prompt of 2 and 3 tokens but the last).  The
    first runs alone in a pool of one row; after round 1 two more arrive, and the pool grows to
    as many rows as the budget holds (budget // 4, at most the 3 wanted), never fewer because
    the budget is met exactly.  The rounds each newcomer waited say where the limit held."""
    from conftest import completion_of

    engine = Engine(
        ModelRunner(model), None, batch_size=4, policy="continuous", kv_budget_tokens=budget
    )
    first = make_request(engine, 0, [1, 2], greedy(3))
    engine.add_request(first)
    engine.step()
    assert (len(engine.kv_cache.lengths), engine.kv_cache.capacity) == (1, 4)
    second = make_request(engine, 1, [3, 4], greedy(3))
    late = make_request(engine, 2, [5, 6], greedy(3))
    engine.add_request(second)
    engine.add_request(late)
    engine.step()
    assert (len(engine.kv_cache.lengths), engine.kv_cache.capacity) == (rows, 4)
    assert rows * 4 <= budget < (rows + 1) * 4
    run_to_end(engine)
    outputs = [completion_of(r) for r in (first, second, late)]
    assert [(o.first_round, o.rounds_waited) for o in outputs] == [
        (1, 0),
        (2, 0),
        (late_first_round, late_rounds_waited),
    ]
    assert [o.finish_round for o in outputs] == [3, 4, late_first_round + 2]
    for output, prompt in zip(outputs, ([1, 2], [3, 4], [5, 6]), strict=True):
        assert output.token_ids == greedy_by_recompute(model, prompt, 3)
