"""`minirt serve --replicas N` on Ray Serve, end to end: real servers on 127.0.0.1, each with
two replicas on this machine's local Ray, held to the offline API (`LLM.generate` of each request
alone), the openai client, raw server-sent events, and the metrics' values.

Marked `ray_serve` and skipped cleanly without Ray Serve and the serve extra; `.ci/run` installs
both and runs them.  Bounded: every server serves at most a few dozen requests, and every wait
has a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("ray.serve", reason='needs Ray Serve (pip install -e ".[serve,ray]")')
pytest.importorskip("httpx", reason='needs the serve extra\'s clients (pip install -e ".[test]")')
pytestmark = [pytest.mark.ray_serve, pytest.mark.timeout(300)]

import httpx  # noqa: E402 (after the importorskip above)
from threadpoolctl import threadpool_limits  # noqa: E402

from minirt import LLM, SamplingParams  # noqa: E402
from conftest import ROOT, random_tensors  # noqa: E402

# The one-process server's test harness (tests/server/serving.py): the same Server, the same
# offline reference.
sys.path.insert(0, str(ROOT / "tests" / "server"))
from serving import Server, offline_alone  # noqa: E402

# How often a replica reports its metrics (minirt/distributed/engine_replica.py REPORT_EVERY_S),
# and a little more: a figure read this long after an event includes it.
REPORT_S = 0.5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random GPT-2 with the shipped model's tokenizer and a context of 640 (room for a
    256-token prefix and its suffixes)."""
    from minirt.model.config import GPT2Config
    from safetensors.numpy import save_file

    folder = tmp_path_factory.mktemp("replica-model")
    raw = {"model_type": "gpt2", "vocab_size": 4096, "n_positions": 640, "n_embd": 64}
    raw.update({"n_layer": 2, "n_head": 2})
    save_file(
        random_tensors(GPT2Config.from_dict(raw, source="test"), 0),
        str(folder / "model.safetensors"),
    )
    (folder / "config.json").write_text(json.dumps(raw))
    shutil.copy(ROOT / "weights" / "shakespeare-gpt2-tiny" / "tokenizer.json", folder)
    return folder


@pytest.fixture(scope="module")
def offline(model_dir):
    return LLM(str(model_dir))


def replicas_server(model_dir, *flags: str) -> Server:
    """`minirt serve` with two replicas of the test model, served as "m"."""
    model = ["--model", str(model_dir), "--served-model-name", "m"]
    return Server(*model, "--replicas", "2", *flags)


def both_replicas_routed(server: Server) -> None:
    """Short completions, one at a time, until each replica has run one: Ray Serve's router in
    the ingress learns of the replicas a moment after they start, and until then may send every
    request to the one it knows.  Tests that need both replicas busy start with this."""
    client = server.client()
    deadline = time.monotonic() + 30
    while sum(v > 0 for v in replica_metric(server, "minirt:rounds_total").values()) < 2:
        assert time.monotonic() < deadline, "both replicas to serve a request"
        client.completions.create(model="m", prompt="warm", max_tokens=1, temperature=0)
        time.sleep(REPORT_S)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def replica_metric(server: Server, name: str) -> dict[str, float]:
    """Each replica's sample of a metric, by its replica label."""
    from prometheus_client.parser import text_string_to_metric_families

    values = {}
    for family in text_string_to_metric_families(httpx.get(f"{server.url}/metrics").text):
        for sample in family.samples:
            if sample.name == name and "replica" in sample.labels:
                values[sample.labels["replica"]] = sample.value
    return values


def fleet_metric(server: Server, name: str) -> float:
    """The fleet's sample of a metric: the one without a replica label."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(httpx.get(f"{server.url}/metrics").text):
        for sample in family.samples:
            if sample.name == name and "replica" not in sample.labels:
                return sample.value
    raise AssertionError(f"no fleet sample {name}")


def success_counts(server: Server) -> dict[str, float]:
    reasons = ("stop", "length", "abort", "error")
    return {r: server.metric("minirt:request_success_total", finished_reason=r) for r in reasons}


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def sse_events(response):
    """The data lines of a server-sent event stream, one at a time as they come."""
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield line[len("data: ") :]


def request_params(k: int) -> tuple[dict, SamplingParams]:
    """The k-th request's body fields and the same SamplingParams offline: greedy or seeded."""
    if k % 2 == 0:
        return {"temperature": 0}, SamplingParams(temperature=0, max_tokens=12, logprobs=2)
    fields = {"temperature": 0.9, "top_p": 0.9, "seed": 1000 + k}
    offline = SamplingParams(temperature=0.9, top_p=0.9, seed=1000 + k, max_tokens=12, logprobs=2)
    return fields, offline


