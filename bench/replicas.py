"""Replicas sharing the work (issue 30): bytes and time per process of a
4-process save and restore, treecask vs Orbax, same mesh, same run.

    python bench/replicas.py [--mib 64] [--mesh dp|hsdp] [--runs 1] [--dir /tmp]

Starts 4 processes on localhost (jax.distributed, gloo CPU collectives, one
CPU device each). Each builds the same global tree: float32 [rows, 1024]
matrices (together --mib MiB) on a mesh of 4 devices -- ``dp``: replicated
over ("data"=4), ``hsdp``: sharded over "model" and replicated over
"replica" of a (2, 2) mesh -- and, per run, timed in process 0 from a
barrier to the moment every process has returned:

* treecask.save(path, tree, compression="none")  (replica-parallel: each
  process writes its share of every replicated shard)
* orbax StandardCheckpointer().save(path, tree) + wait_until_finished()
  (Orbax 0.12.8: replica-parallel by default)
* treecask.load(path, shardings=...) with single_read=True (each stored byte
  read once in the job, the parts exchanged over the collectives) and False
* orbax StandardCheckpointer().restore(path, abstract tree with shardings)
* orbax single-replica restore of the same directory: a PyTreeCheckpointHandler
  whose registry maps jax.Array to SingleReplicaArrayHandler(replica_axis_index=0,
  primary_replica_id=0, broadcast_memory_limit_bytes=1 GiB) (the processes of
  replica 0 read, then broadcast over the collectives), restored with
  SingleReplicaArrayRestoreArgs. A local registry, not the global one, so the
  other Orbax sides keep the stock ArrayHandler. The limit is given because
  the default sizes the broadcast from the device's memory_stats(), which a CPU
  device does not report; 1 GiB puts the whole tree in one broadcast. Orbax
  needs the replica axis to be an axis of a mesh of two or more axes: on
  ``dp`` it restores onto the same 4 devices as a (4, 1) mesh, same P().
  The restored shards are checked against the saved ones after the timing.

Reports seconds, the bytes each process wrote (its shard file; Orbax: its
``ocdbt.process_<k>`` directory; the rest as "shared"), the bytes each
process read to place the leaves (treecask's ``_replicas.placed_bytes``),
the bytes each process's read calls returned during every restore side
(``rchar`` of /proc/self/io, all threads, before and after: every
read()/pread()/readv() of the process, checkpoint files and metadata; it
cannot see mmap, and the gloo exchanges do not show in it: treecask's
single-read exchange adds nothing to its 8 MiB per process and the processes
outside Orbax's primary replica read 0.0 while receiving the broadcast),
and each process's peak resident memory above its level before the side
(sampled every 2 ms). Not a test: the numbers depend on the machine and its
load. Orbax cannot write to a bucket (its kvstore spec knows gcs and file
only); this bench is on a local directory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap

CHILD = textwrap.dedent(
    r'''
    import json, os, shutil, sys, threading, time, traceback
    port, pid, mib, mesh_kind, runs, root = sys.argv[1:7]
    pid, mib, runs = int(pid), int(mib), int(runs)
    os.environ.pop("XLA_FLAGS", None)
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_num_cpu_devices", 1)
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=4, process_id=pid)
    import numpy as np
    import orbax.checkpoint as ocp
    import treecask
    from treecask import _replicas
    from jax._src.distributed import global_state
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from orbax.checkpoint import type_handlers as th

    client = global_state.client
    if mesh_kind == "dp":
        mesh, spec = Mesh(np.array(jax.devices()), ("data",)), P()
    else:
        mesh, spec = Mesh(np.array(jax.devices()).reshape(2, 2), ("replica", "model")), P(None, "model")
    sharding = NamedSharding(mesh, spec)
    n_layers, cols = 8, 1024
    rows = max(64, (mib << 20) // (4 * cols * n_layers) // 64 * 64)
    rng = np.random.default_rng(0)
    values = [rng.standard_normal((rows, cols)).astype(np.float32) for _ in range(n_layers)]
    tree = {"layers": [{"w": jax.make_array_from_callback(v.shape, sharding, lambda i, v=v: v[i])} for v in values],
            "step": 100}
    del values
    shardings = {"layers": [{"w": sharding} for _ in range(n_layers)]}
    abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
                                      if hasattr(x, "sharding") else x, tree)
    seq = [0]

    def barrier():
        seq[0] += 1
        client.wait_at_barrier(f"bench/{seq[0]}", 600_000)

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def rchar():
        with open("/proc/self/io") as f:
            return next(int(ln.split()[1]) for ln in f if ln.startswith("rchar:"))

    def timed(fn):
        barrier()
        base, peak, stop = rss(), [0], threading.Event()
        io0 = rchar()

        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], rss())
                time.sleep(0.002)

        t = threading.Thread(target=sample, daemon=True)
        t.start()
        t0 = time.perf_counter()
        try:
            out, error = fn(), None
        except Exception as e:  # reported in the table; a side failing on only some processes can leave
            # the others in its collectives until --timeout ends them all
            out, error = None, f"{type(e).__name__}: {e}"
            traceback.print_exc()
        finally:
            barrier()
            dt = time.perf_counter() - t0
            io = rchar() - io0
            stop.set()
            t.join()
        del out
        return dt, max(0, max(peak[0], rss()) - base), io, error

    def written(path):
        """Bytes under path per process (file name holding process_<k>), the rest as "shared"."""
        out = {}
        for d, _, files in os.walk(path):
            for f in files:
                p = os.path.join(d, f)
                rel = os.path.relpath(p, path)
                k = next((rel.split("process_")[1].split(".")[0].split("/")[0] for _ in [0]
                          if "process_" in rel), "shared")
                out[k] = out.get(k, 0) + os.path.getsize(p)
        return out

    ckptr = ocp.StandardCheckpointer()

    def orbax_save(path):
        ckptr.save(path, tree)
        ckptr.wait_until_finished()

    single_replica = ocp.Checkpointer(ocp.PyTreeCheckpointHandler(
        type_handler_registry=th.create_type_handler_registry(
            (int, th.ScalarHandler()),
            (jax.Array, th.SingleReplicaArrayHandler(replica_axis_index=0, primary_replica_id=0,
                                                     broadcast_memory_limit_bytes=1 << 30)))))
    # Orbax takes replica k as mesh.devices[k] along replica_axis_index, so it needs a mesh of two or more
    # axes: on the 1-D "data" mesh it fails (AttributeError in get_primary_replica_ids_and_pids on process 0,
    # "process_index k does not exist in provided `global_mesh`" on the others). On dp it gets the same four
    # devices as a (4, 1) ("data", "model") mesh with the same P(): the same placement.
    single_sharding = (NamedSharding(Mesh(np.array(jax.devices()).reshape(4, 1), ("data", "model")), P())
                       if mesh_kind == "dp" else sharding)
    single_args = jax.tree_util.tree_map(
        lambda x: th.SingleReplicaArrayRestoreArgs(sharding=single_sharding, global_shape=x.shape, dtype=x.dtype)
        if hasattr(x, "sharding") else ocp.RestoreArgs(), abstract)
    single_abstract = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=single_sharding) if hasattr(x, "sharding") else x,
        abstract)

    def orbax_single_replica(path):
        got = single_replica.restore(path, args=ocp.args.PyTreeRestore(item=single_abstract, restore_args=single_args))
        jax.block_until_ready(got)
        restored[0] = got
        return got

    def same_as_saved(got):
        """Each process's shards of the restored weights equal the saved ones (checked after the timing)."""
        return all(np.array_equal(np.asarray(a.addressable_data(0)), np.asarray(b.addressable_data(0)))
                   for a, b in zip(jax.tree_util.tree_leaves(got["layers"]), jax.tree_util.tree_leaves(tree["layers"])))

    restored = [None]

    def treecask_load(path, single_read):
        _replicas.placed_bytes = 0
        got = treecask.load(path, shardings=shardings, single_read=single_read)
        jax.block_until_ready(got)
        return got

    results = {}
    for r in range(runs):
        tpath, opath = os.path.join(root, f"treecask_{r}"), os.path.join(root, f"orbax_{r}")
        sides = [("treecask save", lambda: treecask.save(tpath, tree, compression="none"), tpath),
                 ("orbax save", lambda: orbax_save(opath), opath),
                 ("treecask load single_read", lambda: treecask_load(tpath, True), None),
                 ("treecask load each", lambda: treecask_load(tpath, False), None),
                 ("orbax restore", lambda: ckptr.restore(opath, abstract), None),
                 ("orbax single-replica", lambda: orbax_single_replica(opath), None)]
        for name, fn, path in sides:
            dt, peak, io, error = timed(fn)
            row = results.setdefault(name, {"seconds": [], "peak_rss": [], "read": 0, "written": {}, "rchar": [],
                                            "error": None})
            row["error"] = row["error"] or error
            row["seconds"].append(dt)
            row["peak_rss"].append(peak)
            row["rchar"].append(io)
            if restored[0] is not None:
                if not same_as_saved(restored[0]):
                    sys.exit(f"{name}: process {pid} restored different values")
                restored[0] = None
            if name.startswith("treecask load"):
                row["read"] = _replicas.placed_bytes
            if path is not None and pid == 0:
                row["written"] = written(path)
        barrier()
        if pid == 0:
            shutil.rmtree(tpath, ignore_errors=True)
            shutil.rmtree(opath, ignore_errors=True)
        barrier()
    total = sum(x.nbytes for x in jax.tree_util.tree_leaves(tree) if hasattr(x, "nbytes"))
    print("RESULT " + json.dumps({"pid": pid, "total": total, "results": results}), flush=True)
    '''
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=64, help="MiB of float32 weights")
    ap.add_argument("--mesh", choices=("dp", "hsdp"), default="dp")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--verbose", action="store_true", help="print each process's output")
    ap.add_argument("--timeout", type=float, default=600, help="seconds before the processes are killed")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="treecask-replicas-bench-", dir=args.dir)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    script = os.path.join(root, "child.py")
    with open(script, "w") as f:
        f.write(CHILD)
    try:
        procs = [subprocess.Popen([sys.executable, script, str(port), str(i), str(args.mib), args.mesh,
                                   str(args.runs), root], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, env=env) for i in range(4)]
        outs = []
        for p in procs:
            try:
                outs.append(p.communicate(timeout=args.timeout)[0])
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                outs.append(p.communicate()[0] + f"\n(killed after {args.timeout} s)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    lines = [next((ln for ln in o.splitlines() if ln.startswith("RESULT ")), None) for o in outs]
    if None in lines or any(p.returncode for p in procs):
        sys.exit("benchmark failed:\n" + "\n---\n".join(outs))
    if args.verbose:
        for i, o in enumerate(outs):
            print(f"--- process {i}\n{o}")
    res = [json.loads(ln[len("RESULT "):]) for ln in lines]
    mib = 2**20
    print(f"4 processes x 1 CPU device, mesh {args.mesh}, tree {res[0]['total'] / mib:.0f} MiB, "
          f"median of {args.runs} run(s) (seconds: process 0, barrier to barrier)")
    for name, row in res[0]["results"].items():
        sec = sorted(row["seconds"])[len(row["seconds"]) // 2]
        peaks = " ".join(f"{max(r['results'][name]['peak_rss']) / mib:.0f}" for r in res)
        line = f"  {name:26s} {sec:7.3f} s  peak RSS above start per process (MiB): {peaks}"
        if row["written"]:
            w = row["written"]
            line += "  written (MiB): " + " ".join(f"{k}={v / mib:.1f}" for k, v in sorted(w.items()))
        if name.startswith("treecask load"):
            line += "  read (MiB): " + " ".join(f"{r['results'][name]['read'] / mib:.1f}" for r in res)
        if not row["written"]:
            line += "  rchar (MiB): " + " ".join(f"{max(r['results'][name]['rchar']) / mib:.1f}" for r in res)
        errors = sorted({r["results"][name]["error"] for r in res if r["results"][name]["error"]})
        if errors:
            line += "  FAILED: " + " | ".join(errors)
        print(line)


if __name__ == "__main__":
    main()
