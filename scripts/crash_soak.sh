#!/usr/bin/env bash
# Long variants of the robustness suites (docs/robustness.md "Long runs"):
#
#   1. crash:       thousands of saves killed with SIGKILL at random moments;
#                   after each, the path must hold the old or the new archive,
#                   whole, and the next save must sweep the dead temporaries;
#   2. fault:       every file-system call of a save failed (ENOSPC, EIO, ...)
#                   and SIGKILLed before/after, repeated ROUNDS times;
#   3. concurrency: reader processes/threads against a writer replacing the
#                   archive, with many more versions.
#
# Usage: scripts/crash_soak.sh [RUNS]        (default 5000 crash runs)
# Environment (all optional):
#   BUILD_DIR      build tree holding tests/treecask_tests (default: build)
#   RUNS           crash runs (default 5000; also the first argument)
#   SEED           first random seed of the crash runs (default: from the clock)
#   ROUNDS         repetitions of the fault suite (default 3)
#   VERSIONS       versions the concurrency writer saves (default 2000)
#   TMPDIR         where the scratch archives go (default /tmp); point it at
#                  the file system you care about (ext4, xfs, NFS...)
# Prints the doctest summaries; exits non-zero on the first failure.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUILD_DIR="${BUILD_DIR:-build}"
BIN="$BUILD_DIR/tests/treecask_tests"
RUNS="${1:-${RUNS:-5000}}"
SEED="${SEED:-$(date +%s)}"
ROUNDS="${ROUNDS:-3}"
VERSIONS="${VERSIONS:-2000}"
if [[ ! -x "$BIN" ]]; then
  echo "no $BIN: build first (cmake -S . -B $BUILD_DIR -G Ninja && cmake --build $BUILD_DIR)" >&2
  exit 2
fi

# Split the crash runs into batches of 1000 with distinct seeds, so that a
# failure names a reproducible batch: TREECASK_CRASH_SEED=<seed> TREECASK_CRASH_RUNS=<n>.
left=$RUNS
batch=0
while (( left > 0 )); do
  n=$(( left < 1000 ? left : 1000 ))
  seed=$(( SEED + batch ))
  echo "== crash: $n runs, seed $seed"
  TREECASK_CRASH_RUNS=$n TREECASK_CRASH_SEED=$seed "$BIN" -ts=crash -tc='*random moments*' -s=false
  left=$(( left - n ))
  batch=$(( batch + 1 ))
done

for (( r = 1; r <= ROUNDS; r++ )); do
  echo "== fault: round $r of $ROUNDS"
  "$BIN" -ts=fault
done

echo "== concurrency: $VERSIONS versions"
TREECASK_CONCURRENCY_VERSIONS=$VERSIONS "$BIN" -ts=concurrency
echo "PASS: $RUNS crash runs, $ROUNDS fault rounds, $VERSIONS concurrent versions"
