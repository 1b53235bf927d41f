"""Saving to an object store against its limit and against doing it by hand,
same run, same server (docs/remote.md "Saving to object stores";
python/treecask/stores/_upload.py); CheckpointManager on a bucket against the local
one; a 2-process jax.distributed save to a bucket against saving locally and
uploading by hand (issue 21, "Benchmarks").

    python bench/remote_save.py [--pairs 5] [--mib 256] [--mgr-mib 128] [--mp-mib 128]
                                [--parts save,manager,mp] [--quick] [--no-rss] [--no-orbax]

The server is the tests' SeaweedFS (`weed mini`, tests/python/stores.py) on
127.0.0.1. The tree: float32 leaves of 32-64 MiB (random bits), saved with
compression="none". Contenders, each timed once per round (interleaved
rounds; median with min-max):

1. limit: obstore.put of the same bytes (the archive, saved locally once)
   from a local file, multipart with the upload's own part size and
   concurrency (_upload.PART_BYTES, PARTS_IN_FLIGHT), through the same
   obstore client treecask uses: the upload alone, no archive written.
2. treecask.save(url, tree) to a new key (the conditional commit: with
   botocore installed, one multipart upload straight to the key completed
   with If-None-Match, python/treecask/stores/_s3.py; without it, a
   multipart upload to a temporary object, conditional server-side copy onto
   the key, delete of the temporary; then the confirming ranged GET), and
   with overwrite=True onto an existing key (multipart straight to the key).
   The new-key save is also split into its phases (upload, copy, confirm,
   the rest: listing and local write) by timing the calls the commit makes.
3. save-then-upload by hand: treecask.save to a local file (durable=False,
   as the URL save writes its scratch) then the same obstore.put as the limit.

Every object is deleted after its timing and SeaweedFS is asked to vacuum
(its master's /vol/vacuum, until its data directory is empty again) after
a contender (untimed) whenever the next one might not fit, so that its store stays under
its cap (16 volumes of 64 MiB). Peak RSS growth of each case is measured in
a fresh subprocess (VmHWM reset through /proc/self/clear_refs, then VmHWM
minus VmRSS before the call): the upload's buffers are bounded by
PART_BYTES * PARTS_IN_FLIGHT (128 MiB).

Orbax (--no-orbax to skip): whether orbax-checkpoint can save to gs:// or
s3:// against the emulators, tried in a network namespace of its own
(`unshare -rn`: only a loopback interface, so nothing can reach a
non-loopback address, the cloud metadata server included), with SeaweedFS
and fake-gcs-server started inside it.

Manager part (--mgr-mib, a tree of 32 MiB float32 leaves, once as jax.Array
leaves on jax's CPU device and once as NumPy arrays): per round and tree,
CheckpointManager(local dir).save(1, tree) and
CheckpointManager("s3://bench/<prefix>/run").save(1, tree) (asynchronous, the
default; a fresh manager each time, their order swapped every round), timed
until save() returns (the blocking time) and until wait_until_finished()
returns (committed), then a synchronous treecask.save("s3://...", tree) of
the same tree.

Two-process part (--mp-mib): a jax.distributed job of two processes of this
script (coordinator, gloo collectives and S3 all on 127.0.0.1; 2 CPU devices
each; a float32 array sharded by rows over the 4 devices), each round
treecask.save("s3://bench/mp/url-<r>/ckpt", tree) against
treecask.save(local dir) then each process obstore.put of its own shard file
and, after a barrier, process 0's put of index.cask; timed in process 0 from
a barrier before to a barrier after; the whole job killed after MP_TIMEOUT.

Every part after an untimed warm-up round; objects deleted and SeaweedFS
compacted between contenders (untimed). Nothing here contacts a non-loopback
address.

Not a test: the numbers depend on the machine's load (printed at the start).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))
import stores  # noqa: E402  (the tests' loopback servers)

import treecask  # noqa: E402
from treecask.stores import ObjectStore, _upload  # noqa: E402

MIB = 1 << 20
BUCKET = "bench"


# ---------------------------------------------------------------- the tree

def leaf_sizes(mib: int) -> list:
    """Leaf sizes in MiB summing to `mib`: 32 MiB leaves up to 128 MiB, else
    64, 48, 32, 64, 48 (256 MiB) repeated, the last one cut short."""
    pattern = (32,) if mib <= 128 else (64, 48, 32, 64, 48)
    out, left = [], mib
    while left > 0:
        s = min(pattern[len(out) % len(pattern)], left)
        out.append(s)
        left -= s
    return out


def make_tree(mib: int) -> dict:
    rng = np.random.default_rng(0)
    return {f"w{i:02d}": rng.integers(0, 2**31, size=s * MIB // 4, dtype=np.int32).view(np.float32)
            for i, s in enumerate(leaf_sizes(mib))}


# ---------------------------------------------------------------- helpers

def fmt(ts) -> str:
    return f"{statistics.median(ts) * 1e3:.0f} ms ({min(ts) * 1e3:.0f}-{max(ts) * 1e3:.0f})"


def put_limit(store, key: str, path: str):
    """What _upload._put_parts does, on a file: the limit of the upload."""
    import obstore
    with open(path, "rb") as f:
        obstore.put(store, key, f, use_multipart=True, chunk_size=_upload.PART_BYTES,
                    max_concurrency=_upload.PARTS_IN_FLIGHT)


def delete(store, key: str):
    import obstore
    with contextlib.suppress(Exception):
        obstore.delete(store, key)


def leftovers(store) -> list:
    import obstore
    return [m["path"] for batch in obstore.list(store, "", chunk_size=1000) for m in batch]


@contextlib.contextmanager
def phases(acc: dict):
    """Times the calls a save to an object store makes (the pre-check's
    listing, Store.check_new; multipart upload, server-side copy, deletes,
    the confirm) into `acc` (seconds, summed); the rest of a save is the
    local write of the archive."""
    import obstore
    from treecask.stores import _s3
    from treecask.stores._store import Store
    saved = {"_put_parts": _upload._put_parts, "confirm": _upload.confirm}
    saved_store = {"check_new": Store.check_new}
    saved_ob = {"copy": obstore.copy, "delete": obstore.delete}
    saved_s3 = {"put_new": _s3.S3.put_new, "abort_dead": _s3.S3.abort_dead}

    def wrap(name, fn):
        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                acc[name] = acc.get(name, 0.0) + time.perf_counter() - t
        return timed

    names = {"check_new": "listing", "_put_parts": "multipart upload", "copy": "conditional copy",
             "delete": "temporary delete", "confirm": "confirm (ranged GET)",
             "put_new": "conditional multipart upload (botocore)", "abort_dead": "multipart listing (botocore)"}
    try:
        for k, fn in saved.items():
            setattr(_upload, k, wrap(names[k], fn))
        for k, fn in saved_ob.items():
            setattr(obstore, k, wrap(names[k], fn))
        for k, fn in saved_s3.items():
            setattr(_s3.S3, k, wrap(names[k], fn))
        for k, fn in saved_store.items():
            setattr(Store, k, wrap(names[k], fn))
        yield acc
    finally:
        for k, fn in saved.items():
            setattr(_upload, k, fn)
        for k, fn in saved_ob.items():
            setattr(obstore, k, fn)
        for k, fn in saved_s3.items():
            setattr(_s3.S3, k, fn)
        for k, fn in saved_store.items():
            setattr(Store, k, fn)


def master_port(s3) -> int:
    for a in s3.server.argv:
        if a.startswith("-master.port="):
            return int(a.split("=", 1)[1])
    raise RuntimeError("no -master.port in the weed command")


STORE_CAP = 1024 * MIB  # SeaweedFS's volumes: 16 of 64 MiB (stores.py)


def _port(s3) -> int:
    return s3 if isinstance(s3, int) else master_port(s3)  # the S3Server, or its master's port


def master_bytes(s3) -> int:
    """The volumes' bytes as SeaweedFS's master sees them (/vol/status): what
    it assigns writes by. It learns a volume's size from the volume server's
    heartbeat, a few seconds after a compaction: until then a compacted
    volume still counts as full, and a write that needs the volumes it thinks
    full fails with 500 (a 256 MiB run's overwrite contender did, right after
    a vacuum). -1 if the master does not answer."""
    url = f"http://{stores.LOOPBACK}:{_port(s3)}/vol/status"
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            status = json.load(r)
    except Exception:  # noqa: BLE001
        return -1
    total = 0

    def walk(x):
        nonlocal total
        if isinstance(x, dict):
            if "Id" in x and "Size" in x:
                total += int(x["Size"])
            else:
                for v in x.values():
                    walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
    walk(status)
    return total


def make_room(s3, data_dir: pathlib.Path, need: int) -> int:
    """The store's bytes on disk now (deleted objects not yet compacted
    included); vacuums first unless they (and the master's view of them,
    master_bytes) and `need` more bytes stay within half of STORE_CAP (the
    cap counts volumes, and a volume that holds garbage is not written again
    until compacted: bytes alone are no safe measure -- a run that let them
    reach 833 MiB got 500 errors)."""
    used = du(data_dir)
    if max(used, master_bytes(s3)) + need > STORE_CAP // 2:
        vacuum(s3, data_dir)
    return used


def vacuum(s3, data_dir: pathlib.Path, timeout: float = 60.0) -> float:
    """Compacts SeaweedFS's volumes once every object is deleted: asks its
    master to vacuum (/vol/vacuum) once a second until the data directory is
    (nearly) empty -- the filer deletes a removed object's chunks a moment
    later, so the first request may find no garbage yet -- then waits until
    the master sees it too (master_bytes, the next heartbeat). Returns the
    seconds it took (untimed work)."""
    url = f"http://{stores.LOOPBACK}:{_port(s3)}/vol/vacuum?garbageThreshold=0.0001"
    t = time.perf_counter()
    while time.perf_counter() - t < timeout:
        with contextlib.suppress(Exception):
            urllib.request.urlopen(url, timeout=120).read()
        if du(data_dir) < 8 * MIB:
            break
        time.sleep(0.5)
    while time.perf_counter() - t < timeout and master_bytes(s3) >= 8 * MIB:
        time.sleep(0.25)
    return time.perf_counter() - t


def du(path: pathlib.Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# ---------------------------------------------------------------- timed rounds

def bench_times(s3, tree, local_archive: str, tmp: str, pairs: int):
    store = ObjectStore.from_url(f"s3://{BUCKET}/x")[0].store  # treecask's own client
    size = os.path.getsize(local_archive)
    n = [0]

    def fresh(prefix):
        n[0] += 1
        return f"{prefix}-{n[0]:03d}.cask"

    times = {k: [] for k in ("limit", "save", "save_ow", "by_hand")}
    split: dict = {}
    data_dir = pathlib.Path(tmp) / "s3" / "data"
    peak_store = [0]

    def clean():
        """Untimed, after each contender (whose objects are deleted): the
        store's bytes on disk, then a vacuum if the next contender's two
        objects (a temporary and its copy) might not fit."""
        peak_store[0] = max(peak_store[0], make_room(s3, data_dir, 2 * size))

    def run_limit():
        key = fresh("limit")
        t = time.perf_counter()
        put_limit(store, key, local_archive)
        times["limit"].append(time.perf_counter() - t)
        delete(store, key)

    def run_save():
        key = fresh("save")
        acc: dict = {}
        with phases(acc):
            t = time.perf_counter()
            treecask.save(f"s3://{BUCKET}/{key}", tree, compression="none")
            total = time.perf_counter() - t
        times["save"].append(total)
        acc["local write (rest)"] = total - sum(acc.values())
        for k, v in acc.items():
            split.setdefault(k, []).append(v)
        delete(store, key)

    def run_save_ow():
        key = fresh("overwrite")
        put_limit(store, key, local_archive)  # the existing object it replaces (untimed)
        t = time.perf_counter()
        treecask.save(f"s3://{BUCKET}/{key}", tree, compression="none", overwrite=True)
        times["save_ow"].append(time.perf_counter() - t)
        delete(store, key)

    def run_by_hand():
        key = fresh("byhand")
        local = os.path.join(tmp, "by-hand.cask")
        t = time.perf_counter()
        treecask.save(local, tree, compression="none", durable=False, overwrite=True)
        put_limit(store, key, local)
        times["by_hand"].append(time.perf_counter() - t)
        os.unlink(local)
        delete(store, key)

    # One untimed warm-up of each path (connections, first-touch of the code).
    for fn in (run_limit, run_save, run_save_ow, run_by_hand):
        fn()
        clean()
    for v in times.values():
        v.clear()
    split.clear()
    for _ in range(pairs):
        for fn in (run_limit, run_save, run_save_ow, run_by_hand):
            fn()
            clean()
    return size, times, split, leftovers(store), peak_store[0]


# ---------------------------------------------------------------- peak RSS (child)

def _status(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def rss_child(case: str, mib: int, local_archive: str, tmp: str) -> dict:
    """Runs one case once in this (fresh) process; the peak RSS above the RSS
    just before the call."""
    store = ObjectStore.from_url(f"s3://{BUCKET}/x")[0].store
    tree = make_tree(mib) if case != "limit" else None
    key = f"rss-{case}.cask"
    if case == "save_ow":
        put_limit(store, key, local_archive)
    reset = True
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    except OSError:
        reset = False
    before = _status("VmRSS")
    if case == "limit":
        put_limit(store, key, local_archive)
    elif case == "save":
        treecask.save(f"s3://{BUCKET}/{key}", tree, compression="none")
    elif case == "save_ow":
        treecask.save(f"s3://{BUCKET}/{key}", tree, compression="none", overwrite=True)
    elif case == "by_hand":
        local = os.path.join(tmp, "rss-by-hand.cask")
        treecask.save(local, tree, compression="none", durable=False, overwrite=True)
        put_limit(store, key, local)
        os.unlink(local)
    peak = _status("VmHWM")
    delete(store, key)
    return {"case": case, "before": before, "peak": peak, "growth": peak - before, "hwm_reset": reset}


def bench_rss(s3, mib: int, local_archive: str, tmp: str) -> dict:
    out = {}
    for case in ("limit", "save", "save_ow", "by_hand"):
        r = subprocess.run([sys.executable, __file__, "--rss-child", case, "--mib", str(mib),
                            "--archive", local_archive, "--tmp", tmp],
                           capture_output=True, text=True, env=dict(os.environ, **s3.env()), timeout=600)
        if r.returncode != 0:
            out[case] = {"error": r.stderr.strip()[-600:]}
        else:
            out[case] = json.loads(r.stdout.strip().splitlines()[-1])
        make_room(s3, pathlib.Path(tmp) / "s3" / "data", 2 * os.path.getsize(local_archive))
    return out


# ---------------------------------------------------------------- Orbax (network namespace)

ORBAX_PROBE_TIMEOUT = 240


def orbax_probe(tmp: str) -> dict:
    """Runs inside `unshare -rn` (loopback only): starts SeaweedFS and
    fake-gcs-server here, then tries Orbax's StandardCheckpointer on s3:// and
    gs:// (and tensorstore's own gcs kvstore, which Orbax writes arrays
    through, on the emulator). Returns what happened, per attempt."""
    res = {}
    tree = {"w": np.arange(1024, dtype=np.float32)}
    with stores.seaweedfs(pathlib.Path(tmp) / "s3") as s3, stores.fake_gcs(pathlib.Path(tmp) / "gcs") as gcs:
        s3.create_bucket(BUCKET)
        gcs.create_bucket(BUCKET)
        os.environ.update(s3.env())
        os.environ.update(gcs.env())
        # tensorstore: the emulator's URL and a fixed bearer token (no credential lookup).
        os.environ["TENSORSTORE_GCS_HTTP_URL"] = gcs.endpoint
        os.environ["GOOGLE_AUTH_TOKEN_FOR_TESTING"] = "dummy"
        try:
            import orbax.checkpoint as ocp
            res["orbax_version"] = getattr(ocp, "__version__", "?")
        except Exception as e:  # noqa: BLE001
            return {"import": f"{type(e).__name__}: {e}"}
        for url in (f"s3://{BUCKET}/orbax-ckpt", f"gs://{BUCKET}/orbax-ckpt"):
            try:
                ckptr = ocp.StandardCheckpointer()
                ckptr.save(url, tree)
                ckptr.wait_until_finished()
                res[url] = "saved"
            except BaseException as e:  # noqa: BLE001
                res[url] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        try:
            import tensorstore as ts
            kv = ts.KvStore.open({"driver": "gcs", "bucket": BUCKET}).result()
            kv.write("ts-probe", b"hello").result()
            back = kv.read("ts-probe").result().value
            res["tensorstore gcs kvstore"] = "wrote and read back" if back == b"hello" else f"read {back!r}"
        except BaseException as e:  # noqa: BLE001
            res["tensorstore gcs kvstore"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    return res


def bench_orbax(tmp: str) -> dict:
    unshare = shutil.which("unshare")
    if not unshare:
        return {"skipped": "no unshare(1): not run (it must not reach a non-loopback address)"}
    d = os.path.join(tmp, "orbax-ns")
    os.makedirs(d, exist_ok=True)
    cmd = [unshare, "-rn", "sh", "-c",
           'ip link set lo up && exec "$0" "$1" --orbax-child --tmp "$2"', sys.executable, __file__, d]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=ORBAX_PROBE_TIMEOUT)
    except subprocess.TimeoutExpired:
        return {"error": f"no answer within {ORBAX_PROBE_TIMEOUT} s"}
    if r.returncode != 0:
        return {"error": (r.stderr.strip() or r.stdout.strip())[-600:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- manager on a bucket

def delete_prefix(store, prefix: str) -> int:
    """Deletes every object under `prefix`; returns how many there were."""
    import obstore
    names = [m["path"] for batch in obstore.list(store, prefix, chunk_size=1000) for m in batch]
    for n in names:
        delete(store, n)
    return len(names)


def jax_tree(tree: dict) -> dict:
    """The same leaves as jax.Arrays on jax's CPU device (copies, computed)."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    out = {k: jax.device_put(v) for k, v in tree.items()}
    jax.block_until_ready(out)
    return out


