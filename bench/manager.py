#!/usr/bin/env python3
"""Checkpoint-manager benchmark: how long an asynchronous save blocks
the training loop, how long until the step is durable, and the peak extra
memory -- treecask's CheckpointManager against Orbax's
CheckpointManager(enable_async_checkpointing=True), in the same run, with the
physical references beside them. A benchmark, not a test.

    .venv/bin/python bench/manager.py --out docs/performance_runs.md     # the documented run
    .venv/bin/python bench/manager.py --gib 0.25 --reps 1           # a quick run (prints only)

Workload: bench/peers.py's LLM-shaped tree (bf16 kernels, fp32 norms and
biases, an Adam state of the same shapes, an int32 step), about --gib GiB.

Rows (each measured in a fresh subprocess, --reps times, interleaved; medians):
  fresh copy        every leaf copied (np.copyto, 1 thread) into one fresh buffer:
                    the least a snapshot that survives in-place writes and
                    donation must cost (the reference for "blocks")
  treecask save     treecask.save(durable=True) of the NumPy tree: the
                    synchronous reference for "until durable"
  treecask manager  CheckpointManager(dir).save(step, tree) with NumPy leaves,
                    and with jax.Array leaves (CPU), then wait_until_finished();
                    and with keep_snapshot_memory=True and NumPy leaves (the
                    snapshot buffer of step 0 is reused by step 1: its bytes,
                    resident before the measurement starts, are added to the
                    peak); jax.Array leaves are not copied (held as views)
  Orbax manager     ocp.CheckpointManager(dir, options=CheckpointManagerOptions(
                    enable_async_checkpointing=True)).save(step,
                    args=StandardSave(tree)) with jax.Array leaves, then
                    wait_until_finished() and an fsync of every file of the step
                    (Orbax does not fsync; durability is timed the same way for all)
Each save row times the second save of the same tree in its process (step 1,
after an untimed step 0), as in a training loop: one-time set-up is excluded.
No retention (max_to_keep=None for both managers): the rows time saving only.
"blocks" is the time save() takes to return; "until durable" runs from the call
to the end of wait_until_finished() (+ fsync for Orbax). Peak memory: the
resident high-water mark from the call until durable, above the RSS before it
(bench/peers.py PeakMemory; mapped file pages count).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers as P  # noqa: E402  (workloads, memory and fsync helpers, machine description)

MiB, GiB = P.MiB, P.GiB
ROWS = {
    "copy": "fresh copy (np.copyto, 1 thread)",
    "sync": "treecask.save, durable (synchronous)",
    "tc_np": "treecask CheckpointManager, NumPy leaves",
    "tc_jax": "treecask CheckpointManager, jax.Array leaves",
    "tc_keep": "treecask CheckpointManager(keep_snapshot_memory=True), NumPy leaves",
    "orbax": "Orbax CheckpointManager (async), jax.Array leaves",
}


def child(job: Dict[str, Any]) -> Dict[str, Any]:
    import numpy as np

    row, gib, d = job["row"], job["gib"], job["dir"]
    if row in ("tc_jax", "orbax"):
        import jax  # noqa: F401  (imports outside the timed region)
    if row == "orbax":
        import orbax.checkpoint as ocp
    import treecask

    tree = P.build("llm", gib)
    n = P.tree_bytes(tree)
    res: Dict[str, Any] = {"bytes": n}
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    if row == "copy":
        leaves = [np.ascontiguousarray(v).reshape(-1).view(np.uint8) for v in P.flatten(tree).values()]
        P.prewarm(2 * n + 64 * MiB)
        mem = P.PeakMemory()
        t0 = time.perf_counter()
        dst = np.empty(n, np.uint8)
        o = 0
        for x in leaves:
            np.copyto(dst[o:o + x.size], x)
            o += x.size
        res["blocks"] = time.perf_counter() - t0
        res["peak"] = mem.peak_bytes()
        return res
    if row in ("tc_jax", "orbax"):
        tree = P._jax_tree(tree)
    if row == "sync":
        treecask.save(os.path.join(d, "s0.cask"), tree)
        P.prewarm(2 * n + 64 * MiB)
        mem = P.PeakMemory()
        t0 = time.perf_counter()
        treecask.save(os.path.join(d, "s1.cask"), tree)
        res["durable"] = res["blocks"] = time.perf_counter() - t0
        res["peak"] = mem.peak_bytes()
        return res
    if row in ("tc_np", "tc_jax", "tc_keep"):
        m = treecask.CheckpointManager(d, keep_snapshot_memory=row == "tc_keep")
        m.save(0, tree)
        m.wait_until_finished()
        held = m._pool.held_bytes if m._pool is not None else 0
        res["held"] = held
        P.prewarm(2 * n + 64 * MiB)
        mem = P.PeakMemory()
        t0 = time.perf_counter()
        m.save(1, tree)
        res["blocks"] = time.perf_counter() - t0
        m.wait_until_finished()
        res["durable"] = time.perf_counter() - t0
        res["peak"] = mem.peak_bytes() + held  # the kept buffer was resident before the baseline
        assert m.all_steps() == [0, 1]
        m.close()
        return res
    if row == "orbax":
        m = ocp.CheckpointManager(os.path.abspath(d), options=ocp.CheckpointManagerOptions(
            enable_async_checkpointing=True))
        m.save(0, args=ocp.args.StandardSave(tree))
        m.wait_until_finished()
        P.prewarm(2 * n + 64 * MiB)
        mem = P.PeakMemory()
        t0 = time.perf_counter()
        m.save(1, args=ocp.args.StandardSave(tree))
        res["blocks"] = time.perf_counter() - t0
        m.wait_until_finished()
        P.fsync_path(os.path.join(os.path.abspath(d), "1"))
        res["durable"] = time.perf_counter() - t0
        res["peak"] = mem.peak_bytes()
        m.close()
        return res
    raise ValueError(row)


def run_child(job: Dict[str, Any], timeout: float) -> Dict[str, Any]:
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_ENABLE_X64="1", TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONWARNINGS="ignore")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(job)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
    return {"error": f"exit {p.returncode}: " + " | ".join(tail)}


def collect(args) -> Dict[str, List[Dict[str, Any]]]:
    out: Dict[str, List[Dict[str, Any]]] = {r: [] for r in args.rows}
    for rep in range(args.reps):
        order = args.rows[rep % len(args.rows):] + args.rows[:rep % len(args.rows)]  # rotated
        for row in order:
            r = run_child({"row": row, "gib": args.gib, "dir": os.path.join(args.dir, row)}, args.timeout)
            print(f"rep {rep} {row}: {r}", file=sys.stderr, flush=True)
            out[row].append(r)
    shutil.rmtree(args.dir, ignore_errors=True)
    return out


def med(results: List[Dict[str, Any]], field: str) -> Optional[float]:
    xs = [r[field] for r in results if field in r]
    return statistics.median(xs) if xs else None


def render(results: Dict[str, List[Dict[str, Any]]], meta: Dict[str, Any]) -> str:
    nbytes = next((r["bytes"] for rs in results.values() for r in rs if "bytes" in r), 0)
    copy, sync = med(results.get("copy", []), "blocks"), med(results.get("sync", []), "durable")
    lines = [
        "## Checkpoint manager",
        "",
        f"`{meta['command']}` on {meta['started']} ({meta['reps']} repetition(s), medians; "
        f"a {P.fmt_mib(nbytes)} MiB LLM-shaped tree of {meta['leaves']} leaves). Machine: "
        + ", ".join(f"{k} {v}" for k, v in meta["machine"].items()) + ". Versions: "
        + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()) + ".",
        "",
        "Method: bench/manager.py's docstring. Each save row is the second save of the same tree "
        "in its process (a training loop's steady state). \"Blocks\" is how long `save()` keeps the "
        "caller; \"until durable\" runs from the call to the end of `wait_until_finished()` (Orbax: "
        "plus an fsync of every file of its step, which it does not do itself). Peak memory is the "
        "resident high-water mark above the process's RSS before the call.",
        "",
        "| | blocks | ÷ fresh copy | ÷ sync save | until durable | ÷ sync save | peak extra memory (MiB) | ÷ data |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row, label in ROWS.items():
        rs = results.get(row)
        if not rs:
            continue
        errs = [r["error"] for r in rs if "error" in r]
        if len(errs) == len(rs):
            lines.append(f"| {label} | error: {errs[0]} | | | | | | |")
            continue
        b, dur, peak = med(rs, "blocks"), med(rs, "durable"), med(rs, "peak")

        def ratio(x, ref):
            return P.fmt_x(x / ref) if x is not None and ref else "—"

        lines.append(
            f"| {label} | {P.fmt_s(b)} | {ratio(b, copy)} | {ratio(b, sync)} | "
            f"{P.fmt_s(dur) if dur is not None else '—'} | {ratio(dur, sync)} | {P.fmt_mib(peak)} | "
            f"{ratio(peak, nbytes)} |")
    lines.append("")
    tc = results.get("tc_jax") or results.get("tc_np") or []
    keep = results.get("tc_keep") or []
    b, dur, peak = med(tc, "blocks"), med(tc, "durable"), med(tc, "peak")

    def verdict(ok):
        return "met" if ok else "**not met**"

    if None not in (b, dur, peak, copy, sync):
        lines += [
            "Targets (treecask manager with jax.Array leaves):",
            "",
            "| target | measured | verdict |",
            "|---|---|---|",
            f"| blocks ≤ fresh copy | {P.fmt_s(b)} vs {P.fmt_s(copy)} ({b / copy:.2f}×) | {verdict(b <= copy)} |",
            f"| blocks ≤ 15% of a synchronous durable save | {100 * b / sync:.1f}% of {P.fmt_s(sync)} | "
            f"{verdict(b <= 0.15 * sync)} |",
            f"| until durable ≤ 1.1× synchronous save | {dur / sync:.2f}× | {verdict(dur <= 1.1 * sync)} |",
            f"| peak extra memory ≤ 1.1× data | {peak / nbytes:.2f}× | {verdict(peak <= 1.1 * nbytes)} |",
            "",
        ]
    kb = med(keep, "blocks")
    nb = med(results.get("tc_np") or [], "blocks")
    if None not in (kb, nb, copy):
        lines += [
            f"NumPy leaves are copied (the caller may write them in place): `save()` blocks "
            f"{P.fmt_s(nb)} ({nb / copy:.2f}× a fresh copy) into fresh memory, {P.fmt_s(kb)} "
            f"({kb / copy:.2f}×) with `keep_snapshot_memory=True`.",
            "",
        ]
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        import warnings

        warnings.filterwarnings("ignore")
        res = child(json.loads(sys.argv[2]))
        print("RESULT " + json.dumps(res), flush=True)
        sys.stdout.flush()
        os._exit(0)  # skip the teardown of large trees and Orbax's threads
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=1.0, help="size of the LLM-shaped tree (default 1)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions (interleaved), default 3")
    ap.add_argument("--rows", default=",".join(ROWS), help="which rows (default all)")
    ap.add_argument("--dir", default=str(P.ROOT / ".cache" / "bench-manager"),
                    help="scratch directory (on the file system the figures should describe)")
    ap.add_argument("--out", type=Path, help="Markdown file to write the section into (between markers)")
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per measurement subprocess")
    args = ap.parse_args()
    args.rows = [r for r in args.rows.split(",") if r]
    meta = {
        "command": os.environ.get("TREECASK_BENCH_COMMAND") or "python bench/manager.py " + " ".join(sys.argv[1:]),
        "started": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "reps": args.reps, "machine": P.machine_info(), "versions": P.versions(),
        "leaves": len(P.flatten(P.build("llm", args.gib, spec_only=True))),
    }
    results = collect(args)
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    section = render(results, meta)
    if args.out:
        P.write_doc(args.out, section, marker="manager")
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(section)


if __name__ == "__main__":
    main()