def test_sixteen_clients_get_offline_tokens_from_either_replica(model_dir):
    """In exact mode, bitwise: each replica runs its BLAS on one thread, and so does the offline
    reference here (exact mode holds for one thread count: docs/batch-invariance.md)."""
    prompts = [f"To be or not {k}, that is the question of" * (1 + k % 3) for k in range(16)]
    flags = ["--batch-size", "4", "--batch-invariant"]
    with replicas_server(model_dir, *flags) as server:
        client = server.client()

        def complete(k: int):
            fields, _params = request_params(k)
            answer = client.completions.create(
                model="m", prompt=prompts[k], max_tokens=12, logprobs=2, **fields
            )
            return answer

        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(complete, range(16)))
        # Both replicas served some of them: each reports rounds.
        wait_until(
            lambda: sum(v > 0 for v in replica_metric(server, "minirt:rounds_total").values()) == 2,
            10,
            "both replicas to report rounds",
        )
        # The fleet's counters are the sums of what the clients were told, each counted once.
        told = {reason: 0.0 for reason in ("stop", "length", "abort", "error")}
        for answer in answers:
            told[answer.choices[0].finish_reason] += 1
        wait_until(lambda: success_counts(server) == told, 5, f"{told}: {success_counts(server)}")
        usage = [answer.usage for answer in answers]
        generated = sum(u.completion_tokens for u in usage)
        assert fleet_metric(server, "minirt:generation_tokens_total") == generated
        prompted = sum(u.prompt_tokens for u in usage)
        assert fleet_metric(server, "minirt:prompt_tokens_total") == prompted
        wait_until(
            lambda: (
                fleet_metric(server, "minirt:rounds_total")
                == sum(replica_metric(server, "minirt:rounds_total").values())
            ),
            5,
            "the fleet's rounds to be the sum of each replica's",
        )
        assert server.stop(signal.SIGTERM) == 0
    assert len({answer.id for answer in answers}) == 16
    exact = LLM(str(model_dir), batch_invariant=True)
    for k, answer in enumerate(answers):
        _fields, params = request_params(k)
        with threadpool_limits(1, user_api="blas"):
            expected = offline_alone(exact, prompts[k], params)[0]
        (choice,) = answer.choices
        assert choice.model_extra["minirt"]["token_ids"] == expected.token_ids
        assert choice.text == expected.text
        # JSON carries a float exactly: the same bits.
        assert choice.logprobs.token_logprobs == [float(x) for x in expected.logprobs]


def prefixed_prompts(seed: int) -> list[list[int]]:
    """4 distinct prefixes of 256 random token ids, 4 prompts each (a 16-token suffix of its
    own): the first of each prefix first, then the rest, prefixes interleaved."""
    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(5, 4000, 256).tolist() for _ in range(4)]
    order = []
    for _turn in range(4):
        for prefix in prefixes:
            order.append(prefix + rng.integers(5, 4000, 16).tolist())
    return order


def cached_tokens_of_later_requests(model_dir, routing: str) -> list[int]:
    """The cached tokens each request after its prefix's first reports, served one at a time."""
    flags = [
        "--model",
        str(model_dir),
        "--served-model-name",
        "m",
        "--replicas",
        "2",
        "--prefix-cache",
        "--routing",
        routing,
    ]
    cached = []
    with Server(*flags) as server:
        client = server.client()
        for k, prompt in enumerate(prefixed_prompts(7)):
            answer = client.completions.create(
                model="m", prompt=prompt, max_tokens=2, temperature=0
            )
            if k >= 4:
                cached.append(answer.usage.prompt_tokens_details.cached_tokens)
        assert server.stop(signal.SIGTERM) == 0
    return cached


def test_prefix_routing_finds_each_prefix_cached_where_power_of_two_does_not(model_dir):
    by_prefix = cached_tokens_of_later_requests(model_dir, "prefix")
    by_chance = cached_tokens_of_later_requests(model_dir, "power-of-two")
    # 272 tokens: 16 whole blocks of the prefix are usable, (272 - 1) // 16 = 16.
    assert by_prefix == [256] * 12
    # Each prefix's second request lands on the other replica with probability 1/2 (and then
    # misses); all 12 hitting by chance has probability (1/8)^4.
    assert sum(c == 256 for c in by_chance) < 12
    assert set(by_chance) <= {0, 256}


