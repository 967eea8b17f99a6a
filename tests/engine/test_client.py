"""The engine's client (minirt/engine/client.py), driven directly, without HTTP: submissions are
queued all or none, each refusal is a value (its kind, field and numbers), the budget is asked
once per request, an abort frees its row, each event goes to its own submission, the snapshot
counts what a hand count gives, and the thread survives a fault of its own.

Most tests call the client's `apply` and `iterate` on the test's own thread (what the engine
thread does, one iteration at a time), so that rounds happen exactly when the test says; the
last ones start the thread.  No web stack: the callbacks are plain lists."""

from __future__ import annotations

import threading
import time

import pytest

from conftest import make_request, random_model
from minirt import LLM, SamplingParams
from minirt.engine.client import (
    Abort,
    Accepted,
    Add,
    EngineClient,
    EngineObserver,
    Finished,
    Refused,
    Shutdown,
    Submission,
    Token,
)
from minirt.engine.engine import Engine
from minirt.engine.runner import ModelRunner
from minirt.engine.request import (
    FAULT,
    KV_BUDGET,
    QUEUE_FULL,
    ROUND_TOKENS,
    SHUTTING_DOWN,
    TOO_MANY_CHOICES,
    Refusal,
)
from minirt.engine.scheduler import ContinuousScheduler, StaticScheduler
from minirt.errors import FieldError
from minirt.request_maker import RequestMaker
from conftest import completions


@pytest.fixture(scope="module")
def model():
    return random_model(seed=11, vocab_size=60, n_positions=32)


def engine_for(model, **options) -> Engine:
    """A continuous engine of 4 rows and a budget of 10 KV positions, unless told otherwise."""
    settings = {"batch_size": 4, "policy": "continuous", "kv_budget_tokens": 10, **options}
    return Engine(ModelRunner(model), None, **settings)


class Collected:
    """One submission's events, as its callback hears them."""

    def __init__(self):
        self.events: list = []

    def finals(self) -> list[Finished]:
        return [event for event in self.events if isinstance(event, Finished)]


def submission(engine, sub_id: str, *shapes, first_index: int = 1) -> tuple[Submission, Collected]:
    """A submission of one request per (prompt, max_new_tokens), made as the server makes them."""
    collected = Collected()
    requests = []
    for k, (prompt, max_new) in enumerate(shapes):
        params = SamplingParams(max_tokens=max_new, ignore_eos=True, temperature=0.0)
        requests.append(make_request(engine, first_index + k, prompt, params, request_id=sub_id))
    made = Submission(sub_id, tuple(requests), time.perf_counter(), collected.events.append)
    return made, collected


def run_until_idle(client: EngineClient, most: int = 100) -> None:
    """Iterations until nothing waits or runs (each with work runs one round)."""
    for _ in range(most):
        if not client.engine.has_unfinished():
            return
        client.iterate()
    raise AssertionError("the engine never went idle")


# ------------------------------------------------------------------ all or none


def test_one_request_over_the_budget_keeps_its_peers_and_the_other_submission_out(model):
    engine = engine_for(model)
    client = EngineClient(engine, max_queue=8)
    # Needs 2 + 3 - 1 = 4 positions; the second 3 + 20 - 1 = 22 > 10; the other submission 4.
    first, heard_first = submission(engine, "a", ([1, 2], 3), ([1, 2, 3], 20))
    second, heard_second = submission(engine, "b", ([4, 5], 3), first_index=3)
    client.apply(Add((first, second)))
    refused = Refused(Refusal(KV_BUDGET, "max_tokens", needed=22, limit=10))
    assert heard_first.events == [refused] and heard_second.events == [refused]
    # Nothing was queued or stamped: not the fitting request, not the other submission.
    assert not engine.has_unfinished() and not client.tracked
    every = [*first.requests, *second.requests]
    assert all(r.arrival_s is None and not r.finished for r in every)
    assert engine.stats.requests == 0


