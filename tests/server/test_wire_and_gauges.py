"""What a server promises where the suite once looked only from afar: a stream's bytes on the wire (HTTP/1.1
chunks carrying server-sent events, decoded here by hand, not by a client library); the value of each gauge
while a known set of requests runs, computed by hand; a server whose rows are all busy while its queue is
empty (a new request waits, one past the queue is a 503); and the status of a whole completion, not
streamed, that a shutdown cuts (a 503, and so is one still waiting)."""

from __future__ import annotations

import json
import re
import signal
import socket
import threading

import httpx
import pytest
from serving import Server, serve_tests
from tokenizers import Tokenizer as HFTokenizer

from minirt.loading.checkpoint import shipped_model_folder

pytestmark = serve_tests

# Token ids, so that a prompt's length is known without a tokenizer: 3 tokens.
PROMPT_IDS = [5, 6, 7]
LONG = {"prompt": PROMPT_IDS, "max_tokens": 200, "ignore_eos": True, "temperature": 0}


def port_of(server: Server) -> int:
    return int(server.url.rsplit(":", 1)[1])


def send_raw(server: Server, body: dict, close: bool = False) -> socket.socket:
    """A raw POST /v1/completions; with `close`, the server ends the connection after its answer."""
    sock = socket.create_connection(("127.0.0.1", port_of(server)), timeout=60)
    payload = json.dumps(body).encode()
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + (b"Connection: close\r\n" if close else b"")
        + f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    return sock


def read_to_end(sock: socket.socket) -> bytes:
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    sock.close()
    return received


def dechunk(body: bytes) -> tuple[bytes, list[int]]:
    """HTTP/1.1 chunked transfer coding, undone by hand (RFC 9112 section 7.1): each chunk is its size
    in hex, CRLF, that many bytes, CRLF; a chunk of size 0 and a CRLF end it.  Returns the payload and
    the chunk sizes; fails on any byte out of place."""
    payload, sizes, at = b"", [], 0
    while True:
        line_end = body.index(b"\r\n", at)
        size = int(body[at:line_end].split(b";")[0], 16)
        at = line_end + 2
        if size == 0:
            assert body[at:] == b"\r\n", f"bytes after the last chunk: {body[at:]!r}"
            return payload, sizes
        payload += body[at : at + size]
        sizes.append(size)
        assert body[at + size : at + size + 2] == b"\r\n", "a chunk not followed by CRLF"
        at += size + 2


# One event: a `data:` field on one line, then the blank line that ends the event (no CR anywhere).
EVENT = rb"data: [^\r\n]+\n\n"


@pytest.fixture(scope="module")
def server():
    with Server("--batch-size", "4") as running:
        yield running
        assert running.stop() == 0


def test_a_stream_on_the_wire_is_chunks_of_whole_events_ending_in_done(server):
    body = {"prompt": "ROMEO:", "max_tokens": 12, "temperature": 0, "n": 2, "stream": True}
    received = read_to_end(send_raw(server, body, close=True))
    head, _, wire_body = received.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    assert status_line == "HTTP/1.1 200 OK"
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        assert name.lower() not in headers, f"header {name} sent twice"
        headers[name.lower()] = value.strip()
    assert headers["content-type"].split(";")[0] == "text/event-stream"
    assert headers["transfer-encoding"] == "chunked" and "content-length" not in headers
    payload, sizes = dechunk(wire_body)
    # The whole payload is events and nothing else, the last one [DONE].
    assert re.fullmatch(rb"(" + EVENT + rb")+", payload), payload[:300]
    assert payload.endswith(b"\n\ndata: [DONE]\n\n")
    events = [e[len(b"data: ") :] for e in payload.split(b"\n\n")[:-1]]
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    # The text of each choice, pieced together from the wire, is the whole completion's text.
    streamed = ["", ""]
    for c in chunks:
        for choice in c["choices"]:
            streamed[choice["index"]] += choice["text"]
    whole = httpx.post(f"{server.url}/v1/completions", json={**body, "stream": False}).json()
    assert streamed == [choice["text"] for choice in whole["choices"]]
    # The server sends each event as it is made, not the stream in one piece at the end.
    assert len(sizes) > 2


