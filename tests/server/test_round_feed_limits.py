"""The round-grid feed's bounds: at most MAX_WATCHERS pages at once (the next is a 503, and a
place freed is taken again), a heartbeat while the feed is idle, and each round encoded once
for all its watchers, byte for byte what one watcher alone is sent."""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest
from serving import Server, serve_tests

from minirt.engine.round_record import record_round

pytestmark = serve_tests


def open_watchers(server, count: int) -> tuple[list, list]:
    """`count` open GET /rounds/events streams, each read up to its hello: (streams, clients)."""
    clients, streams = [], []
    for _ in range(count):
        client = httpx.Client(timeout=30)
        stream = client.stream("GET", f"{server.url}/rounds/events")
        answer = stream.__enter__()
        clients.append(client)
        streams.append((stream, answer))
    return streams, clients


def test_at_most_32_pages_watch_the_rounds_and_a_freed_place_is_taken_again():
    with Server() as server:
        streams, clients = open_watchers(server, 32)
        assert all(answer.status_code == 200 for _, answer in streams)
        refused = httpx.get(f"{server.url}/rounds/events", timeout=30)
        assert refused.status_code == 503
        assert "32 pages" in refused.json()["error"]["message"]
        stream, _ = streams.pop()
        stream.__exit__(None, None, None)
        clients.pop().close()
        # The server hears the page leave at its next write: a round makes one.
        httpx.post(f"{server.url}/v1/completions", json={"prompt": "x", "max_tokens": 2})
        for _ in range(50):
            with httpx.Client(timeout=30) as client:
                with client.stream("GET", f"{server.url}/rounds/events") as again:
                    if again.status_code == 200:
                        break
            threading.Event().wait(0.1)
        assert again.status_code == 200
        for stream, _ in streams:
            stream.__exit__(None, None, None)
        for client in clients:
            client.close()
        assert server.stop() == 0


def page_parts():
    """A RoundsPage on the shipped model, its client not started (its snapshot is ready)."""
    from minirt import LLM
    from minirt.server.app import ServerSettings
    from minirt.server.handover import Handover
    from minirt.server.round_feed import RoundFeed
    from minirt.server.rounds_page import RoundsPage

    llm = LLM()
    client = llm.engine_client(8)
    feed = RoundFeed()
    page = RoundsPage(
        llm, client, Handover(client, llm.request_maker), feed, ServerSettings("m", "p")
    )
    return page, feed


class GetRequest:
    method = "GET"


def test_an_idle_feed_writes_a_heartbeat_and_a_round_after_it(monkeypatch):
    from minirt.server import rounds_page

    monkeypatch.setattr(rounds_page, "HEARTBEAT_S", 0.05)
    page, feed = page_parts()

    async def read():
        response = await page.events(GetRequest())
        chunks = response.body_iterator
        hello = await anext(chunks)
        heartbeat = await anext(chunks)
        feed.publish(record_round(1, 1, True, 0.0, 0, 0, 10, [], [], [], []))
        round_event = await anext(chunks)
        await chunks.aclose()
        return hello, heartbeat, round_event

    hello, heartbeat, round_event = asyncio.run(read())
    assert json.loads(hello.removeprefix("data: "))["type"] == "hello"
    # A server-sent event's comment: a line that starts with a colon, which a page ignores.
    assert heartbeat == ": heartbeat\n\n"
    assert json.loads(round_event.removeprefix("data: "))["round"] == 1
    assert feed.watchers == []


@pytest.mark.parametrize("watchers", [1, 3])
def test_a_round_is_encoded_once_for_every_watcher(monkeypatch, watchers):
    """Every watcher gets the same event, the one string made once per round."""
    from minirt.server import round_feed

    encoded = []
    real_sse = round_feed.sse
    monkeypatch.setattr(round_feed, "sse", lambda payload: encoded.append(1) or real_sse(payload))
    page, feed = page_parts()

    async def read():
        streams = [(await page.events(GetRequest())).body_iterator for _ in range(watchers)]
        for stream in streams:
            await anext(stream)  # hello
        feed.publish(record_round(1, 4, True, 0.0, 0, 0, 10, [], [], [], []))
        events = [await anext(stream) for stream in streams]
        for stream in streams:
            await stream.aclose()
        return events

    events = asyncio.run(read())
    assert len(encoded) == 1
    assert all(event is events[0] for event in events)
    assert json.loads(events[0].removeprefix("data: "))["round"] == 4


def test_a_watcher_dropped_for_falling_behind_gives_up_its_place_at_the_next_round(monkeypatch):
    """A page that reads nothing (its writes stalled) falls SUBSCRIBER_BACKLOG rounds behind and
    is dropped; its place is free at the next round, though its stream has not ended."""
    from minirt.server import round_feed

    monkeypatch.setattr(round_feed, "SUBSCRIBER_BACKLOG", 3)
    monkeypatch.setattr(round_feed, "MAX_WATCHERS", 2)
    record = record_round(1, 1, True, 0.0, 0, 0, 10, [], [], [], [])

    async def scenario():
        feed = round_feed.RoundFeed()
        stalled, _ = feed.subscribe()
        reading, _ = feed.subscribe()
        with pytest.raises(round_feed.TooManyWatchers):
            feed.subscribe()
        for _ in range(4):  # one round past the backlog of 3
            feed.publish(record)
            await asyncio.sleep(0)
            while not reading.queue.empty():
                reading.queue.get_nowait()
        assert stalled.dropped and not reading.dropped
        feed.publish(record)
        await asyncio.sleep(0)
        assert feed.watchers == [reading]
        feed.subscribe()  # the freed place
        assert len(feed.watchers) == 2

    asyncio.run(scenario())
