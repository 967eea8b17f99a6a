"""A request's body, read within a limit.

Owns: `read_body`, which reads a body as it arrives and refuses it with 413 once it passes the
server's limit (`--max-body-bytes`), declared or sent, before anything parses it.

Must not know: what the body means, or the routes.
"""

from __future__ import annotations

from starlette.requests import ClientDisconnect, Request

from .api_errors import APIError


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 once it passes `limit` bytes (declared or sent)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"the body has {declared} bytes, over the limit of {limit} bytes")
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
