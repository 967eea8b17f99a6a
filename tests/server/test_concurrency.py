"""The promise no peer makes: over HTTP, beside any other clients, a request's completion is token for token what
`LLM.generate` gives it offline, alone, under both policies; and static groups make a late arrival wait."""

from __future__ import annotations

import random
import threading
import time

import httpx
import pytest

from minirt import LLM, SamplingParams
from serving import Server, offline_alone, serve_tests

pytestmark = serve_tests

PROMPTS = [
    "ROMEO:",
    "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?",
    "To be, or not to be",
    "",
    "KING RICHARD III:\nNow is the winter of our discontent\nMade glorious summer by this sun of York;",
    "First Citizen:\nBefore we proceed any further, hear me speak.",
]
CLIENTS = 16
REQUESTS_PER_CLIENT = 4


def drawn_requests(seed: int) -> list[list[dict]]:
    """Each client's requests: prompts, lengths, greedy or seeded sampling, streamed or not, and the pause
    before each (so that they arrive while others run)."""
    rng = random.Random(seed)
    clients = []
    for client in range(CLIENTS):
        mine = []
        for k in range(REQUESTS_PER_CLIENT):
            body = {
                "prompt": rng.choice(PROMPTS),
                "max_tokens": rng.randint(1, 40),
                "temperature": rng.choice([0.0, 0.7, 1.2]),
                "seed": rng.randrange(2**31),
                "stream": rng.random() < 0.5,
                "user": f"client-{client}-{k}",
            }
            if rng.random() < 0.3:
                body["top_k"] = rng.randint(1, 40)
            if rng.random() < 0.3:
                body["stop"] = rng.choice(["\n", " the", "e"])
            mine.append({"pause": rng.uniform(0, 0.15), "body": body})
        clients.append(mine)
    return clients


def offline_params(body: dict) -> SamplingParams:
    stop = body.get("stop")
    return SamplingParams(
        max_tokens=body["max_tokens"],
        temperature=body["temperature"],
        seed=body["seed"],
        top_k=body.get("top_k", 0),
        stop=(stop,) if stop else (),
    )


def complete(http: httpx.Client, url: str, body: dict) -> dict:
    """One completion over HTTP: text, token ids and finish reason, streamed or not."""
    if not body["stream"]:
        answer = http.post(f"{url}/v1/completions", json=body)
        assert answer.status_code == 200, answer.text
        choice = answer.json()["choices"][0]
        return {
            "text": choice["text"],
            "token_ids": choice["minirt"]["token_ids"],
            "finish_reason": choice["finish_reason"],
            "minirt": choice["minirt"],
        }
    import json

    texts = []
    final = None
    with http.stream("POST", f"{url}/v1/completions", json=body) as answer:
        assert answer.status_code == 200
        events = [
            line[len("data: ") :] for line in answer.iter_lines() if line.startswith("data: ")
        ]
    assert events[-1] == "[DONE]"
    for event in events[:-1]:
        choice = json.loads(event)["choices"][0]
        texts.append(choice["text"])
        if choice["finish_reason"] is not None:
            final = choice
    assert final is not None
    return {
        "text": "".join(texts),
        "token_ids": final["minirt"]["token_ids"],
        "finish_reason": final["finish_reason"],
        "minirt": final["minirt"],
    }


@pytest.fixture(scope="module")
def llm():
    return LLM()


@pytest.mark.parametrize("policy", ["continuous", "static"])
def test_64_requests_from_16_concurrent_clients_equal_their_offline_results(policy, llm):
    plan = drawn_requests(seed=26)
    results: dict[str, dict] = {}
    errors = []

    def client(requests):
        with httpx.Client(timeout=120) as http:
            for request in requests:
                time.sleep(request["pause"])
                try:
                    results[request["body"]["user"]] = complete(http, server.url, request["body"])
                except Exception as exc:  # noqa: BLE001 (reported below)
                    errors.append(repr(exc))

    with Server("--policy", policy, "--batch-size", "4") as server:
        threads = [threading.Thread(target=client, args=(mine,)) for mine in plan]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(180)
        assert server.stop() == 0
    assert not errors
    bodies = [request["body"] for mine in plan for request in mine]
    # None lost, none twice.
    assert sorted(results) == sorted(body["user"] for body in bodies) and len(results) == 64
    for body in bodies:
        (expected,) = offline_alone(llm, body["prompt"], offline_params(body))
        got = results[body["user"]]
        assert got["token_ids"] == expected.token_ids, body
        assert got["text"] == expected.text, body
        assert got["finish_reason"] == expected.finish_reason, body
        if policy == "static":
            assert got["minirt"]["group"] is not None
        else:
            assert got["minirt"]["group"] is None


def batching_of(url: str, body: dict) -> dict:
    with httpx.Client(timeout=60) as http:
        return http.post(f"{url}/v1/completions", json=body).json()["choices"][0]["minirt"]


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_under_static_groups_a_request_that_arrives_while_a_group_runs_waits_for_it_to_end(policy):
    long_body = {"prompt": "ROMEO:", "max_tokens": 200, "ignore_eos": True, "temperature": 0}
    short_body = {"prompt": "JULIET:", "max_tokens": 3, "ignore_eos": True, "temperature": 0}
    with Server("--policy", policy, "--batch-size", "4") as server:
        holder = {}
        first = threading.Thread(
            target=lambda: holder.update(long=batching_of(server.url, long_body))
        )
        first.start()
        # The long request runs (alone in its static group, or in the pool) when the short one arrives.
        server.wait_for_metric("minirt:num_requests_running", 1)
        short = batching_of(server.url, short_body)
        first.join()
        assert server.stop() == 0
    long = holder["long"]
    if policy == "static":
        # A row was free, but a static group admits nobody: it waited for the group's last round.
        assert short["first_round"] == long["finish_round"] + 1
        assert short["rounds_waited"] > 0 and short["group"] == long["group"] + 1
    else:
        assert short["rounds_waited"] == 0 and short["first_round"] <= long["finish_round"]
        assert short["finish_round"] < long["finish_round"]
