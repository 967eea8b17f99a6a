"""Requests that a web page sends to another site: refused.

Owns: `SameOriginGuard`, ASGI middleware.  Before any route sees a request, it refuses with 403:

    a page of another site    the request's `Origin` header names a site other than the one it
                              was sent to (its `Host` header);
    a fetch from another site the browser's `Sec-Fetch-Site` says `cross-site` or `same-site`
                              (another port of the same machine is same-site);
    another name for us       on a server that listens on this machine's loopback alone
                              (127.0.0.1, the default), a `Host` that is not a loopback name
                              (localhost, *.localhost, 127.x.x.x, [::1]).

Why.  A server on 127.0.0.1, keyless by default, is reachable by every page the operator's
browser opens: a page on any site may post to http://127.0.0.1:8000/v1/completions.  The browser
marks such a request with the page's `Origin` (it does so for every POST, and for every request
made by a script to another site), which the page cannot forge; and every current browser marks
each request, an <img> tag's GET too, with `Sec-Fetch-Site`, which says whether the page that
made it is this very server.  The server's own round-grid page is same-origin and passes; a
program (curl, the openai client) sends neither header and passes.  Two more rules close what
this leaves: a body must be declared as JSON (bodies.py, 415), so no form or text/plain post
runs; and the server sends no CORS headers, so no other site's script may read a reply.  "null"
(a sandboxed frame, a file: page) is another site too.

DNS rebinding.  A page of evil.example may make its own name resolve to 127.0.0.1 a moment after
it loaded: its requests then reach this server as same-origin ones (Origin and Host both name
evil.example).  A server that listens on the loopback alone can only be meant by a loopback
name, so any other `Host` is refused.  A server that listens on other addresses (`--host
0.0.0.0`) cannot know its names: set `--api-key` there.

Must not know: the routes, the engine, or what a body means.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from starlette.responses import JSONResponse

from .api_errors import error_body

DEFAULT_PORTS = {"http": 80, "https": 443}

# What `Sec-Fetch-Site` says of a request that this server's own pages did not make.
FROM_ANOTHER_SITE = (b"cross-site", b"same-site")


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


def is_loopback_name(host: str) -> bool:
    """Whether a host (no port) names this machine's loopback: localhost and its subdomains
    (RFC 6761: they never leave the machine), 127.0.0.0/8, ::1."""
    host = host.lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_loopback_address(address: str) -> bool:
    """Whether a listening address (--host) is this machine's loopback alone."""
    return is_loopback_name(address)


class SameOriginGuard:
    """ASGI middleware: a request from a page of another site gets 403 (its Origin, its
    Sec-Fetch-Site), and so does one that names this server by another name than a loopback
    one when `loopback_only` (the server listens on the loopback alone)."""

    def __init__(self, app, loopback_only: bool = False):
        self.app = app
        self.loopback_only = loopback_only

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            message = self.refusal(dict(scope["headers"]))
            if message is not None:
                response = JSONResponse(error_body(403, message), status_code=403)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, headers: dict[bytes, bytes]) -> str | None:
        """Why a request is refused, or None."""
        host = headers.get(b"host", b"").decode("latin-1")
        if self.loopback_only:
            site = site_of_host(host, "http")
            if site is None or not is_loopback_name(site[0]):
                return (
                    f"this server listens on this machine's loopback alone, and the request "
                    f"names it {shorten(host)!r} (a page that points its own name at 127.0.0.1 "
                    "does so); call it as 127.0.0.1 or localhost, or listen on other addresses "
                    "with --host and set --api-key"
                )
        fetch_site = headers.get(b"sec-fetch-site")
        if fetch_site is not None and fetch_site.lower() in FROM_ANOTHER_SITE:
            return (
                f"a request that a page of another site made (Sec-Fetch-Site: "
                f"{shorten(fetch_site.decode('latin-1'))}) is refused; call the API from a "
                "program, or from this server's own page"
            )
        origin = headers.get(b"origin")
        if origin is None:
            return None
        shown = origin.decode("latin-1")
        site = site_of(shown)
        # The Host is read with the Origin's scheme: behind a TLS proxy, an https page of this
        # server's own name is this server, whatever the proxy speaks to it.
        if site is None or site != site_of_host(host, urlsplit(shown).scheme):
            return (
                f"a request from a page of another site (Origin: {shorten(shown)}) is refused; "
                "call the API from a program, or from this server's own page"
            )
        return None


def shorten(text: str) -> str:
    return text if len(text) <= 80 else text[:80] + "..."
