"""The serving floor: a TorchServe handler that answers each request with its own body.

Packed as its own archive with the same batching and workers as the GNN archive it is compared
with, it measures what TorchServe itself costs per request (frontend, batching, the Python
worker's protocol); no handler can be faster than this in the same server.
"""

from __future__ import annotations

import json
from typing import Any


def handle(data: list[dict[str, Any]] | None, context: Any) -> list[bytes | str] | None:
    """TorchServe's function entry point; called with ``data=None`` once at load."""
    if data is None:
        return None
    answers: list[bytes | str] = []
    for row in data:
        body = row.get("body", row.get("data"))
        answers.append(bytes(body) if isinstance(body, (bytes, bytearray)) else json.dumps(body))
    return answers
