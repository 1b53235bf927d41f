#!/usr/bin/env bash
# Long variant of the CheckpointManager crash test (tests/python/test_manager.py
# test_sigkill_at_random_moments_never_lists_a_partial_step): KILLS child
# processes, each resuming from the latest step and saving asynchronously with
# retention (max_to_keep=3) until SIGKILLed at a random moment; after every
# kill each listed step must restore and verify. Not part of CI (CI runs 120).
#
# Usage: scripts/manager_soak.sh [KILLS]      (default 2000; ~0.45 s per kill on 2 cores)
# Environment (all optional):
#   KILLS    number of kills (also the first argument)
#   SEED     random seed of the kill delays (default: from the clock)
#   TMPDIR   where the checkpoint directory goes (point it at the file system you care about)
#   PYTHON   interpreter (default: .venv/bin/python)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
KILLS="${1:-${KILLS:-2000}}"
SEED="${SEED:-$(date +%s)}"
PYTHON="${PYTHON:-.venv/bin/python}"
echo "manager soak: $KILLS kills, seed $SEED, TMPDIR=${TMPDIR:-/tmp}"
TREECASK_SOAK="$KILLS" TREECASK_SOAK_SEED="$SEED" "$PYTHON" -m pytest -q \
  "tests/python/test_manager.py::test_sigkill_at_random_moments_never_lists_a_partial_step"
