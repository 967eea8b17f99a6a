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
from ..engine.request import Request
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
        for sample in range(params.n if error is None else 1):
            requests.append(
                llm.make_request(
                    index,
                    entry.prompt,
                    params,
                    request_id=entry.id,
                    logprobs=logprobs,
                    error=error,
                    sample=sample,
                    output_index=len(requests),
                )
            )
    return requests


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
