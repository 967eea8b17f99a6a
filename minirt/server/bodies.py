"""A request's body, read within a limit.

Owns: `read_body`, which reads a body as it arrives and refuses it with 413 once it passes the
server's limit (`--max-body-bytes`), declared or sent, before anything parses it; and with 415
before reading a byte when it is declared as anything but JSON.

Why JSON alone.  A web page may post a `text/plain` or form body to any address, 127.0.0.1
included, without asking first (a "simple" request: no CORS preflight).  A server that parsed
such a body as JSON would run what any page the operator visits sends it.  So, as FastAPI does
since its 0.65.2 security fix, a body is read as JSON only when its Content-Type says JSON
(`application/json`, or `application/<something>+json`) or says nothing; anything else is a 415.
A page's post with no Content-Type at all still carries its `Origin`, which origin.py refuses.

Must not know: what the body means, or the routes.
"""

from __future__ import annotations

from starlette.requests import ClientDisconnect, Request

from .api_errors import APIError


def exceeds(digits: str, limit: int) -> bool:
    """Whether a number written in ASCII digits is over `limit`, decided without parsing one of
    thousands of digits (Python refuses to parse more than 4300, and the work grows with them)."""
    significant = digits.lstrip("0")
    if len(significant) != len(str(limit)):
        return len(significant) > len(str(limit))
    return int(significant or "0") > limit


def is_json(content_type: str) -> bool:
    """Whether a Content-Type header says JSON: application/json or application/...+json, with
    any parameters (charset=utf-8)."""
    media = content_type.split(";", 1)[0].strip().lower()
    kind, _, subtype = media.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 415 unless it is declared as JSON (or not declared), and with 413
    once it passes `limit` bytes (declared or sent)."""
    content_type = request.headers.get("content-type")
    if content_type is not None and not is_json(content_type):
        shown = content_type if len(content_type) <= 80 else content_type[:80] + "..."
        message = (
            f"the body must be JSON, sent with Content-Type: application/json, not {shown!r} "
            "(with curl: -H 'Content-Type: application/json')"
        )
        raise APIError(415, message)
    declared = request.headers.get("content-length")
    if declared is not None and declared.isascii() and declared.isdigit():
        if exceeds(declared, limit):
            shown = (
                declared if len(declared) <= 20 else f"{declared[:20]}... ({len(declared)} digits)"
            )
            raise APIError(413, f"the body has {shown} bytes, over the limit of {limit} bytes")
    chunks = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise APIError(413, f"the body is over the limit of {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        raise APIError(400, "the client went away before sending the whole body") from None
    return b"".join(chunks)
