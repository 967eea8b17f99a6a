"""The round grid's feed over HTTP: the exercise (POST /rounds/exercise), GET /rounds/recent, GET /rounds/events,
--batch-window and --round-delay, against a real `minirt serve`.

The grid must be the engine's own truth: the exercise's rounds are the grid that `python -m minirt.rounds`
prints (its text, parsed), for either policy; a completion the openai client gets is active in exactly as
many rounds as its usage says it produced tokens.  The window and the delay are checked by the clock and by
the groups each request reports (`minirt.group`), against hand counts.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from conftest import ROOT
from serving import Server, serve_tests

pytestmark = serve_tests

LENGTHS = [2, 5, 8, 4]


def printed_grid(policy: str) -> dict[int, str]:
    """`minirt rounds --lengths 2,5,8,4 --batch-size 3`'s grid for one policy: each request's marks, a
    character a round ('#' active, '.' held, '-' waiting)."""
    command = [sys.executable, "-m", "minirt.rounds", "--lengths", "2,5,8,4", "--batch-size", "3"]
    text = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    grid: dict[int, str] = {}
    current = None
    for line in text.splitlines():
        if line.startswith(("static:", "continuous:")):
            current = line.split(":")[0]
        elif line.startswith("req ") and current == policy:
            grid[int(line.split()[1])] = line[8::2].rstrip()
    assert len(grid) == 4, text
    return grid


def marks(rounds: list[dict], request_id: str) -> str:
    """A request's marks in the feed's rounds, as `minirt rounds` prints them."""
    out = []
    for record in rounds:
        states = {cell["state"] for cell in record["cells"] if cell["request"] == request_id}
        if "active" in states:
            out.append("#")
        elif "held" in states:
            out.append(".")
        elif any(w["request"] == request_id for w in record["waiting"]):
            out.append("-")
        else:
            out.append(" ")
    return "".join(out).rstrip()


def wait_for_finish(url: str, request_id: str, timeout: float = 30.0) -> list[dict]:
    """The feed's recent rounds once `request_id` has finished."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rounds = httpx.get(f"{url}/rounds/recent", params={"rounds": 512}).json()["rounds"]
        if any(note["request"] == request_id for r in rounds for note in r["finished"]):
            return rounds
        time.sleep(0.05)
    raise AssertionError(f"{request_id} did not finish within {timeout} s")


def exercise_rounds(url: str) -> tuple[list[str], list[dict]]:
    answer = httpx.post(f"{url}/rounds/exercise", json={"lengths": LENGTHS}, timeout=30)
    assert answer.status_code == 200, answer.text
    ids = answer.json()["ids"]
    assert len(ids) == 4 and len(set(ids)) == 4 and all(i.startswith("cmpl-") for i in ids)
    rounds = wait_for_finish(url, ids[2])
    rounds = wait_for_finish(url, ids[3])
    # The exercise's run: the rounds from its first (the server was idle, so its run starts at 1).
    run = next(r["run"] for r in rounds if any(c["request"] == ids[0] for c in r["cells"]))
    return ids, [r for r in rounds if r["run"] == run]


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_the_exercise_runs_the_grid_minirt_rounds_prints(policy):
    with Server("--policy", policy, "--batch-size", "3") as server:
        ids, rounds = exercise_rounds(server.url)
        assert [r["round"] for r in rounds] == list(range(1, len(rounds) + 1))
        expected = printed_grid(policy)
        for index, request_id in enumerate(ids):
            assert marks(rounds, request_id) == expected[index], (policy, index)
        notes = {n["request"]: n for r in rounds for n in r["finished"]}
        waited = 8 if policy == "static" else 2
        assert notes[ids[3]]["rounds_waited"] == waited
        assert [notes[i]["tokens"] for i in ids] == LENGTHS
        # One row a request, and no row held twice in a round.
        for request_id in ids:
            assert (
                len({c["row"] for r in rounds for c in r["cells"] if c["request"] == request_id})
                == 1
            )
        for record in rounds:
            rows = [c["row"] for c in record["cells"]]
            assert len(rows) == len(set(rows)) and all(0 <= row < 3 for row in rows)
        assert server.stop() == 0


