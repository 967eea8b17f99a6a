"""Requests that a web page sends to another site: refused.

Owns: `SameOriginGuard`, ASGI middleware.  A request whose `Origin` header names a site other
than the one it was sent to (its `Host` header) is refused with 403 before any route sees it.

Why.  A server on 127.0.0.1, keyless by default, is reachable by every page the operator's
browser opens: a page on any site may post to http://127.0.0.1:8000/v1/completions.  The browser
marks such a request with the page's `Origin` (it does so for every POST, and for every request
made by a script to another site), which the page cannot forge.  The server's own round-grid
page is same-origin and passes; a program (curl, the openai client) sends no `Origin` and passes.
Two more rules close what this leaves: a body must be declared as JSON (bodies.py, 415), so no
form or text/plain post runs; and the server sends no CORS headers, so no other site's script
may read a reply.  "null" (a sandboxed frame, a file: page) is another site too.

Not covered: a page that makes its own name resolve to 127.0.0.1 (DNS rebinding) is same-origin
by this test, since it sends a matching Host; set an API key (`--api-key`) on a machine where
that matters.

Must not know: the routes, the engine, or what a body means.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.responses import JSONResponse

from .api_errors import error_body

DEFAULT_PORTS = {"http": 80, "https": 443}


def site_of(origin: str) -> tuple[str, int] | None:
    """(host, port) of an Origin header's value ("http://127.0.0.1:8000"), or None when it names
    no site ("null", or anything that is not scheme://host[:port])."""
    try:
        parts = urlsplit(origin)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname or parts.path not in ("", "/"):
        return None
    return parts.hostname.lower(), port if port is not None else DEFAULT_PORTS[parts.scheme]


def site_of_host(host: str, scheme: str) -> tuple[str, int] | None:
    """(host, port) of a Host header's value ("127.0.0.1:8000", "[::1]:8000", "localhost"), its
    port by default the scheme's."""
    if not host or any(c in host for c in "/?#@\\"):
        return None
    return site_of(f"{scheme}://{host}")


class SameOriginGuard:
    """ASGI middleware: a request from a page of another site (its Origin) gets 403."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            origin = headers.get(b"origin")
            if origin is not None:
                host = headers.get(b"host", b"").decode("latin-1")
                shown = origin.decode("latin-1")
                site = site_of(shown)
                # The Host is read with the Origin's scheme: behind a TLS proxy, an https page
                # of this server's own name is this server, whatever the proxy speaks to it.
                if site is None or site != site_of_host(host, urlsplit(shown).scheme):
                    if len(shown) > 80:
                        shown = shown[:80] + "..."
                    message = (
                        f"a request from a page of another site (Origin: {shown}) is refused; "
                        "call the API from a program, or from this server's own page"
                    )
                    response = JSONResponse(error_body(403, message), status_code=403)
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)