MANAGER_TIMES = ("local_block", "local_commit", "bucket_block", "bucket_commit", "sync")


def bench_manager(s3, mib: int, pairs: int, tmp: str) -> dict:
    """CheckpointManager(s3://...).save against CheckpointManager(dir).save
    (the time until save() returns, and until wait_until_finished() returns)
    and against a synchronous treecask.save(url), for a tree of jax.Array
    leaves and the same tree as NumPy arrays. One fresh manager per timing
    (directory or bucket prefix), asynchronous (the default), step 1, its
    step deleted afterwards (untimed). Interleaved: per round, per tree,
    the local and the bucket manager (their order swapped every round), then
    the synchronous save."""
    store = ObjectStore.from_url(f"s3://{BUCKET}/x")[0].store
    data_dir = pathlib.Path(tmp) / "s3" / "data"
    np_tree = make_tree(mib)
    trees = {"jax.Array": jax_tree(np_tree), "NumPy": np_tree}
    size = sum(v.nbytes for v in np_tree.values())
    times = {kind: {k: [] for k in MANAGER_TIMES} for kind in trees}
    n = [0]

    def manager(kind: str, where: str, out: dict):
        n[0] += 1
        prefix = f"mgr-{n[0]:03d}/"
        d = os.path.join(tmp, prefix) if where == "local" else f"s3://{BUCKET}/{prefix}run"
        mngr = treecask.CheckpointManager(d, compression="none")
        try:
            t = time.perf_counter()
            mngr.save(1, trees[kind])
            blocked = time.perf_counter() - t
            mngr.wait_until_finished()
            committed = time.perf_counter() - t
            if mngr.all_steps() != [1]:
                raise RuntimeError(f"{d}: steps {mngr.all_steps()} after saving step 1")
        finally:
            mngr.close()
        out[f"{where}_block"].append(blocked)
        out[f"{where}_commit"].append(committed)
        if where == "local":
            shutil.rmtree(d)
        else:
            delete_prefix(store, prefix)
            make_room(s3, data_dir, 2 * size)

    def sync(kind: str, out: dict):
        n[0] += 1
        key = f"sync-{n[0]:03d}.cask"
        t = time.perf_counter()
        treecask.save(f"s3://{BUCKET}/{key}", trees[kind], compression="none")
        out["sync"].append(time.perf_counter() - t)
        delete(store, key)
        make_room(s3, data_dir, 2 * size)

    def one_round(r: int):
        for kind, out in times.items():
            for where in (("local", "bucket") if r % 2 == 0 else ("bucket", "local")):
                manager(kind, where, out)
            sync(kind, out)

    one_round(0)  # untimed warm-up
    for kind in times.values():
        for v in kind.values():
            v.clear()
    for r in range(pairs):
        one_round(r)
    return {"size": size, "times": times, "left": leftovers(store)}


