"""The server's process: its socket, uvicorn, its signals, and its one line when ready.

Owns: `bind` (the listening socket, opened before the model loads, so that a port that is taken
or not allowed is one line and exit 2 before anything else happens) and `serve_forever`: the
engine's client (its thread, made by `LLM.engine_client`: the server never reaches the engine
itself), with the metrics as its observer and the round feed as its round callback, the app,
and uvicorn on that socket until SIGINT or SIGTERM.

Shutting down: the first SIGINT or SIGTERM stops accepting (the socket closes; a completion
still arriving on an open connection gets 503), and the requests in flight may finish within
the grace period; when it ends, the engine aborts them, so that each stream gets an error event
and [DONE] and each waiting client a 503.  Then the process exits 0.  A second Ctrl-C quits at
once.

Must not know: the routes, the request bodies, or how rounds are computed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
from collections.abc import Callable
from typing import Any

import uvicorn

from ..llm import LLM
from ..errors import MinirtError
from .app import ServerSettings, build_app
from .connections import DEFAULT_CONNECTION_TIMEOUT_S, bounded_connections
from ..engine.client import EngineClient
from .metrics import ServerMetrics
from .round_feed import RoundFeed

# uvicorn's own limit waits this much longer than the grace period, so that the engine's
# aborts (and the error events they send) come first.
UVICORN_EXTRA_GRACE_S = 5.0

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (port 0: a free one), or one line saying why not."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise MinirtError(f"--host {host}: not an address here ({exc.strerror})") from None
    family, kind, proto, _name, address = infos[0]
    sock = socket.socket(family, kind, proto)
    # A port left in TIME_WAIT by a server that just stopped is free again; one in use is not.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except PermissionError:
        sock.close()
        raise MinirtError(
            f"--port {port}: not allowed here (ports below 1024 need privileges); "
            "choose one from 1024 to 65535"
        ) from None
    except OSError as exc:
        sock.close()
        raise MinirtError(
            f"--host {host} --port {port}: cannot listen there ({exc.strerror}); "
            "choose another port, or stop what holds it"
        ) from None
    return sock


class QuietCancellation(logging.Filter):
    """Drops the log records of tasks cancelled by a second Ctrl-C (uvicorn cancels every
    connection's task, and the app's lifespan, to quit at once): the operator asked for exactly
    that, and each would be a traceback.  Starlette hands uvicorn the lifespan's traceback as
    text, so that one is known by its last line."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, asyncio.CancelledError):
            return False
        return not record.getMessage().rstrip().endswith("asyncio.exceptions.CancelledError")


class MinirtServer(uvicorn.Server):
    """uvicorn's server, which tells the engine when a signal asks it to stop, says when it is
    ready, and exits 0 after a graceful shutdown (uvicorn's own raises the signal again)."""

    def __init__(self, config, client: EngineClient, grace_s: float, ready_line: str):
        super().__init__(config)
        self.engine_client = client
        self.grace_s = grace_s
        self.ready_line = ready_line

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            print(self.ready_line, flush=True)

    def handle_exit(self, sig, frame) -> None:
        if not self.should_exit:
            self.engine_client.begin_shutdown(self.grace_s)
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self):
        """As uvicorn's, but the signal is not raised again once the server has stopped."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        originals = {sig: signal.signal(sig, self.handle_exit) for sig in HANDLED_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in originals.items():
                signal.signal(sig, handler)


def one_process_client(
    llm: LLM,
    max_queue: int,
    metrics: ServerMetrics,
    feed: RoundFeed,
    round_delay_s: float,
    batch_window_s: float,
) -> EngineClient:
    """The engine's own thread in this process, with the metrics as its observer and the round
    feed as its round callback."""
    return llm.engine_client(
        max_queue,
        observer=metrics,
        on_round=feed.publish,
        # On the engine's thread, once it stops accepting: open round-grid pages end.
        on_shutdown=feed.close,
        round_delay_s=round_delay_s,
        batch_window_s=batch_window_s,
    )


def serve_forever(
    llm: LLM,
    sock: socket.socket,
    settings: ServerSettings,
    max_queue: int,
    shutdown_timeout_s: float,
    describe: str,
    round_delay_s: float = 0.0,
    batch_window_s: float = 0.0,
    max_connections: int | None = None,
    connection_timeout_s: float = DEFAULT_CONNECTION_TIMEOUT_S,
    make_client: Callable[[ServerMetrics, Callable[[], None]], Any] | None = None,
) -> None:
    """Serve on `sock` until a signal stops the server, answering at most `max_connections`
    connections at once (None: any number) and waiting `connection_timeout_s` for a head, or
    for a body's next piece (minirt/server/connections.py).  `make_client(observer,
    on_shutdown)`, when given, makes the engine client in place of `llm`'s own engine thread:
    `minirt serve --replicas` gives one over Ray Serve replicas (with the same interface)."""
    metrics = ServerMetrics(settings.model_name)
    feed = RoundFeed()
    if make_client is not None:
        # Served by replicas: their engines' events and metrics come to this client.
        client = make_client(metrics, feed.close)
    else:
        client = one_process_client(llm, max_queue, metrics, feed, round_delay_s, batch_window_s)
    app = build_app(llm, client, metrics, settings, feed)
    config = uvicorn.Config(
        app,
        log_level="warning",
        timeout_graceful_shutdown=int(shutdown_timeout_s + UVICORN_EXTRA_GRACE_S),
        lifespan="on",
        http=bounded_connections(connection_timeout_s),
        limit_concurrency=max_connections,
    )
    # uvicorn configures its loggers when its Config is made: the filter goes on after that.
    logging.getLogger("uvicorn.error").addFilter(QuietCancellation())
    host, port = sock.getsockname()[:2]
    if ":" in host:
        host = f"[{host}]"
    ready = f"minirt serve: http://{host}:{port}  ({describe}; the round grid at /; Ctrl-C to stop)"
    server = MinirtServer(config, client, shutdown_timeout_s, ready)
    server.run(sockets=[sock])
