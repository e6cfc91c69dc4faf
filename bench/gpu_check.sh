#!/usr/bin/env bash
# GPU check: the CUDA tests, the in-process stage benchmark and the served benchmark on a GPU,
# each printed as a table.
#
#   bench/gpu_check.sh            # on a machine with an NVIDIA GPU; about 10 minutes
#   SERVED=0 bench/gpu_check.sh   # without the served benchmark (no Java, or less time)
#
# Python: .venv if its torch sees CUDA; otherwise a venv (.venv-gpu) made with
# --system-site-packages over a python3 whose torch sees CUDA (e.g. a CUDA image's), so the
# CUDA build of torch (and torch-geometric, if there) is reused, never replaced. What else the
# project needs is installed into that venv from pyproject.toml's pins: from PyPI, or offline
# from a folder of wheels given as WHEELS=DIR. The stage benchmark times a GPU worker set up
# three ways (bench/experiments/microbench.py --placement) beside one CPU core; the typed
# benchmark (bench/experiments/gpu_typed.py) times a typed model's worker the same ways and
# checks its answers against the CPU's; the served
# benchmark (bench/experiments/gpu_served.py, TorchServe, so Java 17 too) loads GPU archives
# and a CPU archive with one worker per core in turn.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
step() { echo "==> $*"; }
die() { echo "gpu_check.sh: error: $*" >&2; exit 1; }
has_cuda() { "$1" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }

WORK="$(mktemp -d "${TMPDIR:-/tmp}/gnnserve-gpu.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

step "1/6 finding a Python whose torch sees CUDA"
if [ -x .venv/bin/python ] && has_cuda .venv/bin/python; then
  PY=.venv/bin/python
else
  base="${GPU_PYTHON:-python3}"
  has_cuda "$base" || die "neither .venv/bin/python nor $base has a CUDA build of torch that sees a GPU; install torch's CUDA build (README, 'GPU machines') or set GPU_PYTHON"
  if ! has_cuda .venv-gpu/bin/python; then
    rm -rf .venv-gpu
    "$base" -m venv --system-site-packages .venv-gpu
    # A base python that is itself a venv (CUDA images often ship one) lends the new venv its
    # interpreter's site-packages, not its own: name its own in a .pth file.
    "$base" -c 'import site; print("\n".join(site.getsitepackages()))' \
      >"$(.venv-gpu/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/base-python.pth"
  fi
  PY=.venv-gpu/bin/python
fi
"$PY" -c 'import torch; print("torch", torch.__version__, "on", torch.cuda.get_device_name(0))'

step "2/6 installing what the project needs besides torch (pins from pyproject.toml)"
missing="$("$PY" - <<'EOF'
import importlib.util
import re
import tomllib

project = tomllib.load(open("pyproject.toml", "rb"))["project"]
test_tools = ("pytest==", "hypothesis==")
wanted = project["dependencies"] + [
    r for r in project["optional-dependencies"]["dev"] if r.startswith(test_tools)
]
modules = {"torch-geometric": "torch_geometric", "torchserve": "ts", "pyyaml": "yaml",
           "torch-model-archiver": "model_archiver", "types-PyYAML": None,
           "types-requests": None, "pandas-stubs": None}
for requirement in wanted:
    name = re.split(r"[=<>!~ ]", requirement, maxsplit=1)[0]
    module = modules.get(name, name.replace("-", "_"))
    if name == "torch" or module is None:
        continue
    if importlib.util.find_spec(module) is None:
        print(requirement)
EOF
)"
if [ -n "$missing" ]; then
  torch_pin="torch==$("$PY" -c 'import torch; print(torch.__version__)')"
  echo "$torch_pin" >"$WORK/constraints.txt"
  source_args=()
  [ -n "${WHEELS:-}" ] && source_args=(--no-index --find-links "$WHEELS")
  # shellcheck disable=SC2086
  "$PY" -m pip install --quiet "${source_args[@]}" -c "$WORK/constraints.txt" $missing
fi
"$PY" -m pip install --quiet --no-deps --no-build-isolation -e . 2>/dev/null || true

step "3/6 exactness on CUDA (served vs full-graph forward, GPU vs CPU sampler and engine)"
"$PY" -m pytest -q -p no:cacheprovider -rs \
  tests/unit/handler/test_engine.py tests/unit/handler/test_sampler.py \
  tests/unit/handler/test_tasks_cuda.py tests/unit/handler/test_device_features.py \
  tests/unit/handler/test_feature_keeper.py tests/unit/handler/test_captured_forward.py \
  tests/unit/handler/test_typed_device_features.py \
  tests/unit/handler/test_typed_captured_forward.py \
  -k "cuda or gpu or full_graph or floyd" 2>&1 | tee "$WORK/pytest.log" && tests_rc=0 || tests_rc=$?
if grep -q "SKIPPED.*CUDA" "$WORK/pytest.log"; then
  die "CUDA tests were skipped: torch does not see the GPU from pytest"
fi
# The benchmark runs even when a test failed: its table helps to tell why; the exit status
# is the tests'.

step "4/6 in-process stage benchmark, 10M-edge graph, SAGE [10,10]"
"$PY" - "$WORK" <<'EOF'
import sys
from pathlib import Path

from bench.experiments.microbench import benchmark
from bench.harness.artifacts import Artifacts

artifacts = Artifacts(Path(sys.argv[1]))
store, model = artifacts.store("10M"), artifacts.model_dir()
modes = [("cpu", "served", 1), ("cuda", "gpu-sampling", 4), ("cuda", "eager", 1),
         ("cuda", "served", 1)]
rows = []
for device, placement, threads in modes:
    rows += benchmark(store, model, "10M", (10, 10), threads, batch_sizes=(1, 8, 32, 64, 256),
                      batches=100, device=device, placement=placement)
print()
print("| device | placement | batch | sample ms | gather ms | forward ms | s+g+f ms | s+g+f p90 "
      "| whole batch ms | sampled nodes |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r.device} | {r.placement} | {r.batch_size} | {r.sample:.3f} | {r.gather:.3f} | "
          f"{r.forward:.3f} | {r.sample_gather_forward:.3f} | {r.sample_gather_forward_p90:.3f} "
          f"| {r.total:.3f} | {r.sampled_nodes:.0f} |")
EOF

step "5/6 typed models on the GPU: CPU worker, eager and captured GPU worker, 20k-user fraud graph"
"$PY" -m bench.experiments.gpu_typed --users 20000 --archs sage,gat --out "$WORK/gpu-typed.json" \
  || tests_rc=1

if [ "${SERVED:-1}" = "0" ]; then
  echo "==> 6/6 served benchmark skipped (SERVED=0)"
elif ! command -v java >/dev/null; then
  echo "==> 6/6 served benchmark skipped: TorchServe needs Java 17 (java is not on PATH)"
else
  step "6/6 served benchmark, 10M-edge graph: GPU archives against a CPU archive, one worker per core"
  PYTHON="$ROOT/$PY" "$PY" -m bench.experiments.gpu_served --graph 10M --work "$WORK" \
    --connections 16,64,256 --seconds 6 --out "$WORK/gpu-served.json" || tests_rc=1
fi
exit "$tests_rc"
