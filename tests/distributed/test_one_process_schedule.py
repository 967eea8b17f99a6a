"""The Ray path's replay of one process's schedule (`OneProcessSchedule`), without Ray: records of a
real one-process run, fed in input order as the workers' rows arrive, come out with the group and
round fields that run gave them.  The expected fields are the real engine's, run on a model."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("ray", reason="needs ray (pip install -e .[ray])")
pytestmark = pytest.mark.ray

from minirt import LLM, SamplingParams  # noqa: E402 (after the importorskip above)
from minirt.distributed.serve_on_ray import OneProcessSchedule  # noqa: E402
from minirt.cli.records import record as record_of  # noqa: E402

WHERE = ("group", "rounds_waited", "first_round", "finish_round")


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    policy=st.sampled_from(["static", "continuous"]),
    batch_size=st.integers(1, 4),
    lengths=st.lists(st.tuples(st.integers(1, 20), st.integers(1, 9)), min_size=1, max_size=9),
)
def test_the_replay_gives_each_record_the_rounds_of_one_process(
    tiny_lm, policy, batch_size, lengths
):
    llm = LLM(tiny_lm, batch_size=batch_size, policy=policy, round_token_budget=16, seed=1)
    prompts = [list(range(1, p + 1)) for p, _ in lengths]
    # Sampled, with a quarter of the vocabulary stopping, so that many stop before their
    # max_new_tokens (the replay must end them where the run did).
    stops = tuple(range(0, llm.model.config.vocab_size, 4))
    params = [
        SamplingParams(max_tokens=n, temperature=1.0, stop_token_ids=stops) for _, n in lengths
    ]
    # The run's records, as the command line writes them (one per request).
    outputs = llm.make_requests(prompts, params)
    llm.run(outputs)
    schedule = OneProcessSchedule(policy, batch_size, 16)
    replayed = []
    for output, sp in zip(outputs, params, strict=True):
        record = record_of(output)
        row = {
            "kv_budget": llm.engine.kv_budget_positions,
            "n_positions": llm.model.config.n_positions,
            "max_new_tokens": sp.max_new_tokens,
        }
        # The workers' own fields, which the replay must replace.
        schedule.add({**record, **dict.fromkeys(WHERE, -1)}, row)
        replayed += schedule.ready()
    replayed += schedule.ready(final=True)
    assert [r["index"] for r in replayed] == list(range(len(lengths)))
    assert [[r[k] for k in WHERE] for r in replayed] == [
        [getattr(o, k) for k in WHERE] for o in outputs
    ]
