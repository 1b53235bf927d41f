"""Replicas share the work (python/treecask/_replicas.py; docs/python.md
"Multi-process save and restore"): a replica-parallel save, where every
process of a jax.distributed job writes about 1/N of the bytes whatever the
mesh, and a single-read restore, where each stored byte is fetched once in
the job and the parts travel over the job's collectives (gloo on CPU).

One 4-process job (2 CPU devices each, on 127.0.0.1) saves the same tree on
three meshes -- pure data parallel (8 replicas over 4 processes), 2 replicas
x 4-way model, 8-way model (no replication: the regression guard) -- and
restores them onto the same and other meshes, counting the bytes each
process reads (``_replicas.placed_bytes``); a 2-process job restores them
onto its own mesh, and one with a damaged shard file; this process (8
devices) restores them alone. Values are compared bit for bit (random bits,
NaN payloads included)."""

from __future__ import annotations

import math
import os
import shutil
import textwrap

import numpy as np
import pytest

import treecask
from treecask import _replicas
from jobs import collect, launch

pytest.importorskip("jax")


def test_split_box_tiles_the_box_in_balanced_contiguous_runs():
    for shape in [(8, 8), (5, 3), (2, 4096), (3, 5, 7), (1, 1, 9), (7,), (1,), (0, 4), (), (6, 100)]:
        for k in (1, 2, 3, 4, 8):
            parts = _replicas.split_box(shape, k)
            assert len(parts) == k
            a = np.arange(math.prod(shape)).reshape(shape)
            seen = np.zeros(shape, np.int64)
            sizes = []
            for part in parts:
                n = 0
                for start, stop in part:
                    view = a[tuple(slice(b, e) for b, e in zip(start, stop))]
                    assert view.flags.c_contiguous  # a view of the device buffer, never a copy
                    seen[tuple(slice(b, e) for b, e in zip(start, stop))] += 1
                    n += view.size
                assert len(part) <= 2 * len(shape) + 1 or not shape
                sizes.append(n)
            if shape == () or math.prod(shape) == 0:
                assert [len(p) for p in parts] == [1] + [0] * (k - 1)
                continue
            assert (seen == 1).all(), (shape, k)  # every element in exactly one part
            assert max(sizes) - min(sizes) <= max(1, math.ceil(max(sizes) * 0.2)), (shape, k, sizes)
    # Whole rows where that keeps the parts within 1.25x: one box per part.
    assert _replicas.split_box((256, 256), 4) == [[((64 * r, 0), (64 * r + 64, 256))] for r in range(4)]


