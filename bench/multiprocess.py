"""Two-process save throughput: treecask vs Orbax, same tree, same run.

    python bench/multiprocess.py [--mib 512] [--runs 3] [--dir /tmp] [--devices 4]

Starts 2 processes on localhost (jax.distributed, gloo CPU collectives,
--devices CPU devices each). Each builds the same global tree: float32
matrices sharded P("x", "y") over a (2 * devices / 2, 2) mesh (together
--mib MiB) plus a replicated bf16 embedding (1/16 of that) and a scalar. Per
run, interleaved, every process (after a barrier, timed in process 0 from
the barrier to the save's return, i.e. until the checkpoint is committed):

* treecask.save(path, tree, compression="none")   (durable: fsync + commit)
* orbax StandardCheckpointer().save(path, tree) + wait_until_finished()
* limit: each process writes its own replica-0 shard bytes to one file with
  os.write and fsyncs it -- the durable write the storage allows, done by
  both processes in parallel (the physical limit of a sharded save here)

and memcpy of those bytes (np.copyto) for the memory-bandwidth reference.
Reports medians in GiB/s of the global tree bytes and the ratios. Not a
test: the numbers depend on the machine and its load.
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
    import json, os, shutil, statistics, sys, time
    port, pid, ndev, mib, runs, root = sys.argv[1:7]
    pid, ndev, mib, runs = int(pid), int(ndev), int(mib), int(runs)
    os.environ.pop("XLA_FLAGS", None)
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_num_cpu_devices", ndev)
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid)
    import numpy as np
    import jax.numpy as jnp
    import orbax.checkpoint as ocp
    import treecask
    from jax._src.distributed import global_state
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    client = global_state.client
    mesh = Mesh(np.array(jax.devices()).reshape(ndev, 2), ("x", "y"))
    rows = 4096
    n_layers = 8
    cols = max(256, (mib << 20) // (4 * rows * n_layers) // 256 * 256)
    rng = np.random.default_rng(0)

    def global_array(shape, dtype, spec):
        def cb(idx):
            return rng.standard_normal([s.indices(n)[1] - s.indices(n)[0] for s, n in zip(idx, shape)]).astype(dtype)
        return jax.make_array_from_callback(shape, NamedSharding(mesh, spec), cb)

    tree = {"layers": [{"w": global_array((rows, cols), np.float32, P("x", "y"))} for _ in range(n_layers)],
            "embed": global_array((rows // 4, cols // 4), jnp.bfloat16, P()),
            "step": 100}
    total = sum(x.nbytes for x in jax.tree_util.tree_leaves(tree) if hasattr(x, "nbytes"))
    mine = [np.asarray(s.data) for x in jax.tree_util.tree_leaves(tree) if hasattr(x, "addressable_shards")
            for s in x.addressable_shards if s.replica_id == 0]
    mine_bytes = sum(a.nbytes for a in mine)
    seq = [0]

    def barrier():
        seq[0] += 1
        client.wait_at_barrier(f"bench/{seq[0]}", 600_000)

    def timed(fn):
        barrier()
        t = time.perf_counter()
        fn()
        barrier()
        return time.perf_counter() - t

    def limit(path):
        fd = os.open(f"{path}.{pid}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        for a in mine:
            view = memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8))
            while len(view):
                view = view[os.write(fd, view):]
        os.fsync(fd)
        os.close(fd)

    def memcpy():
        for a in mine:
            np.copyto(np.empty_like(a), a)

    ckptr = ocp.StandardCheckpointer()

    def orbax_save(path):
        ckptr.save(path, tree)
        ckptr.wait_until_finished()

    results = {"treecask": [], "orbax": [], "limit": [], "memcpy": []}
    for r in range(runs):
        for name in ("treecask", "orbax", "limit", "memcpy"):
            path = os.path.join(root, f"{name}_{r}")
            print("start", name, r, flush=True)
            if name == "treecask":
                dt = timed(lambda: treecask.save(path, tree, compression="none"))
            elif name == "orbax":
                dt = timed(lambda: orbax_save(path))
            elif name == "limit":
                dt = timed(lambda: limit(path))
            else:
                dt = timed(memcpy)
            results[name].append(dt)
            barrier()
            if pid == 0:
                shutil.rmtree(path, ignore_errors=True)
                for k in range(2):
                    if os.path.exists(f"{path}.{k}"):
                        os.unlink(f"{path}.{k}")
            barrier()
    if pid == 0:
        print("RESULT " + json.dumps({"total_bytes": total, "process0_bytes": mine_bytes,
                                      "seconds": {k: statistics.median(v) for k, v in results.items()}}), flush=True)
    '''
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=512, help="MiB of sharded float32 weights")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--devices", type=int, default=4, help="CPU devices per process")
    ap.add_argument("--dir", default=tempfile.gettempdir())
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="treecask-mp-bench-", dir=args.dir)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    script = os.path.join(root, "child.py")
    with open(script, "w") as f:
        f.write(CHILD)
    try:
        procs = [subprocess.Popen([sys.executable, script, str(port), str(i), str(args.devices), str(args.mib),
                                   str(args.runs), root], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, env=env) for i in range(2)]
        outs = [p.communicate()[0] for p in procs]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    line = next((ln for ln in outs[0].splitlines() if ln.startswith("RESULT ")), None)
    if line is None or any(p.returncode for p in procs):
        sys.exit("benchmark failed:\n" + "\n---\n".join(outs))
    res = json.loads(line[len("RESULT "):])
    gib = res["total_bytes"] / 2**30
    sec = res["seconds"]
    print(f"2 processes x {args.devices} CPU devices, tree {res['total_bytes'] / 2**20:.0f} MiB "
          f"(process 0 writes {res['process0_bytes'] / 2**20:.0f} MiB), median of {args.runs} runs")
    for k in ("treecask", "orbax", "limit", "memcpy"):
        print(f"  {k:9s} {sec[k]:7.3f} s  {gib / sec[k]:6.2f} GiB/s")
    print(f"  treecask / orbax speed:  {sec['orbax'] / sec['treecask']:.2f}x")
    print(f"  treecask / limit (parallel write+fsync of the same shard bytes): {sec['limit'] / sec['treecask']:.2f}")
    print(f"  treecask / memcpy: {sec['memcpy'] / sec['treecask']:.3f}")


if __name__ == "__main__":
    main()
