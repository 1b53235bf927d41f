"""Saving to an object store against its limit and against doing it by hand,
same run, same server (docs/remote.md "Saving to object stores";
python/treecask/_upload.py).

    python bench/remote_save.py [--pairs 5] [--mib 256] [--quick] [--no-rss] [--no-orbax]

The server is the tests' SeaweedFS (`weed mini`, tests/python/stores.py) on
127.0.0.1. The tree: float32 leaves of 32-64 MiB (random bits), saved with
compression="none". Contenders, each timed once per round (interleaved
rounds; median with min-max):

1. limit: obstore.put of the same bytes (the archive, saved locally once)
   from a local file, multipart with the upload's own part size and
   concurrency (_upload.PART_BYTES, PARTS_IN_FLIGHT), through the same
   obstore client treecask uses: the upload alone, no archive written.
2. treecask.save(url, tree) to a new key (the conditional commit: multipart
   upload to a temporary object, conditional server-side copy onto the key,
   delete of the temporary), and with overwrite=True onto an existing key
   (multipart straight to the key). The new-key save is also split into its
   phases (listing, local write, multipart upload, copy, temporary delete) by
   timing the calls _upload.save_url makes.
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

Not a test: the numbers depend on the machine's load (printed at the start).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import shutil
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
from treecask import _remote, _upload  # noqa: E402

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
    """Times the calls _upload.save_url makes (listing, multipart upload,
    server-side copy, deletes) into `acc` (seconds, summed); the rest of a
    save is the local write of the archive."""
    import obstore
    saved = {"check_target": _upload.check_target, "_put_parts": _upload._put_parts}
    saved_ob = {"copy": obstore.copy, "delete": obstore.delete}

    def wrap(name, fn):
        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                acc[name] = acc.get(name, 0.0) + time.perf_counter() - t
        return timed

    names = {"check_target": "listing", "_put_parts": "multipart upload", "copy": "conditional copy",
             "delete": "temporary delete"}
    try:
        for k, fn in saved.items():
            setattr(_upload, k, wrap(names[k], fn))
        for k, fn in saved_ob.items():
            setattr(obstore, k, wrap(names[k], fn))
        yield acc
    finally:
        for k, fn in saved.items():
            setattr(_upload, k, fn)
        for k, fn in saved_ob.items():
            setattr(obstore, k, fn)


def master_port(s3) -> int:
    for a in s3.server.argv:
        if a.startswith("-master.port="):
            return int(a.split("=", 1)[1])
    raise RuntimeError("no -master.port in the weed command")


STORE_CAP = 1024 * MIB  # SeaweedFS's volumes: 16 of 64 MiB (stores.py)


def make_room(s3, data_dir: pathlib.Path, need: int) -> int:
    """The store's bytes on disk now (deleted objects not yet compacted
    included); vacuums first unless they and `need` more bytes stay within
    half of STORE_CAP (the cap counts volumes, and a volume that holds
    garbage is not written again until compacted: bytes alone are no safe
    measure -- a run that let them reach 833 MiB got 500 errors)."""
    used = du(data_dir)
    if used + need > STORE_CAP // 2:
        vacuum(s3, data_dir)
    return used


def vacuum(s3, data_dir: pathlib.Path, timeout: float = 60.0) -> float:
    """Compacts SeaweedFS's volumes once every object is deleted: asks its
    master to vacuum (/vol/vacuum) once a second until the data directory is
    (nearly) empty -- the filer deletes a removed object's chunks a moment
    later, so the first request may find no garbage yet. Returns the seconds
    it took (untimed work)."""
    url = f"http://{stores.LOOPBACK}:{master_port(s3)}/vol/vacuum?garbageThreshold=0.0001"
    t = time.perf_counter()
    while time.perf_counter() - t < timeout:
        with contextlib.suppress(Exception):
            urllib.request.urlopen(url, timeout=120).read()
        if du(data_dir) < 8 * MIB:
            break
        time.sleep(0.5)
    return time.perf_counter() - t


def du(path: pathlib.Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# ---------------------------------------------------------------- timed rounds

def bench_times(s3, tree, local_archive: str, tmp: str, pairs: int):
    store, _ = _remote._store_for(f"s3://{BUCKET}/x", None)  # treecask's own client
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
    store, _ = _remote._store_for(f"s3://{BUCKET}/x", None)
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


# ---------------------------------------------------------------- report

def report(size, times, split, rss, pairs):
    med = {k: statistics.median(v) for k, v in times.items()}
    gib = size / 2**30
    print(f"\n### Saving {size / MIB:.1f} MiB to S3 (SeaweedFS on loopback), {pairs} interleaved rounds\n")
    print("| contender | time, median (min-max) | GiB/s | limit / contender (throughput ratio) |")
    print("|---|---|---|---|")
    rows = (("limit: obstore.put of the archive file, multipart "
             f"({_upload.PART_BYTES // MIB} MiB x {_upload.PARTS_IN_FLIGHT})", "limit"),
            ("treecask.save(url), new key (temporary + conditional copy)", "save"),
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
    for k in ("listing", "local write (rest)", "multipart upload", "conditional copy", "temporary delete"):
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=5, help="interleaved rounds")
    ap.add_argument("--mib", type=int, default=256, help="tree size (MiB)")
    ap.add_argument("--quick", action="store_true", help="smoke test: 64 MiB, 2 rounds")
    ap.add_argument("--no-rss", action="store_true")
    ap.add_argument("--no-orbax", action="store_true")
    ap.add_argument("--rss-child", help=argparse.SUPPRESS)
    ap.add_argument("--orbax-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--archive", help=argparse.SUPPRESS)
    ap.add_argument("--tmp", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rss_child:
        print(json.dumps(rss_child(args.rss_child, args.mib, args.archive, args.tmp)))
        return
    if args.orbax_child:
        print(json.dumps(orbax_probe(args.tmp)))
        return
    if args.quick:
        args.mib, args.pairs = 64, 2
    t0 = time.time()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} CPUs; "
          f"tree {args.mib} MiB in leaves of {leaf_sizes(args.mib)} MiB (float32, compression='none')")
    with tempfile.TemporaryDirectory(prefix="treecask-bench-save-") as tmp:
        tree = make_tree(args.mib)
        local_archive = os.path.join(tmp, "archive.cask")
        treecask.save(local_archive, tree, compression="none")
        with stores.seaweedfs(pathlib.Path(tmp) / "s3") as s3:
            s3.create_bucket(BUCKET)
            os.environ.update(s3.env())
            size, times, split, left, peak_store = bench_times(s3, tree, local_archive, tmp, args.pairs)
            rss = {} if args.no_rss else bench_rss(s3, args.mib, local_archive, tmp)
            data_bytes = du(pathlib.Path(tmp) / "s3" / "data")
        report(size, times, split, rss, args.pairs)
        print(f"\nObjects left in the bucket: {left or 'none'}; SeaweedFS data directory: at most "
              f"{peak_store / MIB:.0f} MiB after a contender (deleted objects not yet compacted included), {data_bytes / MIB:.0f} MiB "
              "at the end")
        if not args.no_orbax:
            print("\n### Orbax to s3:// and gs:// (own network namespace: loopback only)\n")
            for k, v in bench_orbax(tmp).items():
                print(f"- {k}: {v}")
    print(f"\n(total {time.time() - t0:.0f} s; load average at the end "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())})")


if __name__ == "__main__":
    main()
