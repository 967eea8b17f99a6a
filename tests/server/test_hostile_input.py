"""`minirt serve` against bodies built to cost it: whatever a body holds, up to the size limit, it
is answered within a bounded time while `/health` keeps answering; every bound is exact (at it,
taken; one past it, a 400 naming the field); bodies that are not JSON, and requests from pages of
other sites, are refused before anything runs; numbers of thousands of digits are a 400 or 413,
never a 500.  Expected values are the bounds as docs/serving.md's Limits table states them, and
the HTTP rules (RFC 9110's 415, the Fetch standard's Origin)."""

from __future__ import annotations

import json
import re
import socket
import sys
import threading
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serving import Server, serve_tests
from tokenizers import Tokenizer as HFTokenizer

from minirt.loading.checkpoint import shipped_model_folder

pytestmark = serve_tests

# The shipped model: a context of 256 tokens, no token longer than 29 bytes.
CONTEXT = 256
MOST_BYTES_PER_TOKEN = 29
BODY_LIMIT = 2 * 2**20

# A hostile body may take this long to be answered, and /health this long meanwhile.
ANSWER_WITHIN_S = 5.0
HEALTH_WITHIN_S = 1.0


@pytest.fixture(scope="module")
def server():
    with Server("--batch-size", "4", "--max-queue", "64") as running:
        yield running
        assert running.stop() == 0


def post(server, body, path="/v1/completions", **options) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=60, **options)


def error_of(answer: httpx.Response, status: int, param=None) -> str:
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["param"] == param, error
    assert "Traceback" not in answer.text
    return error["message"]


class HealthWatch:
    """Polls /health from its own thread while a body is answered: the slowest answer seen."""

    def __init__(self, server):
        self.url = f"{server.url}/health"
        self.slowest = 0.0
        self.failures = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.poll, daemon=True)

    def poll(self):
        with httpx.Client(timeout=30) as client:
            while not self.done.is_set():
                start = time.perf_counter()
                if client.get(self.url).status_code != 200:
                    self.failures += 1
                self.slowest = max(self.slowest, time.perf_counter() - start)
                time.sleep(0.02)

    def __enter__(self):
        self.thread.start()
        time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()


def answered_promptly(server, raw: bytes, path: str = "/v1/completions") -> httpx.Response:
    """Post raw JSON; assert that it is answered within ANSWER_WITHIN_S, and /health within
    HEALTH_WITHIN_S all the while."""
    assert len(raw) <= BODY_LIMIT
    headers = {"Content-Type": "application/json"}
    with HealthWatch(server) as health:
        start = time.perf_counter()
        answer = httpx.post(f"{server.url}{path}", content=raw, headers=headers, timeout=60)
        took = time.perf_counter() - start
    assert took < ANSWER_WITHIN_S, f"answered after {took:.2f} s"
    assert health.failures == 0 and health.slowest < HEALTH_WITHIN_S, health.slowest
    assert answer.status_code < 500, answer.text
    return answer


def test_a_logit_bias_of_60000_keys_is_refused_at_once_while_health_answers(server):
    """692 KB of logit_bias, under the body limit: refused by its size, before any key is looked
    at (a check per pair of keys took minutes, with /health frozen)."""
    bias = {str(token): 1.0 for token in range(60_000)}
    raw = json.dumps({"prompt": "x", "max_tokens": 1, "logit_bias": bias}).encode()
    answer = answered_promptly(server, raw)
    assert "at most 300 entries" in error_of(answer, 400, "logit_bias")


