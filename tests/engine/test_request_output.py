"""A request's final output (minirt/engine/output.py) holds copies of its values: what the API
returns and the server hands across threads never changes with the Request it came from."""

from conftest import finished_request

from minirt.engine.output import RequestOutput


def test_an_output_keeps_its_values_when_the_request_changes_after():
    request = finished_request(tokens=3)
    request.want_logprobs = True
    request.logprobs = [-0.5, -1.0, -2.0]
    request.prompt_logprobs = [None, -3.0]
    output = RequestOutput.from_request(request)
    request.token_ids.append(9)
    request.logprobs.append(-4.0)
    request.prompt_ids.append(7)
    request.prompt_logprobs.append(-5.0)
    assert output.token_ids == [5, 5, 5] and output.logprobs == [-0.5, -1.0, -2.0]
    assert output.prompt_token_ids == [1, 2] and output.prompt_logprobs == [None, -3.0]
