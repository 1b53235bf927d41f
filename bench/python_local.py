#!/usr/bin/env python3
"""The Python layer's local save, open and load, timed inside one process,
and A/B of two builds of the package: the claim "the Python layer's local
speed is unchanged" a refactor of it (a store seam, say) must back with
numbers. A benchmark, not a test.

    python3 bench/python_local.py [--dir /tmp/treecask-pylocal]        # one process: prints its figures
    python3 bench/python_local.py --vs PATH_A PATH_B [--pairs 5]       # A/B of two builds

``PATH_A`` and ``PATH_B`` are directories that hold a built ``treecask``
package (an unpacked wheel, or a checkout's ``python/`` with its extension
copied in); each measuring process runs this script with ``PYTHONPATH`` set
to one of them. Pairs run A B, B A, A B... (the first of a pair alternates);
each pair's ratio A/B of a workload's seconds is taken, and the median ratio
with the lowest and highest is printed (a range that straddles 1 says
"unchanged within noise"), as bench/revisions.py does for the core.

Workloads, each the median of its repetitions in one process (seconds), all
on a local file system (``--dir``), NumPy leaves only:

- ``save_small``: 5x ``treecask.save`` of 2,000 float32 leaves of 4 KiB
  (``durable=False``, default compression), a new file each time;
- ``save_bulk``: 3x ``treecask.save`` of one 256 MiB float32 leaf
  (``compression="none"``, ``durable=False``);
- ``open``: 200x ``treecask.open`` then close of the 2,000-leaf archive;
- ``load_small``: 10x ``treecask.load`` of the 2,000-leaf archive;
- ``load_bulk``: 3x ``treecask.load`` of the 256 MiB archive (page cache warm).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

WORKLOADS = ["save_small", "save_bulk", "open", "load_small", "load_bulk"]


def timed(fn, reps: int) -> float:
    """The median of ``reps`` calls of ``fn(i)`` (seconds)."""
    out = []
    for i in range(reps):
        t0 = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def measure(d: Path) -> dict:
    """One process's figures: {workload: median seconds}."""
    import numpy as np
    import treecask

    d.mkdir(parents=True, exist_ok=True)
    for f in d.glob("*.cask"):
        f.unlink()
    small = {f"w{i}": np.full(1024, i, np.float32) for i in range(2000)}
    bulk = {"w": np.arange((256 << 20) // 4, dtype=np.float32)}
    out = {}

    def save_small(i):
        treecask.save(str(d / f"small-{i}.cask"), small, durable=False)
    out["save_small"] = timed(save_small, 5)

    def save_bulk(i):
        p = d / f"bulk-{i}.cask"
        treecask.save(str(p), bulk, compression="none", durable=False)
        if i:
            p.unlink()
    out["save_bulk"] = timed(save_bulk, 3)

    def open_close(_):
        with treecask.open(str(d / "small-0.cask")):
            pass
    out["open"] = timed(open_close, 200)
    out["load_small"] = timed(lambda _: treecask.load(str(d / "small-0.cask")), 10)
    out["load_bulk"] = timed(lambda _: treecask.load(str(d / "bulk-0.cask")), 3)
    for f in d.glob("*.cask"):
        f.unlink()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/treecask-pylocal"))
    ap.add_argument("--vs", nargs=2, metavar=("PATH_A", "PATH_B"))
    ap.add_argument("--pairs", type=int, default=5)
    args = ap.parse_args()
    if not args.vs:
        print(json.dumps(measure(args.dir)))
        return

    def run(side: str) -> dict:
        env = dict(os.environ, PYTHONPATH=args.vs[0 if side == "A" else 1])
        p = subprocess.run([sys.executable, __file__, "--dir", str(args.dir)], env=env, check=True,
                           capture_output=True, text=True)
        return json.loads(p.stdout.strip().splitlines()[-1])

    run("A"), run("B")  # warm-up
    got = {"A": [], "B": []}
    for k in range(args.pairs):
        for side in ("AB" if k % 2 == 0 else "BA"):
            got[side].append(run(side))
    print(f"A = {args.vs[0]}, B = {args.vs[1]}; {args.pairs} pairs; load {os.getloadavg()[0]:.2f}; "
          f"{os.cpu_count()} cores")
    print("| workload | A ms | B ms | A/B (min-max) |")
    print("|---|---|---|---|")
    for w in WORKLOADS:
        a = [g[w] for g in got["A"]]
        b = [g[w] for g in got["B"]]
        r = [x / y for x, y in zip(a, b)]
        print(f"| {w} | {1e3 * statistics.median(a):.3f} | {1e3 * statistics.median(b):.3f} | "
              f"{statistics.median(r):.3f} ({min(r):.2f}-{max(r):.2f}) |", flush=True)


if __name__ == "__main__":
    main()