def hostile_body(kind: str, size: int) -> dict:
    """A completion body that holds `size` of one costly thing."""
    body: dict = {"prompt": "x", "max_tokens": 1}
    if kind == "logit_bias":
        body["logit_bias"] = {str(token): -1.0 for token in range(size)}
    elif kind == "stop":
        body["stop"] = [f"s{i}" for i in range(size)]
    elif kind == "stop_length":
        body["stop"] = "y" * size
    elif kind == "stop_token_ids":
        body["stop_token_ids"] = [token % 4096 for token in range(size)]
    elif kind == "prompts":
        body["prompt"] = ["x"] * size
    elif kind == "prompt_text":
        body["prompt"] = "To be, or not to be. " * (size // 21 + 1)
    elif kind == "prompt_ids":
        body["prompt"] = [token % 4096 for token in range(size)]
    elif kind == "id_lists":
        body["prompt"] = [[1, 2, 3]] * size
    else:
        body["user"] = "u" * size
    return body


@settings(
    max_examples=14,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    kind=st.sampled_from(
        [
            "logit_bias",
            "stop",
            "stop_length",
            "stop_token_ids",
            "prompts",
            "prompt_text",
            "prompt_ids",
            "id_lists",
            "user",
        ]
    ),
    fraction=st.floats(0.05, 1.0),
)
def test_any_body_up_to_the_limit_is_answered_in_bounded_time_while_health_answers(
    server, kind, fraction
):
    """Each kind of costly field, grown towards the 2 MiB body limit (as far as a body of it
    stays under the limit)."""
    small = json.dumps(hostile_body(kind, 1000)).encode()
    per_item = max(1, len(small) // 1000)
    size = max(1, int(fraction * (BODY_LIMIT - 200) / per_item))
    raw = json.dumps(hostile_body(kind, size)).encode()
    while len(raw) > BODY_LIMIT:
        size = int(size * 0.9)
        raw = json.dumps(hostile_body(kind, size)).encode()
    answered_promptly(server, raw)


@pytest.mark.parametrize(
    "field, at_bound, past_bound",
    [
        ("stop", [f"s{i}" for i in range(4)], [f"s{i}" for i in range(5)]),
        ("stop", "q" * 1000, "q" * 1001),
        ("logit_bias", {str(t): 0.5 for t in range(300)}, {str(t): 0.5 for t in range(301)}),
        ("stop_token_ids", list(range(300)), list(range(301))),
        ("n", 64, 65),
    ],
)
def test_each_bound_takes_its_limit_and_refuses_one_past_it_naming_the_field(
    server, field, at_bound, past_bound
):
    body = {"prompt": "x", "max_tokens": 1, "ignore_eos": True}
    taken = post(server, {**body, field: at_bound})
    assert taken.status_code == 200, taken.text
    error_of(post(server, {**body, field: past_bound}), 400, field)


def test_a_completion_of_more_prompts_than_the_queue_holds_is_refused_before_any_is_encoded(
    server,
):
    """80,000 prompts of 20 characters: refused by their number (prompts x n against
    --max-queue 64), at once."""
    raw = json.dumps({"prompt": ["To be, or not to be."] * 80_000, "max_tokens": 1}).encode()
    answer = answered_promptly(server, raw)
    assert "80000 choices" in error_of(answer, 400, "n")


def test_prompts_times_n_past_the_queue_are_refused_before_any_prompt_is_looked_at(server):
    """2 prompts x n = 40 is 80 choices, past --max-queue 64, and the second prompt holds a token
    id outside the vocabulary: the refusal is about the count (no prompt was checked)."""
    body = {"prompt": [[1, 2], [1, 10**9]], "n": 40, "max_tokens": 1}
    assert "80 choices" in error_of(post(server, body), 400, "n")
    # Under the bound, the same prompts get as far as the bad id.
    assert "vocabulary" in error_of(post(server, {**body, "n": 32}), 400, "prompt")


def test_a_prompt_longer_than_any_encoding_could_fit_is_refused_without_encoding_it(server):
    """At most 256 x 29 characters may fit the context; one more cannot, and is refused by its
    length (an encoded prompt of 256 tokens passes that check and fits)."""
    longest = CONTEXT * MOST_BYTES_PER_TOKEN
    message = error_of(
        post(server, {"prompt": "a" * (longest + 1), "max_tokens": 1}), 400, "prompt"
    )
    assert f"{longest + 1} characters" in message
    message = error_of(post(server, {"prompt": "a" * longest, "max_tokens": 1}), 400, "prompt")
    assert "tokens, more than the model's context of 256" in message


# ---------------------------------------------------------------------- bodies that are not JSON


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/jsonp",
        "json",
    ],
)
def test_a_body_declared_as_anything_but_json_is_a_415_and_runs_nothing(server, content_type):
    before = server.metric("minirt:request_success_total", finished_reason="length")
    raw = json.dumps({"prompt": "x", "max_tokens": 1, "ignore_eos": True}).encode()
    for path in ("/v1/completions", "/tokenize", "/detokenize", "/rounds/exercise"):
        answer = httpx.post(
            f"{server.url}{path}", content=raw, headers={"Content-Type": content_type}
        )
        assert "Content-Type: application/json" in error_of(answer, 415)
    assert server.metric("minirt:request_success_total", finished_reason="length") == before


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON",
        "application/vnd.example+json",
    ],
)
def test_a_body_declared_as_json_or_not_declared_runs(server, content_type):
    raw = json.dumps({"prompt": "x", "max_tokens": 2, "ignore_eos": True}).encode()
    headers = {} if content_type is None else {"Content-Type": content_type}
    answer = httpx.post(f"{server.url}/v1/completions", content=raw, headers=headers)
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 2


