"""Remote reading against its limits and peers, same run, same servers
(issue "Read checkpoints straight from object stores"; docs/remote.md).

    python bench/remote.py [--runs 5] [--mib 256] [--rtt-ms 10] [--runai-python PATH]

Servers are the tests' (tests/python/stores.py), on loopback: Debian's nginx
(HTTP Range) and SeaweedFS (S3). Three workloads:

1. Open + one tensor of a 10,000-leaf archive (leaves of 1,024 float32, 40
   MiB: the first leaf lies in what the open fetched, a middle one does not)
   against safetensors read by range requests as a remote reader must (its
   8-byte header length, then its JSON header, then the tensor), both through
   obstore (the Python package's client), plus the CLI (`treecask get`: the
   C++ core and its libcurl source, process start included). Requests are
   counted in nginx's access log. Loopback has no latency, so the same is also
   timed through a proxy that delays every request by --rtt-ms (a wide-area
   round trip): what a round trip saved at open is worth.
2. Full load of --mib MiB (4 MiB float32 leaves of random bytes) from nginx
   and from S3: treecask.load(url) against the limit (the object's bytes
   fetched by concurrent 8 MiB range requests, obstore.get_ranges, nothing
   parsed, copied or checked), against download-then-load (GET the whole
   object, write it to a local file, treecask.load it) and `treecask verify
   URL` (the CLI: every chunk fetched and checksummed, no arrays), and the
   GET requests of each (nginx's log; a counting proxy for S3). With
   --runai-python, the Run:ai model streamer (bench/remote_runai.py, in its
   own environment: it needs torch) reads the same tensors as safetensors from
   the same S3 bucket.
3. Bytes fetched by partial reads: one 4 MiB leaf and 1/8 of its rows, from
   nginx's log, against the bytes asked for.
4. Bytes one process of a 2-process restore fetches for its own boxes (one
   read_slice per box, as ShardedArchive and load(shardings=) read them),
   against the bytes of its boxes: rows split (P("x")) and columns split
   (P(None, "y"): C-order chunks hold whole rows, so each process fetches
   every chunk).

Runs are interleaved (every contender once per round); medians are printed
with min-max, and ratios as contender time / treecask time. Not a test: the
numbers depend on the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))
import stores  # noqa: E402  (the tests' loopback servers)

import treecask  # noqa: E402

# The CLI: the C++ core with its libcurl source (the Python extension reads
# URLs through obstore and is built without libcurl).
CLI = os.environ.get("TREECASK_CLI", str(ROOT / "build" / "src" / "cli" / "treecask"))


def cli(*args):
    subprocess.run([CLI, *args], check=True, capture_output=True)


# ---------------------------------------------------------------- a latency proxy

class DelayProxy:
    """A TCP proxy on 127.0.0.1 that holds every burst of bytes a client sends
    for `delay` seconds before passing it on: each HTTP request then costs one
    more round trip of `delay` (responses pass at once)."""

    def __init__(self, target_port: int, delay: float):
        self.delay, self.target = delay, target_port
        self.port = stores.free_ports(1)[0]
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()
        self.ready.wait(10)

    def _run(self):
        asyncio.set_event_loop(self.loop)

        async def pipe(reader, writer, delay):
            try:
                while data := await reader.read(1 << 20):
                    if delay:
                        await asyncio.sleep(delay)
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                writer.close()

        async def handle(cr, cw):
            sr, sw = await asyncio.open_connection("127.0.0.1", self.target)
            await asyncio.gather(pipe(cr, sw, self.delay), pipe(sr, cw, 0))

        async def main():
            await asyncio.start_server(handle, "127.0.0.1", self.port)
            self.ready.set()
            await asyncio.Event().wait()

        self.loop.run_until_complete(main())


# ---------------------------------------------------------------- helpers

def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def interleaved(contenders: dict, runs: int) -> dict:
    times = {k: [] for k in contenders}
    for _ in range(runs):
        for k, fn in contenders.items():
            times[k].append(timed(fn))
    return times


def fmt(ts):
    return f"{statistics.median(ts) * 1e3:.1f} ms ({min(ts) * 1e3:.1f}-{max(ts) * 1e3:.1f})"


def log_lines(web) -> list:
    return (web.server.log_path.parent / "access.log").read_text().splitlines()


def bytes_sent(lines) -> int:
    """nginx's combined log: the field after the status is the body bytes."""
    total = 0
    for line in lines:
        parts = line.split('"')
        if len(parts) > 2:
            total += int(parts[2].split()[1])
    return total


def st_open_first_tensor(store, path, name):
    """safetensors read by range: 8-byte length, JSON header, then one tensor."""
    import obstore
    n = int.from_bytes(bytes(obstore.get_range(store, path, start=0, length=8)), "little")
    header = json.loads(bytes(obstore.get_range(store, path, start=8, length=n)))
    b, e = header[name]["data_offsets"]
    raw = obstore.get_range(store, path, start=8 + n + b, length=e - b)
    return np.frombuffer(raw, dtype=np.float32)


