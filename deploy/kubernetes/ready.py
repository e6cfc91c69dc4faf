"""Readiness probe: ready once the model has a READY worker, asked of the management API.

Run by the kubelet inside the container (exec probe), so it reaches the management API on
127.0.0.1 and reads the key_file.json that TorchServe wrote in the working directory. The
management key expires after ``token_expiration_min`` (60 by default); when the API refuses
it, the probe asks ``POST /token?type=management`` with the file's ``API`` key for a fresh one
(TorchServe rewrites the file) and asks again, so a pod does not turn unready an hour after it
started. Without a key file (token authorization off) it asks without a token. Standard library
only: it runs under any Python in the image. Exit 0 = ready; 1 = not ready, with the reason
printed (the kubelet shows it in the pod's events).
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

# TorchServe 0.12 answers a missing, wrong or expired token with 400 (InvalidKeyException).
REFUSED_TOKEN = (400, 401)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gnn", help="model name (default gnn)")
    parser.add_argument(
        "--url",
        default="http://127.0.0.1:8081",
        help="management API (default http://127.0.0.1:8081)",
    )
    parser.add_argument(
        "--key-file",
        type=Path,
        default=Path("key_file.json"),
        help="TorchServe's key file (default key_file.json in the working directory)",
    )
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds per call (default 3)")
    return parser.parse_args(argv)


def read_keys(key_file: Path) -> dict[str, Any] | None:
    """The key file's content, or None when TorchServe has not written one."""
    try:
        return json.loads(key_file.read_text())
    except FileNotFoundError:
        return None


def call(method: str, url: str, key: str | None, timeout: float) -> bytes:
    request = urllib.request.Request(url, method=method)
    if key is not None:
        request.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read()


def describe_model(args: argparse.Namespace) -> Any:
    """GET /models/<model>, refreshing an expired management key once."""
    url = f"{args.url}/models/{args.model}"
    keys = read_keys(args.key_file)
    if keys is None:
        return json.loads(call("GET", url, None, args.timeout))
    try:
        return json.loads(call("GET", url, keys["management"]["key"], args.timeout))
    except urllib.error.HTTPError as exc:
        if exc.code not in REFUSED_TOKEN:
            raise
    # TorchServe answers with an empty body and writes the new key into the key file.
    call("POST", f"{args.url}/token?type=management", keys["API"]["key"], args.timeout)
    fresh = read_keys(args.key_file) or keys
    return json.loads(call("GET", url, fresh["management"]["key"], args.timeout))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        versions = describe_model(args)
    except (OSError, ValueError, KeyError) as exc:
        # URLError and HTTPError are OSErrors; a half-written key file is a ValueError.
        print(f"not ready: management API did not describe {args.model!r}: {exc}")
        return 1
    ready = [
        worker
        for version in versions
        for worker in version.get("workers", [])
        if worker.get("status") == "READY"
    ]
    if not ready:
        print(f"not ready: {args.model!r} has no READY worker yet")
        return 1
    print(f"ready: {args.model!r} has {len(ready)} READY worker(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