# ---------------------------------------------------------------------- pages of other sites


def test_a_request_from_a_page_of_another_site_is_a_403_and_runs_nothing(server):
    before = server.metric("minirt:request_success_total", finished_reason="length")
    body = {"prompt": "x", "max_tokens": 1, "ignore_eos": True}
    port = server.url.rsplit(":", 1)[1]
    for origin in (
        "http://evil.example",
        f"http://evil.example:{port}",
        "http://localhost:1",
        f"http://127.0.0.1:{int(port) + 1}",
        "null",
        "file://",
    ):
        headers = {"Origin": origin}
        for answer in (
            post(server, body, headers=headers),
            post(server, {"lengths": [2]}, path="/rounds/exercise", headers=headers),
            httpx.get(f"{server.url}/v1/models", headers=headers),
        ):
            assert "another site" in error_of(answer, 403), origin
    assert server.metric("minirt:request_success_total", finished_reason="length") == before


def test_a_request_from_the_servers_own_page_or_a_program_runs(server):
    """The round-grid page's origin is the server's own: http://127.0.0.1:PORT (or localhost by
    that name, as its Host says).  A program sends no Origin."""
    body = {"prompt": "x", "max_tokens": 1, "ignore_eos": True}
    port = server.url.rsplit(":", 1)[1]
    assert post(server, body, headers={"Origin": server.url}).status_code == 200
    assert post(server, body).status_code == 200
    named = {"Origin": f"http://localhost:{port}", "Host": f"localhost:{port}"}
    assert post(server, body, headers=named).status_code == 200


def test_a_page_that_points_its_own_name_at_this_machine_is_a_403(server):
    """DNS rebinding: evil.example resolves to 127.0.0.1 a moment after its page loaded, and its
    requests arrive same-origin (Origin and Host both evil.example).  A server on the loopback
    alone answers loopback names only."""
    body = {"prompt": "x", "max_tokens": 1, "ignore_eos": True}
    port = server.url.rsplit(":", 1)[1]
    for name in ("evil.example", "evil.example.", "127.0.0.1.evil.example", "localhost.evil"):
        rebound = {"Host": f"{name}:{port}", "Origin": f"http://{name}:{port}"}
        for answer in (
            post(server, body, headers=rebound),
            httpx.get(f"{server.url}/rounds/recent", headers={"Host": f"{name}:{port}"}),
            httpx.get(f"{server.url}/health", headers={"Host": name}),
        ):
            assert "loopback" in error_of(answer, 403), name
    for name in ("localhost", "LOCALHOST", "grid.localhost", "127.0.0.1", "127.9.9.9", "[::1]"):
        named = {"Host": f"{name}:{port}", "Origin": f"http://{name}:{port}"}
        assert post(server, body, headers=named).status_code == 200, name