def fetch_limit(store, path, size, piece=8 << 20):
    """The object's bytes by concurrent range requests (obstore.get_ranges: the
    requests run concurrently in Rust, each range's bytes kept as they came)."""
    import obstore
    starts = list(range(0, size, piece))
    return obstore.get_ranges(store, path, starts=starts, ends=[min(s + piece, size) for s in starts])


def download_then_load(store, path, tmp):
    import obstore
    local = os.path.join(tmp, "downloaded.cask")
    with open(local, "wb") as f:
        f.write(obstore.get(store, path).bytes())
    return treecask.load(local)


# ---------------------------------------------------------------- workloads

def bench_open(web, tmp, runs, rtt_ms):
    from safetensors.numpy import save_file
    import obstore.store
    tree = {f"layer_{i:05d}": np.full((1024,), i, np.float32) for i in range(10_000)}
    treecask.save(web.root / "many.cask", tree, compression="none", overwrite=True)
    save_file(tree, str(web.root / "many.safetensors"))
    print("\n### Open + one tensor, 10,000 leaves (nginx on loopback)\n")
    print("| reader | tensor | requests | time on loopback | time at +%d ms per request |" % rtt_ms)
    print("|---|---|---|---|---|")
    for first in ("layer_00000", "layer_05000"):
        bench_open_one(web, tmp, first, runs, rtt_ms)


def bench_open_one(web, tmp, first, runs, rtt_ms):
    import obstore.store
    want = int(first.rsplit("_", 1)[1])
    proxy = DelayProxy(int(web.endpoint.rsplit(":", 1)[1]), rtt_ms / 1e3)
    rows = []
    for base in (web.endpoint, f"http://127.0.0.1:{proxy.port}"):
        st_store = obstore.store.HTTPStore.from_url(base + "/", client_options={"allow_http": True})
        tc_url = base + "/many.cask"

        def tc_py():
            with treecask.open(tc_url) as a:
                assert a.read(first)[0] == want

        def tc_cpp():
            cli("get", tc_url, first, "-o", os.path.join(tmp, "first.npy"), "--overwrite")

        def st():
            assert st_open_first_tensor(st_store, "many.safetensors", first)[0] == want

        counts = {}
        for k, fn in (("treecask (Python, obstore)", tc_py), ("treecask get (CLI: C++, libcurl)", tc_cpp),
                      ("safetensors by range (obstore)", st)):
            before = len(log_lines(web))
            fn()
            counts[k] = len(log_lines(web)) - before
        times = interleaved({"treecask (Python, obstore)": tc_py, "treecask get (CLI: C++, libcurl)": tc_cpp,
                             "safetensors by range (obstore)": st}, runs)
        rows.append((counts, times))
    (counts, t0), (_, t1) = rows
    for k in t0:
        print(f"| {k} | {first} | {counts[k]} | {fmt(t0[k])} | {fmt(t1[k])} |")
    st = statistics.median(t1["safetensors by range (obstore)"])
    print(f"| safetensors / treecask at +{rtt_ms:g} ms | {first} | | | "
          f"Python {st / statistics.median(t1['treecask (Python, obstore)']):.2f}x, "
          f"CLI {st / statistics.median(t1['treecask get (CLI: C++, libcurl)']):.2f}x |")