def stream_body(prompt: str, max_tokens: int) -> dict:
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}


def requests_held(server: Server) -> dict[str, float]:
    """Each replica's requests, in its rows or its queue, by its label."""
    running = replica_metric(server, "minirt:num_requests_running")
    waiting = replica_metric(server, "minirt:num_requests_waiting")
    return {label: running[label] + waiting.get(label, 0.0) for label in running}


def busiest_once_all_held(server: Server, total: int) -> int:
    """Once the replicas hold all `total` streams, each some: the process of the replica
    holding the most (its `minirt:replica_info` sample names it)."""
    wait_until(
        lambda: (
            sum(requests_held(server).values()) == total and min(requests_held(server).values()) > 0
        ),
        30,
        f"both replicas to hold the {total} streams: {requests_held(server)}",
    )
    held = requests_held(server)
    return replica_pids(server)[max(held, key=held.get)]


def replica_pids(server: Server) -> dict[str, int]:
    """Each live replica's process id, by its label (`minirt:replica_info`)."""
    from prometheus_client.parser import text_string_to_metric_families

    pids = {}
    for family in text_string_to_metric_families(httpx.get(f"{server.url}/metrics").text):
        for sample in family.samples:
            if sample.name == "minirt:replica_info":
                pids[sample.labels["replica"]] = int(sample.labels["pid"])
    return pids


class Streams:
    """Streaming completions on their own threads, each one's data lines kept as they come."""

    def __init__(self, server: Server, prompts: list[str], max_tokens: int):
        self.events: dict[int, list[str]] = {k: [] for k in range(len(prompts))}
        self.done: dict[int, float] = {}
        self.threads = [
            threading.Thread(target=self.read, args=(server, k, p, max_tokens), daemon=True)
            for k, p in enumerate(prompts)
        ]
        for thread in self.threads:
            thread.start()

    def read(self, server: Server, k: int, prompt: str, max_tokens: int) -> None:
        body = stream_body(prompt, max_tokens)
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as answer:
            for data in sse_events(answer):
                self.events[k].append(data)
        self.done[k] = time.monotonic()

    def join(self, timeout: float) -> None:
        for thread in self.threads:
            thread.join(timeout)

    def outcome(self, k: int) -> tuple[str | None, str, list[int] | None]:
        """A stream's error message (None if it finished), its text, and its token ids."""
        assert self.events[k][-1] == "[DONE]", self.events[k][-3:]
        bodies = [json.loads(data) for data in self.events[k][:-1]]
        text = "".join(body["choices"][0]["text"] for body in bodies if "choices" in body)
        if "error" in bodies[-1]:
            return bodies[-1]["error"]["message"], text, None
        return None, text, bodies[-1]["choices"][0]["minirt"]["token_ids"]


def test_a_killed_replica_fails_its_streams_cleanly_and_spares_the_rest(model_dir, offline):
    """6 streams of 4 s or more on 2 replicas; the one holding the most is killed."""
    prompts = [f"Friends, Romans, countrymen {k}" for k in range(6)]
    with replicas_server(model_dir, "--round-delay", "40") as server:
        both_replicas_routed(server)
        streams = Streams(server, prompts, 100)
        victim = busiest_once_all_held(server, len(prompts))
        os.kill(victim, signal.SIGKILL)
        streams.join(60)
        lost = sum(streams.outcome(k)[0] is not None for k in range(len(prompts)))
        # The dead replica never reports them: the ingress counts each once, as an error.
        wait_until(
            lambda: success_counts(server)["error"] == lost,
            5,
            f"{lost} streams counted as errors: {success_counts(server)}",
        )
        # The next request is served (by the survivor, or the replica Ray Serve starts anew).
        answer = server.client().completions.create(
            model="m", prompt=prompts[0], max_tokens=8, temperature=0
        )
        assert answer.choices[0].finish_reason == "length"
        assert server.stop(signal.SIGTERM) == 0
    failed = 0
    for k, prompt in enumerate(prompts):
        error, text, token_ids = streams.outcome(k)
        if error is not None:
            failed += 1
            assert "the replica serving it stopped" in error
            continue
        expected = offline_alone(offline, prompt, SamplingParams(temperature=0, max_tokens=100))
        assert (text, token_ids) == (expected[0].text, expected[0].token_ids)
    # The victim held the most of the 6 (at least 3), the survivor at least 1.
    assert 3 <= failed <= 5