def test_a_fetch_another_site_made_is_a_403_and_the_servers_own_or_a_typed_one_runs(server):
    """Sec-Fetch-Site, which browsers set on every request (an <img> tag's GET, which carries
    no Origin, too): cross-site, and same-site (another port of this machine), are refused."""
    for made_by in ("cross-site", "same-site", "Cross-Site"):
        for answer in (
            httpx.get(f"{server.url}/rounds/recent", headers={"Sec-Fetch-Site": made_by}),
            httpx.get(f"{server.url}/rounds/events", headers={"Sec-Fetch-Site": made_by}),
            post(server, {"prompt": "x", "max_tokens": 1}, headers={"Sec-Fetch-Site": made_by}),
        ):
            assert "another site" in error_of(answer, 403), made_by
    for made_by in ("same-origin", "none"):
        answer = httpx.get(f"{server.url}/rounds/recent", headers={"Sec-Fetch-Site": made_by})
        assert answer.status_code == 200, made_by


def test_the_page_may_not_be_shown_in_another_sites_frame(server):
    for path in ("/", "/rounds"):
        headers = httpx.get(f"{server.url}{path}").headers
        assert headers["x-frame-options"] == "DENY"
        assert headers["content-security-policy"] == "frame-ancestors 'none'"


def test_an_error_quotes_at_most_1000_characters_of_what_was_sent(server):
    answer = post(server, {"prompt": "x", "model": "m" * 100_000})
    message = answer.json()["error"]["message"]
    assert answer.status_code == 404 and len(message) == 1000 + len("...")
    assert message.startswith("the model 'mmm") and message.endswith("m...")


@pytest.mark.parametrize(
    "field, too_many, param, words",
    [
        # More prompts than the queue holds, the last of the wrong type: refused by the count.
        ("prompt", [[1]] * 64 + [5], "n", "65 choices"),
        ("logit_bias", {**{str(t): 0.5 for t in range(300)}, "300": "x"}, "logit_bias", "at most"),
        ("stop_token_ids", [*range(300), "x"], "stop_token_ids", "at most"),
        ("stop", ["a", "b", "c", "d", 5], "stop", "at most"),
        ("prompt", [1] * CONTEXT + ["x"], "prompt", f"{CONTEXT + 1} tokens"),
        ("prompt", [[1] * (CONTEXT + 1), ["x"]], "prompt", f"{CONTEXT + 1} tokens"),
    ],
)
def test_a_list_past_its_bound_is_refused_by_its_length_before_its_items_are_checked(
    server, field, too_many, param, words
):
    """Counted before pydantic checks a single item (its work grows with them): the refusal is
    about the length, even though an item is of the wrong type as well."""
    message = error_of(post(server, {"prompt": "x", field: too_many}), 400, param)
    assert words in message, message


def test_detokenize_takes_the_contexts_ids_and_refuses_one_more(server):
    tokenizer = HFTokenizer.from_file(str(shipped_model_folder() / "tokenizer.json"))
    ids = [(7 * k) % 1000 for k in range(CONTEXT)]
    answer = post(server, {"tokens": ids}, path="/detokenize")
    assert answer.status_code == 200
    assert answer.json()["prompt"] == tokenizer.decode(ids, skip_special_tokens=False)
    assert "context" in error_of(
        post(server, {"tokens": ids + [1]}, path="/detokenize"), 400, "tokens"
    )


