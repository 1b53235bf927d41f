"""Hugging Face sharded checkpoints: treecask's import (shards -> one archive) and
export (archive -> shards) against the physical limit and the safetensors package.

    .venv/bin/python bench/hf_sharded.py [--mib 512] [--shard-mib 100] [--reps 3]

A synthetic LLM-like tree (bf16 matrices and f32 vectors) is written as a sharded
checkpoint with safetensors.numpy.save_file (``--shard-mib`` per shard, index beside).
Each figure is the median of ``--reps`` runs, every output durable (fsync of
each file and its directory inside the timed region, as treecask does itself):

- import: ``treecask.import_safetensors(dir, out.cask, compression="none")``;
  the limit: copying the shard files' bytes into one file (read + write + fsync);
  the peer: ``safetensors.numpy.load_file`` of every shard + ``save_file`` of all
  tensors into one file (how one merges shards with the safetensors package).
- export: ``treecask.export_safetensors(out.cask, dir2, max_shard_size)``;
  the limit: copying the archive's tensor bytes into shard files; the peer:
  ``load_file`` of the merged file + ``save_file`` per shard (transformers'
  save_pretrained writes shards the same way: one save_file per shard).

Prints a Markdown table; ratios are (other's time / treecask's time), > 1 means
treecask is faster. Compare figures of one run only: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

import ml_dtypes
import numpy as np
from safetensors.numpy import load_file, save_file

import treecask


def fsync_path(p):
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_tensors(mib: int):
    rng = np.random.default_rng(0)
    out, total, i = {}, 0, 0
    while total < mib << 20:
        w = rng.standard_normal((1024, 2048), np.float32).astype(ml_dtypes.bfloat16)  # 4 MiB
        b = rng.standard_normal(2048).astype(np.float32)
        out[f"model.layers.{i}.mlp.weight"] = w
        out[f"model.layers.{i}.mlp.bias"] = b
        total += w.nbytes + b.nbytes
        i += 1
    return out


def write_sharded(tensors, d, shard_bytes):
    os.makedirs(d)
    groups, cur, size = [], {}, 0
    for k, v in tensors.items():
        if cur and size + v.nbytes > shard_bytes:
            groups.append(cur)
            cur, size = {}, 0
        cur[k] = v
        size += v.nbytes
    groups.append(cur)
    wm = {}
    for i, g in enumerate(groups):
        name = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file(g, os.path.join(d, name), metadata={"format": "pt"})
        wm.update({k: name for k in g})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(v.nbytes for v in tensors.values())}, "weight_map": wm}, f)
    return [os.path.join(d, f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors") for i in range(len(groups))]


def copy_bytes(srcs, dsts):
    """Each src's bytes into its dst (read + write + fsync): the physical limit."""
    for s, d in zip(srcs, dsts):
        with open(s, "rb") as fi, open(d, "wb") as fo:
            shutil.copyfileobj(fi, fo, 64 << 20)
            fo.flush()
            os.fsync(fo.fileno())
    fsync_path(os.path.dirname(dsts[0]))


def timed(fn, reps):
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--shard-mib", type=int, default=100)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="tc_hf_bench_", dir=os.environ.get("TMPDIR"))
    try:
        tensors = make_tensors(a.mib)
        data = sum(v.nbytes for v in tensors.values())
        src = os.path.join(tmp, "src")
        shards = write_sharded(tensors, src, a.shard_mib << 20)
        del tensors
        cask = os.path.join(tmp, "out.cask")
        merged = os.path.join(tmp, "merged.safetensors")
        limit_dir = os.path.join(tmp, "limit")
        os.makedirs(limit_dir)

        def tc_import():
            treecask.import_safetensors(src, cask, compression="none", overwrite=True)

        def peer_import():
            ts = {}
            for s in shards:
                ts.update(load_file(s))
            save_file(ts, merged, metadata={"format": "pt"})
            fsync_path(merged)
            fsync_path(tmp)

        def limit_import():
            # All shard bytes into one file.
            with open(os.path.join(limit_dir, "one"), "wb") as fo:
                for s in shards:
                    with open(s, "rb") as fi:
                        shutil.copyfileobj(fi, fo, 64 << 20)
                fo.flush()
                os.fsync(fo.fileno())
            fsync_path(limit_dir)

        t_imp = timed(tc_import, a.reps)
        t_imp_peer = timed(peer_import, a.reps)
        t_imp_lim = timed(limit_import, a.reps)

        out_dir = os.path.join(tmp, "export")
        peer_dir = os.path.join(tmp, "peer_export")
        os.makedirs(peer_dir)
        size = f"{a.shard_mib}MB"
        max_bytes = a.shard_mib * 10**6

        def tc_export():
            treecask.export_safetensors(cask, out_dir, max_shard_size=size, overwrite=True)

        def peer_export():
            ts = load_file(merged)
            groups, cur, n = [], {}, 0
            for k, v in ts.items():
                if cur and n + v.nbytes > max_bytes:
                    groups.append(cur)
                    cur, n = {}, 0
                cur[k] = v
                n += v.nbytes
            groups.append(cur)
            for i, g in enumerate(groups):
                p = os.path.join(peer_dir, f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors")
                save_file(g, p, metadata={"format": "pt"})
                fsync_path(p)
            fsync_path(peer_dir)

        def limit_export():
            copy_bytes(shards, [os.path.join(limit_dir, f"s{i}") for i in range(len(shards))])

        t_exp = timed(tc_export, a.reps)
        t_exp_peer = timed(peer_export, a.reps)
        t_exp_lim = timed(limit_export, a.reps)

        gb = data / 1e9
        print(f"Data {data / 2**20:.1f} MiB in {len(shards)} shards of <= {a.shard_mib} MiB; "
              f"{a.reps} repetitions, medians; warm page cache; treecask {treecask.__version__}.\n")
        print("| operation | treecask | limit (copy bytes + fsync) | safetensors package | treecask speed / limit speed | safetensors time / treecask time |")
        print("|---|---|---|---|---|---|")
        for name, t, lim, peer in (("import shards -> one file", t_imp, t_imp_lim, t_imp_peer),
                                   ("export one -> shards", t_exp, t_exp_lim, t_exp_peer)):
            print(f"| {name} | {t * 1e3:.0f} ms ({gb / t:.2f} GB/s) | {lim * 1e3:.0f} ms ({gb / lim:.2f} GB/s) | "
                  f"{peer * 1e3:.0f} ms ({gb / peer:.2f} GB/s) | {lim / t:.2f}x | {peer / t:.2f}x |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
