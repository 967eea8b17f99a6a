"""Each connection's bounds while a request arrives: how big its head may grow and how long it may
take, how long its body may pause, and how many connections are answered at once.

Owns: `BoundedConnection`, uvicorn's httptools protocol (one per connection) with these bounds
added, and `bounded_connections`, the class uvicorn is given (its timeout set).

  - A head (request line and headers) is counted as it arrives.  Once more than HEAD_LIMIT bytes
    of it have come without its end, the connection gets a 431 and is closed: the parser keeps
    every byte of an unfinished head (each piece appended to the last, so a head of megabytes
    costs memory and quadratic time), and HostRule (http_rules.py) sees a head only once it is
    whole.  HEAD_LIMIT is HostRule's HEADER_LIMIT plus room for the request line, so that a head
    within HostRule's limit always arrives whole and gets HostRule's exact answer.
  - A head must be whole within `timeout_s` of its first byte (of the connection's opening, for
    the first): past it, a 408 if any of it came, and the connection closes (silently when
    nothing came).  Between requests, uvicorn's keep-alive timer closes an idle connection.
  - A body may pause `timeout_s` between two pieces: past it, a 408 if no answer has begun, and
    the connection closes.  Time the server itself stops reading (its buffer is full, a pipelined
    request waits) is not counted.
  - Past `limit_concurrency` connections (uvicorn's Config), a request gets a 503 and its
    connection closes.  uvicorn's own check counts the new connection against the limit and
    answers in plain text; this one lets exactly the limit in and answers in OpenAI's shape.

Must not know: the routes, the engine, or what a request means; the Host rule and the exact
header count stay HostRule's.
"""

from __future__ import annotations

import json

from starlette.responses import JSONResponse
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from .api_errors import error_body
from .http_rules import HEADER_LIMIT

# The request line's share of a head, beyond HostRule's headers: a URL of about 8 KiB (what
# Apache and nginx take by default).
REQUEST_LINE_ROOM = 8 * 1024
HEAD_LIMIT = HEADER_LIMIT + REQUEST_LINE_ROOM
# How long a head may take to arrive, and a body may pause (nginx waits 60 s for each; a program
# on a working network sends a head in one piece).
DEFAULT_CONNECTION_TIMEOUT_S = 30.0
# Connections beyond those a full server has in use (--max-queue waiting, --batch-size running,
# the round feed's watchers): /health, /metrics, tokenizing, keep-alive connections between
# requests.
SPARE_CONNECTIONS = 64


def connections_for(max_queue: int, batch_size: int, watchers: int) -> int:
    """How many connections a server answers at once: each request it can hold (waiting or
    running), each page watching the round feed, and SPARE_CONNECTIONS more."""
    return max_queue + batch_size + watchers + SPARE_CONNECTIONS