# ---------------------------------------------------------------- two processes (jax.distributed)

MP_TIMEOUT = 360  # seconds for the whole 2-process job (start, rounds, exit)
MP_BARRIER_MS = 240_000


def mp_child(port: int, nproc: int, pid: int, mib: int, pairs: int, local_root: str, data_dir: str,
             mport: int) -> None:
    """One process of the 2-process job (started by bench_two_process): 2 CPU
    devices each, gloo collectives bound to 127.0.0.1, a float32 array of
    `mib` MiB sharded by rows over the 4 devices (each process holds half),
    then per round (after an untimed warm-up round) and between barriers of
    the coordination service:

    - url: treecask.save("s3://bench/mp/url-<r>/ckpt", tree)
    - by_hand: treecask.save(local dir, tree, durable=False) (the sharded
      directory: index.cask, process_<k>.cask), then each process puts its
      own process_<k>.cask (obstore.put, multipart, the upload's part size
      and concurrency), a barrier, then process 0 puts index.cask (last, as
      a commit would).

    Objects and directories are deleted, and SeaweedFS compacted, between
    contenders (untimed, process 0, between barriers). Process 0 prints
    MP_RESULT <json>; every process ends with CHILD OK <pid>."""
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_num_cpu_devices", 2)
    from jax._src import xla_bridge
    make_gloo = xla_bridge._jax.make_gloo_tcp_collectives
    # gloo's TCP device on 127.0.0.1 (not the address the host name resolves to).
    gloo_on = []

    def loopback_gloo(distributed_client, **_):
        gloo_on.append(stores.LOOPBACK)
        return make_gloo(distributed_client, hostname=stores.LOOPBACK)
    xla_bridge._jax.make_gloo_tcp_collectives = loopback_gloo
    jax.distributed.initialize(f"{stores.LOOPBACK}:{port}", num_processes=nproc, process_id=pid)
    import obstore
    from jax._src.distributed import global_state
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    client = global_state.client
    cols = 1024
    rows = mib * MIB // 4 // cols
    mesh = Mesh(np.array(jax.devices()), ("x",))

    def shard(index):
        r = index[0]
        start, stop = r.start or 0, rows if r.stop is None else r.stop
        return (np.random.default_rng(start).integers(0, 2**31, size=(stop - start, cols), dtype=np.int32)
                .view(np.float32))

    tree = {"w": jax.make_array_from_callback((rows, cols), NamedSharding(mesh, P("x")), shard), "step": 1}
    store = ObjectStore.from_url(f"s3://{BUCKET}/x")[0].store
    nb = [0]

    def barrier():
        nb[0] += 1
        client.wait_at_barrier(f"remote_save_bench/{nb[0]}", MP_BARRIER_MS)

    def clean(prefix: str, local: str = ""):
        """Untimed: process 0 deletes the contender's objects (checking there
        were 3: index and two shard files) and its local directory, then
        makes room in the store."""
        barrier()
        if pid == 0:
            got = delete_prefix(store, prefix)
            if got != 3:
                raise RuntimeError(f"{prefix}: {got} objects, expected index.cask and 2 shard files")
            if local:
                shutil.rmtree(local)
            make_room(mport, pathlib.Path(data_dir), 2 * mib * MIB)
        barrier()

    def run_url(r: int) -> float:
        barrier()
        t = time.perf_counter()
        treecask.save(f"s3://{BUCKET}/mp/url-{r}/ckpt", tree, compression="none")
        barrier()
        dt = time.perf_counter() - t
        clean(f"mp/url-{r}/")
        return dt

    def run_by_hand(r: int):
        local = os.path.join(local_root, f"by-hand-{r}")
        key = f"mp/by-hand-{r}/ckpt"
        barrier()
        t = time.perf_counter()
        treecask.save(local, tree, compression="none", durable=False)
        t_local = time.perf_counter() - t
        put_limit(store, f"{key}/process_{pid}.cask", os.path.join(local, f"process_{pid}.cask"))
        barrier()
        if pid == 0:
            with open(os.path.join(local, "index.cask"), "rb") as f:
                obstore.put(store, f"{key}/index.cask", f.read())
        barrier()
        dt = time.perf_counter() - t
        shard_bytes = os.path.getsize(os.path.join(local, f"process_{pid}.cask"))
        clean(f"mp/by-hand-{r}/", local)
        return dt, t_local, shard_bytes

    res = {"url": [], "by_hand": [], "by_hand_local": []}
    for r in range(pairs + 1):  # round 0: untimed warm-up
        a = run_url(r)
        b, b_local, shard_bytes = run_by_hand(r)
        if r:
            res["url"].append(a)
            res["by_hand"].append(b)
            res["by_hand_local"].append(b_local)
    res["shard_bytes"] = shard_bytes
    res["devices"] = (f"{jax.process_count()} processes x {jax.local_device_count()} CPU devices, gloo "
                      f"collectives on {gloo_on[0] if gloo_on else '(gloo not created)'}")
    if pid == 0:
        print("MP_RESULT " + json.dumps(res), flush=True)
    barrier()
    print(f"CHILD OK {pid}", flush=True)


