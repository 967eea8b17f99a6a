"""`minirt serve` over raw HTTP (httpx, and a bare socket where a client must misbehave): bodies that are not
JSON, too big, of the wrong types or missing; wrong methods and paths; a client that leaves mid-stream or while
queued; and the other endpoints in vLLM's shapes.  Every error is OpenAI's object, never a traceback."""

from __future__ import annotations

import json
import socket

import httpx
import pytest
from serving import Server, serve_tests
from tokenizers import Tokenizer as HFTokenizer

from minirt.loading.checkpoint import shipped_model_folder

pytestmark = serve_tests


@pytest.fixture(scope="module")
def server():
    with Server("--batch-size", "8") as running:
        yield running
        assert running.stop() == 0


def assert_openai_error(answer: httpx.Response, status: int, param=None) -> dict:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == "application/json"
    body = answer.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["param"] == param
    assert "Traceback" not in answer.text and "\n" not in body["error"]["message"]
    return body["error"]


@pytest.mark.parametrize(
    "content, param",
    [
        (b"{not json", None),
        (b'{"prompt": "x",}', None),
        (b"[1, 2]", None),
        (b'"a string"', None),
        (b"", None),
        (b"   ", None),
        (b'{"prompt": 5}', "prompt"),
        (b'{"prompt": [[1, 2], "x"]}', "prompt"),
        (b'{"prompt": "x", "max_tokens": "5"}', "max_tokens"),
        (b'{"prompt": "x", "n": true}', "n"),
        (b'{"prompt": "x", "stream": "yes"}', "stream"),
        (b'{"prompt": "x", "stop": [1]}', "stop"),
        (b'{"prompt": "x", "stream_options": {"include_usage": true}}', "stream_options"),
        (b'{"max_tokens": 3}', "prompt"),
        (b'{"prompt": "x", "logprobs": 2, "echo": true, "stream": true}', "echo"),
        (b'{"prompt": "\xff\xfe"}', None),
    ],
)
def test_a_bad_body_is_a_400_in_openai_shape(server, content, param):
    answer = httpx.post(
        f"{server.url}/v1/completions",
        content=content,
        headers={"content-type": "application/json"},
    )
    assert_openai_error(answer, 400, param)


def test_a_missing_body_is_a_400(server):
    answer = httpx.post(f"{server.url}/v1/completions")
    assert "no body" in assert_openai_error(answer, 400)["message"]


def test_a_huge_body_is_a_413_whether_declared_or_streamed(server):
    huge = json.dumps({"prompt": "x" * (3 * 2**20)}).encode()
    answer = httpx.post(f"{server.url}/v1/completions", content=huge)
    assert "limit" in assert_openai_error(answer, 413)["message"]

    def chunked():  # no Content-Length: the limit holds on what arrives
        for _ in range(48):
            yield b" " * 2**16

    answer = httpx.post(f"{server.url}/v1/completions", content=chunked())
    assert_openai_error(answer, 413)


def test_a_wrong_method_is_a_405_and_an_unknown_path_a_404(server):
    assert_openai_error(httpx.get(f"{server.url}/v1/completions"), 405)
    assert_openai_error(httpx.post(f"{server.url}/v1/models"), 405)
    assert_openai_error(httpx.get(f"{server.url}/v1/nothing-here"), 404)
    assert_openai_error(httpx.get(f"{server.url}/no-such-page"), 404)
    assert_openai_error(httpx.post(f"{server.url}/"), 405)


def test_models_health_tokenize_and_detokenize_in_vllm_shapes(server):
    models = httpx.get(f"{server.url}/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == [
        "shakespeare-gpt2-tiny"
    ]
    assert models["data"][0]["max_model_len"] == 256
    assert httpx.get(f"{server.url}/health").status_code == 200
    reference = HFTokenizer.from_file(str(shipped_model_folder() / "tokenizer.json"))
    text = "ROMEO: But soft, what light through yonder window breaks?"
    ids = reference.encode(text).ids
    tokenized = httpx.post(f"{server.url}/tokenize", json={"prompt": text}).json()
    assert (
        tokenized["tokens"] == ids
        and tokenized["count"] == len(ids)
        and tokenized["max_model_len"] == 256
    )
    assert httpx.post(f"{server.url}/detokenize", json={"tokens": ids}).json() == {
        "prompt": reference.decode(ids)
    }
    assert_openai_error(
        httpx.post(f"{server.url}/detokenize", json={"tokens": [4096]}), 400, "tokens"
    )
    assert_openai_error(httpx.post(f"{server.url}/tokenize", json={"prompt": 3}), 400, "prompt")
    assert_openai_error(
        httpx.post(f"{server.url}/tokenize", json={"prompt": "x", "model": "other"}), 404, "model"
    )


