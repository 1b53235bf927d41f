#!/usr/bin/env bash
# Benchmarks (not tests): the C++ core benchmark (build/bench/treecask_bench_core)
# and the peer benchmark (bench/peers.py), written into docs/performance_runs.md
# between <!-- peers:begin --> and <!-- peers:end --> (the core table is part
# of that section), with the plot docs/performance_ratios.png.
#
#   bash scripts/bench.sh                      # 1 GiB, 5 interleaved repetitions (~45 min on 2 cores)
#   bash scripts/bench.sh --gib 0.25 --reps 3  # quicker; other flags go to bench/peers.py
#
# Needs: the C++ build (scripts/setup.sh), the Python package in .venv
# (pip install .), the peers: pip install -r bench/requirements.txt, and the
# MiniLM weights in .cache/models (scripts/main_job.sh; skipped if missing).
#
# Environment (all optional):
#   BUILD_DIR         build tree (default: build)
#   PYTHON            interpreter (default: .venv/bin/python, else python3)
#   SCRATCH           where the benchmark files go (default: $TMPDIR or /tmp)
#   OUT               the Markdown file (default: docs/performance_runs.md)
#   BENCH_SKIP_BUILD  set to 1 to use the existing treecask_bench_core binary
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

BUILD_DIR="${BUILD_DIR:-build}"
SCRATCH="${SCRATCH:-${TMPDIR:-/tmp}}"
OUT="${OUT:-docs/performance_runs.md}"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi

ARGS="$*"
GIB=1
PASS=()
while (( $# )); do
  case "$1" in
    --gib) GIB="$2"; PASS+=("$1" "$2"); shift 2 ;;
    *) PASS+=("$1"); shift ;;
  esac
done
[[ " ${PASS[*]-} " == *" --gib "* ]] || PASS+=(--gib "$GIB")

"$PYTHON" - <<'PY' || { echo "missing benchmark dependencies: $PYTHON -m pip install -r bench/requirements.txt && $PYTHON -m pip install ." >&2; exit 1; }
import importlib
for m in ("treecask", "numpy", "ml_dtypes", "safetensors", "orbax.checkpoint", "jax", "equinox", "flax", "matplotlib"):
    importlib.import_module(m)
PY

if [[ -z "${BENCH_SKIP_BUILD:-}" ]]; then
  cmake --build "$BUILD_DIR" --target treecask_bench_core
fi
CORE="$BUILD_DIR/bench/treecask_bench_core"
[[ -x "$CORE" ]] || { echo "no $CORE: configure and build first (scripts/setup.sh)" >&2; exit 1; }

mkdir -p "$SCRATCH"
core_out="$(mktemp "${SCRATCH}/treecask-core.XXXXXX")"
trap 'rm -f "$core_out"' EXIT
echo "== C++ core: $CORE $SCRATCH --gib $GIB"
"$CORE" "$SCRATCH" --gib "$GIB" | tee "$core_out"

echo "== peers: $PYTHON bench/peers.py ${PASS[*]} --out $OUT"
TREECASK_BENCH_COMMAND="bash scripts/bench.sh${ARGS:+ $ARGS}" "$PYTHON" bench/peers.py "${PASS[@]}" --dir "$SCRATCH/treecask-peers" --core "$core_out" --out "$OUT"