def bench_two_process(s3, mib: int, pairs: int, tmp: str) -> dict:
    """Starts the 2-process jax.distributed job (mp_child; coordinator on a
    free 127.0.0.1 port, CPU only, the environment of tests/python/jobs.py)
    and returns process 0's result, or {"error": ...}; the whole job is
    killed after MP_TIMEOUT seconds."""
    from jobs import free_port
    local_root = os.path.join(tmp, "mp-local")
    os.makedirs(local_root, exist_ok=True)
    port = free_port()
    env = dict(os.environ, **s3.env())
    env.pop("XLA_FLAGS", None)
    env["JAX_PLATFORMS"] = "cpu"
    env["TREECASK_BARRIER_TIMEOUT_S"] = "120"
    procs, logs = [], []
    for i in range(2):
        log = open(os.path.join(tmp, f"mp-{i}.log"), "w+")
        logs.append(log)
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "--mp-child", str(port), "2", str(i), "--mib", str(mib), "--pairs",
             str(pairs), "--local-root", local_root, "--data-dir", str(pathlib.Path(tmp) / "s3" / "data"),
             "--master-port", str(master_port(s3))],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env))
    deadline = time.monotonic() + MP_TIMEOUT
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        timed_out = any(p.poll() is None for p in procs)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    outs = []
    for log in logs:
        log.seek(0)
        outs.append(log.read())
        log.close()
    if timed_out:
        return {"error": f"killed after {MP_TIMEOUT} s; process 0 said: {outs[0][-800:]}"}
    for i, (p, out) in enumerate(zip(procs, outs)):
        if p.returncode != 0 or f"CHILD OK {i}" not in out:
            return {"error": f"process {i} exited {p.returncode}: {out[-1500:]}"}
    for line in outs[0].splitlines():
        if line.startswith("MP_RESULT "):
            return json.loads(line[len("MP_RESULT "):])
    return {"error": "no MP_RESULT from process 0"}