def test_openai_completions_are_active_in_the_grid_for_as_many_rounds_as_they_made_tokens():
    with Server("--batch-size", "4") as server:
        client = server.client()
        answers = {}

        def send(k):
            answers[k] = client.completions.create(
                model=None, prompt=f"ROMEO {k}:", max_tokens=3 + 5 * k, seed=k, temperature=0.8
            )

        threads = [threading.Thread(target=send, args=(k,)) for k in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert len(answers) == 6
        rounds = httpx.get(f"{server.url}/rounds/recent", params={"rounds": 512}).json()["rounds"]
        for answer in answers.values():
            cells = [
                (r["run"], r["round"])
                for r in rounds
                for c in r["cells"]
                if c["request"] == answer.id and c["state"] == "active"
            ]
            assert len(cells) == answer.usage.completion_tokens
            assert len(set(cells)) == len(cells)
        assert server.stop() == 0


def test_the_event_stream_says_hello_then_sends_every_round_once():
    with Server("--batch-size", "2") as server:
        events = []
        with httpx.Client(timeout=30) as http:
            with http.stream("GET", f"{server.url}/rounds/events") as stream:
                assert stream.headers["content-type"].startswith("text/event-stream")
                lines = stream.iter_lines()
                hello = json.loads(next(line for line in lines if line.startswith("data: "))[6:])
                assert hello["type"] == "hello" and hello["rounds"] == []
                assert hello["server"]["policy"] == "continuous"
                assert hello["server"]["batch_size"] == 2
                body = {"prompt": "To be", "max_tokens": 7, "temperature": 0}
                answer = httpx.post(f"{server.url}/v1/completions", json=body, timeout=30).json()
                for line in lines:
                    if not line.startswith("data: "):
                        continue
                    event = json.loads(line[6:])
                    events.append(event)
                    if any(n["request"] == answer["id"] for n in event["finished"]):
                        break
        assert [e["round"] for e in events] == list(range(1, 8))
        assert all(e["type"] == "round" for e in events)
        assert all(
            e["cells"] == [{"row": 0, "request": answer["id"], "sample": 0, "state": "active"}]
            for e in events
        )
        assert server.stop() == 0


def test_a_late_request_joins_a_static_group_within_the_batch_window_and_not_after_it():
    def groups(window_ms: str) -> list[int]:
        with Server(
            "--policy",
            "static",
            "--batch-size",
            "4",
            "--batch-window",
            window_ms,
            "--round-delay",
            "20",
        ) as server:
            found = {}

            def send(k, pause):
                time.sleep(pause)
                body = {"prompt": "ROMEO:", "max_tokens": 12, "temperature": 0}
                answer = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()
                found[k] = answer["choices"][0]["minirt"]["group"]

            threads = [threading.Thread(target=send, args=(k, 0.15 * k)) for k in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            assert server.stop() == 0
            return [found[0], found[1]]

    # 150 ms apart: a 1,000 ms window holds the group open for the second; with none, the first starts alone
    # and runs 12 rounds of 20 ms or more, so the second waits for a group of its own.
    assert groups("1000") == [1, 1]
    assert groups("0") == [1, 2]


def test_a_full_static_group_starts_at_once_whatever_the_window():
    with Server("--policy", "static", "--batch-size", "2", "--batch-window", "20000") as server:
        started = time.monotonic()
        answer = httpx.post(f"{server.url}/rounds/exercise", json={"lengths": [3, 3]}, timeout=60)
        rounds = wait_for_finish(server.url, answer.json()["ids"][1])
        assert time.monotonic() - started < 10, "the full group waited for its window"
        assert len(rounds) == 3
        assert server.stop() == 0


def test_the_round_delay_pauses_after_every_round():
    body = {"prompt": "ROMEO:", "max_tokens": 6, "temperature": 0}
    with Server("--round-delay", "150") as server:
        started = time.monotonic()
        answer = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
        elapsed = time.monotonic() - started
        assert answer.json()["usage"]["completion_tokens"] == 6
        # Six rounds, and a pause of 150 ms after each of the first five before the next.
        assert elapsed >= 5 * 0.150
        facts = httpx.get(f"{server.url}/rounds/recent").json()["server"]
        assert facts["round_delay_ms"] == 150
        assert server.stop() == 0


def test_bad_exercises_and_recent_queries_are_refused_in_openais_shape():
    with Server("--api-key", "sk-test") as server:
        url = server.url
        key = {"Authorization": "Bearer sk-test"}
        cases = [
            ({"lengths": []}, "lengths"),
            ({"lengths": [0]}, "lengths"),
            ({"lengths": [2] * 17}, "lengths"),
            ({"lengths": [5000]}, "lengths"),
            ({"lengths": ["2"]}, "lengths"),
            ({"lengths": [2], "prompt": "x"}, "prompt"),
        ]
        for body, param in cases:
            answer = httpx.post(f"{url}/rounds/exercise", json=body, headers=key)
            assert answer.status_code == 400, (body, answer.text)
            assert answer.json()["error"]["param"] == param
        answer = httpx.post(f"{url}/rounds/exercise", content=b"{not json", headers=key)
        assert answer.status_code == 400
        assert "not valid JSON" in answer.json()["error"]["message"]
        # The exercise spends compute: it needs the key; the page and its feeds are open, as /metrics is.
        answer = httpx.post(f"{url}/rounds/exercise", json={"lengths": [2]})
        assert answer.status_code == 401
        assert (
            httpx.post(f"{url}/rounds/exercise", json={"lengths": [2]}, headers=key).status_code
            == 200
        )
        for query in ("0", "513", "x", "-1", "²", "١٢"):
            answer = httpx.get(f"{url}/rounds/recent", params={"rounds": query})
            assert answer.status_code == 400 and answer.json()["error"]["param"] == "rounds"
        assert httpx.get(f"{url}/rounds/recent").status_code == 200
        assert httpx.get(f"{url}/").status_code == 200
        assert httpx.get(f"{url}/rounds/exercise", headers=key).status_code == 405
        assert server.stop() == 0


def test_the_page_is_one_file_that_fetches_nothing_from_elsewhere():
    with Server() as server:
        for path in ("/", "/rounds"):
            answer = httpx.get(f"{server.url}{path}")
            assert answer.status_code == 200
            assert answer.headers["content-type"].startswith("text/html")
            page = answer.text
            assert "<script>" in page and "<style>" in page
            # No script, style sheet, font or image from another host: it works offline.
            for reference in (
                'src="http',
                "src='http",
                'href="http',
                "href='http",
                "@import",
                "url(http",
            ):
                assert reference not in page
        assert server.stop() == 0


def test_an_open_event_stream_does_not_hold_up_the_servers_exit():
    with Server() as server:
        with httpx.Client(timeout=30) as http:
            with http.stream("GET", f"{server.url}/rounds/events") as stream:
                lines = stream.iter_lines()
                next(line for line in lines if line.startswith("data: "))
                started = time.monotonic()
                server.process.send_signal(signal.SIGTERM)
                rest = list(lines)
                assert rest == [] or all(not line.startswith("data: ") for line in rest)
        assert server.process.wait(30) == 0
        # Far below the grace period (30 s) plus uvicorn's own (5 s more).
        assert time.monotonic() - started < 10


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--batch-window", "10"], "--batch-window applies to static groups only"),
        (
            ["--policy", "static", "--batch-window", "-1"],
            "--batch-window must be from 0 to 60000 ms",
        ),
        (
            ["--policy", "static", "--batch-window", "nan"],
            "--batch-window must be from 0 to 60000 ms",
        ),
        (["--round-delay", "1e9"], "--round-delay must be from 0 to 60000 ms"),
        (["--round-delay", "soon"], "--round-delay: invalid float value"),
    ],
)
def test_bad_window_and_delay_flags_are_one_line_and_exit_2(flags, message):
    command = [sys.executable, "-m", "minirt.serve", "--port", "0", *flags]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_a_client_that_leaves_is_the_feeds_news_even_when_no_round_follows():
    with Server("--batch-size", "2", "--round-delay", "50") as server:
        body = {"prompt": "ROMEO:", "max_tokens": 200, "ignore_eos": True, "stream": True}
        with httpx.Client(timeout=30) as http:
            with http.stream("POST", f"{server.url}/v1/completions", json=body) as answer:
                chunks = (line for line in answer.iter_lines() if line.startswith("data: "))
                completion_id = json.loads(next(chunks)[6:])["id"]
                next(chunks)
        # It was alone: its abort is reported by a step that runs no round.
        rounds = wait_for_finish(server.url, completion_id)
        last = rounds[-1]
        assert last["ran_round"] is False and last["cells"] == [] and last["waiting"] == []
        assert [(n["request"], n["finish_reason"]) for n in last["finished"]] == [
            (completion_id, "abort")
        ]
        assert all(r["ran_round"] for r in rounds[:-1])
        assert server.stop() == 0