def test_submissions_accepted_together_all_run_to_their_ends(model):
    engine = engine_for(model, kv_budget_tokens=40)
    client = EngineClient(engine, max_queue=8)
    first, heard_first = submission(engine, "a", ([1, 2], 3), ([3], 5))
    second, heard_second = submission(engine, "b", ([4, 5, 6], 2), first_index=3)
    client.apply(Add((first, second)))
    assert heard_first.events == [Accepted()] and heard_second.events == [Accepted()]
    run_until_idle(client)
    # Each submission hears of its own requests only (their lengths tell them apart), by their
    # place in it.
    assert [(f.choice, len(f.output.token_ids)) for f in heard_first.finals()] == [(0, 3), (1, 5)]
    assert [(f.choice, len(f.output.token_ids)) for f in heard_second.finals()] == [(0, 2)]
    tokens_b = [e for e in heard_second.events if isinstance(e, Token)]
    assert [e.token_id for e in tokens_b] == heard_second.finals()[0].output.token_ids


# ------------------------------------------------------------------ each refusal, as a value


def refusal_of(client: EngineClient, made: Submission, collected: Collected) -> Refusal:
    client.apply(Add((made,)))
    (answer,) = collected.events
    assert isinstance(answer, Refused)
    return answer.refusal


def test_a_kv_budget_refusal_names_max_tokens_and_its_numbers(model):
    engine = engine_for(model)
    client = EngineClient(engine, max_queue=8)
    # 4 + 9 - 1 = 12 positions, over 10.
    made, collected = submission(engine, "a", ([1, 2, 3, 4], 9))
    refusal = refusal_of(client, made, collected)
    assert refusal == Refusal(KV_BUDGET, "max_tokens", needed=12, limit=10)
    assert refusal.message == (
        "needs 12 KV cache positions, over the budget of 10; "
        "lower max_tokens or raise the KV budget"
    )


def test_a_round_token_refusal_names_the_prompt_and_its_numbers(model):
    engine = engine_for(model, round_token_budget=4, chunked_prefill=False)
    client = EngineClient(engine, max_queue=8)
    # A prompt of 5 tokens, over a round of 4; 5 + 2 - 1 = 6 positions fit the budget of 10.
    made, collected = submission(engine, "a", ([1, 2, 3, 4, 5], 2))
    refusal = refusal_of(client, made, collected)
    assert refusal == Refusal(ROUND_TOKENS, "prompt", needed=5, limit=4)
    assert str(refusal) == (
        "its prompt of 5 tokens exceeds the round token budget of 4; raise the budget, or let "
        "its prefill be chunked"
    )


def test_more_requests_than_the_queue_holds_is_about_n(model):
    engine = engine_for(model)
    client = EngineClient(engine, max_queue=3)
    made, collected = submission(engine, "a", *[([1], 2)] * 4)
    assert refusal_of(client, made, collected) == Refusal(TOO_MANY_CHOICES, "n", needed=4, limit=3)


def test_a_full_queue_counts_who_waits(model):
    engine = engine_for(model)
    client = EngineClient(engine, max_queue=3)
    waiting, heard = submission(engine, "a", ([1], 2), ([2], 2))
    client.apply(Add((waiting,)))
    assert heard.events == [Accepted()]
    # 2 wait (no round has run), and 2 more would make 4 > 3.
    made, collected = submission(engine, "b", ([1], 2), ([2], 2), first_index=3)
    assert refusal_of(client, made, collected) == Refusal(
        QUEUE_FULL, None, needed=2, limit=3, waiting=2
    )
    # One more fits exactly.
    last, heard_last = submission(engine, "c", ([3], 2), first_index=5)
    client.apply(Add((last,)))
    assert heard_last.events == [Accepted()]


def test_a_client_shutting_down_refuses_everything(model):
    engine = engine_for(model)
    closed = []
    client = EngineClient(engine, max_queue=8, on_shutdown=lambda: closed.append(True))
    client.apply(Shutdown(time.monotonic() + 60))
    assert closed == [True]
    made, collected = submission(engine, "a", ([1], 2))
    assert refusal_of(client, made, collected) == Refusal(SHUTTING_DOWN)


def test_a_fault_while_queueing_is_refused_with_its_detail(model, monkeypatch):
    engine = engine_for(model)
    client = EngineClient(engine, max_queue=8)

    def broken(requests):
        raise RuntimeError("boom")

    monkeypatch.setattr(engine, "add_requests", broken)
    made, collected = submission(engine, "a", ([1], 2))
    assert refusal_of(client, made, collected) == Refusal(FAULT, detail="RuntimeError: boom")