# ---------------------------------------------------------------- report

def _new_key_path() -> str:
    """How this run commits a new large key (docs/stores.md "S3 with botocore")."""
    from treecask.stores import _s3
    store = ObjectStore.from_url(f"s3://{BUCKET}/x")[0].store
    return ("conditional multipart straight to the key, botocore" if _s3.for_store(store) is not None
            else "temporary + conditional copy")


def report(size, times, split, rss, pairs):
    med = {k: statistics.median(v) for k, v in times.items()}
    gib = size / 2**30
    print(f"\n### Saving {size / MIB:.1f} MiB to S3 (SeaweedFS on loopback), {pairs} interleaved rounds\n")
    print("| contender | time, median (min-max) | GiB/s | limit / contender (throughput ratio) |")
    print("|---|---|---|---|")
    rows = (("limit: obstore.put of the archive file, multipart "
             f"({_upload.PART_BYTES // MIB} MiB x {_upload.PARTS_IN_FLIGHT})", "limit"),
            ("treecask.save(url), new key (" + _new_key_path() + ")", "save"),
            ("treecask.save(url, overwrite=True), existing key (multipart to the key)", "save_ow"),
            ("by hand: treecask.save(local) + obstore.put (same parts)", "by_hand"))
    for label, k in rows:
        print(f"| {label} | {fmt(times[k])} | {gib / med[k]:.2f} | {med['limit'] / med[k]:.2f} |")
    print("\nsave / limit (throughput; target >= 0.8): "
          f"new key **{med['limit'] / med['save']:.2f}x**, overwrite **{med['limit'] / med['save_ow']:.2f}x**")
    print("save-then-upload / save (time): "
          f"new key **{med['by_hand'] / med['save']:.2f}x**, overwrite **{med['by_hand'] / med['save_ow']:.2f}x**")
    print("\nWhere a new-key save's time goes (median per phase, min-max):\n")
    print("| phase | time | share of the save |")
    print("|---|---|---|")
    for k in ("listing", "local write (rest)", "multipart upload", "conditional copy", "temporary delete",
              "conditional multipart upload (botocore)", "confirm (ranged GET)", "multipart listing (botocore)"):
        if k in split:
            print(f"| {k} | {fmt(split[k])} | {statistics.median(split[k]) / med['save']:.0%} |")
    if rss:
        print(f"\n### Peak RSS growth of one call (fresh process each; bound of the upload buffers: "
              f"{_upload.PART_BYTES * _upload.PARTS_IN_FLIGHT // MIB} MiB)\n")
        print("| case | RSS before | peak RSS growth |")
        print("|---|---|---|")
        for label, k in rows:
            r = rss[k]
            if "error" in r:
                print(f"| {label} | failed: {r['error'][-200:]} | |")
            else:
                note = "" if r["hwm_reset"] else " (VmHWM not reset: lower bound)"
                print(f"| {label} | {r['before'] / MIB:.0f} MiB | {r['growth'] / MIB:.0f} MiB{note} |")



