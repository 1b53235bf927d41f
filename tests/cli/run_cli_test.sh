#!/usr/bin/env bash
# Runs cli_test.py against the treecask binary given as $1 with a Python that
# has numpy, safetensors and ml_dtypes: $PYTHON, else <repo>/.venv/bin/python,
# else python3 (cli_test.py exits 77, "skipped", when they are missing).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$root/.venv/bin/python" ]]; then PYTHON="$root/.venv/bin/python"; else PYTHON=python3; fi
fi
exec "$PYTHON" "$here/cli_test.py" "$@"