def test_a_model_checks_refusal_carries_its_field():
    """What the server names as `param`, as a value (no message is parsed)."""
    maker = RequestMaker(None, vocab_size=60, n_positions=32, bos_token_id=None)
    cases = [
        (SamplingParams(stop=["x"], temperature=0.0, max_tokens=64), "stop"),
        (SamplingParams(stop_token_ids=[60], temperature=0.0, max_tokens=64), "stop_token_ids"),
        (SamplingParams(logit_bias={61: 1.0}, temperature=0.0, max_tokens=64), "logit_bias"),
    ]
    for params, field in cases:
        with pytest.raises(FieldError) as raised:
            maker.check_params(params)
        assert raised.value.field == field
    with pytest.raises(FieldError) as raised:
        maker.prompt_ids([1, 99])
    assert raised.value.field == "prompt"


# ------------------------------------------------------------------ the budget, asked once


def counting_refusals(monkeypatch, scheduler_class) -> list:
    """Every call of the scheduler's refusal, recorded."""
    calls = []
    real = scheduler_class.refusal

    def counted(self, request):
        calls.append(request)
        return real(self, request)

    monkeypatch.setattr(scheduler_class, "refusal", counted)
    return calls


@pytest.mark.parametrize("scheduler_class", [StaticScheduler, ContinuousScheduler])
def test_the_budget_is_asked_once_per_request(model, monkeypatch, scheduler_class):
    engine = engine_for(model, policy=scheduler_class.policy, kv_budget_tokens=20)
    calls = counting_refusals(monkeypatch, scheduler_class)
    client = EngineClient(engine, max_queue=8)
    made, collected = submission(engine, "a", ([1], 2), ([2, 3], 3), ([4], 2))
    client.apply(Add((made,)))
    assert collected.events == [Accepted()]
    run_until_idle(client)
    assert calls == list(made.requests)
    # A refused one ends the asking: the first fits, the second does not, the third is not asked.
    calls.clear()
    refused, heard = submission(engine, "b", ([1], 2), ([1, 2, 3], 39), ([4], 2), first_index=4)
    client.apply(Add((refused,)))
    assert isinstance(heard.events[0], Refused) and calls == list(refused.requests[:2])
    # Offline: add_request asks once too, and words the refusal as before.
    calls.clear()
    engine.start_run()
    (too_big,) = submission(engine, "c", ([1, 2, 3], 39), first_index=7)[0].requests
    engine.add_request(too_big)
    assert calls == [too_big] and too_big.finished
    # 3 + 39 - 1 positions, but never more than the context of 32.
    assert too_big.error == "needs 32 KV cache positions, over the budget of 20; " + (
        "lower max_tokens or raise the KV budget"
    )


# ------------------------------------------------------------------ abort, snapshot


def test_an_abort_frees_its_row_for_the_request_that_waits(model):
    # One row: the second submission waits until the first leaves it.
    engine = engine_for(model, batch_size=1, kv_budget_tokens=40)
    client = EngineClient(engine, max_queue=8)
    long, heard_long = submission(engine, "long", ([1, 2], 20))
    short, heard_short = submission(engine, "short", ([3], 2), first_index=2)
    client.apply(Add((long, short)))
    client.iterate()
    assert (client.snapshot().running, client.snapshot().waiting) == (1, 1)
    client.apply(Abort("long"))
    client.iterate()
    (final,) = heard_long.finals()
    assert final.output.finish_reason == "abort" and len(final.output.token_ids) == 1
    # The round after the abort gave its row to the short request: its first token.
    assert [type(e) for e in heard_short.events] == [Accepted, Token]
    assert (client.snapshot().running, client.snapshot().waiting) == (1, 0)
    run_until_idle(client)
    assert heard_short.finals()[0].output.finish_reason == "length"
    assert long.requests[0] not in client.tracked and not client.tracked