CHILD = textwrap.dedent(r'''
    import os, sys
    port, nproc, pid, scenario, root = sys.argv[1:6]
    nproc, pid = int(nproc), int(pid)
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_num_cpu_devices", 8 // nproc)
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=nproc, process_id=pid)
    import numpy as np
    import treecask
    from treecask import _replicas
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    sys.path.insert(0, os.environ["TESTS_DIR"])
    from test_replicas import TREE, SPECS, MESHES, Q4

    def mesh(name):
        shape, axes = MESHES[name]
        return Mesh(np.array(jax.devices()).reshape(shape), axes)

    def shardings(name):
        m = mesh(name)
        return {k: NamedSharding(m, P(*spec)) for k, spec in SPECS[name].items()}

    def check(got, name):
        for k, want in TREE.items():
            arr = got[k]
            assert arr.sharding.spec == P(*SPECS[name][k]), (k, arr.sharding)
            for s in arr.addressable_shards:
                assert np.asarray(s.data).tobytes() == want[s.index].tobytes(), (k, s.index)
        assert got["step"] == 7

    def restore(ckpt, onto, **options):
        _replicas.placed_bytes = 0
        got = treecask.load(f"{root}/{ckpt}", shardings=shardings(onto), **options)
        check(got, onto)
        print(f"PLACED {ckpt}>{onto}{'' if options.get('single_read', True) else '/each'} "
              f"{_replicas.placed_bytes}", flush=True)

    if scenario == "save":
        for name in MESHES:
            sh = shardings(name)
            tree = {k: jax.make_array_from_callback(v.shape, sh[k], lambda i, v=v: v[i]) for k, v in TREE.items()}
            tree["step"] = 7
            treecask.save(f"{root}/{name}", tree, chunk_size=4096, compression="none")
        # A replicated int4 array: its parts packed each on its own, read back by every process.
        everywhere = NamedSharding(mesh("dp"), P())
        treecask.save(f"{root}/int4", {"q": jax.make_array_from_callback(Q4.shape, everywhere, lambda i: Q4[i])})
        q = treecask.load(f"{root}/int4", shardings=everywhere)["q"]
        assert all(np.asarray(s.data).tobytes() == Q4.tobytes() for s in q.addressable_shards)
        restore("dp", "dp")
        restore("dp", "dp", single_read=False)
        restore("hsdp", "dp")
        restore("mp", "hsdp")
        restore("dp", "mp")
    elif scenario == "restore":  # 2 processes x 4 devices
        restore("dp", "hsdp")
        restore("hsdp", "hsdp")
        restore("mp", "dp")
        restore("single.cask", "dp")  # a single-file archive: read once as well
        # A damaged chunk in the part another process reads: every process raises, none hangs.
        try:
            treecask.load(f"{root}/damaged", shardings=shardings("dp"))
            raise SystemExit("expected an error")
        except treecask.Error as e:
            print(f"ERROR {type(e).__name__} {e}", flush=True)
    print(f"CHILD OK {pid}", flush=True)
''')

_rng = np.random.default_rng(30)


def _bits(shape, dtype):
    """Random bit patterns of `dtype` (NaN payloads, negative zeros, subnormals...)."""
    n = math.prod(shape) * np.dtype(dtype).itemsize
    return np.frombuffer(_rng.integers(0, 256, n, dtype=np.uint8).tobytes(), dtype).reshape(shape)


import ml_dtypes  # noqa: E402

TREE = {
    "w": _bits((256, 256), np.float32),          # 256 KiB: split 4 ways when replicated 4 ways
    "e": _bits((512, 64), ml_dtypes.bfloat16),   # 64 KiB
    "m": _rng.integers(0, 2, (256, 256)).astype(bool),
    # Too small to split when saved (written whole, balanced by bytes) or to read once (every
    # process reads its own): under 4 x MIN_PART_BYTES and READ_ONCE_MIN_BYTES.
    "i": _bits((96, 30), np.int32),
    "b": _bits((64,), np.float32),
    "o": _bits((5, 3), np.int32),
}
SMALL = sum(TREE[k].nbytes for k in "ibo")
# Meshes of 8 devices (4 processes x 2, or 2 x 4): (shape, axis names); the PartitionSpec of each leaf.
MESHES = {"dp": ((8,), ("data",)), "hsdp": ((2, 4), ("replica", "model")), "mp": ((8,), ("model",))}
SPECS = {
    "dp": {k: () for k in TREE},
    "hsdp": {"w": (None, "model"), "e": ("model",), "i": (), "m": (), "b": (), "o": ()},
    "mp": {"w": ("model",), "e": ("model",), "i": ("model",), "m": ("model",), "b": ("model",), "o": ()},
}
RAW = sum(v.nbytes for v in TREE.values())
Q4 = ((np.arange(256 * 512) * 7) % 16 - 8).astype(ml_dtypes.int4).reshape(256, 512)


def _job(tmp_path, scenario, nproc):
    procs = launch(tmp_path / "child.py", CHILD, nproc, lambda port, i: (port, nproc, i, scenario, tmp_path),
                   env_extra={"TESTS_DIR": os.path.dirname(os.path.abspath(__file__))})
    outs = collect(procs, scenario, timeout=240)
    placed = {}
    for out in outs:
        for line in out.splitlines():
            if line.startswith("PLACED "):
                _, what, n = line.split()
                placed.setdefault(what, []).append(int(n))
    return outs, placed


