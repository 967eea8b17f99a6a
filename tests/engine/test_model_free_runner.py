"""The model-free runner: the engine's own rounds with no numbers, as `minirt rounds` and the Ray
replay use it.  Expected rounds are counted by hand."""

from conftest import serve_all
from conftest import stub_request as stub

from minirt.engine.engine import Engine
from minirt.engine.model_free_runner import Ending, ModelFreeRunner


def test_each_request_gives_token_zero_until_its_own_stop_rule():
    """Static, 2 rows: requests of 3 and 1 tokens share group 1 (rounds 1-3), the third waits
    for it and runs alone in rounds 4-5."""
    requests = [stub(0, 2, 3), stub(1, 4, 1), stub(2, 1, 2)]
    stats = serve_all(Engine(ModelFreeRunner(), None, batch_size=2), requests)
    assert [r.token_ids for r in requests] == [[0, 0, 0], [0], [0, 0]]
    assert [(r.group, r.first_round, r.finish_round) for r in requests] == [
        (1, 1, 3),
        (1, 1, 1),
        (2, 4, 5),
    ]
    assert [r.rounds_waited for r in requests] == [0, 0, 3]
    assert stats.active_rows_per_round == [2, 1, 1, 1, 1]
    assert stats.held_rows_per_round == [2, 2, 2, 1, 1]


def test_an_ending_stops_a_request_early_or_fails_it_a_round_after_its_last_token():
    """max_new_tokens 5 each; one stops after 2 tokens (an EOS, in the run replayed), one fails
    after 1 (its logits went NaN in its second token's round), one runs to its length."""
    runner = ModelFreeRunner()
    stopped, failed, full = stub(0, 1, 5), stub(1, 1, 5), stub(2, 1, 5)
    runner.endings[stopped] = Ending(2)
    runner.endings[failed] = Ending(1, fails=True)
    engine = Engine(runner, None, batch_size=3, policy="continuous")
    serve_all(engine, [stopped, failed, full])
    assert (stopped.token_ids, stopped.finish_reason, stopped.finish_round) == ([0, 0], "stop", 2)
    assert (failed.token_ids, failed.finish_reason, failed.finish_round) == ([0], "error", 2)
    assert (full.token_ids, full.finish_reason, full.finish_round) == ([0] * 5, "length", 5)


def test_a_failure_before_the_first_token_ends_it_in_its_prefill_round():
    runner = ModelFreeRunner()
    request = stub(0, 3, 4)
    runner.endings[request] = Ending(0, fails=True)
    serve_all(Engine(runner, None, batch_size=1), [request])
    assert (request.token_ids, request.finish_reason, request.finish_round) == ([], "error", 1)


def test_the_context_ends_a_request_as_the_engine_does():
    """A context of 6: a 4-token prompt has room for 2 tokens (prompt + output fill it)."""
    request = stub(0, 4, 10)
    serve_all(Engine(ModelFreeRunner(n_positions=6), None, batch_size=1), [request])
    assert request.token_ids == [0, 0] and request.finish_reason == "length"