def test_each_gauge_holds_the_value_counted_by_hand_while_requests_run_and_0_after():
    # 2 rows, a budget of 1,000 KV positions; 4 choices of a 3-token prompt and 200 tokens each.
    with Server("--batch-size", "2", "--kv-budget", "1000") as server:
        sock = send_raw(server, {**LONG, "n": 4, "stream": True})
        server.wait_for_metric("minirt:num_requests_waiting", 2, timeout=10)
        assert server.metric("minirt:num_requests_running") == 2
        assert server.metric("minirt:kv_slots_used") == 2
        # Each running choice reserves its prompt and every token but the last: 3 + 200 - 1.
        assert server.metric("minirt:kv_cache_usage_perc") == pytest.approx(2 * 202 / 1000)
        assert server.metric("minirt:prefix_cache_positions") == 0
        sock.close()
        for name in ("running", "waiting"):
            server.wait_for_metric(f"minirt:num_requests_{name}", 0, timeout=10)
        server.wait_for_metric("minirt:kv_slots_used", 0, timeout=10)
        assert server.metric("minirt:kv_cache_usage_perc") == 0
        # A text prompt's tokens, counted by the tokenizers library: prefilled once per choice.
        tokenizer = HFTokenizer.from_file(str(shipped_model_folder() / "tokenizer.json"))
        prompt = "To be, or not to be"
        before = server.metric("minirt:prompt_tokens_total")
        answer = httpx.post(
            f"{server.url}/v1/completions", json={"prompt": prompt, "max_tokens": 2, "n": 3}
        )
        assert answer.status_code == 200
        counted = len(tokenizer.encode(prompt).ids)
        assert server.metric("minirt:prompt_tokens_total") - before == 3 * counted
        assert answer.json()["usage"]["prompt_tokens"] == counted
        assert server.stop() == 0


def post_in_thread(url: str, body: dict, into: dict) -> threading.Thread:
    def run():
        into["answer"] = httpx.post(f"{url}/v1/completions", json=body, timeout=120)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_with_every_row_busy_and_the_queue_empty_a_request_waits_and_one_past_the_queue_is_a_503():
    # Rounds of 20 ms at least, so that the two rows stay busy while the test looks.
    with Server("--batch-size", "2", "--max-queue", "1", "--round-delay", "20") as server:
        # Two streams take the two rows (one of n = 2 would be more choices than the queue holds).
        # Each in turn: sent together, the second could find the first still queued, and the
        # queue of one full.
        socks = []
        for rows in (1, 2):
            socks.append(send_raw(server, {**LONG, "stream": True}))
            server.wait_for_metric("minirt:num_requests_running", rows, timeout=10)
        assert server.metric("minirt:num_requests_waiting") == 0
        # Every row is busy and nobody waits: a request is queued, not refused.
        waiter: dict = {}
        body = {"prompt": PROMPT_IDS, "max_tokens": 5, "temperature": 0, "ignore_eos": True}
        thread = post_in_thread(server.url, body, waiter)
        server.wait_for_metric("minirt:num_requests_waiting", 1, timeout=10)
        # The queue of one is exactly full: the next is a 503, and the waiter keeps its place.
        refused = httpx.post(f"{server.url}/v1/completions", json=body)
        assert refused.status_code == 503 and "queue is full" in refused.json()["error"]["message"]
        assert server.metric("minirt:num_requests_waiting") == 1
        for sock in socks:
            sock.close()  # the rows free up
        thread.join(60)
        answer = waiter["answer"]
        assert answer.status_code == 200
        alone = httpx.post(f"{server.url}/v1/completions", json=body).json()
        assert answer.json()["choices"][0]["text"] == alone["choices"][0]["text"]
        assert answer.json()["usage"]["completion_tokens"] == 5
        assert server.stop() == 0


def test_a_whole_completion_cut_by_the_shutdown_is_a_503_and_so_is_one_still_waiting():
    with Server("--batch-size", "2", "--shutdown-timeout", "0.5") as server:
        running: dict = {}
        waiting: dict = {}
        # 16 choices of 200 tokens in 2 rows: 1,600 rounds, far longer than the grace period.
        first = post_in_thread(server.url, {**LONG, "n": 16}, running)
        server.wait_for_metric("minirt:num_requests_running", 2, timeout=10)
        server.wait_for_metric("minirt:num_requests_waiting", 14, timeout=10)
        second = post_in_thread(server.url, {**LONG, "max_tokens": 3}, waiting)
        server.wait_for_metric("minirt:num_requests_waiting", 15, timeout=10)
        assert server.stop(signal.SIGTERM, timeout=30) == 0
        first.join(30)
        second.join(30)
    for result in (running, waiting):
        answer = result["answer"]
        assert answer.status_code == 503, answer.text
        error = answer.json()["error"]
        assert error["code"] == "aborted"
        assert "shut down" in error["message"] and "Traceback" not in answer.text


def test_a_prompt_of_ids_that_fills_the_context_exactly_is_served_and_one_more_is_a_400(server):
    """The context's count of ids is the most a prompt may hold: exactly that many is served
    (with max_tokens null: one token, which fills the context, so it ends on "length"), and one
    more is refused naming the prompt.  The context is read from the shipped model's
    config.json, not from minirt."""
    config = json.loads((shipped_model_folder() / "config.json").read_text())
    context = config["n_positions"]
    url = f"{server.url}/v1/completions"
    full = httpx.post(
        url, json={"prompt": [5] * context, "max_tokens": None, "temperature": 0}, timeout=120
    )
    assert full.status_code == 200, full.text
    assert full.json()["choices"][0]["finish_reason"] == "length"
    assert full.json()["usage"] == {
        "prompt_tokens": context,
        "completion_tokens": 1,
        "total_tokens": context + 1,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    over = httpx.post(url, json={"prompt": [5] * (context + 1), "max_tokens": None}, timeout=60)
    assert over.status_code == 400
    assert over.json()["error"]["param"] == "prompt"