def bench_full(web, s3, tmp, mib, runs, runai_python):
    import obstore.store
    rng = np.random.default_rng(0)
    n = max(1, mib // 4)
    tree = {f"w{i:03d}": rng.integers(0, 2**31, size=1 << 20, dtype=np.int32).view(np.float32) for i in range(n)}
    path = web.root / "full.cask"
    treecask.save(path, tree, compression="none", overwrite=True)
    size = path.stat().st_size
    s3.create_bucket("bench")
    s3.put("bench", "full.cask", path)
    print(f"\n### Full load of {n * 4} MiB ({n} leaves of 4 MiB)\n")
    print("| store | treecask.load(url) (Python, obstore) | treecask verify (CLI: C++, libcurl) | limit: 8 MiB ranges, "
          "concurrent (obstore.get_ranges) | download, then load | treecask GiB/s | limit / treecask | "
          "download-then-load / treecask |")
    print("|---|---|---|---|---|---|---|---|")
    for label, store, url in (
            ("nginx", obstore.store.HTTPStore.from_url(web.endpoint + "/", client_options={"allow_http": True}),
             web.url("full.cask")),
            ("S3 (SeaweedFS)", s3.store("bench"), "s3://bench/full.cask")):
        env = s3.env() if url.startswith("s3://") else {}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            def cpp():
                cli("verify", url)

            t = interleaved({
                "tc": lambda: treecask.load(url),
                "cpp": cpp,
                "limit": lambda: fetch_limit(store, "full.cask", size),
                "dl": lambda: download_then_load(store, "full.cask", tmp),
            }, runs)
        finally:
            for k, v in old.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        tc, lim, dl = (statistics.median(t[k]) for k in ("tc", "limit", "dl"))
        print(f"| {label} | {fmt(t['tc'])} | {fmt(t['cpp'])} | {fmt(t['limit'])} | {fmt(t['dl'])} | "
              f"{size / tc / 2**30:.2f} | {lim / tc:.2f}x | {dl / tc:.2f}x |")
    print("\n| store | GETs of treecask.load(url) | GETs of treecask verify | GETs of the limit (8 MiB ranges) |")
    print("|---|---|---|---|")
    for label, url in (("nginx", web.url("full.cask")), ("S3 (SeaweedFS)", "s3://bench/full.cask")):
        py, cpp = count_gets(web, s3, url)
        print(f"| {label} | {py} | {cpp} | {-(-size // (8 << 20))} |")
    if runai_python:
        from safetensors.numpy import save_file
        st = os.path.join(tmp, "full.safetensors")
        save_file(tree, st)
        s3.put("bench", "full.safetensors", st)
        env = dict(os.environ, **s3.env())
        r = subprocess.run([runai_python, str(ROOT / "bench" / "remote_runai.py"), "--endpoint", s3.endpoint,
                            "--bucket", "bench", "--key", "full.safetensors", "--runs", str(runs)],
                           capture_output=True, text=True, env=env)
        if r.returncode != 0:
            print(f"\nRun:ai model streamer: failed: {r.stderr.strip()[-800:]}")
        else:
            got = json.loads(r.stdout.strip().splitlines()[-1])
            print(f"\nRun:ai model streamer ({got.get('version')}) from S3, same tensors as safetensors: "
                  f"{fmt(got['runai_s'])}; Run:ai / treecask.load: "
                  f"{statistics.median(got['runai_s']) / tc:.2f}x")


def count_gets(web, s3, url):
    """GET requests of one treecask.load(url) and one `treecask verify url`:
    nginx's access log, or for s3:// a counting proxy in front of SeaweedFS
    (stores.S3Proxy, set as the endpoint of both)."""
    if not url.startswith("s3://"):
        before = len(log_lines(web))
        treecask.load(url)
        py = len(log_lines(web)) - before
        before = len(log_lines(web))
        cli("verify", url)
        return py, len(log_lines(web)) - before
    proxy = stores.S3Proxy(s3.endpoint)
    env = dict(s3.env(), AWS_ENDPOINT_URL=proxy.endpoint)
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        treecask.load(url)
        py = len(proxy.gets)
        cli("verify", url)
        return py, len(proxy.gets) - py
    finally:
        proxy.close()
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def bench_partial(web, runs):
    print("\n### Bytes fetched by partial reads (nginx log)\n")
    print("| read | bytes asked | bytes fetched |")
    print("|---|---|---|")
    url = web.url("full.cask")
    with treecask.open(url) as a:
        for what, fn, asked in (
                ("open", lambda: None, 0),
                ("one 4 MiB leaf", lambda: a.read("w001"), 4 << 20),
                ("rows 0-1/8 of a leaf", lambda: a.read_rows("w002", 0, (1 << 20) // 8), 512 << 10)):
            before = len(log_lines(web))
            fn()
            print(f"| {what} | {asked} | {bytes_sent(log_lines(web)[before:])} |")


def bench_boxes(web):
    """What one process of a 2-process restore fetches: the boxes it owns of
    every leaf (P("x"): half the rows; P(None, "y"): half the columns), read
    as a restore reads them (one read_slice per box), from nginx's log."""
    rng = np.random.default_rng(1)
    tree = {f"w{i}": rng.standard_normal((4096, 1024)).astype(np.float32) for i in range(4)}
    treecask.save(web.root / "boxes.cask", tree, compression="none", overwrite=True)
    print("\n### A process's own boxes (2 processes; 4 leaves of 16 MiB, chunks of 1 MiB)\n")
    print("| PartitionSpec | process | bytes of its boxes | bytes fetched | fetched / boxes |")
    print("|---|---|---|---|---|")
    with treecask.open(web.url("boxes.cask")) as a:
        for spec, box in (('P("x")', lambda p: (slice(p * 2048, (p + 1) * 2048), slice(None))),
                          ('P(None, "y")', lambda p: (slice(None), slice(p * 512, (p + 1) * 512)))):
            for p in (0, 1):
                before = len(log_lines(web))
                got = sum(a.read_slice(k, box(p)).nbytes for k in tree)
                fetched = bytes_sent(log_lines(web)[before:])
                print(f"| {spec} | {p} | {got} | {fetched} | {fetched / got:.2f} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--rtt-ms", type=float, default=10.0)
    ap.add_argument("--runai-python", default="", help="python of an environment with runai-model-streamer")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp) / "www"
        root.mkdir()
        with stores.nginx(root, pathlib.Path(tmp) / "nginx") as web, stores.seaweedfs(pathlib.Path(tmp) / "s3") as s3:
            bench_open(web, tmp, args.runs, args.rtt_ms)
            bench_full(web, s3, tmp, args.mib, args.runs, args.runai_python)
            bench_partial(web, args.runs)
            bench_boxes(web)


if __name__ == "__main__":
    main()
