"""The serving paths ("Speed for servers") against safetensors and
memcpy, in one process, interleaved, medians:

* open to first tensor at 10,000 leaves: treecask ``open(p)[key]`` (a verified
  zero-copy view) against safetensors ``safe_open`` + ``get_tensor``;
* one leaf as a fresh copy: treecask ``open(p).read(key)`` against
  safetensors ``safe_open`` + ``get_tensor`` and a memcpy of the same bytes
  into a fresh array (the limit);
* the whole tree: ``treecask.load(p)`` against ``treecask.load(p, copy=False)``
  (read-only views of the map, every chunk checksummed once), the latter
  against its limit (every byte of the file read once through a fresh map on
  all cores: a NumPy reduction per thread, no checksum, no tree) and, in a
  fresh process each, the private (RssAnon) and file-backed (RssFile)
  resident memory each adds.

    python bench/server_paths.py [--gib 1] [--rounds 7] [--dir /tmp]

Every figure is measured in each of ``--rounds`` rounds, the contenders of a
pair one after the other within a round (the order alternating), each as the
median of several calls; the table gives the median over rounds of each
contender and of the per-round ratio, with the ratio's lowest and highest
round as the noise. Both files sit in the page cache (just written). Before
each timed whole-tree load, memory of twice the data size is touched and freed
(peers.prewarm: this VM returns freed memory to the host). Not a test: the
figures depend on the machine's load; compare ratios from the same run only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import page_cache  # noqa: E402
import peers  # noqa: E402  (build, flatten, leaf_key, prewarm)

import treecask  # noqa: E402


def pair(name_a: str, fa: Callable, name_b: str, fb: Callable, rounds: int, reps: int,
         before: Callable[[], Any] = lambda: None) -> Dict[str, Any]:
    """Interleaved rounds of a and b; per-round medians; ratio b / a per round."""
    ta, tb = [], []
    for r in range(rounds):
        order = [(fa, ta), (fb, tb)] if r % 2 == 0 else [(fb, tb), (fa, ta)]
        for f, out in order:
            before()
            out.append(peers.median_call(f, reps))
    ratios = [b / a for a, b in zip(ta, tb)]
    return {"a": name_a, "b": name_b, "ta": statistics.median(ta), "tb": statistics.median(tb),
            "ratio": statistics.median(ratios), "lo": min(ratios), "hi": max(ratios)}


def fmt(s: float) -> str:
    return f"{s * 1e3:.2f} ms" if s >= 1e-3 else f"{s * 1e6:.0f} µs"


_RSS_PROBE = textwrap.dedent("""
    import sys
    import numpy as np
    import treecask

    def status(field):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024

    path, copy = sys.argv[1], sys.argv[2] == "1"
    a0, f0 = status("RssAnon"), status("RssFile")
    tree = treecask.load(path, copy=copy)
    flat = []
    def walk(x):
        if isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, np.ndarray):
            flat.append(x)
    walk(tree)
    for x in flat:  # touch every page of every leaf
        np.asarray(x).reshape(-1).view(np.uint8)[::4096].sum()
    print(status("RssAnon") - a0, status("RssFile") - f0, sum(x.nbytes for x in flat))
