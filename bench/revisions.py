#!/usr/bin/env python3
"""A/B of two git revisions of the C++ core on one fixed workload
(bench/core_probe.cc), for the claim a refactor must back with numbers:
"speed unchanged". A benchmark, not a test.

    python3 bench/revisions.py REV_A REV_B [--pairs 9] [--workdir /tmp/treecask-revisions]
                               [--only open read ...] [--apply COMMIT ...]

Each revision is exported with ``git archive`` (the checkout is not touched),
its library alone is built (Release, ``-DTREECASK_BUILD_{TESTS,CLI,BENCH}=OFF``, ``-DTREECASK_WITH_CURL=OFF``;
ccache is used when installed), and this checkout's bench/core_probe.cc is
compiled against it, so both sides run the same source (``views`` is skipped
when either revision predates ``Archive::view_many``). ``--apply COMMIT``
applies that commit's diff to both trees first (for a fix both sides need,
e.g. 4e13244: before it a verified read could fail a checksum at random, and
the run stops on a failed process). The archives the
probe reads are written once by REV_B's probe (the baseline); both
revisions must read them (format 4.0 readers read every older version).

Workloads (whole processes): ``open`` (400 opens of a 10,000-leaf archive,
each with index_of and a verified view of one leaf), ``read_many`` (10x every
leaf of a 512 MiB archive, all cores), ``read`` (10x each leaf in turn;
leaves from 8 MiB fan out), ``views`` (20x view_many of every leaf,
verified), ``save`` (2 non-durable raw saves of the same 512 MiB). Pairs run
A B, B A, A B... (the first of a pair alternates); each pair's ratio A/B of
wall seconds and of CPU seconds (user + system of the child, from wait4) is
taken, and the median ratio with the lowest and highest is printed: a ratio
near 1 whose range straddles 1 says "unchanged within noise".
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = {
    "open": lambda d: ["open", str(d / "small.cask"), "w2500", "400"],
    "read_many": lambda d: ["read_many", str(d / "bulk.cask"), "10"],
    "read": lambda d: ["read", str(d / "bulk.cask"), "10"],
    "views": lambda d: ["views", str(d / "bulk.cask"), "20"],
    "save": None,  # each side saves to its own file
}


def sh(cmd, **kw):
    subprocess.run(cmd, check=True, **kw)


def build(rev: str, work: Path, apply: list[str]) -> tuple[Path, bool]:
    """The probe built against `rev`'s library (with the diffs of `apply`);
    returns its path and whether the revision has Archive::view_many."""
    src = work / f"src-{rev}"
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    sh(["tar", "-x", "-C", str(src)], input=archive)
    for commit in apply:
        diff = subprocess.run(["git", "-C", str(ROOT), "show", "--format=", commit, "--", "src", "include"],
                              check=True, capture_output=True).stdout
        sh(["git", "apply"], input=diff, cwd=src)
    has_views = "view_many" in (src / "include" / "treecask" / "archive.h").read_text()
    launcher = ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"] if shutil.which("ccache") else []
    sh(["cmake", "-S", str(src), "-B", str(src / "build"), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
        "-DTREECASK_BUILD_TESTS=OFF", "-DTREECASK_BUILD_CLI=OFF", "-DTREECASK_BUILD_BENCH=OFF",
        "-DTREECASK_WITH_CURL=OFF",  # the probe reads local files; no -lcurl to link
        "-DTREECASK_INSTALL=OFF", *launcher], stdout=subprocess.DEVNULL)
    sh(["cmake", "--build", str(src / "build"), "--target", "treecask"], stdout=subprocess.DEVNULL)
    lib = next((src / "build").rglob("libtreecask.a"))
    libs = subprocess.run(["pkg-config", "--libs", "lmdb", "liblz4", "libxxhash"], check=True,
                          capture_output=True, text=True).stdout.split()
    probe = work / f"probe-{rev}"
    sh(["g++", "-std=c++20", "-O2", *([] if has_views else ["-DCORE_PROBE_NO_VIEW_MANY"]), "-I",
        str(src / "include"), str(ROOT / "bench" / "core_probe.cc"), str(lib), *libs, "-pthread", "-o", str(probe)])
    return probe, has_views


def run(cmd) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one whole process."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{cmd} failed")
    return wall, ru.ru_utime + ru.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rev_a")
    ap.add_argument("rev_b")
    ap.add_argument("--pairs", type=int, default=9)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/treecask-revisions"))
    ap.add_argument("--only", nargs="*", choices=list(WORKLOADS), help="workloads to run (default: all)")
    ap.add_argument("--apply", nargs="*", default=[], help="commits whose src/ and include/ diffs both trees get")
    args = ap.parse_args()
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    built = {side: build(rev, work, args.apply) for side, rev in (("A", args.rev_a), ("B", args.rev_b))}
    probe = {side: p for side, (p, _) in built.items()}
    skip = set() if all(v for _, v in built.values()) else {"views"}
    sh([probe["B"], "small", str(work / "small.cask")])
    sh([probe["B"], "save", str(work / "bulk.cask"), "1"])
    print(f"A = {args.rev_a}, B = {args.rev_b}; {args.pairs} pairs; load {os.getloadavg()[0]:.2f}; "
          f"{os.cpu_count()} cores")
    print("| workload | A wall s | B wall s | A/B wall (min-max) | A/B cpu (min-max) |")
    print("|---|---|---|---|---|")
    for name in [w for w in (args.only or WORKLOADS) if w not in skip]:
        def cmd(side):
            if name == "save":
                return [probe[side], "save", str(work / f"save-{side}.cask"), "2"]
            return [probe[side], *WORKLOADS[name](work)]

        run(cmd("A")), run(cmd("B"))  # warm-up
        walls = {"A": [], "B": []}
        cpus = {"A": [], "B": []}
        for k in range(args.pairs):
            for side in ("AB" if k % 2 == 0 else "BA"):
                w, c = run(cmd(side))
                walls[side].append(w)
                cpus[side].append(c)
        rw = [a / b for a, b in zip(walls["A"], walls["B"])]
        rc = [a / b for a, b in zip(cpus["A"], cpus["B"])]
        print(f"| {name} | {statistics.median(walls['A']):.3f} | {statistics.median(walls['B']):.3f} | "
              f"{statistics.median(rw):.3f} ({min(rw):.2f}-{max(rw):.2f}) | "
              f"{statistics.median(rc):.3f} ({min(rc):.2f}-{max(rc):.2f}) |", flush=True)


if __name__ == "__main__":
    main()
