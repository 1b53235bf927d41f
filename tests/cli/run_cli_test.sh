#!/usr/bin/env bash
# Runs the CLI tests (test_cli_tool.py, under pytest) against the treecask
# binary given as $1, with a Python that has pytest, numpy, safetensors and
# ml_dtypes: $PYTHON, else <repo>/.venv/bin/python, else python3. Exits 77
# (ctest's "skipped") when that Python lacks them.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$root/.venv/bin/python" ]]; then PYTHON="$root/.venv/bin/python"; else PYTHON=python3; fi
fi
if ! "$PYTHON" -c "import pytest, numpy, safetensors, ml_dtypes" 2>/dev/null; then
  echo "SKIP: $PYTHON lacks pytest, numpy, safetensors or ml_dtypes"
  exit 77
fi
TREECASK_CLI="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
export TREECASK_CLI
shift
exec "$PYTHON" -m pytest "$here/test_cli_tool.py" -q "$@"
