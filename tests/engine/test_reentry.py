"""Re-entrant calls: a run's own callbacks (or another thread) asking the same LLM for a second run,
or stepping the run behind its back.

The rule (docs/refusals.md, "The Python API"): the call is refused with a ReentryError (a RuntimeError
that says what happened and what to do), and the run in progress goes on untouched.  The expected
results come from the invariant "a refused call changes nothing": each outer run must give exactly what
the same prompts give in a run with no callbacks at all, and the LLM must serve normally afterwards.
"""

from __future__ import annotations

import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minirt import LLM, SamplingParams
from minirt.errors import MinirtError, ReentryError
from conftest import completions

PROMPTS = ["To be", "or not", "to be, that is"]


@pytest.fixture(scope="module")
def llm():
    return LLM(batch_size=2)


def plain_run(llm, params):
    """The prompts' outputs, and the run's round count, with no callbacks at all."""
    outputs = completions(llm.generate(PROMPTS, params))
    return [(o.token_ids, o.finish_reason) for o in outputs], llm.last_stats.rounds


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    max_new_tokens=st.integers(1, 4),
    which=st.sampled_from(["on_token", "on_final"]),
    when=st.sampled_from(["first", "last"]),
    inner=st.sampled_from(["generate", "run", "step"]),
)
def test_a_call_from_a_callback_is_refused_and_the_run_goes_on(
    llm, max_new_tokens, which, when, inner
):
    params = SamplingParams(max_tokens=max_new_tokens, temperature=0.8, seed=3)
    expected, expected_rounds = plain_run(llm, params)
    refusals = []
    calls = []

    def call_inside(_event):
        calls.append(1)
        # The first callback, or every one (so the last one too, after which nothing runs).
        if when == "first" and len(calls) > 1:
            return
        try:
            if inner == "generate":
                completions(
                    llm.generate(
                        ["a prompt of its own"], SamplingParams(max_tokens=2, temperature=0.0)
                    )
                )
            elif inner == "run":
                requests = llm.make_requests(["a prompt of its own"], None)
                llm.run(requests)
            else:
                llm.engine.step()
        except ReentryError as exc:
            refusals.append(exc)

    outputs = completions(llm.generate(PROMPTS, params, **{which: call_inside}))
    assert [(o.token_ids, o.finish_reason) for o in outputs] == expected
    assert llm.last_stats.rounds == expected_rounds
    assert refusals, "the inner call was not refused"
    assert len(refusals) == (1 if when == "first" else len(calls))
    message = str(refusals[0])
    assert "\n" not in message and "while this engine is serving a run" in message
    assert isinstance(refusals[0], RuntimeError) and isinstance(refusals[0], MinirtError)
    # And the LLM is as usable as before.
    assert plain_run(llm, params) == (expected, expected_rounds)


def test_a_call_from_another_thread_during_a_run_is_refused(llm):
    params = SamplingParams(max_tokens=3, temperature=0.0)
    expected, _ = plain_run(llm, params)
    seen = []

    def from_another_thread():
        try:
            completions(llm.generate(["hello"], params))
        except ReentryError as exc:
            seen.append(exc)

    def on_token(_event):
        if not seen:
            # Deterministic: the other thread runs to its end while this run waits in a callback.
            thread = threading.Thread(target=from_another_thread)
            thread.start()
            thread.join()

    outputs = completions(llm.generate(PROMPTS, params, on_token=on_token))
    assert len(seen) == 1
    assert [(o.token_ids, o.finish_reason) for o in outputs] == expected


def test_the_refusal_names_the_call_that_was_refused(llm):
    names = []

    def on_token(_event):
        for call in (lambda: completions(llm.generate(["x"])), lambda: llm.engine.step()):
            try:
                call()
            except ReentryError as exc:
                names.append(str(exc).split("(")[0])

    completions(
        llm.generate(["x"], SamplingParams(max_tokens=1, temperature=0.0), on_token=on_token)
    )
    assert names == ["LLM.generate", "Engine.step"]


def test_aborting_from_a_callback_is_allowed(llm):
    """Abort is not a run of its own: from on_token it ends that request, and its peers go on."""
    params = SamplingParams(max_tokens=5, ignore_eos=True, temperature=0.0)
    expected, _ = plain_run(llm, params)

    def on_token(event):
        if event.index == 0:
            llm.engine.abort(event.id)

    outputs = completions(llm.generate(PROMPTS, params, on_token=on_token))
    assert outputs[0].finish_reason == "abort" and len(outputs[0].token_ids) == 1
    assert [(o.token_ids, o.finish_reason) for o in outputs[1:]] == expected[1:]


def test_threads_racing_into_one_llm_each_get_a_result_or_a_reentry_error(llm):
    """Three threads released at once into the same LLM, many times, with Python switching threads as often
    as it can: each call either gives exactly what a lone call gives, or is refused with a ReentryError.
    Never an internal error, and never a mixed-up result (the engine is taken without waiting, so two runs
    never interleave)."""
    import sys

    params = SamplingParams(max_tokens=3, temperature=1.0, seed=3)
    expected, _ = plain_run(llm, params)
    outcomes = []
    barrier = threading.Barrier(3)

    def call():
        barrier.wait()
        try:
            outputs = completions(llm.generate(PROMPTS, params))
            outcomes.append([(o.token_ids, o.finish_reason) for o in outputs])
        except ReentryError:
            outcomes.append("refused")
        except Exception as exc:  # noqa: BLE001 (any other error is the failure this test looks for)
            outcomes.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(25):
            threads = [threading.Thread(target=call) for _ in range(3)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=60)
    finally:
        sys.setswitchinterval(interval)
    assert len(outcomes) == 75
    errors = [o for o in outcomes if isinstance(o, Exception)]
    assert not errors, errors[:3]
    served = [o for o in outcomes if o != "refused"]
    assert served and all(o == expected for o in served)
    # And the LLM serves normally afterwards.
    assert plain_run(llm, params)[0] == expected


def test_start_run_from_a_callback_is_refused_and_the_run_goes_on(llm):
    params = SamplingParams(max_tokens=3, temperature=0.0)
    expected, _ = plain_run(llm, params)
    refused = []

    def on_token(_event):
        try:
            llm.engine.start_run()
        except ReentryError as exc:
            refused.append(exc)

    outputs = completions(llm.generate(PROMPTS, params, on_token=on_token))
    assert refused and [(o.token_ids, o.finish_reason) for o in outputs] == expected


def test_leaving_a_run_of_steps_early_frees_the_llm(llm):
    """A `break` out of `with llm.steps(...)`, and an exception raised in its loop, end the run
    there: the LLM serves the same prompts as before straight after (no ReentryError)."""
    params = SamplingParams(max_tokens=3, temperature=0.0)
    expected, _ = plain_run(llm, params)
    with llm.steps(llm.make_requests(PROMPTS, params)) as steps:
        for step in steps:
            if step.round_number == 1:
                break
    assert plain_run(llm, params)[0] == expected
    with pytest.raises(KeyError):
        with llm.steps(llm.make_requests(PROMPTS, params)) as steps:
            for _step in steps:
                raise KeyError("the caller's own error")
    assert plain_run(llm, params)[0] == expected