def _written(ckpt):
    """Raw bytes of tree leaves in each process's shard file."""
    out = {}
    for f in sorted(os.listdir(ckpt)):
        if f.startswith("process_"):
            with treecask.open(ckpt / f) as a:
                out[f] = sum(a.info(k).byte_length for k in a.keys() if not k.startswith("step"))
    return out


def test_replicas_share_the_save_and_each_byte_is_read_once(tmp_path):
    outs, placed = _job(tmp_path, "save", 4)

    # Replica-parallel save: on the replicated meshes every process writes about a quarter.
    for name in ("dp", "hsdp"):
        written = _written(tmp_path / name)
        assert len(written) == 4 and sum(written.values()) == RAW, written
        assert max(written.values()) <= 1.3 * min(written.values()), (name, written)
    with treecask.open(tmp_path / "dp" / "process_2.cask") as a:  # rows 128-191 of w, a view of its buffer
        assert "w@128:192,0:256" in a.keys()
        np.testing.assert_array_equal(a["w@128:192,0:256"].view(np.uint32), TREE["w"][128:192].view(np.uint32))
    with treecask.open(tmp_path / "int4") as c:
        assert sorted(b.file for b in c.info("q").shards) == [f"process_{k}.cask" for k in range(4)]
        assert c["q"].tobytes() == Q4.tobytes()
    # No replication: each process writes exactly its two devices' blocks, as before.
    written = _written(tmp_path / "mp")
    assert sum(written.values()) == RAW
    for k in range(4):
        with treecask.open(tmp_path / "mp" / f"process_{k}.cask") as a:
            assert sorted(x for x in a.keys() if x.startswith("w@")) == [
                f"w@{32 * d}:{32 * d + 32},0:256" for d in (2 * k, 2 * k + 1)]

    # Single-read restore: the job reads the large leaves once, a quarter by each process (the
    # small ones by every process that needs them). Without it: 4 times.
    for what in ("dp>dp", "hsdp>dp"):
        assert sum(placed[what]) == RAW + 3 * SMALL, (what, placed[what], RAW)
        assert max(placed[what]) <= 1.3 * RAW / 4, (what, placed[what])
    assert sum(placed["mp>hsdp"]) <= RAW + 3 * SMALL, placed["mp>hsdp"]  # "e" is split over "model"
    assert RAW + 3 * SMALL <= 1.25 * RAW
    assert placed["dp>dp/each"] == [RAW] * 4
    # Onto a mesh with no replication: every process reads its own blocks, nothing else.
    assert sum(placed["dp>mp"]) == RAW + 3 * TREE["o"].nbytes

    # One process (8 devices here) restores every checkpoint, as NumPy and onto a mesh.
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    for name in MESHES:
        plain = treecask.load(tmp_path / name)
        assert plain["step"] == 7
        for k, v in TREE.items():
            assert plain[k].dtype == v.dtype and plain[k].tobytes() == v.tobytes(), (name, k)
        m = Mesh(np.array(jax.devices()).reshape(2, 4), ("replica", "model"))
        got = treecask.load(tmp_path / name, shardings={k: NamedSharding(m, P(*s)) for k, s in SPECS["hsdp"].items()})
        for k, v in TREE.items():
            assert np.asarray(got[k]).tobytes() == v.tobytes(), (name, k)

    # Another topology: 2 processes x 4 devices; and a damaged shard file there.
    shutil.copytree(tmp_path / "dp", tmp_path / "damaged")
    victim = tmp_path / "damaged" / "process_3.cask"
    blob = bytearray(victim.read_bytes())
    at = blob.find(TREE["w"][200].tobytes())
    assert at > 0
    blob[at] ^= 0xFF
    victim.write_bytes(bytes(blob))
    treecask.save(tmp_path / "single.cask", dict(TREE, step=7))
    outs, placed = _job(tmp_path, "restore", 2)
    for what in ("dp>hsdp", "hsdp>hsdp", "mp>dp", "single.cask>dp"):
        assert sum(placed[what]) <= 1.25 * RAW, (what, placed[what])
    # Process 1 reads rows 128-255 of w (process_3.cask's part among them): its checksum error;
    # process 0 learns over the same collective that process 1 failed.
    assert "ERROR ChecksumError" in outs[1] and "process_3.cask" in outs[1], outs[1]
    assert "ERROR Error" in outs[0] and "process 1 failed to read its part" in outs[0], outs[0]