def test_disconnected_streams_free_every_replicas_rows_and_kv(model_dir):
    flags = [
        "--model",
        str(model_dir),
        "--served-model-name",
        "m",
        "--replicas",
        "2",
        "--round-delay",
        "50",
    ]
    with Server(*flags) as server:
        both_replicas_routed(server)
        responses = []
        clients = [httpx.Client(timeout=30) for _ in range(20)]
        for k, client in enumerate(clients):
            request = client.build_request(
                "POST", f"{server.url}/v1/completions", json=stream_body(f"Stream {k}", 400)
            )
            response = client.send(request, stream=True)
            responses.append((response, response.iter_lines()))
        # Accepted (its head sent): 16 hold rows, 4 wait for one (8 rows a replica).
        wait_until(
            lambda: (
                sum(replica_metric(server, "minirt:num_requests_running").values())
                + sum(replica_metric(server, "minirt:num_requests_waiting").values())
                == 20
            ),
            10,
            "all 20 streams to be held by the replicas",
        )
        busy = replica_metric(server, "minirt:kv_slots_used")
        assert len(busy) == 2 and all(slots > 0 for slots in busy.values())
        closed_at = time.monotonic()
        for (response, _lines), client in zip(responses, clients, strict=True):
            response.close()
            client.close()
        for name in (
            "minirt:num_requests_running",
            "minirt:num_requests_waiting",
            "minirt:kv_cache_usage_perc",
            "minirt:kv_slots_used",
        ):
            wait_until(
                lambda name=name: replica_metric(server, name) == {r: 0.0 for r in busy},
                10,
                f"{name} to return to 0 on every replica",
            )
            # The fleet's series (no replica label) is 0 too.
            assert fleet_metric(server, name) == 0
        # Freed by the aborts, long before 400 rounds of 50 ms could end any of them.
        assert time.monotonic() - closed_at < 10
        wait_until(
            lambda: server.metric("minirt:request_success_total", finished_reason="abort") == 20,
            5,
            f"every stream counted as aborted: {success_counts(server)}",
        )
        assert server.stop(signal.SIGTERM) == 0