def test_tokenize_refuses_a_text_no_encoding_could_fit_without_encoding_it(server):
    raw = json.dumps({"prompt": "a" * (CONTEXT * MOST_BYTES_PER_TOKEN + 1)}).encode()
    answer = answered_promptly(server, raw, path="/tokenize")
    assert "characters" in error_of(answer, 400, "prompt")
    fits = post(server, {"prompt": "ab " * 80}, path="/tokenize")
    assert fits.status_code == 200 and fits.json()["count"] <= CONTEXT


# ---------------------------------------------------------------------- numbers of many digits


def test_a_query_number_of_5000_digits_is_a_400_naming_it(server):
    for text in ("9" * 5000, "1" + "0" * 4999, "10" + "0" * 400, "0" * 5000):
        answer = httpx.get(f"{server.url}/rounds/recent", params={"rounds": text})
        message = error_of(answer, 400, "rounds")
        assert "from 1 to" in message and len(message) < 300
    answer = httpx.get(f"{server.url}/rounds/recent", params={"rounds": "0" * 4999 + "3"})
    assert answer.status_code == 200 and len(answer.json()["rounds"]) <= 3


def raw_request(server, request: bytes) -> bytes:
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_a_content_length_of_5000_digits_is_refused_never_a_500(server):
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + b"9" * 5000 + b"\r\n\r\n{}"
    )
    reply = raw_request(server, request)
    status = int(reply.split(b" ", 2)[1])
    assert 400 <= status < 500, reply[:200]


# ---------------------------------------------------------------------- the Limits table


def test_the_limits_table_holds_the_values_the_code_enforces():
    """docs/serving.md's Limits table against the constants the checks use: it cannot go stale."""
    from conftest import ROOT

    from minirt.engine.params import MAX_LOGIT_BIAS, MAX_PRESENCE_OR_FREQUENCY
    from minirt.engine.params import MAX_REPETITION_PENALTY
    from minirt.serve import DEFAULT_MAX_QUEUE, DEFAULT_SHUTDOWN_TIMEOUT_S
    from minirt.server import protocol
    from minirt.server.app import DEFAULT_MAX_BODY_BYTES
    from minirt.server.http_rules import HEADER_LIMIT
    from minirt.server.round_feed import MAX_WATCHERS, RECENT_ROUNDS
    from minirt.server.rounds_page import HEARTBEAT_S
    from minirt.server.rounds_page import MAX_EXERCISE_LENGTH, MAX_EXERCISE_REQUESTS

    text = (ROOT / "docs" / "serving.md").read_text()
    section = text.split("## Limits", 1)[1].split("\n## ", 1)[0]
    table = [line for line in section.splitlines() if line.startswith("| ")][1:]
    rows = {row.split(" | ")[0].strip("| "): row for row in table}
    assert f"| {DEFAULT_MAX_BODY_BYTES // 2**20} MiB |" in rows["a body"]
    assert f"| {DEFAULT_MAX_QUEUE} |" in rows["requests waiting"]
    assert f"| 1 to {protocol.MAX_N} |" in rows["`n`"]
    assert f"| 0 to {protocol.MAX_LOGPROBS} |" in rows["`logprobs`"]
    assert f"| {protocol.MAX_STOP} sequences |" in rows["`stop`"]
    assert f"| {protocol.MAX_STOP_CHARS:,} characters |" in rows["each `stop` sequence"]
    assert f"| {protocol.MAX_STOP_TOKEN_IDS} ids |" in rows["`stop_token_ids`"]
    bias = f"| {protocol.MAX_LOGIT_BIAS_ENTRIES} entries, each -{MAX_LOGIT_BIAS:g} to {MAX_LOGIT_BIAS:g} |"
    assert bias in rows["`logit_bias`"]
    penalty = f"| -{MAX_PRESENCE_OR_FREQUENCY:g} to {MAX_PRESENCE_OR_FREQUENCY:g} |"
    assert penalty in rows["`presence_penalty`, `frequency_penalty`"]
    repetition = f"| 1/{MAX_REPETITION_PENALTY:g} to {MAX_REPETITION_PENALTY:g} |"
    assert repetition in rows["`repetition_penalty`"]
    assert f"| 1 to {RECENT_ROUNDS} |" in rows["`GET /rounds/recent?rounds=`"]
    watching = rows["pages watching `GET /rounds/events`"]
    assert f"| {MAX_WATCHERS} |" in watching and f"every {HEARTBEAT_S:g} s" in watching
    exercise = f"| 1 to {MAX_EXERCISE_REQUESTS} of them, each 1 to {MAX_EXERCISE_LENGTH} tokens"
    assert exercise in rows["`POST /rounds/exercise` lengths"]
    assert f"| {DEFAULT_SHUTDOWN_TIMEOUT_S:g} s |" in rows["a shutdown"]
    assert f"| {HEADER_LIMIT // 1024} KiB, all together |" in rows["a request's headers"]
    from minirt import serve
    from minirt.server import connections

    arriving = rows["a request's head as it arrives (request line and headers)"]
    assert f"| {connections.HEAD_LIMIT // 1024} KiB | 431 |" in arriving
    assert f"{connections.REQUEST_LINE_ROOM // 1024} KiB for the request line" in arriving
    timeout = connections.DEFAULT_CONNECTION_TIMEOUT_S
    assert serve.DEFAULT_CONNECTION_TIMEOUT_S == timeout
    assert f"| {timeout:g} s | 408 |" in rows["a request's head, to arrive whole"]
    assert f"| {timeout:g} s | 408 |" in rows["a body, between two pieces"]
    assert connections.connections_for(0, 0, 0) == connections.SPARE_CONNECTIONS
    assert connections.connections_for(1, 10, 100) == 111 + connections.SPARE_CONNECTIONS
    answered = (
        f"| `--max-queue` + `--batch-size` + {MAX_WATCHERS} + {connections.SPARE_CONNECTIONS} |"
    )
    assert answered in rows["connections answered at once"]


