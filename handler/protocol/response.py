"""What the API answers one request with; every engine's ``respond`` returns one per request."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Response:
    """One request's answer: HTTP status, JSON body, and any headers of its own."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
