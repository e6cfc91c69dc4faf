#!/usr/bin/env python3
"""gnnctl: the common TorchServe management calls, with the token read for you.

    scripts/gnnctl.py status [MODEL]
    scripts/gnnctl.py register ARCHIVE.mar [--workers N]
    scripts/gnnctl.py set-default MODEL VERSION
    scripts/gnnctl.py scale MODEL WORKERS [--version V]
    scripts/gnnctl.py unregister MODEL VERSION
    scripts/gnnctl.py token inference|management

The management key comes from the key_file.json that TorchServe writes where it starts
(``.serve/key_file.json`` for ``make serve``; ``--key-file`` or ``GNNSERVE_KEY_FILE`` to change).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_KEY_FILE = ROOT / ".serve" / "key_file.json"

# TorchServe 0.12's answer when a scale call races its worker bookkeeping; a scale is idempotent.
RACE = "ConcurrentModificationException"
SCALE_RETRIES = 3
RETRY_BACKOFF_S = 0.5


class Management:
    """Calls the management API with the management key from ``key_file``."""

    def __init__(self, url: str, key_file: Path, timeout: float) -> None:
        self.url = url.rstrip("/")
        self.key_file = key_file
        self.timeout = timeout
        # Never through HTTP(S)_PROXY or ALL_PROXY from the environment: the management key
        # would go to the proxy, and the management API is on this host (loopback).
        self.session = requests.Session()
        self.session.trust_env = False

    def keys(self) -> dict[str, Any]:
        if not self.key_file.is_file():
            raise SystemExit(
                f"no key file at {self.key_file}: start TorchServe first (make serve), or pass "
                "--key-file PATH (TorchServe writes key_file.json in the directory it starts in)"
            )
        data: dict[str, Any] = json.loads(self.key_file.read_text())
        return data

    def call(
        self, method: str, path: str, params: dict[str, Any] | None = None, retries: int = 0
    ) -> Any:
        """One call; an HTTP error exits with TorchServe's message. An idempotent call may pass
        ``retries``: TorchServe 0.12 sometimes answers a scale that races its own worker
        bookkeeping with 500 ``ConcurrentModificationException``; that answer is retried."""
        key = self.keys()["API" if path.startswith("/token") else "management"]["key"]
        for attempt in range(retries + 1):
            response = self.session.request(
                method,
                f"{self.url}{path}",
                params=params,
                headers={"Authorization": f"Bearer {key}"},
                timeout=self.timeout,
            )
            try:
                body = response.json()
            except ValueError:
                body = response.text
            raced = response.status_code == 500 and RACE in str(body)
            if not raced or attempt == retries:
                break
            time.sleep(RETRY_BACKOFF_S * 2**attempt)
        if response.status_code >= 400:
            message = body.get("message", body) if isinstance(body, dict) else body
            raise SystemExit(f"{method} {path} failed with {response.status_code}: {message}")
        return body


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gnnctl", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--management",
        default=os.environ.get("GNNSERVE_MANAGEMENT", "http://127.0.0.1:8081"),
        help="management API address (default: %(default)s)",
    )
    parser.add_argument(
        "--key-file",
        type=Path,
        default=Path(os.environ.get("GNNSERVE_KEY_FILE", DEFAULT_KEY_FILE)),
        help="TorchServe's key_file.json (default: %(default)s)",
    )
    parser.add_argument("--timeout", type=float, default=300, help="seconds per call")
    commands = parser.add_subparsers(dest="command", required=True)
    status = commands.add_parser("status", help="registered models, or one model's versions")
    status.add_argument("model", nargs="?", help="model name")
    register = commands.add_parser("register", help="register an archive from the model store")
    register.add_argument("archive", help="file name in the model store, e.g. gnn_v2.0.mar")
    register.add_argument("--workers", type=int, default=1, help="initial workers")
    default = commands.add_parser("set-default", help="route unversioned traffic to VERSION")
    default.add_argument("model")
    default.add_argument("version")
    scale = commands.add_parser("scale", help="set a model's worker count, waiting for it")
    scale.add_argument("model")
    scale.add_argument("workers", type=int)
    scale.add_argument("--version", help="a version other than the default")
    unregister = commands.add_parser("unregister", help="retire one version")
    unregister.add_argument("model")
    unregister.add_argument("version")
    token = commands.add_parser("token", help="issue a fresh inference or management key")
    token.add_argument("type", choices=("inference", "management"))
    return parser


def run(args: argparse.Namespace) -> Any:
    """Dispatches one command; returns TorchServe's JSON answer."""
    api = Management(args.management, args.key_file, args.timeout)
    if args.command == "status":
        return api.call("GET", f"/models/{args.model}/all" if args.model else "/models")
    if args.command == "register":
        params = {"url": args.archive, "initial_workers": args.workers, "synchronous": "true"}
        return api.call("POST", "/models", params)
    if args.command == "set-default":
        return api.call("PUT", f"/models/{args.model}/{args.version}/set-default")
    if args.command == "scale":
        path = f"/models/{args.model}" + (f"/{args.version}" if args.version else "")
        params = {"min_worker": args.workers, "max_worker": args.workers, "synchronous": "true"}
        return api.call("PUT", path, params, retries=SCALE_RETRIES)
    if args.command == "unregister":
        return api.call("DELETE", f"/models/{args.model}/{args.version}")
    return api.call("POST", "/token", {"type": args.type})


def main(argv: list[str] | None = None) -> int:
    print(json.dumps(run(_parser().parse_args(argv)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