def report_manager(m: dict, pairs: int):
    print(f"\n### CheckpointManager on a bucket: {m['size'] / MIB:.0f} MiB tree, {pairs} interleaved rounds\n")
    print("Asynchronous managers (the default), compression='none'; a fresh manager and step 1 per timing.\n")
    print("| tree | contender | save() blocks, median (min-max) | until committed (save + wait_until_finished) |")
    print("|---|---|---|---|")
    for kind, t in m["times"].items():
        print(f"| {kind} | CheckpointManager(local dir) | {fmt(t['local_block'])} | {fmt(t['local_commit'])} |")
        print(f"| {kind} | CheckpointManager('s3://bench/...') | {fmt(t['bucket_block'])} | "
              f"{fmt(t['bucket_commit'])} |")
        print(f"| {kind} | treecask.save('s3://bench/...') (synchronous) | (all of it) | {fmt(t['sync'])} |")
    print()
    for kind, t in m["times"].items():
        med = {k: statistics.median(v) for k, v in t.items()}
        print(f"- {kind}: save() blocks bucket / local **{med['bucket_block'] / med['local_block']:.2f}x** "
              f"({med['bucket_block'] * 1e3:.0f} vs {med['local_block'] * 1e3:.0f} ms); until committed, "
              f"bucket manager / synchronous save(url) **{med['bucket_commit'] / med['sync']:.2f}x**")
    print(f"\nObjects left in the bucket by this part: {m['left'] or 'none'}")


