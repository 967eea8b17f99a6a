"""How a prompts file's entries become requests.

Owns: `build_requests`, one request per entry and sample, a JSONL line's own fields over the run's
defaults, and a bad entry becoming a request with its own error.  Shared by `python -m
minirt.generate` and its Ray workers (minirt/distributed/ray_data.py), so that both make the same
requests.

Must not know: files, output, or how requests are served.
"""

from __future__ import annotations


from .prompt_file import PromptEntry, json_text
from ..engine.params import SamplingParams, first_refused_field
from ..engine.request import Request, fail_request
from ..errors import RequestError
from ..llm import LLM


def build_requests(
    llm: LLM,
    entries: list[PromptEntry],
    run_defaults: SamplingParams,
    logprobs: bool,
    indexes: list[int] | None = None,
) -> list[Request]:
    """One request per prompts-file line and sample (its index: the line's place among them, or the
    one `indexes` gives, as rows spread over workers keep theirs; n samples: n requests, one after
    another); a bad line becomes a request with its own error, and its peers still run."""
    requests: list[Request] = []
    if indexes is None:
        indexes = list(range(len(entries)))
    for index, entry in zip(indexes, entries, strict=True):
        error = entry.error
        params = run_defaults
        if error is None:
            try:
                params = run_defaults.updated(**entry.overrides)
            except RequestError as exc:
                error = f"line {entry.line}: {override_refusal(run_defaults, entry.overrides, exc)}"
        if error is not None:
            requests.append(
                refused_line(index, entry, run_defaults, logprobs, len(requests), error)
            )
            continue
        assert entry.prompt is not None  # a line without a prompt has an error
        for sample in range(params.n):
            request = llm.make_request(
                index,
                entry.prompt,
                params,
                request_id=entry.id,
                logprobs=logprobs,
                sample=sample,
                output_index=len(requests),
            )
            requests.append(request)
    return requests


def refused_line(
    index: int,
    entry: PromptEntry,
    params: SamplingParams,
    logprobs: bool,
    output_index: int,
    error: str,
) -> Request:
    """The request of a line that is bad before any prompt is made of it (not JSON, an unknown
    or bad field): failed at once with the line's own error, and never served, so that its
    record still comes in its place."""
    if entry.id is None:
        request_id = str(index)
    else:
        request_id = entry.id
    request = Request(
        index=index,
        id=request_id,
        prompt=entry.prompt if isinstance(entry.prompt, str) else None,
        prompt_ids=[],
        params=params,
        # Its record has the logprobs fields its peers have (empty).
        want_logprobs=logprobs or params.logprobs is not None,
        output_index=output_index,
    )
    fail_request(request, error)
    return request


def override_refusal(run_defaults: SamplingParams, overrides: dict, refusal: RequestError) -> str:
    """Why a line's own sampling fields were refused, naming the field and showing its value as
    the line wrote it, in JSON: 'temperature must be a number >= 0 (0 is greedy), got "hot"',
    never Python's 'hot' (nor True for true, None for null, {'a': 1} for {"a": 1})."""
    refused = first_refused_field(run_defaults, overrides)
    if refused is None:
        # Each field passes alone: the refusal is of the fields together, in its own words.
        return str(refusal)
    name, rule = refused
    return f"{rule}, got {json_text(overrides[name])}"