METRICS = [
    "minirt:num_requests_running",
    "minirt:num_requests_waiting",
    "minirt:kv_cache_usage_perc",
    "minirt:kv_slots_used",
    "minirt:prompt_tokens_total",
    "minirt:generation_tokens_total",
    "minirt:request_success_total",
    "minirt:time_to_first_token_seconds_count",
    "minirt:time_per_output_token_seconds_count",
    "minirt:e2e_request_latency_seconds_count",
    "minirt:request_queue_time_seconds_count",
    "minirt:rounds_total",
]


def test_metrics_count_what_a_completion_did(server):
    before = {
        name: server.metric(name) for name in METRICS if name != "minirt:request_success_total"
    }
    length_before = server.metric("minirt:request_success_total", finished_reason="length")
    body = {"prompt": "ROMEO:", "max_tokens": 7, "temperature": 0, "ignore_eos": True, "n": 3}
    completion = httpx.post(f"{server.url}/v1/completions", json=body).json()
    prompt_tokens = completion["usage"]["prompt_tokens"]
    assert (
        server.metric("minirt:request_success_total", finished_reason="length") == length_before + 3
    )
    assert (
        server.metric("minirt:generation_tokens_total")
        == before["minirt:generation_tokens_total"] + 21
    )
    # Each of the three choices prefilled its prompt.
    assert (
        server.metric("minirt:prompt_tokens_total")
        == before["minirt:prompt_tokens_total"] + 3 * prompt_tokens
    )
    assert server.metric("minirt:rounds_total") == before["minirt:rounds_total"] + 7
    # This server runs without --prefix-cache: nothing was looked up in one, or found.
    assert server.metric("minirt:prefix_cache_queries_total") == 0
    assert server.metric("minirt:prefix_cache_hits_total") == 0
    for name in (
        "time_to_first_token",
        "e2e_request_latency",
        "request_queue_time",
        "time_per_output_token",
    ):
        key = f"minirt:{name}_seconds_count"
        assert server.metric(key) == before[key] + 3
    server.wait_for_metric("minirt:num_requests_running", 0)
    from prometheus_client.parser import text_string_to_metric_families

    families = {
        f.name for f in text_string_to_metric_families(httpx.get(f"{server.url}/metrics").text)
    }
    assert {"minirt:num_requests_running", "minirt:request_success", "minirt:rounds"} <= families


def open_stream(server, body: dict) -> socket.socket:
    """A raw HTTP request whose response we read a little of, then drop."""
    sock = socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])))
    payload = json.dumps(body).encode()
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    return sock


LONG = {"prompt": "ROMEO:", "max_tokens": 250, "ignore_eos": True, "temperature": 0, "n": 64}


def test_a_client_that_leaves_mid_stream_is_aborted_and_frees_its_rows(server):
    aborted_before = server.metric("minirt:request_success_total", finished_reason="abort")
    sock = open_stream(server, {**LONG, "stream": True})
    first = b""
    while b"data: " not in first:  # the headers, then a first event
        first += sock.recv(4096)
    assert first.startswith(b"HTTP/1.1 200")
    sock.close()
    # 64 x 250 tokens in rows of 8 would take seconds more; the abort frees every row within a round.
    server.wait_for_metric("minirt:num_requests_running", 0, timeout=5)
    server.wait_for_metric("minirt:num_requests_waiting", 0, timeout=5)
    server.wait_for_metric("minirt:kv_slots_used", 0, timeout=5)
    assert server.metric("minirt:kv_cache_usage_perc") == 0
    aborted = (
        server.metric("minirt:request_success_total", finished_reason="abort") - aborted_before
    )
    assert aborted >= 56  # at most the first 8 rows could have finished
    # The server goes on serving.
    answer = httpx.post(
        f"{server.url}/v1/completions", json={"prompt": "x", "max_tokens": 2}
    ).json()
    assert answer["usage"]["completion_tokens"] >= 1


