"""A prompt's final output (minirt/engine/output.py), checked against values written by hand:

* it holds copies of its request's values: what the API returns and the server hands across threads never
  changes with the Request it came from;
* its shape is vLLM's: one RequestOutput per prompt holding its n CompletionOutputs by sample number, each
  token's logprobs a {token id: Logprob} dict with the chosen token first and then the top N by rank, the
  cumulative logprob their sum, the prompt's logprobs a dict per token after a None."""

import math

import pytest

from conftest import finished_request
from minirt.engine.output import CompletionOutput, Logprob, RequestOutput
from minirt.engine.params import SamplingParams


class Letters:
    """A detokenizer by hand: token t is the letter chr(ord('a') + t)."""

    eos_token_id = None

    def decode(self, token_ids):
        return "".join(chr(ord("a") + t) for t in token_ids)


def with_logprobs(request, top_n=None):
    """The finished request (3 tokens of id 5) as if it had asked for logprobs (top_n alternatives)."""
    request.params = SamplingParams(max_tokens=3, logprobs=top_n or 0, temperature=0.0)
    request.want_logprobs = True
    request.logprobs = [-0.5, -1.0, -2.0]
    request.logprob_ranks = [1, 2, 7]
    if top_n:
        # Step 0: token 5 is the most likely; step 1: second, after token 3; step 2: outside the top 2.
        request.top_logprobs = [
            [(5, -0.5), (4, -1.5)],
            [(3, -0.25), (5, -1.0)],
            [(1, -0.1), (2, -0.2)],
        ]
    return request


def test_an_output_keeps_its_values_when_the_request_changes_after():
    request = with_logprobs(finished_request(tokens=3))
    request.prompt_logprobs = [None, -3.0]
    output = RequestOutput.from_requests([request])
    request.token_ids.append(9)
    request.logprobs.append(-4.0)
    request.logprob_ranks.append(1)
    request.prompt_ids.append(7)
    request.prompt_logprobs.append(-5.0)
    (completion,) = output.outputs
    assert completion.token_ids == [5, 5, 5] and len(completion.logprobs) == 3
    assert output.prompt_token_ids == [1, 2] and len(output.prompt_logprobs) == 2


def test_each_tokens_logprobs_hold_the_chosen_token_first_then_the_top_n_by_rank():
    output = RequestOutput.from_requests(
        [with_logprobs(finished_request(tokens=3), top_n=2)], Letters()
    )
    (completion,) = output.outputs
    assert completion.logprobs == [
        # Chosen and most likely: listed once, with its rank 1.
        {5: Logprob(-0.5, 1, "f"), 4: Logprob(-1.5, 2, "e")},
        {5: Logprob(-1.0, 2, "f"), 3: Logprob(-0.25, 1, "d")},
        # Outside the top 2: first, with its own rank, then the top 2.
        {5: Logprob(-2.0, 7, "f"), 1: Logprob(-0.1, 1, "b"), 2: Logprob(-0.2, 2, "c")},
    ]
    assert [list(step) for step in completion.logprobs] == [[5, 4], [5, 3], [5, 1, 2]]
    assert completion.cumulative_logprob == pytest.approx(-3.5)


def test_logprobs_0_gives_the_chosen_token_alone_and_none_gives_none():
    only_chosen = CompletionOutput.from_request(with_logprobs(finished_request(tokens=3)))
    assert only_chosen.logprobs == [
        {5: Logprob(-0.5, 1, None)},
        {5: Logprob(-1.0, 2, None)},
        {5: Logprob(-2.0, 7, None)},
    ]
    none_asked = CompletionOutput.from_request(finished_request(tokens=3))
    assert none_asked.logprobs is None and none_asked.cumulative_logprob is None


def test_the_prompts_logprobs_are_a_dict_per_token_after_a_none():
    request = finished_request(tokens=1)
    request.prompt_ids = [1, 2, 3]
    request.prompt_logprobs = [None, -3.0, -math.inf]
    output = RequestOutput.from_requests([request], Letters())
    assert output.prompt_logprobs == [
        None,
        {2: Logprob(-3.0, None, "c")},
        {3: Logprob(-math.inf, None, "d")},
    ]
    assert RequestOutput.from_requests([finished_request()]).prompt_logprobs is None


def test_a_prompts_samples_are_its_outputs_in_sample_order_with_the_prompts_fields_once():
    samples = [finished_request(index=4, tokens=k + 1) for k in range(3)]
    for k, request in enumerate(samples):
        request.sample = k
        request.id = "q7"
    samples[2].finish_reason = "stop"
    output = RequestOutput.from_requests(samples, Letters())
    assert (output.request_id, output.index, output.prompt, output.prompt_token_ids) == (
        "q7",
        4,
        "To be",
        [1, 2],
    )
    assert [c.index for c in output.outputs] == [0, 1, 2]
    assert [len(c.token_ids) for c in output.outputs] == [1, 2, 3]
    assert [c.finish_reason for c in output.outputs] == ["length", "length", "stop"]
    assert output.finished and output.ok and all(c.finished() for c in output.outputs)
    samples[1].error = "its logits were not finite"
    assert not RequestOutput.from_requests(samples).ok


def test_a_request_refused_before_its_first_token_has_no_cumulative_logprob():
    """No token: no sum (None), not a log-probability of 0 (probability 1); and no entries."""
    request = with_logprobs(finished_request(tokens=3))
    request.token_ids, request.logprobs, request.logprob_ranks = [], [], []
    request.finish_reason, request.error = (
        "error",
        "needs 99 KV cache positions, over the budget of 8",
    )
    completion = CompletionOutput.from_request(request)
    assert completion.cumulative_logprob is None and completion.logprobs == []
    assert not completion.ok