# ---------------------------------------------------------------------- the checks on their own


@given(digits=st.text("0123456789", min_size=1, max_size=40), limit=st.integers(0, 10**12))
def test_exceeds_agrees_with_integer_comparison(digits, limit):
    from minirt.server.bodies import exceeds

    assert exceeds(digits, limit) == (int(digits) > limit)


def test_exceeds_decides_thousands_of_digits_without_parsing_them():
    from minirt.server.bodies import exceeds

    assert exceeds("9" * 5000, 2**21) and not exceeds("0" * 5000 + "7", 8)


@pytest.mark.parametrize(
    "content_type, json_",
    [
        ("application/json", True),
        ("application/json; charset=utf-8", True),
        (" APPLICATION/JSON ;charset=utf-8", True),
        ("application/problem+json", True),
        ("application/jsonl", False),
        ("text/json", False),
        ("text/plain", False),
        ("application/x-www-form-urlencoded", False),
        ("", False),
    ],
)
def test_is_json_reads_the_media_type_alone(content_type, json_):
    from minirt.server.bodies import is_json

    assert is_json(content_type) is json_


@given(
    host=st.sampled_from(["127.0.0.1", "localhost", "[::1]", "example.com"]),
    port=st.one_of(st.none(), st.integers(1, 65535)),
    scheme=st.sampled_from(["http", "https"]),
)
def test_an_origin_is_its_hosts_site_and_the_default_port_is_the_schemes(host, port, scheme):
    from minirt.server.origin import site_of, site_of_host

    authority = host if port is None else f"{host}:{port}"
    expected_port = port if port is not None else {"http": 80, "https": 443}[scheme]
    expected = (host.strip("[]").lower(), expected_port)
    assert site_of(f"{scheme}://{authority}") == expected
    assert site_of_host(authority, scheme) == expected


@pytest.mark.parametrize(
    "origin", ["null", "file://", "http://", "ftp://example.com", "http://a:99999", "x"]
)
def test_an_origin_that_names_no_site_is_none(origin):
    from minirt.server.origin import site_of

    assert site_of(origin) is None


