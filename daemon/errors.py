"""API errors: one hierarchy; each class carries its HTTP status and code.

Every failure a client can cause maps to a 4xx with ``{"error": {"code",
"message"}}``; anything else is a 500 with the same shape and no traceback.
"""

from __future__ import annotations


class APIError(Exception):
    status = 500
    code = "internal"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def body(self) -> dict[str, dict[str, str]]:
        return {"error": {"code": self.code, "message": self.message}}


class BadRequest(APIError):
    status = 400
    code = "bad_request"


class Unauthorized(APIError):
    status = 401
    code = "unauthorized"


class Forbidden(APIError):
    status = 403
    code = "forbidden"


class NotFound(APIError):
    status = 404
    code = "not_found"


class Conflict(APIError):
    status = 409
    code = "conflict"


class PayloadTooLarge(APIError):
    status = 413
    code = "too_large"


class Unavailable(APIError):
    status = 503
    code = "unavailable"


class MethodNotAllowed(APIError):
    status = 405
    code = "method_not_allowed"