""")


def rss_of_load(path: str, copy: bool) -> Tuple[int, int, int]:
    r = subprocess.run([sys.executable, "-c", _RSS_PROBE, path, "1" if copy else "0"], capture_output=True,
                       text=True, env=os.environ, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    anon, file, nbytes = map(int, r.stdout.split())
    return anon, file, nbytes


def mapped_read(path: str, threads: int) -> int:
    """Reads every 8-byte word of `path` once through a fresh read-only map,
    the file cut into `threads` equal ranges, one NumPy reduction per thread
    (NumPy drops the GIL in it). What a verified ``load(copy=False)`` cannot
    beat: it must fault in and read each byte of each leaf once to checksum it."""
    import threading

    m = np.memmap(path, dtype=np.uint64, mode="r", shape=(os.path.getsize(path) // 8,))
    parts = np.array_split(m, threads)
    out = [0] * threads

    def reduce(k: int) -> None:
        out[k] = int(np.bitwise_or.reduce(parts[k]))

    pool = [threading.Thread(target=reduce, args=(k,)) for k in range(1, threads)]
    for t in pool:
        t.start()
    reduce(0)
    for t in pool:
        t.join()
    return out[0]  # unmapped on return, inside the timed call, as peers.median_call frees load(copy=False)'s views


def st_view(path: str, key: str) -> np.ndarray:
    """A read-only view of tensor `key`'s bytes in safetensors file `path`
    (8-byte little-endian header length, JSON header, data; offsets in the
    header count from the data's start)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        begin, end = json.loads(f.read(n))[key]["data_offsets"]
    return np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n + begin, shape=(end - begin,))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0, help="size of the LLM-shaped tree")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--core", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build",
                                                   "bench", "treecask_bench_core"),
                    help="treecask_bench_core, for the C++ open-to-first-tensor row (skipped when absent)")
    args = ap.parse_args()
    import ml_dtypes  # noqa: F401  (safetensors' numpy loader needs bfloat16 registered)
    from safetensors import safe_open
    from safetensors.numpy import save_file

    rows: List[Tuple[str, Dict[str, Any], str]] = []

    # ---- open to first tensor at 10,000 leaves ----
    small = peers.build("small", args.gib)
    tc, st = os.path.join(args.dir, "server_small.cask"), os.path.join(args.dir, "server_small.safetensors")
    treecask.save(tc, small, compression="none", overwrite=True)
    save_file(peers.flatten(small), st)
    key = "blocks/block_050/p_50"
    del small

    def tc_first():
        with treecask.open(tc) as a:
            return a[key]

    def st_first():
        with safe_open(st, "np") as f:
            return f.get_tensor(key)

    np.testing.assert_array_equal(tc_first(), st_first())
    rows.append(("open to first tensor, 10,000 leaves: treecask `open(p)[key]` vs safetensors "
                 "`safe_open`+`get_tensor`", pair("treecask", tc_first, "safetensors", st_first,
                                                  args.rounds, 50), "x"))
    if os.path.exists(args.core):
        # C++: `treecask_bench_core --open-first` on the same file (Archive::open + index_of +
        # verified view; its own median of 50 calls) in a child process, each round right
        # after the Python safetensors figure of that round.
        tcs, sts = [], []
        for r in range(args.rounds):
            out = subprocess.run([args.core, "--open-first", tc, key, "50"], capture_output=True, text=True,
                                 check=True).stdout
            tcs.append(float(out) / 1e3)
            sts.append(peers.median_call(st_first, 50))
        ratios = [b / a for a, b in zip(tcs, sts)]
        rows.append(("open to first tensor, 10,000 leaves, C++: `Archive::open` + `index_of` + verified "
                     "`view` vs safetensors (Python, Rust core) `safe_open`+`get_tensor`",
                     {"a": "treecask C++", "b": "safetensors", "ta": statistics.median(tcs),
                      "tb": statistics.median(sts), "ratio": statistics.median(ratios), "lo": min(ratios),
                      "hi": max(ratios)}, "x"))
    for p in (tc, st):
        os.remove(p)

    # ---- one leaf, fresh copy ----
    llm = peers.build("llm", args.gib)
    flat = peers.flatten(llm)
    key = peers.leaf_key("llm", args.gib)
    leaf = flat[key]
    tc, st = os.path.join(args.dir, "server_llm.cask"), os.path.join(args.dir, "server_llm.safetensors")
    treecask.save(tc, llm, compression="none", overwrite=True)
    save_file(flat, st)
    nbytes = peers.tree_bytes(llm)
    del llm, flat

    def tc_read():
        with treecask.open(tc) as a:
            return a.read(key)

    def st_read():
        with safe_open(st, "np") as f:
            return f.get_tensor(key)

    def memcpy_leaf():
        out = np.empty_like(leaf)
        np.copyto(out, leaf)
        return out

    np.testing.assert_array_equal(tc_read(), st_read())
    with treecask.open(tc) as a:  # the page-cache folios each reader copies from
        folios = {"treecask": page_cache.summary(a[key]), "safetensors": page_cache.summary(st_view(st, key))}
    one = pair("treecask", tc_read, "safetensors", st_read, args.rounds, 30)
    lim = pair("treecask", tc_read, "memcpy", memcpy_leaf, args.rounds, 30)
    rows.append((f"one leaf as a fresh copy (`{key}`, {leaf.nbytes / 2**20:.0f} MiB): treecask "
                 "`open(p).read(key)` vs safetensors `safe_open`+`get_tensor`", one, "x"))
    rows.append(("the same leaf: treecask vs memcpy into a fresh array (the limit)", lim, "x"))

    # ---- the whole tree: load() vs load(copy=False) ----
    def load_copy():
        return treecask.load(tc)

    def load_views():
        return treecask.load(tc, copy=False)

    whole = pair("load(copy=False)", load_views, "load()", load_copy, args.rounds, 3,
                 before=lambda: peers.prewarm(2 * nbytes))
    rows.append((f"whole tree ({nbytes / 2**20:,.0f} MiB, {len(treecask.open(tc))} leaves): "
                 "`load(p, copy=False)` vs `load(p)`", whole, "x"))
    threads = os.cpu_count() or 1
    floor = pair("load(copy=False)", load_views, "mapped read", lambda: mapped_read(tc, threads), args.rounds, 3,
                 before=lambda: peers.prewarm(2 * nbytes))
    rows.append((f"the same: `load(p, copy=False)` vs every byte of the file read once through a fresh map, "
                 f"{threads} threads (the limit)", floor, "x"))
    rss = {c: rss_of_load(tc, c) for c in (False, True)}

    print(f"treecask {treecask.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{args.rounds} rounds, LLM tree {args.gib} GiB\n")
    print("| measure | treecask | peer / limit | ratio (median) | ratio, lowest–highest round |")
    print("|---|---|---|---|---|")
    for label, r, _ in rows:
        print(f"| {label} | {r['a']} {fmt(r['ta'])} | {r['b']} {fmt(r['tb'])} | {r['ratio']:.2f}× | "
              f"{r['lo']:.2f}–{r['hi']:.2f}× |")
    print()
    for name, line in folios.items():
        print(f"page-cache folios behind the one leaf, {name} file: {line or 'not readable (needs root)'}")
    for c, (anon, file, n) in rss.items():
        print(f"load(copy={c}) in a fresh process, every page touched: RssAnon +{anon / 2**20:,.1f} MiB, "
              f"RssFile +{file / 2**20:,.1f} MiB, for {n / 2**20:,.1f} MiB of leaves")
    for p in (tc, st):
        os.remove(p)


if __name__ == "__main__":
    main()