# ---------------------------------------------------------------------- HTTP by the book


def exchange(server, request: bytes, timeout: float = 5.0) -> tuple[list[int], bool]:
    """Send `request` and then a GET /health on one connection: the statuses answered, and
    whether the server closed the connection (False: it was still open after `timeout`)."""
    host, port = server.url.removeprefix("http://").split(":")
    follow_up = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    data = b""
    closed = False
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(request + follow_up)
        try:
            while chunk := sock.recv(65536):
                data += chunk
            closed = True
        except (TimeoutError, ConnectionResetError):
            closed = isinstance(sys.exc_info()[1], ConnectionResetError)
    statuses = [
        int(line.split(b" ")[1]) for line in data.split(b"\r\n") if line.startswith(b"HTTP/1.")
    ]
    return statuses, closed


@pytest.mark.parametrize(
    "path",
    ["/", "/rounds", "/rounds/events", "/rounds/recent", "/v1/models", "/health", "/metrics"],
)
def test_head_on_every_route_answers_its_headers_and_ends(server, path):
    """The request after a HEAD on the same connection is answered too (a HEAD of the round feed
    used to stream for ever, so nothing after it was)."""
    statuses, _ = exchange(server, f"HEAD {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    assert statuses == [200, 200]


AMBIGUOUS = {
    "Content-Length and Transfer-Encoding": b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "two Content-Lengths": b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    "a Content-Length list": b"Content-Length: 2, 2\r\n\r\n{}",
    "a signed Content-Length": b"Content-Length: +2\r\n\r\n{}",
    "a space before the colon": b"Content-Length : 2\r\n\r\n{}",
    "Transfer-Encoding not chunked": b"Transfer-Encoding: gzip\r\n\r\n{}",
    "chunked twice": b"Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n",
    "a bad chunk size": b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    "a folded header": b"X-A: a\r\n b\r\nContent-Length: 2\r\n\r\n{}",
}


@pytest.mark.parametrize("name", AMBIGUOUS)
def test_a_request_ambiguous_in_its_framing_is_a_400_and_its_connection_closes(server, name):
    """What follows it on the connection is never read as a request of its own (request
    smuggling): one answer, then the connection ends."""
    request = b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    statuses, closed = exchange(server, request + AMBIGUOUS[name])
    assert statuses == [400] and closed


@pytest.mark.parametrize("headers", [b"", b"Host: x\r\nHost: y\r\n"], ids=["no Host", "two Hosts"])
def test_an_http_1_1_request_without_exactly_one_host_is_a_400_and_its_connection_closes(
    server, headers
):
    statuses, closed = exchange(server, b"GET /v1/models HTTP/1.1\r\n" + headers + b"\r\n")
    assert statuses == [400] and closed


def test_headers_over_64_kib_are_a_431(server):
    big = b"X-Padding: " + b"a" * (64 * 1024) + b"\r\n"
    statuses, closed = exchange(
        server, b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n" + big + b"\r\n"
    )
    assert statuses == [431] and closed


# ---------------------------------------------------------------------- every value checked


LONE = "\\ud800"  # JSON's escape for a lone surrogate: valid JSON, not text


@pytest.mark.parametrize(
    "raw, param, where",
    [
        ('{"prompt": "x", "stop": "a' + LONE + '"}', "stop", "stop"),
        ('{"prompt": "x", "stop": ["ok", "a' + LONE + '"]}', "stop", "stop[1]"),
        ('{"prompt": "x", "user": "' + LONE + '"}', "user", "user"),
        ('{"prompt": "x", "model": "' + LONE + '"}', "model", "model"),
        ('{"prompt": ["ok", "' + LONE + '"]}', "prompt", "prompt[1]"),
        ('{"prompt": "x", "logit_bias": {"' + LONE + '": 1}}', "logit_bias", "has a key"),
        ('{"prompt": "x", "' + LONE + '": 1}', '"' + LONE + '"', "field name"),
        (
            '{"prompt": "x", "stream": true, "stream_options": {"' + LONE + '": 1}}',
            'stream_options."' + LONE + '"',
            "field name",
        ),
    ],
)
def test_a_string_that_is_not_text_is_a_400_in_any_field_naming_it(server, raw, param, where):
    """Keys and values, top level or nested: a 400 whose body is valid UTF-8 JSON (a lone
    surrogate written back raw would make the reply itself unencodable: a 500)."""
    answer = httpx.post(
        f"{server.url}/v1/completions",
        content=raw.encode(),
        headers={"Content-Type": "application/json"},
    )
    answer.content.decode("utf-8")  # the reply is text
    message = error_of(answer, 400, param)
    assert "lone surrogate" in message and where.replace(LONE, "") in message


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF), max_size=8),
    upper=st.booleans(),
)
def test_a_body_with_no_surrogate_escape_holds_text_alone(text, upper):
    """The server walks a body for lone surrogates only when its bytes hold an escape of one:
    whenever json.loads gives a string that is not text, the escape is found (in either case of
    hex digits, which JSON allows)."""
    from minirt.server.protocol import SURROGATE_ESCAPE

    raw = json.dumps({"stop": text})  # ASCII: every surrogate written as \udxxx
    if upper:
        raw = re.sub(r"\\u([0-9a-f]{4})", lambda m: "\\u" + m[1].upper(), raw)
    value = json.loads(raw)["stop"]
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        assert SURROGATE_ESCAPE.search(raw.encode()) is not None, raw


