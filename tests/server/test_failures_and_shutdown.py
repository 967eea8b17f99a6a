"""What goes wrong while a server runs: a request whose logits go non-finite fails alone (its peers' streams go
on, equal to offline); SIGTERM lets the streams in flight finish, or aborts them after the grace period, and the
server exits 0 either way."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import threading
import time

import httpx
import numpy as np
import pytest
from conftest import FIXTURES
from safetensors.numpy import load_file, save_file
from serving import Server, offline_alone, serve_tests

from minirt import LLM, SamplingParams

pytestmark = serve_tests

POISONED_TOKEN = 7


@pytest.fixture(scope="module")
def poisoned_folder(tmp_path_factory):
    """The untied-head fixture (token-id prompts, no tokenizer) with one embedding row NaN: a prompt that holds
    that token gets NaN logits, and only its own row does."""
    folder = tmp_path_factory.mktemp("poisoned") / "model"
    shutil.copytree(FIXTURES / "untied_head", folder)
    tensors = load_file(str(folder / "model.safetensors"))
    name = next(n for n in tensors if n.endswith("wte.weight"))
    tensors[name][POISONED_TOKEN] = np.nan
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def events_of(answer: httpx.Response) -> list:
    return [line[len("data: ") :] for line in answer.iter_lines() if line.startswith("data: ")]


def test_a_request_with_nan_logits_fails_alone_while_its_peers_finish(poisoned_folder):
    healthy = {
        "prompt": [1, 2, 3],
        "max_tokens": 30,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    failing = {"prompt": [POISONED_TOKEN, 1, 2], "max_tokens": 30, "temperature": 0}
    with Server("--model", str(poisoned_folder), "--batch-size", "4") as server:
        results = {}

        def stream_healthy():
            with httpx.stream(
                "POST", f"{server.url}/v1/completions", json=healthy, timeout=60
            ) as answer:
                results["healthy"] = events_of(answer)

        thread = threading.Thread(target=stream_healthy)
        thread.start()
        whole = httpx.post(f"{server.url}/v1/completions", json=failing, timeout=60)
        with httpx.stream(
            "POST", f"{server.url}/v1/completions", json={**failing, "stream": True}
        ) as answer:
            streamed = events_of(answer)
        thread.join()
        assert server.stop() == 0
    error = whole.json()["error"]
    assert (
        whole.status_code == 500
        and "not finite" in error["message"]
        and error["type"] == "server_error"
    )
    # Streamed: the error arrives as an event, then [DONE].
    assert streamed[-1] == "[DONE]" and "not finite" in json.loads(streamed[-2])["error"]["message"]
    (expected,) = offline_alone(
        LLM(poisoned_folder),
        [1, 2, 3],
        SamplingParams(max_tokens=30, ignore_eos=True, temperature=0.0),
    )
    final = json.loads(results["healthy"][-2])["choices"][0]
    assert final["finish_reason"] == "length" and final["minirt"]["token_ids"] == expected.token_ids


LONG = {"prompt": "ROMEO:", "max_tokens": 200, "ignore_eos": True, "temperature": 0, "stream": True}


def stream_in_thread(
    url: str, body: dict, into: list, started: threading.Event
) -> threading.Thread:
    def run():
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as answer:
            # A stream's headers come once the engine's thread has queued every choice: from here
            # the completion is in flight, whether its first token has come or not (on a loaded
            # machine, the last of four completions of 16 choices waits many seconds for a row).
            if answer.status_code == 200:
                started.set()
            for line in answer.iter_lines():
                if line.startswith("data: "):
                    into.append(line[len("data: ") :])

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_sigterm_lets_every_stream_in_flight_finish_then_exits_0():
    # A grace period far beyond the work (a few seconds alone, more on a loaded machine), so that only a
    # server that drops what is in flight can fail this.
    # Rounds of 5 ms at least until the signal (a shutdown ends the pauses): the work still to do
    # when it comes is seconds of rounds however fast or loaded the machine, and what is left after
    # it runs at full speed, well within the grace period even on a loaded machine.
    with Server(
        "--batch-size", "8", "--shutdown-timeout", "100", "--round-delay", "5"
    ) as server:  # fmt: skip
        streams = [[] for _ in range(4)]
        started = [threading.Event() for _ in streams]
        # 4 x 4 choices of 200 tokens in 8 rows: 400 rounds, 2 s of pauses alone.
        threads = [
            stream_in_thread(server.url, {**LONG, "n": 4}, events, event)
            for events, event in zip(streams, started, strict=True)
        ]
        for event in started:
            assert event.wait(30)
        port = int(server.url.rsplit(":", 1)[1])
        server.process.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(110)
        assert server.process.wait(60) == 0
        # Nobody new gets in.
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
    for events in streams:
        assert events[-1] == "[DONE]"
        finals = [
            json.loads(e)["choices"][0]
            for e in events[:-1]
            if json.loads(e)["choices"][0]["finish_reason"]
        ]
        assert len(finals) == 4
        assert all(
            f["finish_reason"] == "length" and len(f["minirt"]["token_ids"]) == 200 for f in finals
        )


def test_after_the_grace_period_the_rest_is_aborted_with_an_error_event_and_exit_0():
    with Server("--batch-size", "8", "--shutdown-timeout", "0.5") as server:
        events = []
        started = threading.Event()
        # 64 x 200 tokens: far more than half a second.
        thread = stream_in_thread(server.url, {**LONG, "n": 64}, events, started)
        assert started.wait(30)
        assert server.stop(signal.SIGINT, timeout=30) == 0
        thread.join(30)
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert "shut down" in error["message"] and "--shutdown-timeout" in error["message"]
    # Every one of the 64 choices is told how it ended: a finish_reason, or an error naming it.
    reported = set()
    for event in events[:-1]:
        data = json.loads(event)
        if "error" in data:
            reported.add(int(data["error"]["message"].split()[1].rstrip(":")))
        elif data["choices"] and data["choices"][0]["finish_reason"] is not None:
            reported.add(data["choices"][0]["index"])
    assert reported == set(range(64))


def test_a_stream_whose_choice_fails_reports_every_other_choice_and_leaves_nothing_running(
    poisoned_folder,
):
    """n = 4 of a poisoned prompt: a choice fails in its first round, the stream ends, and each of
    the other three is reported too (failed as well, or stopped because of the first); the
    server then holds no request."""
    body = {"prompt": [POISONED_TOKEN, 1, 2], "max_tokens": 30, "n": 4, "stream": True}
    with Server("--model", str(poisoned_folder), "--batch-size", "2") as server:
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as answer:
            events = events_of(answer)
        server.wait_for_metric("minirt:num_requests_running", 0, timeout=10)
        server.wait_for_metric("minirt:num_requests_waiting", 0, timeout=10)
        assert server.stop() == 0
    assert events[-1] == "[DONE]"
    errors = [json.loads(event)["error"]["message"] for event in events[:-1]]
    named = sorted(int(message.split()[1].rstrip(":")) for message in errors)
    assert named == [0, 1, 2, 3]


# The engine thread's own faults: tests/engine/test_client.py (the client, without HTTP).


def test_a_second_ctrl_c_quits_at_once_without_a_traceback():
    """A stream and a round-grid page open, a long grace period: the first SIGINT starts the
    graceful shutdown, the second quits at once, and the log holds no traceback (uvicorn cancels
    every task to quit; each cancellation used to be logged as a CancelledError)."""
    started = threading.Event()

    def stream(url):
        try:
            with httpx.stream("POST", f"{url}/v1/completions", json={**LONG, "n": 16}) as answer:
                started.set()
                for _ in answer.iter_lines():
                    pass
        except httpx.HTTPError:
            pass  # the server quit mid-stream, as asked

    def watch(url):
        try:
            with httpx.stream(
                "GET", f"{url}/rounds/events", timeout=httpx.Timeout(5, read=None)
            ) as answer:
                for _ in answer.iter_lines():
                    pass
        except httpx.HTTPError:
            pass

    with Server("--batch-size", "8", "--shutdown-timeout", "100") as server:
        threads = [
            threading.Thread(target=f, args=(server.url,), daemon=True) for f in (stream, watch)
        ]
        for thread in threads:
            thread.start()
        assert started.wait(30)
        server.process.send_signal(signal.SIGINT)
        time.sleep(0.5)
        server.process.send_signal(signal.SIGINT)
        code = server.process.wait(30)
        for thread in threads:
            thread.join(30)
        time.sleep(0.2)
    log = "".join(server.stderr_lines)
    assert code == 0, log
    assert "Traceback" not in log and "CancelledError" not in log, log
