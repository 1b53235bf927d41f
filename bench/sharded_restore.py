#!/usr/bin/env python3
"""Sharded-restore benchmark: ``treecask.load(path, shardings=...)``
against ``jax.device_put`` of the same tree from host memory and against Orbax
``StandardCheckpointer.restore`` with the same shardings, on 8 CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=8``), in the same run. A
benchmark, not a test.

    .venv/bin/python bench/sharded_restore.py                 # 512 MiB, 3 repetitions
    .venv/bin/python bench/sharded_restore.py --mib 128 --reps 1
    .venv/bin/python bench/sharded_restore.py --core          # the core's read_slices alone

Workload: a tree of 4 float32 leaves of --mib/4 MiB each, shape (rows, 4096)
(random values: "auto" compression stores them raw), saved once with
``treecask.save`` defaults and once with Orbax ``StandardCheckpointer``.

Cases (PartitionSpec on a mesh of axes ("x", "y")): P("x", None) on (8, 1),
P(None, "y") on (1, 8), P("x", "y") on (4, 2).

Contenders, each run in a fresh subprocess (imports, allocator state and memory
high-water marks do not leak), contenders rotated across repetitions, figures
the median over repetitions:
  device_put  the numpy tree built in RAM (untimed), then jax.device_put(tree,
              sharding) + block_until_ready
  treecask    treecask.load(path, shardings=sharding) + block_until_ready
              (every chunk's XXH3 checked, as by default)
  orbax       StandardCheckpointer().restore(path, ShapeDtypeStruct template
              with the sharding) + block_until_ready
  memcpy      the physical limit: numpy.copyto of every leaf into pre-faulted
              arrays, one thread
Timing starts after jax has initialised its devices and after prewarm() (the
VM hands freed memory back to its host; see bench/peers.py). The page cache is
warm (the files were just written). Peak memory: VmHWM above the VmRSS taken
just before the timed region (/proc/self/clear_refs "5"), minus the result's
own bytes, i.e. the extra memory the operation needed beyond what it returns
(for device_put: beyond its input, which is already resident).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from peers import PeakMemory, prewarm  # noqa: E402

MiB = 1 << 20
COLS = 4096
CASES = [("P('x', None)", (8, 1), ("x", None)), ("P(None, 'y')", (1, 8), (None, "y")),
         ("P('x', 'y')", (4, 2), ("x", "y"))]
CONTENDERS = ["device_put", "treecask", "orbax", "memcpy"]


def build(mib: int):
    import numpy as np

    rows = mib * MiB // 4 // 4 // COLS
    return {f"layer{k}": {"w": np.random.default_rng(k).random((rows, COLS), dtype=np.float32)}
            for k in range(4)}


def child(args) -> dict:
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    name, mesh_shape, spec = args["contender"], tuple(args["mesh"]), tuple(args["spec"])
    mesh = jax.make_mesh(mesh_shape, ("x", "y"))
    sharding = NamedSharding(mesh, PartitionSpec(*spec))
    jax.devices()
    total = args["mib"] * MiB
    tree = build(args["mib"]) if name in ("device_put", "memcpy") else None
    check = None
    if name == "memcpy":
        dst = {k: {"w": np.empty_like(v["w"])} for k, v in tree.items()}
        for v in dst.values():
            v["w"].fill(0)
    if name == "orbax":
        import orbax.checkpoint as ocp

        rows = args["mib"] * MiB // 4 // 4 // COLS
        tmpl = {f"layer{k}": {"w": jax.ShapeDtypeStruct((rows, COLS), np.float32, sharding=sharding)}
                for k in range(4)}
        ck = ocp.StandardCheckpointer()
    prewarm(2 * total)
    mem = PeakMemory()
    t0 = time.perf_counter()
    if name == "device_put":
        out = jax.device_put(tree, sharding)
        jax.block_until_ready(out)
    elif name == "treecask":
        import treecask

        out = treecask.load(args["tc"], shardings=sharding)
        jax.block_until_ready(out)
    elif name == "orbax":
        out = ck.restore(args["ob"], tmpl)
        jax.block_until_ready(out)
    else:
        for k, v in tree.items():
            np.copyto(dst[k]["w"], v["w"])
        out = dst
    dt = time.perf_counter() - t0
    peak = mem.peak_bytes()
    extra = peak - (total if name in ("treecask", "orbax") else 0)
    if name in ("treecask", "orbax"):  # every shard of one leaf equals its slice of the source
        want = build(args["mib"])["layer3"]["w"]
        got = out["layer3"]["w"]
        assert got.sharding == sharding
        check = all(np.array_equal(np.asarray(s.data), want[s.index]) for s in got.addressable_shards)
    return {"seconds": dt, "peak_extra": extra, "mem_method": mem.method, "check": check}


def run_child(payload: dict) -> dict:
    r = subprocess.run([sys.executable, __file__, "--child", json.dumps(payload)], capture_output=True,
                       text=True, env={**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"})
    if r.returncode != 0:
        raise RuntimeError(f"{payload['contender']} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def prepare(mib: int, tmp: Path):
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax
    import orbax.checkpoint as ocp

    import treecask

    tree = build(mib)
    tc = tmp / "tree.cask"
    treecask.save(tc, tree)
    ob = tmp / "tree.orbax"
    ck = ocp.StandardCheckpointer()
    ck.save(str(ob), jax.tree.map(jax.numpy.asarray, tree))
    ck.wait_until_finished()
    ck.close()
    return str(tc), str(ob)


def core(mib: int, tmp: Path) -> None:
    """--core: the core's read_slices alone on one leaf of the tree, into
    pre-faulted destinations (no page faults, no JAX): boxes of 8 row blocks,
    8 column blocks and a (4, 2) grid, verified or not, 1 and 2 threads; the
    best of 5 calls each."""
    import numpy as np

    import treecask
    from treecask._archive import _aligned_empty

    path = tmp / "tree.cask"
    treecask.save(path, build(mib), overwrite=True)
    with treecask.open(path) as a:
        i = a._index("layer0/w")
        rows, cols = a.info(i).shape
        grids = {"rows": (8, 1), "cols": (1, 8), "(4, 2)": (4, 2)}
        print(f"read_slices of one {rows * cols * 4 / MiB:.0f} MiB leaf into pre-faulted buffers, best of 5")
        for threads in (1, 2):
            for verify in (True, False):
                for label, (gx, gy) in grids.items():
                    starts = [[x * rows // gx, y * cols // gy] for x in range(gx) for y in range(gy)]
                    stops = [[(x + 1) * rows // gx, (y + 1) * cols // gy] for x in range(gx) for y in range(gy)]
                    outs = [_aligned_empty((e[0] - b[0], e[1] - b[1]), np.dtype(np.float32))
                            for b, e in zip(starts, stops)]
                    for o in outs:
                        o.fill(0)
                    best = float("inf")
                    for _ in range(5):
                        t0 = time.perf_counter()
                        a._c().read_slices(i, starts, stops, outs, verify, threads)
                        best = min(best, time.perf_counter() - t0)
                    print(f"  {threads} thread(s), {'verified' if verify else 'unverified':10s} {label:7s} "
                          f"{best * 1e3:6.1f} ms  {rows * cols * 4 / best / 1e9:5.2f} GB/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=512, help="tree size in MiB (4 float32 leaves)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temporary one)")
    ap.add_argument("--core", action="store_true", help="time the core's read_slices alone (see core())")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(json.loads(a.child))))
        return
    tmp = Path(a.dir or tempfile.mkdtemp(prefix="tc-sharded-"))
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        if a.core:
            return core(a.mib, tmp)
        tc, ob = prepare(a.mib, tmp)
        res = {}
        for rep in range(a.reps):
            for label, mesh, spec in CASES:
                order = CONTENDERS[rep % len(CONTENDERS):] + CONTENDERS[:rep % len(CONTENDERS)]
                for c in order:
                    r = run_child({"contender": c, "mesh": mesh, "spec": spec, "mib": a.mib, "tc": tc, "ob": ob})
                    if r["check"] is False:
                        raise RuntimeError(f"{c} {label}: restored shards differ from the source")
                    res.setdefault((label, c), []).append(r)
                    print(f"rep {rep} {label:14s} {c:10s} {r['seconds']:.3f} s, "
                          f"peak extra {r['peak_extra'] / MiB:.0f} MiB", file=sys.stderr)
        nproc = os.cpu_count()
        print(f"\n{a.mib} MiB tree (4 float32 leaves of (rows, {COLS})), 8 CPU devices, {nproc} cores, "
              f"median of {a.reps}; GB/s = tree bytes / time\n")
        print("Speed ratios are time(peer) / time(treecask): above 1 means treecask is faster; the "
              "ratio of the medians, and in brackets of the best (least disturbed) runs.\n")
        print("| sharding | mesh | device_put | treecask | Orbax | memcpy (1 thread) | treecask vs device_put "
              "| treecask vs Orbax | peak extra: device_put / treecask / Orbax |")
        print("|---|---|---|---|---|---|---|---|---|")
        for label, mesh, spec in CASES:
            med = {c: statistics.median(r["seconds"] for r in res[(label, c)]) for c in CONTENDERS}
            best = {c: min(r["seconds"] for r in res[(label, c)]) for c in CONTENDERS}
            mem = {c: max(r["peak_extra"] for r in res[(label, c)]) for c in CONTENDERS}
            gbs = {c: a.mib * MiB / med[c] / 1e9 for c in CONTENDERS}
            cell = {c: f"{med[c]:.3f} s ({gbs[c]:.2f} GB/s)" for c in CONTENDERS}
            print(f"| `{label}` | {mesh} | {cell['device_put']} | {cell['treecask']} | {cell['orbax']} | "
                  f"{cell['memcpy']} | {med['device_put'] / med['treecask']:.2f}x "
                  f"({best['device_put'] / best['treecask']:.2f}x) | "
                  f"{med['orbax'] / med['treecask']:.2f}x ({best['orbax'] / best['treecask']:.2f}x) | "
                  f"{mem['device_put'] / MiB:.0f} / {mem['treecask'] / MiB:.0f} / {mem['orbax'] / MiB:.0f} MiB |")
    finally:
        if not a.dir:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