def test_the_snapshot_counts_what_a_hand_count_gives(model):
    engine = engine_for(model, batch_size=2, kv_budget_tokens=40)
    client = EngineClient(engine, max_queue=8)
    before = client.snapshot()
    assert (before.running, before.waiting, before.rounds, before.kv_positions_reserved) == (
        0,
        0,
        0,
        0,
    )
    # Needs 2 + 5 - 1 = 6, 3 + 8 - 1 = 10, and 1 + 3 - 1 = 3 positions; two rows.
    made, _ = submission(engine, "a", ([1, 2], 5), ([3, 4, 5], 8), ([6], 3))
    client.apply(Add((made,)))
    client.iterate()
    after = client.snapshot()
    # The first two run (6 + 10 positions reserved, a slot each), the third waits.
    assert (after.running, after.waiting) == (2, 1)
    assert (after.kv_positions_reserved, after.kv_budget_positions) == (16, 40)
    assert after.kv_slots_used == 2 and after.rounds == 1
    # The prefix cache is off: nothing was looked up in it.
    assert (after.prefix_cache_queries, after.prefix_cache_hits) == (0, 0)
    assert after.prefix_cache_positions == 0 and after.prefix_cache is False
    fixed = (after.policy, after.batch_size, after.context_length, after.chunked_prefill)
    assert fixed == ("continuous", 2, 32, True) and after.round_token_budget == 2048
    client.iterate()
    assert client.snapshot().rounds == 2


class Recorded(EngineObserver):
    """An observer that keeps what it hears."""

    def __init__(self):
        self.first_tokens: list = []
        self.outputs: list = []
        self.rounds: list = []
        self.snapshots: list = []

    def first_token(self, seconds, queued_seconds, prompt_tokens, looked_up_tokens, cached_tokens):
        self.first_tokens.append((prompt_tokens, looked_up_tokens, cached_tokens))

    def finished(self, output, seconds):
        self.outputs.append(output)

    def round_ran(self, new_tokens):
        self.rounds.append(new_tokens)

    def observe(self, snapshot):
        self.snapshots.append(snapshot)


def test_the_observer_hears_plain_values(model):
    engine = engine_for(model, kv_budget_tokens=40)
    observer = Recorded()
    rounds = []
    client = EngineClient(engine, max_queue=8, observer=observer, on_round=rounds.append)
    made, heard = submission(engine, "a", ([1, 2], 3), ([3], 2))
    client.apply(Add((made,)))
    run_until_idle(client)
    # Round 1: two first tokens; round 2: two tokens (the second request's last); round 3: one.
    assert observer.rounds == [2, 2, 1]
    # No prefix cache: nothing looked up in one.
    assert observer.first_tokens == [(2, 0, 0), (1, 0, 0)]
    assert observer.outputs == [f.output for f in heard.finals()]
    assert [s.rounds for s in observer.snapshots] == [1, 2, 3]
    assert [r.round_number for r in rounds] == [1, 2, 3]


# ------------------------------------------------------------------ the thread


def thread_events(client: EngineClient, made: Submission, collected: Collected) -> list:
    """Add a submission to a running client and wait for its last final record."""
    done = threading.Event()

    def hear(event):
        collected.events.append(event)
        if isinstance(event, (Finished, Refused)):
            done.set()

    client.add(Submission(made.id, made.requests, made.received_s, hear))
    assert done.wait(30)
    return collected.events


@pytest.mark.parametrize("where", ["in a round", "around a round"])
def test_the_engine_thread_survives_a_fault_of_its_own_and_tells_the_clients_it_held(where):
    llm = LLM(batch_size=2, policy="continuous")
    faults = []

    class FaultyObserver(EngineObserver):
        def observe(self, snapshot):
            if where == "around a round" and client.tracked and not faults:
                faults.append(where)
                raise RuntimeError(f"a bug {where}")

    client = llm.engine_client(8, observer=FaultyObserver())
    if where == "in a round":
        real_step = client.engine.step

        def step():
            # Once, while a request is held.
            if client.tracked and not faults:
                faults.append(where)
                raise RuntimeError(f"a bug {where}")
            return real_step()

        client.engine.step = step  # type: ignore[method-assign]
    params = SamplingParams(max_tokens=3, ignore_eos=True, temperature=0.0)
    client.start()
    try:
        assert client.is_alive()
        outcomes = []
        for index in (1, 2):
            request = llm.request_maker.make(index, "ROMEO:", params, request_id="c")
            made = Submission("c", (request,), time.perf_counter(), print)
            outcomes.append(thread_events(client, made, Collected()))
    finally:
        client.stop()
    assert not client.is_alive()
    first, second = outcomes
    assert faults == [where]
    assert isinstance(first[0], Accepted) and first[-1].output.finish_reason == "error"
    assert f"a bug {where}" in first[-1].output.error
    (expected,) = completions(llm.generate(["ROMEO:"], params))
    assert second[-1].output.finish_reason == "length"
    assert second[-1].output.token_ids == expected.token_ids