def test_a_full_fleet_answers_503_at_once_and_serves_again_when_a_stream_ends(model_dir):
    """2 replicas of 1 row and a queue of 1: the fleet holds 4 requests exactly; the 5th is
    refused at once as one process refuses past --max-queue, and once a stream ends the next
    one is served."""
    flags = ["--batch-size", "1", "--max-queue", "1", "--round-delay", "50"]
    with replicas_server(model_dir, *flags) as server:
        both_replicas_routed(server)
        clients = [httpx.Client(timeout=30) for _ in range(4)]
        responses = []
        for k, client in enumerate(clients):
            request = client.build_request(
                "POST", f"{server.url}/v1/completions", json=stream_body(f"Held {k}", 400)
            )
            responses.append(client.send(request, stream=True))
        wait_until(
            lambda: (
                replica_metric(server, "minirt:num_requests_running")
                == replica_metric(server, "minirt:num_requests_waiting")
                == {label: 1.0 for label in replica_pids(server)}
            ),
            10,
            "each replica to hold one stream in its row and one in its queue",
        )
        started = time.monotonic()
        refused = httpx.post(
            f"{server.url}/v1/completions", json={"prompt": "Fifth", "max_tokens": 2}, timeout=30
        )
        assert time.monotonic() - started < 5
        assert refused.status_code == 503, refused.text
        error = refused.json()["error"]
        assert error["message"] == (
            "the queue is full (2 requests wait, 2 at most: --max-queue); retry later"
        )
        responses[0].close()
        clients[0].close()
        wait_until(
            lambda: (
                sum(replica_metric(server, "minirt:num_requests_running").values())
                + sum(replica_metric(server, "minirt:num_requests_waiting").values())
                == 3
            ),
            10,
            "the closed stream's request to be aborted",
        )
        answer = httpx.post(
            f"{server.url}/v1/completions",
            json={"prompt": "Fifth", "max_tokens": 2, "temperature": 0},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        for response, client in zip(responses[1:], clients[1:], strict=True):
            response.close()
            client.close()
        assert server.stop(signal.SIGTERM) == 0


def test_a_stalled_replica_does_not_hold_up_the_other(model_dir, offline):
    """One replica stopped (SIGSTOP: its rounds wait) while both hold streams: the other's
    streams finish meanwhile; once it goes on, its own finish too, all equal to offline."""
    prompts = [f"Now is the winter of our discontent {k}" for k in range(6)]
    with replicas_server(model_dir, "--round-delay", "30") as server:
        both_replicas_routed(server)
        streams = Streams(server, prompts, 80)
        victim = busiest_once_all_held(server, len(prompts))
        os.kill(victim, signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            wait_until(lambda: len(streams.done) >= 1, 20, "the other replica's streams to end")
            time.sleep(2.0)
            held = [k for k in range(6) if k not in streams.done]
        finally:
            os.kill(victim, signal.SIGCONT)
        streams.join(60)
        assert server.stop(signal.SIGTERM) == 0
    assert 1 <= len(held) <= 5
    assert all(streams.done[k] > stopped_at for k in range(6))
    for k, prompt in enumerate(prompts):
        error, text, token_ids = streams.outcome(k)
        expected = offline_alone(offline, prompt, SamplingParams(temperature=0, max_tokens=80))
        assert (error, text, token_ids) == (None, expected[0].text, expected[0].token_ids)


def test_sigint_lets_every_replicas_streams_finish_then_exits_0(model_dir, offline):
    flags = [
        "--model",
        str(model_dir),
        "--served-model-name",
        "m",
        "--replicas",
        "2",
        "--round-delay",
        "30",
    ]
    prompts = [f"Once more unto the breach {k}" for k in range(4)]
    results: dict[int, list[str]] = {}
    first = threading.Barrier(5, timeout=60)

    def stream(k: int) -> None:
        with httpx.stream(
            "POST", f"{server.url}/v1/completions", json=stream_body(prompts[k], 30), timeout=60
        ) as response:
            events = []
            for data in sse_events(response):
                if not events:
                    first.wait()
                events.append(data)
            results[k] = events

    with Server(*flags) as server:
        threads = [threading.Thread(target=stream, args=(k,)) for k in range(4)]
        for thread in threads:
            thread.start()
        first.wait()
        ours = list(replica_pids(server).values())
        assert len(ours) == 2
        server.process.send_signal(signal.SIGINT)
        for thread in threads:
            thread.join(60)
        assert server.process.wait(60) == 0
    wait_until(lambda: not any(alive(pid) for pid in ours), 30, "the replicas to end with it")
    for k in range(4):
        bodies = [json.loads(data) for data in results[k][:-1]]
        assert results[k][-1] == "[DONE]"
        text = "".join(body["choices"][0]["text"] for body in bodies)
        expected = offline_alone(offline, prompts[k], SamplingParams(temperature=0, max_tokens=30))
        assert text == expected[0].text
        assert bodies[-1]["choices"][0]["finish_reason"] == "length"


class FakeReplica:
    def __init__(self, name: str):
        self.replica_id = name


class FakePending:
    """What the router reads of a pending request: its order's keys and its internal id."""

    def __init__(self, keys: tuple[int, ...], request_id: str):
        from types import SimpleNamespace

        from minirt.distributed.engine_replica import Order

        self.args = [Order((), keys)]
        self.metadata = SimpleNamespace(internal_request_id=request_id)


def prefix_router(imbalance: int):
    from minirt.distributed.prefix_router import PrefixAffinityRouter

    router = PrefixAffinityRouter.__new__(PrefixAffinityRouter)
    router.initialize_state(imbalance=imbalance)
    return router


def test_the_prefix_router_keeps_a_prefix_home_up_to_its_margin_exactly():
    import asyncio

    router = prefix_router(imbalance=2)
    home = FakeReplica("home")
    other = FakeReplica("other")
    router.on_request_routed(FakePending((1, 2, 3), "first"), "home", None)
    # A prompt sharing the first two blocks goes home, first in the ranks.
    ranks = asyncio.run(router.choose_replicas([home, other], FakePending((1, 2, 9), "x")))
    assert ranks[0] == [home]
    # Home 2 more in flight than the least busy: still home (the margin is "more than 2").
    router.on_request_routed(FakePending((), "busy"), "home", None)
    ranks = asyncio.run(router.choose_replicas([home, other], FakePending((1,), "y")))
    assert ranks[0] == [home]
    # One more: power of two choices alone.
    router.on_request_routed(FakePending((), "busier"), "home", None)
    ranks = asyncio.run(router.choose_replicas([home, other], FakePending((1,), "z")))
    assert len(ranks) == 1 and set(ranks[0]) == {home, other}
    # Finished, it is home again; an unknown prefix is power of two choices.
    router.on_request_completed("home", "busier")
    assert asyncio.run(router.choose_replicas([home, other], FakePending((1,), "w")))[0] == [home]
    assert len(asyncio.run(router.choose_replicas([home, other], FakePending((7,), "v")))) == 1


def test_the_prefix_router_forgets_a_dead_replicas_prefixes():
    import asyncio

    router = prefix_router(imbalance=8)
    router._replicas = {}
    router._replicas_list = []
    router._replica_id_set = set()
    router._queue_len_gauge_last_update = {}
    router.on_request_routed(FakePending((5, 6), "a"), "gone", None)
    router.on_replica_actor_died("gone")
    survivor = FakeReplica("left")
    ranks = asyncio.run(router.choose_replicas([survivor], FakePending((5, 6), "b")))
    assert ranks == [[survivor]] and not router.last_replica


def test_a_request_completed_before_it_is_routed_is_in_flight_nowhere():
    """Ray Serve can tell the router a stream ended before it says where it went (an order
    refused at once): the request must not count as in flight there for ever."""
    import asyncio

    router = prefix_router(imbalance=0)
    home = FakeReplica("home")
    other = FakeReplica("other")
    router.on_request_routed(FakePending((1, 2), "first"), "home", None)
    router.on_request_completed("home", "first")
    router.on_request_completed("home", "quick")
    router.on_request_routed(FakePending((1, 2), "quick"), "home", None)
    assert router.load("home") == 0
    # So home, with nothing in flight, keeps the prefix even with no margin at all.
    ranks = asyncio.run(router.choose_replicas([home, other], FakePending((1, 2), "next")))
    assert ranks[0] == [home]
    # A try Ray Serve rejected is told completed only: remembered, but not without bound.
    from minirt.distributed.prefix_router import MAX_COMPLETED_EARLY

    for k in range(MAX_COMPLETED_EARLY + 5):
        router.on_request_completed("other", f"rejected {k}")
    assert len(router.completed_early) == MAX_COMPLETED_EARLY


class LockThenEngineRound:
    """An ObserverRelay's lock that, the first time a take releases it, lets the engine's thread
    run one round (its calls, then its new snapshot) right there: the moment a report can race."""

    def __init__(self, engine_round):
        self.lock = threading.Lock()
        self.engine_round = engine_round
        self.armed = False

    def __enter__(self):
        self.lock.acquire()

    def __exit__(self, *exc_info):
        self.lock.release()
        if self.armed:
            self.armed = False
            self.engine_round()


def test_a_reports_snapshot_is_never_newer_than_its_calls():
    """Each report's snapshot counts no round whose call is not in that report or an earlier
    one: else the metrics would show gauges (say at 0) before the calls that explain them."""
    from minirt.distributed.engine_replica import ObserverRelay
    from minirt.engine.client import EngineSnapshot

    fixed = {"policy": "continuous", "batch_size": 8, "round_token_budget": 512}
    fixed.update({"chunked_prefill": False, "prefix_cache": False, "context_length": 64})
    counts = dict.fromkeys(("running", "waiting", "kv_positions_reserved", "kv_slots_used"), 0)
    counts.update(dict.fromkeys(("prefix_cache_queries", "prefix_cache_hits", "rounds"), 0))
    counts.update(kv_budget_positions=512, prefix_cache_positions=0)
    relay = ObserverRelay(EngineSnapshot(**counts, **fixed))

    def engine_round() -> None:
        # The engine's thread: its observer calls first, then its snapshot.
        relay.round_ran(1)
        counts["rounds"] += 1
        relay.observe(EngineSnapshot(**counts, **fixed))

    lock = LockThenEngineRound(engine_round)
    relay.lock = lock
    rounds_reported = 0
    for _ in range(3):
        lock.armed = True
        calls, snapshot = relay.take()
        rounds_reported += sum(name == "round_ran" for name, _arguments in calls)
        assert snapshot.rounds <= rounds_reported
    # The rounds did run, and every one is reported in the end.
    calls, snapshot = relay.take()
    rounds_reported += sum(name == "round_ran" for name, _arguments in calls)
    assert snapshot.rounds == rounds_reported == 3