def test_a_long_round_delay_never_holds_up_a_shutdown():
    with Server("--round-delay", "20000") as server:
        body = {"prompt": "ROMEO:", "max_tokens": 5, "ignore_eos": True, "stream": True}
        with httpx.Client(timeout=60) as http:
            with http.stream("POST", f"{server.url}/v1/completions", json=body) as answer:
                lines = answer.iter_lines()
                first = next(line for line in lines if line.startswith("data: "))
                started = time.monotonic()
                server.process.send_signal(signal.SIGTERM)
                rest = [line[6:] for line in lines if line.startswith("data: ")]
        # The pause ends with the shutdown: the stream finishes its 5 tokens at once and ends with [DONE].
        assert rest[-1] == "[DONE]"
        finals = [json.loads(e)["choices"][0] for e in [first[6:], *rest[:-1]]]
        assert finals[-1]["finish_reason"] == "length"
        assert len(finals[-1]["minirt"]["token_ids"]) == 5
        assert server.process.wait(30) == 0
        assert time.monotonic() - started < 10


def test_a_static_group_the_kv_budget_has_filled_does_not_wait_out_its_window():
    # 40 KV positions: two requests of 3 + 24 positions each cannot share a group, so the first group is full
    # by memory with one member, and waiting longer could add nobody.
    flags = [
        "--policy",
        "static",
        "--batch-size",
        "4",
        "--batch-window",
        "60000",
        "--kv-budget",
        "40",
    ]
    with Server(*flags) as server:
        started = time.monotonic()
        answers = httpx.post(
            f"{server.url}/rounds/exercise", json={"lengths": [25, 25]}, timeout=60
        )
        ids = answers.json()["ids"]
        rounds = wait_for_finish(server.url, ids[0], timeout=50)
        assert time.monotonic() - started < 20, (
            "the group waited for a member the KV budget holds no room for"
        )
        ran = [r for r in rounds if r["ran_round"]]
        assert [sorted({c["request"] for c in r["cells"]}) for r in ran] == [[ids[0]]] * 25
        # The second waited beside it, for a row the budget had no room for.
        assert all([w["request"] for w in r["waiting"]] == [ids[1]] for r in ran)
        assert server.stop() == 0
