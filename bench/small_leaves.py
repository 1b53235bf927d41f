"""Ad-hoc timing of the "10,000 small leaves" workload of bench/peers.py in one
process: treecask.save / treecask.load / treecask.load(subtree=one leaf)
against safetensors.numpy save_file / load_file / safe_open + get_tensor,
interleaved, medians.

    python bench/small_leaves.py [--runs 7] [--dir /tmp] [--workload llm --gib 1]

--workload picks another tree of bench/peers.py (e.g. the LLM-shaped one, with
its one-leaf key).

Both sides are timed as bench/peers.py times them: treecask.save(compression=
"none", durable=True); safetensors save_file of the flattened dict plus an
fsync of the file and its directory; loads to a nested dict (safetensors:
load_file + unflatten). Before each timed call it touches and frees twice the
data size of memory (peers.prewarm). Not a test: the numbers depend on the
machine's load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402  (build_small, flatten, unflatten, fsync_path)

import treecask  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--workload", default="small", choices=sorted(peers.WORKLOADS))
    ap.add_argument("--gib", type=float, default=1.0, help="size of the llm / sparse trees")
    args = ap.parse_args()
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    tree = peers.build(args.workload, args.gib)
    tc = os.path.join(args.dir, "small_leaves.cask")
    st = os.path.join(args.dir, "small_leaves.safetensors")
    key = peers.leaf_key(args.workload, args.gib)

    def tc_save():
        treecask.save(tc, tree, compression="none", overwrite=True)

    def st_save():
        save_file(peers.flatten(tree), st)
        peers.fsync_path(st)

    def tc_load():
        return treecask.load(tc)

    def st_load():
        return peers.unflatten(load_file(st))

    def tc_one():
        return treecask.load(tc, subtree=key)

    def tc_open_read():
        with treecask.open(tc) as a:
            return a.read(key)

    def st_one():
        with safe_open(st, "np") as f:
            return f.get_tensor(key)

    cases = [("treecask.save", tc_save), ("safetensors save_file", st_save),
             ("treecask.load", tc_load), ("safetensors load_file", st_load),
             ("treecask.load(subtree=one leaf)", tc_one), ("treecask.open().read(key)", tc_open_read),
             ("safetensors safe_open+get_tensor", st_one)]
    tc_save(), st_save()
    want = peers.flatten(tree)[key]
    assert np.array_equal(peers.flatten(tc_load())[key], want) and np.array_equal(tc_one(), want)
    assert np.array_equal(st_one(), want)
    print(f"{args.workload}: {len(peers.flatten(tree))} leaves, one leaf {key!r}")
    nbytes = sum(np.asarray(x).nbytes for x in peers.flatten(tree).values())
    times = {name: [] for name, _ in cases}
    for _ in range(args.runs):
        for name, fn in cases:
            peers.prewarm(2 * nbytes)  # as bench/peers.py does: fresh memory is guest-held
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    for name, _ in cases:
        ts = times[name]
        print(f"{name:34s} median {statistics.median(ts) * 1e3:8.2f} ms   min {min(ts) * 1e3:8.2f} ms")
    os.unlink(tc)
    os.unlink(st)


if __name__ == "__main__":
    main()
