"""Signed checkpoints (issue 36): treecask's verified reads against OpenSSF model
signing (`model-signing` 1.1.1), ratios in one run.

    .venv/bin/python bench/signing.py [--gib 1,4] [--reps 3] [--dir /tmp] [--out docs/performance_runs.md]

Rows (each figure measured in a fresh subprocess, the verified-shard cache being per
process; the timed region excludes the interpreter's start and imports; medians of
--reps repetitions, the contenders interleaved):

1. Time to the first verified tensor of a signed archive of --gib GiB (the LLM-shaped
   tree of bench/peers.py, saved raw; one 4 MiB bf16 leaf): treecask
   `open(p, signature=, public_key=)[key]` (the shards covering the open's pages and the
   leaf hashed, its view handed out after) against what model_signing allows: its
   `verify key` of the whole file (the Python API call its CLI makes, file
   serialization, the CLI's default) followed by an unverified `treecask.open(p)[key]`.
   [goal >= 20x at 1 GiB, growing with the size]
2. Full verify: `treecask.verify(p, signature=, public_key=)` (every shard's SHA-256,
   then the chunks ending in it, one pass on all cores) against model_signing's verification of the same
   archive with the same bundle (treecask's shards bundle, which its Python API reads;
   its CLI cannot, docs/signing.md) and with its own file-serialization bundle; the limit
   is SHA-256 of every shard on all cores (hashlib over an mmap in one thread per core:
   hashlib releases the GIL). [goal >= 1.0x model_signing]
3. Open-to-first-tensor at 10,000 leaves (bench/peers.py's small tree): verified
   `open(p, signature=, public_key=)[key]` against unverified `open(p)[key]`, in a fresh
   process and in one that verified another archive first (OpenSSL's one-time set-up
   done; compared with an unverified open in a process that also verified another
   archive first), and with 1 MiB shards instead of the default; and the same in C++
   (`treecask_bench_core --open-signed`, $TREECASK_BENCH_CORE or build/bench/, when
   built). [goal verified <= 2x unverified]
4. Sign right after a save (the file in the page cache): `treecask.sign(p, private_key=)`
   (shards, the default) against model_signing's `sign key` of the same file (the Python
   API call its CLI makes; file serialization). [goal >= 1.0x]

Warm page cache throughout: every file was just written and fits in memory. Not a test:
the numbers depend on the machine's load (2 shared cores here).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import mmap
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402  (build, leaf_key, machine_info, versions, write_doc)

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
# The C++ figure of row 3 (`treecask_bench_core --open-signed`, built by `cmake --build build`).
CORE = Path(os.environ.get("TREECASK_BENCH_CORE", ROOT / "build" / "bench" / "treecask_bench_core"))


# ---- what one child process measures ----------------------------------------------------

def _ms_verify(path: str, sig: str, pub: str, shard_size=None) -> None:
    import model_signing

    cfg = model_signing.verifying.Config().use_elliptic_key_verifier(public_key=pub)
    if shard_size is None:  # `model_signing verify key`: file serialization
        cfg.set_hashing_config(model_signing.hashing.Config())
    cfg.verify(path, sig)


def _ms_sign(path: str, key: str, sig: str) -> None:
    import model_signing

    (model_signing.signing.Config().use_elliptic_key_signer(private_key=key)
     .set_hashing_config(model_signing.hashing.Config()).sign(path, sig))


def _sha256_limit(path: str, shard: int, threads: int) -> None:
    """SHA-256 of every `shard`-byte range of `path`, `threads` at a time (hashlib
    releases the GIL on buffers over 2 KiB): the limit of any full verification."""
    import hashlib

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        view = memoryview(m)
        size = len(m)

        def one(start: int) -> bytes:
            return hashlib.sha256(view[start:min(start + shard, size)]).digest()

        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, range(0, size, shard)))
        view.release()


def child(job: Dict[str, Any]) -> Dict[str, Any]:
    import treecask

    kind, p = job["kind"], job["path"]
    if kind.endswith("_ms"):  # its imports (sigstore, cryptography, ...) outside the timed region
        import model_signing  # noqa: F401
    if kind in ("first_tc_warm", "first_plain_warm"):  # a process that verified another archive before:
        with treecask.open(job["warm"], signature=job["warm"] + ".sig", public_key=job["pub"]) as a:
            a.load()  # OpenSSL loaded, the key decoded, the open path's code and memory in use
        kind = kind[:-len("_warm")]
    t0 = time.perf_counter()
    if kind == "first_tc":
        with treecask.open(p, signature=job["sig"], public_key=job["pub"]) as a:
            x = a[job["key"]]
            assert x.nbytes > 0
    elif kind == "first_ms":
        _ms_verify(p, job["sig"], job["pub"])
        with treecask.open(p) as a:
            x = a[job["key"]]
            assert x.nbytes > 0
    elif kind == "first_plain":
        with treecask.open(p) as a:
            x = a[job["key"]]
            assert x.nbytes > 0
    elif kind == "verify_tc":
        treecask.verify(p, signature=job["sig"], public_key=job["pub"])
    elif kind == "verify_ms":
        _ms_verify(p, job["sig"], job["pub"], job.get("shard_size"))
    elif kind == "sha_limit":
        _sha256_limit(p, job["shard_size"], job["threads"])
    elif kind == "sign_tc":
        treecask.sign(p, private_key=job["key_file"], signature=job["out"])
    elif kind == "sign_ms":
        _ms_sign(p, job["key_file"], job["out"])
    else:
        raise ValueError(kind)
    return {"s": time.perf_counter() - t0}


def run_child(job: Dict[str, Any], timeout: float = 900) -> float:
    cmd = [sys.executable, __file__, "--child", json.dumps(job)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])["s"]
    raise RuntimeError(f"{job['kind']} failed: {(p.stderr or p.stdout).strip()[-2000:]}")


def measure(jobs: Dict[str, Dict[str, Any]], reps: int) -> Dict[str, float]:
    """Median seconds of each job, the jobs interleaved across repetitions."""
    times: Dict[str, List[float]] = {k: [] for k in jobs}
    for _ in range(reps):
        for k, job in jobs.items():
            times[k].append(run_child(job))
            print(f"  {k}: {times[k][-1] * 1e3:.1f} ms", file=sys.stderr, flush=True)
    return {k: statistics.median(v) for k, v in times.items()}


# ---- the parent --------------------------------------------------------------------

def make_keys(d: Path) -> Dict[str, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    k = ec.generate_private_key(ec.SECP256R1())
    priv, pub = d / "key.pem", d / "key.pub.pem"
    priv.write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption()))
    pub.write_bytes(k.public_key().public_bytes(serialization.Encoding.PEM,
                                                serialization.PublicFormat.SubjectPublicKeyInfo))
    return {"key_file": str(priv), "pub": str(pub)}


def shard_size_of(sig: str) -> int:
    import base64

    bundle = json.loads(Path(sig).read_text())
    st = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    return int(st["predicate"]["serialization"]["shard_size"])


def fmt(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def bench_size(gib: float, d: Path, keys: Dict[str, str], reps: int) -> Dict[str, Any]:
    import treecask

    path = str(d / f"llm_{gib:g}.cask")
    print(f"saving a {gib:g} GiB LLM-shaped tree to {path}", file=sys.stderr, flush=True)
    tree = peers.build("llm", gib)
    treecask.save(path, tree, compression="none", overwrite=True)
    del tree
    key = peers.leaf_key("llm", gib)
    size = os.path.getsize(path)
    tc_sig, ms_sig = path + ".sig", path + ".ms.sig"
    # Sign right after the save: both from the page cache, interleaved.
    sign = measure({"treecask.sign": dict(kind="sign_tc", path=path, out=tc_sig, **keys),
                    "model_signing sign": dict(kind="sign_ms", path=path, out=ms_sig, **keys)}, reps)
    shard = shard_size_of(tc_sig)
    base = dict(path=path, pub=keys["pub"], key=key)
    first = measure({"treecask verified open + leaf": dict(kind="first_tc", sig=tc_sig, **base),
                     "model_signing verify + open + leaf": dict(kind="first_ms", sig=ms_sig, **base),
                     "unverified open + leaf": dict(kind="first_plain", **base)}, reps)
    cores = os.cpu_count() or 1
    full = measure({"treecask.verify": dict(kind="verify_tc", sig=tc_sig, **base),
                    "model_signing verify, treecask's shards bundle":
                        dict(kind="verify_ms", sig=tc_sig, shard_size=shard, **base),
                    "model_signing verify, its files bundle": dict(kind="verify_ms", sig=ms_sig, **base),
                    f"SHA-256 of every shard, {cores} threads (limit)":
                        dict(kind="sha_limit", path=path, shard_size=shard, threads=cores),
                    "SHA-256 of every shard, 1 thread": dict(kind="sha_limit", path=path, shard_size=shard,
                                                             threads=1)}, reps)
    for f in (path, tc_sig, ms_sig):
        os.unlink(f)
    return {"gib": gib, "size": size, "key": key, "shard": shard, "sign": sign, "first": first, "full": full}


def bench_small(d: Path, keys: Dict[str, str], reps: int) -> Dict[str, Any]:
    import treecask

    import numpy as np

    path = str(d / "small.cask")
    treecask.save(path, peers.build("small", 0), compression="none", overwrite=True)
    sig = treecask.sign(path, private_key=keys["key_file"])
    sig1m = treecask.sign(path, private_key=keys["key_file"], signature=path + ".1m.sig", shard_size=1 << 20)
    warm = str(d / "warm.cask")  # another signed archive, opened first by the "warm" child
    treecask.save(warm, {"x": np.arange(16, dtype=np.float32)}, overwrite=True)
    treecask.sign(warm, private_key=keys["key_file"])
    base = dict(path=path, pub=keys["pub"], key=peers.leaf_key("small", 0))
    r = measure({"verified open + leaf": dict(kind="first_tc", sig=sig, **base),
                 "verified open + leaf, OpenSSL loaded (a 2nd archive in the process)":
                     dict(kind="first_tc_warm", sig=sig, warm=warm, **base),
                 "verified open + leaf, 1 MiB shards": dict(kind="first_tc", sig=sig1m, **base),
                 "unverified open + leaf": dict(kind="first_plain", **base),
                 "unverified open + leaf, after another archive's verified open":
                     dict(kind="first_plain_warm", warm=warm, **base)}, reps)
    cpp: Dict[str, float] = {}
    if CORE.exists():  # the same in C++: Archive::open + index_of + a verified view, each in a fresh process
        key = peers.leaf_key("small", 0)
        runs: Dict[str, List[float]] = {"verified": [], "verified, OpenSSL loaded": [], "unverified": [],
                                        "unverified, after another archive's verified open": []}
        for _ in range(reps):
            for k, extra in (("verified", [sig, keys["pub"]]),
                             ("verified, OpenSSL loaded", [sig, keys["pub"], warm, warm + ".sig"]),
                             ("unverified", ["-", "-"]),
                             ("unverified, after another archive's verified open",
                              ["-", keys["pub"], warm, warm + ".sig"])):
                out = subprocess.run([str(CORE), "--open-signed", path, key, *extra], capture_output=True, text=True,
                                     check=True).stdout
                runs[k].append(float(out) / 1e3)
        cpp = {k: statistics.median(v) for k, v in runs.items()}
    size = os.path.getsize(path)
    shard = shard_size_of(sig)
    for f in (path, sig, sig1m, warm, warm + ".sig"):
        os.unlink(f)
    return {"first": r, "cpp": cpp, "size": size, "shard": shard}


def report(results: List[Dict[str, Any]], small: Dict[str, Any], args, started: str) -> str:
    mi = ", ".join(f"{k} {v}" for k, v in peers.machine_info().items())
    vs = ", ".join(f"{k} {v}" for k, v in peers.versions().items())
    from importlib import metadata

    lines = [
        "## Signed checkpoints (`bench/signing.py`)",
        "",
        f"`python bench/signing.py --gib {args.gib} --reps {args.reps}` on {started} ({args.reps} repetition(s), "
        f"medians, each figure in a fresh process). Machine: {mi}. Versions: {vs}, model-signing "
        f"{metadata.version('model-signing')}.",
        "",
        "Method: bench/signing.py's docstring. Warm page cache. model_signing is timed inside its process, "
        "as its CLI's `verify key` / `sign key` run (the CLI adds its interpreter start and imports, about "
        "1 s here, not counted).",
        "",
    ]
    targets = []
    for r in results:
        f, v, s = r["first"], r["full"], r["sign"]
        tc_first = f["treecask verified open + leaf"]
        ms_first = f["model_signing verify + open + leaf"]
        lines += [f"### {r['gib']:g} GiB LLM-shaped tree ({r['size'] / MiB:,.0f} MiB file, leaf `{r['key']}`, "
                  f"treecask's shards of {r['shard'] / MiB:g} MiB)", "",
                  "| | time | ratio |", "|---|---:|---:|"]
        for k, t in f.items():
            lines.append(f"| first tensor: {k} | {fmt(t)} | {ms_first / t:,.1f}× |")
        tc_v = v["treecask.verify"]
        limit = [t for k, t in v.items() if k.endswith("(limit)")][0]
        for k, t in v.items():
            lines.append(f"| full verify: {k} | {fmt(t)} | {t / tc_v:,.2f}× treecask |")
        tc_s = s["treecask.sign"]
        for k, t in s.items():
            lines.append(f"| sign after save: {k} | {fmt(t)} | {t / tc_s:,.2f}× treecask |")
        lines.append("")
        ms_same = v["model_signing verify, treecask's shards bundle"]
        ms_files = v["model_signing verify, its files bundle"]
        targets += [
            (f"first verified tensor, {r['gib']:g} GiB: ≥ 20× model_signing verify + open",
             f"{ms_first / tc_first:,.1f}× ({fmt(tc_first)} vs {fmt(ms_first)})", ms_first / tc_first >= 20),
            (f"full verify, {r['gib']:g} GiB: ≥ 1.0× model_signing verify (same bundle)",
             f"{ms_same / tc_v:.2f}× ({fmt(tc_v)} vs {fmt(ms_same)}); its files bundle {ms_files / tc_v:.2f}×; "
             f"{limit / tc_v:.2f}× the SHA-256 limit ({fmt(limit)})", ms_same / tc_v >= 1.0),
            (f"sign right after save, {r['gib']:g} GiB: ≥ 1.0× model_signing sign",
             f"{s['model_signing sign'] / tc_s:.2f}× ({fmt(tc_s)} vs {fmt(s['model_signing sign'])})",
             s["model_signing sign"] / tc_s >= 1.0),
        ]
    sv, su = small["first"]["verified open + leaf"], small["first"]["unverified open + leaf"]
    sw = small["first"]["verified open + leaf, OpenSSL loaded (a 2nd archive in the process)"]
    suw = small["first"]["unverified open + leaf, after another archive's verified open"]
    lines += [f"### 10,000 small leaves (bench/peers.py's small tree, {small['size'] / MiB:.1f} MiB file, "
              f"treecask's default shards of {small['shard'] >> 10} KiB)", "",
              "First call in a fresh process (the verified-shard cache starts empty), so slower than the "
              "in-process medians of docs/performance.md's open row. The fresh process also pays OpenSSL's "
              "one-time set-up (its providers, the first key decode); the \"OpenSSL loaded\" row is a process "
              "that verified another archive with the same key first, as a server or a manager's restore does "
              "from its second archive on, and is compared with an unverified open in a process that did the "
              "same (its open path's code and memory already in use, as they are for the verified one).", "",
              "| | time | ÷ unverified (fresh) | ÷ unverified (after another archive) |", "|---|---:|---:|---:|"]
    lines += [f"| open to first tensor, {k} | {fmt(t)} | {t / su:.2f}× | {t / suw:.2f}× |"
              for k, t in small["first"].items()]
    if small["cpp"]:
        cu, cuw = small["cpp"]["unverified"], small["cpp"]["unverified, after another archive's verified open"]
        lines += [f"| C++ `treecask_bench_core --open-signed` (Archive::open + a verified view, a fresh "
                  f"process), {k} | {fmt(t)} | {t / cu:.2f}× | {t / cuw:.2f}× |" for k, t in small["cpp"].items()]
    lines.append("")
    targets.append(("open to first tensor at 10,000 leaves: verified ≤ 2× unverified, a fresh process",
                    f"{sv / su:.2f}× ({fmt(sv)} vs {fmt(su)})", sv / su <= 2.0))
    targets.append(("the same in a process that verified another archive first, against an unverified "
                    "open in the same kind of process",
                    f"{sw / suw:.2f}× ({fmt(sw)} vs {fmt(suw)})", sw / suw <= 2.0))
    lines += ["Targets (issue 36):", "", "| target | measured | verdict |", "|---|---|---|"]
    lines += [f"| {t} | {m} | {'met' if ok else '**missed**'} |" for t, m, ok in targets]
    return "\n".join(lines) + "\n"


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        res = child(json.loads(sys.argv[2]))
        print("RESULT " + json.dumps(res), flush=True)
        sys.stdout.flush()
        os._exit(0)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", default="1", help="archive sizes in GiB, comma-separated (default 1; e.g. 1,4)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--out", type=Path, help="Markdown file to write the section into (between markers)")
    args = ap.parse_args()
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="treecask-signing-") as tmp:
        d = Path(tmp)
        keys = make_keys(d)
        small = bench_small(d, keys, max(args.reps, 25))  # millisecond figures: many repetitions
        results = [bench_size(float(g), d, keys, args.reps) for g in args.gib.split(",")]
    section = report(results, small, args, started)
    print(section)
    if args.out:
        peers.write_doc(args.out, section, marker="signing")
        print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