def report_two_process(r: dict, mib: int, pairs: int):
    print(f"\n### Two processes (jax.distributed, gloo on 127.0.0.1) saving one {mib} MiB sharded array "
          f"to the bucket, {pairs} interleaved rounds\n")
    if "error" in r:
        print(f"failed: {r['error']}")
        return
    print(f"{r['devices']}; each process's shard file {r['shard_bytes'] / MIB:.1f} MiB; timed in process 0 "
          "from a barrier before to a barrier after (both processes done).\n")
    med = {k: statistics.median(r[k]) for k in ("url", "by_hand", "by_hand_local")}
    print("| contender | time, median (min-max) | time / treecask.save(url) |")
    print("|---|---|---|")
    print(f"| treecask.save('s3://bench/.../ckpt', tree) in both processes | {fmt(r['url'])} | 1.00 |")
    print(f"| by hand: treecask.save(local dir, durable=False), each process obstore.put its shard file, "
          f"barrier, process 0 puts index.cask | {fmt(r['by_hand'])} | {med['by_hand'] / med['url']:.2f} |")
    print(f"| (of which the local save) | {fmt(r['by_hand_local'])} | {med['by_hand_local'] / med['url']:.2f} |")
    print(f"\nsave-then-upload / save(url) (time): **{med['by_hand'] / med['url']:.2f}x**")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=5, help="interleaved rounds (every part)")
    ap.add_argument("--mib", type=int, default=256, help="tree size (MiB) of the save-vs-limit part")
    ap.add_argument("--mgr-mib", type=int, default=128, help="tree size (MiB) of the manager part")
    ap.add_argument("--mp-mib", type=int, default=128, help="array size (MiB) of the 2-process part")
    ap.add_argument("--parts", default="save,manager,mp",
                    help="comma-separated: save (against the limit, RSS, Orbax), manager, mp (2 processes)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 2 rounds; 64 MiB (save part), 32 MiB (manager and 2-process parts)")
    ap.add_argument("--no-rss", action="store_true")
    ap.add_argument("--no-orbax", action="store_true")
    ap.add_argument("--rss-child", help=argparse.SUPPRESS)
    ap.add_argument("--orbax-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mp-child", nargs=3, type=int, help=argparse.SUPPRESS)
    ap.add_argument("--archive", help=argparse.SUPPRESS)
    ap.add_argument("--tmp", help=argparse.SUPPRESS)
    ap.add_argument("--local-root", help=argparse.SUPPRESS)
    ap.add_argument("--data-dir", help=argparse.SUPPRESS)
    ap.add_argument("--master-port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rss_child:
        print(json.dumps(rss_child(args.rss_child, args.mib, args.archive, args.tmp)))
        return
    if args.orbax_child:
        print(json.dumps(orbax_probe(args.tmp)))
        return
    if args.mp_child:
        mp_child(*args.mp_child, args.mib, args.pairs, args.local_root, args.data_dir, args.master_port)
        return
    # SIGTERM (timeout(1)...) unwinds like Ctrl-C: the servers, the 2-process job and
    # the temporary directory (SeaweedFS's data, archives) go with it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parts = set(args.parts.split(","))
    if parts - {"save", "manager", "mp"}:
        ap.error(f"unknown part(s) {sorted(parts - {'save', 'manager', 'mp'})}")
    if args.quick:
        args.mib, args.mgr_mib, args.mp_mib, args.pairs = 64, 32, 32, 2
    t0 = time.time()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} CPUs; parts {sorted(parts)}")
    if "save" in parts:
        print(f"save part: tree {args.mib} MiB in leaves of {leaf_sizes(args.mib)} MiB "
              "(float32, compression='none')")
    with tempfile.TemporaryDirectory(prefix="treecask-bench-save-") as tmp:
        with stores.seaweedfs(pathlib.Path(tmp) / "s3") as s3:
            s3.create_bucket(BUCKET)
            os.environ.update(s3.env())
            if "save" in parts:
                tree = make_tree(args.mib)
                local_archive = os.path.join(tmp, "archive.cask")
                treecask.save(local_archive, tree, compression="none")
                size, times, split, left, peak_store = bench_times(s3, tree, local_archive, tmp, args.pairs)
                rss = {} if args.no_rss else bench_rss(s3, args.mib, local_archive, tmp)
                del tree
                data_bytes = du(pathlib.Path(tmp) / "s3" / "data")
                report(size, times, split, rss, args.pairs)
                print(f"({time.time() - t0:.0f} s)")
                print(f"\nObjects left in the bucket: {left or 'none'}; SeaweedFS data directory: at most "
                      f"{peak_store / MIB:.0f} MiB after a contender (deleted objects not yet compacted "
                      f"included), {data_bytes / MIB:.0f} MiB at the end of this part")
            if "manager" in parts:
                t = time.time()
                report_manager(bench_manager(s3, args.mgr_mib, args.pairs, tmp), args.pairs)
                print(f"({time.time() - t:.0f} s)")
            if "mp" in parts:
                t = time.time()
                report_two_process(bench_two_process(s3, args.mp_mib, args.pairs, tmp), args.mp_mib, args.pairs)
                print(f"({time.time() - t:.0f} s)")
            data_bytes = du(pathlib.Path(tmp) / "s3" / "data")
        print(f"\nSeaweedFS data directory at the end: {data_bytes / MIB:.0f} MiB")
        if "save" in parts and not args.no_orbax:
            print("\n### Orbax to s3:// and gs:// (own network namespace: loopback only)\n")
            for k, v in bench_orbax(tmp).items():
                print(f"- {k}: {v}")
    print(f"\n(total {time.time() - t0:.0f} s; load average at the end "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())})")


if __name__ == "__main__":
    main()