@pytest.mark.parametrize("escape", ["\\udfff", "\\uDC00", "\\uD83D"])
def test_a_lone_surrogate_of_either_half_and_case_is_refused(server, escape):
    raw = ('{"prompt": "x", "stop": ["ok", "a' + escape + '"]}').encode()
    answer = httpx.post(
        f"{server.url}/v1/completions", content=raw, headers={"Content-Type": "application/json"}
    )
    assert "lone surrogate" in error_of(answer, 400, "stop")
    paired = ('{"prompt": "x", "max_tokens": 1, "stop": ["\\ud83d\\ude00"]}').encode()
    taken = httpx.post(
        f"{server.url}/v1/completions", content=paired, headers={"Content-Type": "application/json"}
    )
    assert taken.status_code == 200, taken.text


def test_an_unknown_nested_field_is_named_by_its_path(server):
    body = {"prompt": "x", "stream": True, "stream_options": {"include_usage": True, "extra": 1}}
    message = error_of(post(server, body), 400, "stream_options.extra")
    assert "'stream_options.extra'" in message


def test_a_nested_field_of_the_wrong_type_is_named_by_its_path(server):
    body = {"prompt": "x", "stream": True, "stream_options": {"include_usage": "yes"}}
    error_of(post(server, body), 400, "stream_options.include_usage")


def test_max_tokens_past_the_context_is_a_400_and_null_is_what_the_context_holds(server):
    """A prompt of 6 ids in a context of 256: 250 new tokens fit exactly, 251 do not (vLLM's
    rule: refused, not cut to 250), and null asks for the 250."""
    body = {"prompt": [5] * 6, "ignore_eos": True, "temperature": 0}
    fits = post(server, {**body, "max_tokens": CONTEXT - 6}).json()
    assert fits["usage"]["completion_tokens"] == CONTEXT - 6
    message = error_of(post(server, {**body, "max_tokens": CONTEXT - 5}), 400, "max_tokens")
    assert "at most 250" in message
    error_of(post(server, {**body, "max_tokens": 100_000}), 400, "max_tokens")
    whole = post(server, {**body, "max_tokens": None}).json()
    assert whole["usage"]["completion_tokens"] == CONTEXT - 6
