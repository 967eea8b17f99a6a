"""The one shape every HTTP error takes: OpenAI's `{"error": {message, type, param, code}}`.

Owns: `APIError`, the exception a handler raises to answer with an error (its status, its one-line
message, and the request field it names), and `error_body`, the JSON it becomes.

Must not know: the web framework, the engine or the model.
"""

from __future__ import annotations

# The `type` OpenAI gives each status.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    431: "invalid_request_error",
    500: "server_error",
    503: "service_unavailable_error",
}


# The longest message and field name an error sends (longer ones are cut, with "...").
MAX_MESSAGE_CHARS = 1000
MAX_PARAM_CHARS = 200


class APIError(Exception):
    """An answer that is an error: a status, one line saying what and what to do, and the field
    of the request it is about (None when it is about the whole request)."""

    def __init__(self, status: int, message: str, param: str | None = None, code=None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict:
        return error_body(self.status, self.message, self.param, self.code)


def error_body(status: int, message: str, param: str | None = None, code=None) -> dict:
    """OpenAI's error object; `code` defaults to the status, as vLLM gives it."""
    if code is None:
        code = status
    return {
        "error": {
            "message": cut(message, MAX_MESSAGE_CHARS),
            "type": ERROR_TYPES.get(status, "invalid_request_error"),
            "param": None if param is None else cut(param, MAX_PARAM_CHARS),
            "code": code,
        }
    }


def cut(text: str, most: int) -> str:
    """`text`, or its first `most` characters and "..." when it is longer."""
    return text if len(text) <= most else text[:most] + "..."