def test_a_client_that_leaves_while_waiting_is_aborted_too(server):
    aborted_before = server.metric("minirt:request_success_total", finished_reason="abort")
    sock = open_stream(server, LONG)  # not streamed: nothing is sent until it ends
    server.wait_for_metric("minirt:num_requests_running", 8, timeout=5)
    sock.close()
    server.wait_for_metric("minirt:num_requests_waiting", 0, timeout=5)
    server.wait_for_metric("minirt:num_requests_running", 0, timeout=5)
    assert (
        server.metric("minirt:request_success_total", finished_reason="abort") - aborted_before
        >= 56
    )


def test_a_full_queue_is_a_503_a_completion_bigger_than_the_queue_a_400_and_the_queue_drains():
    with Server("--batch-size", "2", "--max-queue", "4") as server:
        # Four choices fit the queue: 2 take the rows, 2 wait.
        sock = open_stream(server, {**LONG, "n": 4})
        server.wait_for_metric("minirt:num_requests_waiting", 2, timeout=5)
        # Three more would make 5 waiting: refused, to retry later.
        answer = httpx.post(
            f"{server.url}/v1/completions", json={"prompt": "x", "max_tokens": 2, "n": 3}
        )
        assert "queue is full" in assert_openai_error(answer, 503)["message"]
        # One completion of more choices than the queue holds could never be queued: a 400, not a 503.
        answer = httpx.post(
            f"{server.url}/v1/completions", json={"prompt": ["x"] * 5, "max_tokens": 2}
        )
        assert "--max-queue" in assert_openai_error(answer, 400, "n")["message"]
        sock.close()
        server.wait_for_metric("minirt:num_requests_waiting", 0, timeout=5)
        server.wait_for_metric("minirt:num_requests_running", 0, timeout=5)
        answer = httpx.post(
            f"{server.url}/v1/completions", json={"prompt": "x", "max_tokens": 2, "n": 3}
        )
        assert answer.status_code == 200
        assert server.stop() == 0


@pytest.fixture(scope="module")
def unchunked_server():
    # Unchunked, so that a prompt over the round's budget is refused (chunked, it is fed over several rounds).
    with Server("--max-round-tokens", "8", "--no-chunked-prefill") as running:
        yield running
        assert running.stop() == 0


@pytest.mark.parametrize("path", ["/v1/completions", "/tokenize"])
def test_a_lone_surrogate_is_a_400_that_names_no_file(unchunked_server, path):
    answer = httpx.post(f"{unchunked_server.url}{path}", content=b'{"prompt": "x\\ud800y"}')
    error = answer.json()["error"]
    assert (
        answer.status_code == 400 and error["param"] == "prompt" and "surrogate" in error["message"]
    )
    assert "/" not in error["message"]


def test_an_integer_past_pythons_digit_limit_is_a_plain_400(unchunked_server):
    answer = httpx.post(
        f"{unchunked_server.url}/v1/completions",
        content=b'{"prompt": "x", "seed": ' + b"9" * 5000 + b"}",
    )
    assert answer.status_code == 400 and "4300 digits" in answer.json()["error"]["message"]
    assert "sys." not in answer.text


def test_a_prompt_over_the_round_token_budget_is_about_the_prompt_and_the_servers_flag(
    unchunked_server,
):
    answer = httpx.post(
        f"{unchunked_server.url}/v1/completions", json={"prompt": [5] * 17, "max_tokens": 2}
    )
    error = answer.json()["error"]
    assert (
        answer.status_code == 400
        and error["param"] == "prompt"
        and "--max-round-tokens" in error["message"]
    )


def test_with_include_usage_every_chunk_has_a_usage_null_until_the_last(unchunked_server):
    body = {
        "prompt": "ROMEO",
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", f"{unchunked_server.url}/v1/completions", json=body) as answer:
        events = [
            json.loads(line[6:]) for line in answer.iter_lines() if line.startswith("data: {")
        ]
    assert all("usage" in e and e["usage"] is None for e in events[:-1])
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 4
