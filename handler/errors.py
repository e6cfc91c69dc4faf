"""Typed request errors and the one table that maps them to HTTP statuses and bodies."""

from __future__ import annotations

from typing import Any, ClassVar


class ApiError(Exception):
    """A request that cannot be answered; carries its HTTP status and a JSON-ready body."""

    status: ClassVar[int] = 500
    phrase: ClassVar[str] = "Internal Server Error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @property
    def type_name(self) -> str:
        return type(self).__name__

    def body(self) -> dict[str, Any]:
        """The JSON error body of docs/api.md: ``{"code", "type", "message"}``."""
        return {"code": self.status, "type": self.type_name, "message": self.message}


class BadRequest(ApiError):
    """400: the body is not a valid request (syntax, types, missing or conflicting fields)."""

    status = 400
    phrase = "Bad Request"


class Forbidden(ApiError):
    """403: updates are off for this archive, or the update key is missing or wrong."""

    status = 403
    phrase = "Forbidden"


class Conflict(ApiError):
    """409: the update names something that already exists (a node ID, an edge)."""

    status = 409
    phrase = "Conflict"


class NotFound(ApiError):
    """404: the update names a node or edge the graph does not have."""

    status = 404
    phrase = "Not Found"


class NodeNotFound(ApiError):
    """404: a requested node ID is not in the graph; the message lists the missing IDs."""

    status = 404
    phrase = "Not Found"


class TooLarge(ApiError):
    """413: the request asks for more IDs than the archive's configured limits allow."""

    status = 413
    phrase = "Payload Too Large"


class InternalError(ApiError):
    """500: something unexpected failed inside the handler; the worker stays up."""

    status = 500
    phrase = "Internal Server Error"


class Unavailable(ApiError):
    """503: this worker cannot take updates now (it could not apply a record of the log)."""

    status = 503
    phrase = "Service Unavailable"


class InsufficientStorage(ApiError):
    """507: the update could not be written (a full disk or quota); nothing was applied."""

    status = 507
    phrase = "Insufficient Storage"
