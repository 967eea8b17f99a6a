"""What a hostile review of `minirt serve` found, each held by a test: a budget too small for one token, logprobs
on a model without a tokenizer, a lone surrogate, an integer past Python's digit limit, a prompt over the round's
token budget, usage: null in every chunk with include_usage, and an engine thread that survives a fault of its
own (before: every later completion waited for ever)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import httpx
import pytest

from conftest import FIXTURES, ROOT
from minirt import LLM, SamplingParams
from serving import Server, offline_alone, serve_tests

pytestmark = serve_tests


def test_a_kv_budget_that_holds_no_token_is_one_line_and_exit_2():
    done = subprocess.run(
        [sys.executable, "-m", "minirt", "serve", "--port", "0", "--kv-budget", "1KiB"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        done.returncode == 2 and done.stderr.count("\n") == 1 and "--kv-budget 1KiB" in done.stderr
    )


def test_logprobs_on_a_model_without_a_tokenizer_name_tokens_as_vllm_does():
    body = {
        "prompt": [1, 2, 3],
        "max_tokens": 5,
        "temperature": 0,
        "logprobs": 1,
        "ignore_eos": True,
    }
    with Server("--model", str(FIXTURES / "untied_head")) as server:
        whole = httpx.post(f"{server.url}/v1/completions", json=body).json()
        with httpx.stream(
            "POST", f"{server.url}/v1/completions", json={**body, "stream": True}
        ) as answer:
            events = [
                json.loads(line[6:]) for line in answer.iter_lines() if line.startswith("data: {")
            ]
        assert server.stop() == 0
    (expected,) = offline_alone(
        LLM(FIXTURES / "untied_head"),
        [1, 2, 3],
        SamplingParams(max_new_tokens=5, logprobs=1, ignore_eos=True),
    )
    logprobs = whole["choices"][0]["logprobs"]
    assert logprobs["tokens"] == [f"token_id:{t}" for t in expected.token_ids]
    assert logprobs["token_logprobs"] == pytest.approx(expected.logprobs, abs=1e-5)
    assert logprobs["text_offset"] == [0] * 5
    streamed = [
        lp
        for e in events
        if e["choices"] and e["choices"][0]["logprobs"]
        for lp in e["choices"][0]["logprobs"]["token_logprobs"]
    ]
    assert streamed == pytest.approx(expected.logprobs, abs=1e-5)


@pytest.fixture(scope="module")
def server():
    # Unchunked, so that a prompt over the round's budget is refused (chunked, it is fed over several rounds).
    with Server("--max-round-tokens", "8", "--no-chunked-prefill") as running:
        yield running
        assert running.stop() == 0


@pytest.mark.parametrize("path", ["/v1/completions", "/tokenize"])
def test_a_lone_surrogate_is_a_400_that_names_no_file(server, path):
    answer = httpx.post(f"{server.url}{path}", content=b'{"prompt": "x\\ud800y"}')
    error = answer.json()["error"]
    assert (
        answer.status_code == 400 and error["param"] == "prompt" and "surrogate" in error["message"]
    )
    assert "/" not in error["message"]


def test_an_integer_past_pythons_digit_limit_is_a_plain_400(server):
    answer = httpx.post(
        f"{server.url}/v1/completions", content=b'{"prompt": "x", "seed": ' + b"9" * 5000 + b"}"
    )
    assert answer.status_code == 400 and "4300 digits" in answer.json()["error"]["message"]
    assert "sys." not in answer.text


def test_a_prompt_over_the_round_token_budget_is_about_the_prompt_and_the_servers_flag(server):
    answer = httpx.post(f"{server.url}/v1/completions", json={"prompt": [5] * 17, "max_tokens": 2})
    error = answer.json()["error"]
    assert (
        answer.status_code == 400
        and error["param"] == "prompt"
        and "--max-round-tokens" in error["message"]
    )


def test_with_include_usage_every_chunk_has_a_usage_null_until_the_last(server):
    body = {
        "prompt": "ROMEO",
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body) as answer:
        events = [
            json.loads(line[6:]) for line in answer.iter_lines() if line.startswith("data: {")
        ]
    assert all("usage" in e and e["usage"] is None for e in events[:-1])
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 4


@pytest.mark.parametrize("where", ["in a round", "around a round"])
def test_the_engine_thread_survives_a_fault_of_its_own_and_tells_the_clients_it_held(where):
    from minirt.server.engine_loop import Accepted, ChoiceSpec, Completion, EngineLoop, Finished
    from minirt.server.metrics import ServerMetrics

    llm = LLM(batch_size=2, policy="continuous")
    engine = llm.engine
    metrics = ServerMetrics("m")
    loop = EngineLoop(engine, metrics, max_queue=8)
    faults = []

    def fault_once(real):
        def call(*args):
            # Once, while a request is held.
            if loop.tracked and not faults:
                faults.append(where)
                raise RuntimeError(f"a bug {where}")
            return real(*args)

        return call

    if where == "in a round":
        engine.step = fault_once(engine.step)
    else:
        metrics.observe_engine = fault_once(metrics.observe_engine)
    params = SamplingParams(max_new_tokens=3, ignore_eos=True)
    ids = tuple(engine.prompt_ids("ROMEO:"))

    async def complete() -> list:
        completion = Completion("c", [ChoiceSpec(ids, params, 0)], 0.0)
        loop.submit(completion)
        events = [await asyncio.wait_for(completion.events.get(), 10)]
        while not isinstance(events[-1], Finished):
            events.append(await asyncio.wait_for(completion.events.get(), 10))
        return events

    async def two_completions():
        loop.start()
        try:
            return await complete(), await complete()
        finally:
            await asyncio.to_thread(loop.stop)

    first, second = asyncio.run(two_completions())
    assert faults == [where]
    assert isinstance(first[0], Accepted) and first[-1].finish_reason == "error"
    assert f"a bug {where}" in first[-1].error
    (expected,) = offline_alone(llm, "ROMEO:", params)
    assert second[-1].finish_reason == "length" and list(second[-1].token_ids) == expected.token_ids
