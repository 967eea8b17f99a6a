"""What HTTP itself requires of a request, beyond what the parser checks.

Owns: `HostRule`, ASGI middleware.  An HTTP/1.1 request must carry exactly one `Host` (RFC 9112,
section 3.2: "A server MUST respond with a 400 (Bad Request) status code to any HTTP/1.1 request
message that lacks a Host header field and to any that contains more than one"); a request whose
headers pass HEADER_LIMIT bytes is a 431.  Either answer closes the connection, so nothing sent
after such a request on it is read as a request of its own.

The parser (uvicorn's httptools, as vLLM's server uses it) already refuses, and closes the
connection on, what is ambiguous in the framing: Content-Length with Transfer-Encoding, two
Content-Lengths, a Transfer-Encoding other than chunked, a bad chunk size, a header folded over
two lines or with a space before its colon, bare line feeds.

Must not know: the routes, the engine, or what a body means.
"""

from __future__ import annotations

from starlette.responses import JSONResponse

from .api_errors import error_body

# Headers of more bytes than this, all together, are a 431.
HEADER_LIMIT = 64 * 1024


class HostRule:
    """ASGI middleware: one Host on HTTP/1.1, headers within HEADER_LIMIT."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            refusal = refused(scope)
            if refusal is not None:
                status, message = refusal
                response = JSONResponse(
                    error_body(status, message), status_code=status, headers={"Connection": "close"}
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def refused(scope) -> tuple[int, str] | None:
    """(status, message) for a request HTTP itself refuses, or None."""
    headers = scope["headers"]
    size = sum(len(name) + len(value) + 4 for name, value in headers)
    if size > HEADER_LIMIT:
        return 431, f"the request's headers have {size} bytes, over the limit of {HEADER_LIMIT}"
    hosts = sum(1 for name, _ in headers if name == b"host")
    if scope.get("http_version") == "1.1" and hosts != 1:
        return 400, f"an HTTP/1.1 request needs one Host header, and this one has {hosts}"
    return None