MEMORY_CHILD = textwrap.dedent(r'''
    import gc, os, sys
    port, nproc, pid, root = sys.argv[1:5]
    nproc, pid = int(nproc), int(pid)
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_num_cpu_devices", 2)
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=nproc, process_id=pid)
    import numpy as np
    import treecask
    from treecask import _replicas
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    MIB = 1 << 20

    def status(field):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024

    def reset_peak():
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS

    # rows sharded over the 2 devices of a process, replicated over the 2 processes
    mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("replica", "model"))
    sh = NamedSharding(mesh, P("model"))
    rows = (64 * MIB) // (4 * 1024)
    w = np.random.default_rng(0).standard_normal((rows, 1024), np.float32)
    def tree(scale):
        return {"w": jax.make_array_from_callback(w.shape, sh, lambda i: w[i] * scale)}
    treecask.save(root + "/warm", tree(1))  # compiles and warms every path once
    treecask.load(root + "/warm", shardings={"w": sh})
    t = tree(2)
    jax.block_until_ready(t)
    gc.collect()
    held = 64 * MIB  # this process's device buffers: two 32 MiB row blocks
    base = status("VmRSS")
    reset_peak()
    treecask.save(root + "/ckpt", t)
    save_peak = status("VmHWM") - base
    del t
    gc.collect()
    base = status("VmRSS")
    reset_peak()
    before = _replicas.placed_bytes
    got = treecask.load(root + "/ckpt", shardings={"w": sh})
    jax.block_until_ready(got)
    load_peak = status("VmHWM") - base - held  # above the restored tree
    read = _replicas.placed_bytes - before
    ok = all(np.array_equal(np.asarray(s.data), w[s.index] * 2) for s in got["w"].addressable_shards)
    print("MEM", pid, save_peak // MIB, load_peak // MIB, read // MIB, ok, flush=True)
    print("CHILD OK", pid, flush=True)
''')


def test_replica_parallel_save_and_single_read_restore_keep_host_memory_flat(tmp_path):
    """Two processes, a 64 MiB float32 array per process (row blocks over each
    process's 2 devices, replicated over the processes): the save writes 32
    MiB per process and peaks <= 24 MiB above the tree (as a single process's
    save, test_memory.py); the single-read restore reads 32 MiB per process
    (its part of each block) and peaks, above the tree it restores, at the
    parts of one leaf in flight -- the parts read, their device copy and the
    all-gather's receive buffer, 3 x 32 MiB -- plus 8 MiB; never a second
    copy of the tree. (Measured here: 2 MiB for the save, 93 MiB for the
    restore.)"""
    procs = launch(tmp_path / "mem_child.py", MEMORY_CHILD, 2, lambda port, i: (port, 2, i, tmp_path))
    outs = collect(procs, "memory", timeout=240)
    for out in outs:
        line = [ln for ln in out.splitlines() if ln.startswith("MEM ")][0].split()
        save_peak, load_peak, read, ok = int(line[2]), int(line[3]), int(line[4]), line[5] == "True"
        assert ok, out
        assert save_peak <= 24, out
        assert read <= 33, out  # its half of the stored 64 MiB (plus nothing else)
        assert load_peak <= 3 * read + 8, out