class BoundedConnection(HttpToolsProtocol):
    """uvicorn's httptools protocol, with a head's size and time, a body's pauses and the number
    of connections bounded (the module's docstring says how)."""

    timeout_s = DEFAULT_CONNECTION_TIMEOUT_S

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Checked here instead (on_headers_complete), so that uvicorn's own check is off.
        self.max_connections: int | None = self.config.limit_concurrency
        self.limit_concurrency = None
        # A head is awaited from the connection's opening, and again once a message is whole.
        self.awaiting_head = True
        self.head_bytes = 0
        self.head_begun = False
        self.messages_completed = 0
        self.head_deadline = None
        self.body_expected = False
        self.body_last_arrival = 0.0
        self.body_deadline = None

    # ------------------------------------------------------------------ what arrives

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.head_deadline = self.loop.call_later(self.timeout_s, self.head_too_slow)

    def connection_lost(self, exc) -> None:
        self.cancel_head_deadline()
        self.cancel_body_deadline()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return
        # A chunk that begins while a head is awaited is the head's (or the blank lines a
        # client may send before one), up to where the head ends: counted whole only if the
        # head has not ended when the parser is done with it.
        counted = self.awaiting_head
        if counted:
            self.head_begun = True
            if self.head_deadline is None:
                self.head_deadline = self.loop.call_later(self.timeout_s, self.head_too_slow)
        if self.body_expected:
            self.body_last_arrival = self.loop.time()
        completed_before = self.messages_completed
        super().data_received(data)
        if not self.awaiting_head or self.transport.is_closing():
            return
        # A head that began after another message ended, within this chunk, is not counted
        # from this chunk: where in it the head began is unknown.  So a head may hold up to one
        # chunk (256 KiB at most) more than HEAD_LIMIT before it is refused, never less.
        if counted and self.messages_completed == completed_before:
            self.head_bytes += len(data)
        if self.head_bytes > HEAD_LIMIT:
            self.refuse(
                431,
                f"the request's head passed {HEAD_LIMIT} bytes before its end arrived; "
                f"headers may have {HEADER_LIMIT} bytes in all",
            )

    # ------------------------------------------------------------------ the parser's callbacks

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.head_begun = True
        if self.head_deadline is None:
            self.head_deadline = self.loop.call_later(self.timeout_s, self.head_too_slow)

    def on_headers_complete(self) -> None:
        self.awaiting_head = False
        self.head_bytes = 0
        self.head_begun = False
        self.cancel_head_deadline()
        self.body_expected = True
        self.body_last_arrival = self.loop.time()
        self.body_deadline = self.loop.call_later(self.timeout_s, self.body_too_slow)
        # uvicorn answers a request with self.app; one past the limit gets the refusal instead.
        self.app = self.config.loaded_app
        if self.max_connections is not None and (
            len(self.connections) > self.max_connections or len(self.tasks) >= self.max_connections
        ):
            self.app = TooManyConnections(self.max_connections)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self.body_expected = False
        self.cancel_body_deadline()
        self.awaiting_head = True
        self.messages_completed += 1

    def handle_websocket_upgrade(self) -> None:
        # The connection goes to uvicorn's WebSocket protocol (where one is installed), which
        # keeps its own time: no deadline of this one may close it later.
        self.body_expected = False
        self.cancel_head_deadline()
        self.cancel_body_deadline()
        super().handle_websocket_upgrade()

    # ------------------------------------------------------------------ the deadlines

    def head_too_slow(self) -> None:
        self.head_deadline = None
        if self.transport.is_closing():
            return
        if self.flow.read_paused:
            # The server stopped reading (a pipelined request waits): not the client's delay.
            self.head_deadline = self.loop.call_later(self.timeout_s, self.head_too_slow)
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # An answer is still owed on this connection: it is given, then the connection
            # closes (what came of the next head is dropped).
            self.cycle.keep_alive = False
            return
        if self.head_begun:
            self.refuse(408, f"the request's head did not arrive whole within {self.timeout_s:g} s")
        else:
            self.transport.close()

    def body_too_slow(self) -> None:
        self.body_deadline = None
        if self.transport.is_closing() or not self.body_expected:
            return
        now = self.loop.time()
        if self.flow.read_paused:
            # The server is not reading (the app has not taken what came): the pause is ours.
            self.body_last_arrival = now
        paused = now - self.body_last_arrival
        if paused < self.timeout_s:
            self.body_deadline = self.loop.call_later(self.timeout_s - paused, self.body_too_slow)
            return
        if self.cycle is not None and not self.cycle.response_started:
            self.refuse(408, f"the request's body paused for {self.timeout_s:g} s")
        else:
            self.transport.close()

    def cancel_head_deadline(self) -> None:
        if self.head_deadline is not None:
            self.head_deadline.cancel()
            self.head_deadline = None

    def cancel_body_deadline(self) -> None:
        if self.body_deadline is not None:
            self.body_deadline.cancel()
            self.body_deadline = None

    # ------------------------------------------------------------------ answers of its own

    def refuse(self, status: int, message: str) -> None:
        """Answer `status` in OpenAI's shape and close the connection; a request the app may
        be waiting on ends (the app sees the client gone)."""
        body = json.dumps(error_body(status, message)).encode()
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
        ]
        self.transport.write(b"".join(head) + body)
        self.cancel_head_deadline()
        self.cancel_body_deadline()
        self.transport.close()


class TooManyConnections:
    """The ASGI app that answers a request past the connection limit: a 503, connection closed."""

    def __init__(self, limit: int):
        self.limit = limit

    async def __call__(self, scope, receive, send) -> None:
        message = f"the server has {self.limit} connections open, its limit; retry later"
        response = JSONResponse(
            error_body(503, message), status_code=503, headers={"Connection": "close"}
        )
        await response(scope, receive, send)


def bounded_connections(timeout_s: float = DEFAULT_CONNECTION_TIMEOUT_S) -> type:
    """The protocol class uvicorn is given: BoundedConnection with its head deadline and body
    pause `timeout_s`."""
    return type("BoundedConnection", (BoundedConnection,), {"timeout_s": timeout_s})
