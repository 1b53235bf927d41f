"""Signed checkpoints (docs/signing.md) against the OpenSSF model_signing reference,
through the two command-line tools (each timing a whole process: start, imports, work),
as ratios measured in one run; bench/signing.py times the same goals through the Python
API inside the process:

- sign right after a save: `treecask sign A` (default shards: the size / 1024, a power of two in
  [256 KiB, 2 MiB]; all cores) against
  `model_signing sign key A` (its default: file serialization);
- full verify: `treecask verify A --signature` (every signed byte's SHA-256 and every
  chunk's XXH3 in one pass on all cores) against `model_signing verify key` of the same archive with a
  bundle model_signing made (file serialization), and against the limit of SHA-256 on all
  cores (`sha256sum`-style: OpenSSL's SHA-256 of the file split over the cores, measured in
  this process with hashlib, which uses OpenSSL);
- time to the first verified tensor (open + one 4 MiB leaf to .npy): `treecask get A leaf
  --signature` against `model_signing verify key` followed by an unverified `treecask get`;
- open-to-first-tensor at 10,000 small leaves: a verified `treecask get` against an
  unverified one.

    python bench/signing_cli.py [--gib 1] [--dir /tmp] [--runs 3]

Needs the `treecask` tool ($TREECASK_CLI or on PATH), `model_signing` (pip install
model-signing==1.1.1), the openssl command and the treecask Python package (to write the
archives). The page cache is warm for every side (each file read once before timing):
the ratios compare hashing and work, not the disk. Medians of --runs. Not a test.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import treecask

TREECASK = os.environ.get("TREECASK_CLI") or shutil.which("treecask")
MODEL_SIGNING = shutil.which("model_signing") or os.path.join(os.path.dirname(sys.executable), "model_signing")


def run(*cmd) -> float:
    t = time.perf_counter()
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, cmd))}: exit {r.returncode}\n{r.stdout}\n{r.stderr}")
    return dt


def median(fn, runs: int) -> float:
    return statistics.median(fn() for _ in range(runs))


def warm(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def sha256_all_cores(path: str) -> float:
    """Seconds to SHA-256 the file in 1 MiB pieces on every core (hashlib is OpenSSL's)."""
    size = os.path.getsize(path)
    piece = 1 << 20

    def one(start: int) -> bytes:
        with open(path, "rb") as f:
            f.seek(start)
            return hashlib.sha256(f.read(piece)).digest()

    t = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as ex:
        list(ex.map(one, range(0, size, piece)))
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    if not TREECASK:
        raise SystemExit("set TREECASK_CLI to the treecask tool")
    work = tempfile.mkdtemp(dir=args.dir, prefix="bench-signing-")
    try:
        key, pub = f"{work}/key.pem", f"{work}/pub.pem"
        subprocess.run(["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", key], check=True)
        subprocess.run(["openssl", "ec", "-in", key, "-pubout", "-out", pub], check=True, capture_output=True)
        leaves = max(1, int(args.gib * 256))  # 4 MiB leaves
        rng = np.random.default_rng(0)
        block = rng.integers(0, 256, size=4 << 20, dtype=np.uint8)
        tree = {f"layer{i:05d}": (block + np.uint8(i)).view(np.float32) for i in range(leaves)}
        a = f"{work}/model.cask"
        treecask.save(a, tree, compression="none")
        del tree
        size = os.path.getsize(a)
        warm(a)
        print(f"archive: {size} bytes, {leaves} leaves of 4 MiB; {os.cpu_count()} cores")

        sig = f"{a}.sig"
        t_sign = median(lambda: run(TREECASK, "sign", a, "--private-key", key, "--overwrite"), args.runs)
        ms_sig = f"{work}/ms.sig"
        t_ms_sign = median(lambda: run(MODEL_SIGNING, "sign", "key", "--private_key", key, "--signature", ms_sig, a),
                           args.runs)
        print(f"sign: treecask {t_sign:.3f} s, model_signing {t_ms_sign:.3f} s: {t_ms_sign / t_sign:.2f}x")

        t_verify = median(lambda: run(TREECASK, "verify", a, "--signature", sig, "--public-key", pub), args.runs)
        t_verify_ms_bundle = median(
            lambda: run(TREECASK, "verify", a, "--signature", ms_sig, "--public-key", pub), args.runs)
        t_ms_verify = median(
            lambda: run(MODEL_SIGNING, "verify", "key", "--signature", ms_sig, "--public_key", pub, a), args.runs)
        t_limit = median(lambda: sha256_all_cores(a), args.runs)
        print(f"full verify: treecask (shards) {t_verify:.3f} s, treecask (model_signing's files bundle) "
              f"{t_verify_ms_bundle:.3f} s, model_signing {t_ms_verify:.3f} s: {t_ms_verify / t_verify:.2f}x; "
              f"SHA-256 on all cores {t_limit:.3f} s ({size / t_limit / 1e9:.2f} GB/s)")

        npy = f"{work}/x.npy"
        t_first = median(lambda: run(TREECASK, "get", a, "layer00000", "-o", npy, "--overwrite", "--signature", sig,
                                     "--public-key", pub), args.runs)
        t_first_plain = median(lambda: run(TREECASK, "get", a, "layer00000", "-o", npy, "--overwrite"), args.runs)
        t_ms_first = t_ms_verify + t_first_plain
        print(f"first verified tensor (4 MiB): treecask {t_first:.3f} s (unverified {t_first_plain:.3f} s), "
              f"model_signing verify + get {t_ms_first:.3f} s: {t_ms_first / t_first:.1f}x")

        small = f"{work}/small.cask"
        treecask.save(small, {f"p{i:05d}": np.full(16, i, np.float32) for i in range(10000)}, compression="none")
        warm(small)
        run(TREECASK, "sign", small, "--private-key", key, "--overwrite")
        t_small = median(lambda: run(TREECASK, "get", small, "p05000", "-o", npy, "--overwrite", "--signature",
                                     f"{small}.sig", "--public-key", pub), args.runs)
        t_small_plain = median(lambda: run(TREECASK, "get", small, "p05000", "-o", npy, "--overwrite"), args.runs)
        print(f"10,000 leaves, open + one leaf: verified {t_small:.3f} s, unverified {t_small_plain:.3f} s: "
              f"{t_small / t_small_plain:.2f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
