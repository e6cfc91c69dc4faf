"""Typed request errors, each with its HTTP status and JSON body (``handler.protocol.error_table``
maps the domain errors of graph_assets/ and model/ to these)."""

from __future__ import annotations

from typing import Any, ClassVar


class ApiError(Exception):
    """A request that cannot be answered; carries its HTTP status and a JSON-ready body."""

    status: ClassVar[int] = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @property
    def type_name(self) -> str:
        return type(self).__name__

    def body(self) -> dict[str, Any]:
        """The JSON error body of docs/api.md: ``{"code", "type", "message"}``, plus ``error``
        (the message again): the Open Inference Protocol's error body, which its clients
        (tritonclient, KServe's) read and fail to decode without."""
        return {
            "code": self.status,
            "type": self.type_name,
            "message": self.message,
            "error": self.message,
        }


class BadRequest(ApiError):
    """400: the body is not a valid request (syntax, types, missing or conflicting fields)."""

    status = 400


class Forbidden(ApiError):
    """403: updates are off for this archive, or the update key is missing or wrong."""

    status = 403


class Conflict(ApiError):
    """409: the update names something that already exists (a node ID, an edge)."""

    status = 409


class NotFound(ApiError):
    """404: a node a request names, or a node or edge an update names, is not in the graph (or
    was removed); the message lists what is missing."""

    status = 404


class TooLarge(ApiError):
    """413: the request asks for more IDs than the archive's configured limits allow."""

    status = 413


class InternalError(ApiError):
    """500: something unexpected failed inside the handler; the worker stays up."""

    status = 500


class NonFiniteOutput(ApiError):
    """500: the model answered NaN or infinity for this request: the model or the features it
    read are broken, not the request (``handler.protocol.answer_check``)."""

    status = 500


class Unavailable(ApiError):
    """503, with Retry-After: this worker cannot answer now but may soon. It could not apply a
    record of the update log, or the graph store (Redis) did not answer in time."""

    status = 503


class InsufficientStorage(ApiError):
    """507: the update could not be written (a full disk or quota); nothing was applied."""

    status = 507
