#!/usr/bin/env bash
# Starts or stops the demo TorchServe for `make serve` / `make stop`, all state under .serve/.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="$ROOT/.serve"
VENV_BIN="$ROOT/.venv/bin"
MODEL="${MODEL:-gnn}"
ARCHIVE="${ARCHIVE:-gnn.mar}"
# TorchServe keeps its pid file and unpacked archives in the temp dir: ours is private.
export TEMP="$STATE/tmp" TMPDIR="$STATE/tmp" LOG_LOCATION="$STATE/logs" METRICS_LOCATION="$STATE/logs"
export PATH="$VENV_BIN:$PATH"
# Workers are forked from one process that imported torch and PyG (prefork/, docs/operations.md
# "Worker memory"); GNNSERVE_PREFORK=0 starts each worker as a fresh interpreter instead.
export PYTHONPATH="$ROOT/prefork${PYTHONPATH:+:$PYTHONPATH}"

# auth_config KIND: curl config (for `curl --config -`) sending the KIND key from key_file.json, so
# the key travels through a pipe and never appears on a command line (ps shows those to all).
auth_config() {
  "$VENV_BIN/python" -c 'import json,sys; print("header = \"Authorization: Bearer %s\"" % json.load(open(sys.argv[1]))[sys.argv[2]]["key"])' \
    "$STATE/key_file.json" "$1"
}

# private_dir DIR: creates DIR 0700, or refuses (one line) one that is not this user's alone.
private_dir() {
  PYTHONPATH="$ROOT" "$VENV_BIN/python" -c 'import sys
from graph_assets.errors import UnsafeDirectory
from graph_assets.private_dir import ensure_private_dir
try:
    ensure_private_dir(sys.argv[1])
except UnsafeDirectory as error:
    sys.exit(f"serve.sh: {error}")' "$1"
}

# start [resume]: with the repo's config and the demo archive, or from the last snapshot.
start() {
  if [ -f "$STATE/tmp/.model_server.pid" ] && kill -0 "$(cat "$STATE/tmp/.model_server.pid")" 2>/dev/null; then
    echo "TorchServe is already running (pid $(cat "$STATE/tmp/.model_server.pid")); 'make stop' first"
    exit 1
  fi
  for port in 8080 8081 8082; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "port $port on 127.0.0.1 is in use (config.properties needs 8080-8082); stop what holds it" >&2
      exit 1
    fi
  done
  private_dir "$STATE/tmp"
  mkdir -p "$STATE/logs"
  if [ "${1:-}" = resume ]; then
    ls "$STATE"/logs/config/*.cfg >/dev/null 2>&1 || { echo "no snapshot in $STATE/logs/config; use 'make serve'" >&2; exit 1; }
    echo "==> resuming TorchServe from its last snapshot in $STATE/logs/config"
    (cd "$STATE" && torchserve --start --model-store "$ROOT/model_store" >"$STATE/logs/start.out" 2>&1)
  else
    echo "==> starting TorchServe with $ROOT/config.properties (logs in $STATE/logs)"
    (cd "$STATE" && torchserve --start --ts-config "$ROOT/config.properties" \
       --model-store "$ROOT/model_store" --models "$MODEL=$ARCHIVE" >"$STATE/logs/start.out" 2>&1)
  fi
  for _ in $(seq 1 120); do
    if [ -f "$STATE/key_file.json" ] && auth_config management | curl -sf --config - \
        "http://127.0.0.1:8081/models/$MODEL" 2>/dev/null | grep -q '"status": "READY"'; then
      cat <<MSG

TorchServe is serving '$MODEL'. Query it (the token is read from $STATE/key_file.json and
handed to curl as a header file, so it never shows in ps):

  curl -X POST http://127.0.0.1:8080/predictions/$MODEL \\
       -H @<(python3 -c 'import json; print("Authorization: Bearer " + json.load(open("$STATE/key_file.json"))["inference"]["key"])') \\
       -H 'Content-Type: application/json' -d '{"node_id": 42}'

Management API: port 8081 with the "management" key; Prometheus metrics: http://127.0.0.1:8082/metrics
Stop it with: make stop
MSG
      return 0
    fi
    sleep 1
  done
  echo "TorchServe did not become ready in 120 s; see $STATE/logs/model_log.log and ts_log.log" >&2
  stop || true
  exit 1
}

stop() {
  if [ ! -f "$STATE/tmp/.model_server.pid" ]; then
    echo "TorchServe is not running (no pid file in $STATE/tmp)"
    return 0
  fi
  torchserve --stop
}

case "${1:-}" in
  start) start ;;
  resume) start resume ;;
  stop) stop ;;
  *) echo "usage: $0 start|resume|stop" >&2; exit 2 ;;
esac
