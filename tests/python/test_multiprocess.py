"""Multi-process save and restore with jax.distributed, in real processes on
localhost (SPEC.md "Sharded checkpoints"; docs/python.md "Multi-process").

Each launch starts N child Python processes that call
``jax.distributed.initialize("127.0.0.1:PORT", num_processes=N, process_id=i)``
with gloo CPU collectives and ``jax_num_cpu_devices`` devices each; the child
code is CHILD below. Scenarios are batched per launch: a process costs about
2 s to start.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import textwrap
import time

import numpy as np
import pytest

import treecask
from treecask import _core, _distributed
from jobs import collect, launch

pytest.importorskip("jax")

CHILD = textwrap.dedent(
    r'''
    import os, sys
    port, nproc, pid, ndev, scenario, root = sys.argv[1:7]
    nproc, pid, ndev = int(nproc), int(pid), int(ndev)
    os.environ.pop("XLA_FLAGS", None)
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_num_cpu_devices", ndev)
    if nproc > 1:
        jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=nproc, process_id=pid)
    import numpy as np
    import treecask
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    W = np.arange(64, dtype=np.float32).reshape(8, 8) * 0.5
    REP = (np.arange(15, dtype=np.int32) * 3).reshape(5, 3)
    HOST = np.arange(4.0)
    import ml_dtypes
    # Sub-byte leaves (packed two per byte in the files): saved in boxes of
    # 2x6 (int4) and 4x3 (uint4) elements, restored in boxes that start
    # mid-byte and cross the saved ones.
    Q4 = ((np.arange(96) * 5) % 16 - 8).astype(ml_dtypes.int4).reshape(8, 12)
    U4 = ((np.arange(96) * 7) % 16).astype(ml_dtypes.uint4).reshape(8, 12)

    def check_sub_byte(path, m, q_spec, u_spec):
        got = treecask.load(path, shardings={"q": NamedSharding(m, q_spec), "u": NamedSharding(m, u_spec)})
        check(got["q"], Q4)
        check(got["u"], U4)

    def mesh(shape):
        assert len(jax.devices()) == shape[0] * shape[1]
        return Mesh(np.array(jax.devices()).reshape(shape), ("x", "y"))

    def global_array(value, sharding):
        return jax.make_array_from_callback(value.shape, sharding, lambda idx: value[idx])

    def check(arr, want):
        assert arr.shape == want.shape and arr.dtype == want.dtype, (arr.shape, arr.dtype, want.shape)
        assert len(arr.addressable_shards) == ndev
        for s in arr.addressable_shards:
            np.testing.assert_array_equal(np.asarray(s.data), want[s.index])

    def restore_and_check(path, m, spec, step):
        sh = {"params": {"w": NamedSharding(m, spec), "rep": NamedSharding(m, P())}}
        tree = treecask.load(path, shardings=sh)
        check(tree["params"]["w"], W)
        assert tree["params"]["w"].sharding.spec == spec
        check(tree["params"]["rep"], REP)
        assert tree["step"] == step and isinstance(tree["step"], int)
        np.testing.assert_array_equal(tree["host"], HOST)
        # As plain NumPy, in every process.
        plain = treecask.load(path)
        np.testing.assert_array_equal(plain["params"]["w"], W)
        np.testing.assert_array_equal(plain["params"]["rep"], REP)

    if scenario == "save":  # 2 processes x 4 devices
        m = mesh((4, 2))
        tree = {"params": {"w": global_array(W, NamedSharding(m, P("x", "y"))),
                           "rep": global_array(REP, NamedSharding(m, P()))},
                "step": 7, "host": HOST}
        treecask.save(root + "/arrays", {"w": tree["params"]["w"], "rep": tree["params"]["rep"]})
        st = treecask.save(root + "/ckpt", tree, metadata={"run": "mp"})
        assert st.num_leaves == 4 and st.raw_bytes == W.nbytes + REP.nbytes + 8 + HOST.nbytes, st
        try:
            treecask.save(root + "/ckpt", tree)
            raise SystemExit("expected AlreadyExistsError")
        except treecask.AlreadyExistsError as e:
            assert "ckpt" in str(e)
        tree["step"] = 8
        treecask.save(root + "/ckpt", tree, overwrite=True, metadata={"run": "mp"})
        restore_and_check(root + "/ckpt", m, P("x", "y"), 8)
        treecask.save(root + "/sub_byte", {"q": global_array(Q4, NamedSharding(m, P("x", "y"))),
                                           "u": global_array(U4, NamedSharding(m, P("y", "x")))})
        check_sub_byte(root + "/sub_byte", m, P("y", "x"), P("x", "y"))
        # The single-file archive the test wrote, placed onto this job's mesh.
        single = treecask.load(root + "/single.cask", shardings=NamedSharding(m, P("x", "y")))
        check(single["w"], W)
    elif scenario == "restore_1x8":
        restore_and_check(root + "/ckpt", mesh((2, 4)), P(None, "y"), 8)
        check_sub_byte(root + "/sub_byte", mesh((2, 4)), P(None, "y"), P("x", "y"))
    elif scenario == "restore_4x2":
        m = mesh((8, 1))
        restore_and_check(root + "/ckpt", m, P("x", "y"), 8)
        check_sub_byte(root + "/sub_byte", m, P("x", None), P(None, "y"))
        single = treecask.load(root + "/single.cask", shardings=NamedSharding(m, P("x", None)))
        check(single["w"], W)
    elif scenario == "kill":  # 2 x 4: a good save, then one that process 1 dies in
        m = mesh((4, 2))
        tree = {"params": {"w": global_array(W, NamedSharding(m, P("x", "y"))),
                           "rep": global_array(REP, NamedSharding(m, P()))},
                "step": 1, "host": HOST}
        treecask.save(root + "/prev", tree)
        big = np.ones((4096, 4096), np.float32)
        # Replicated over "x", which spans both processes: each writes half of each column block.
        tree["big"] = jax.make_array_from_callback(big.shape, NamedSharding(m, P(None, "y")), lambda idx: big[idx])
        print("BIG", flush=True)
        treecask.save(root + "/next", tree)
        print("SAVED", flush=True)
    elif scenario == "manager":  # 2 x 2: a CheckpointManager called the same way in every process
        from jax._src.distributed import global_state
        from jax.experimental import multihost_utils
        m = mesh((2, 2))
        sh = NamedSharding(m, P("x", "y"))
        clobber = jax.jit(lambda a: a * 0 - 1, donate_argnums=0, out_shardings=sh)
        # Replicated over "x", which spans both processes: each saves half of each column block.
        cols = NamedSharding(m, P(None, "y"))
        R = np.arange(128 * 128, dtype=np.float32).reshape(128, 128)
        clobber_r = jax.jit(lambda a: a * 0 - 1, donate_argnums=0, out_shardings=cols)
        with treecask.CheckpointManager(root + "/run", max_to_keep=2) as mngr:
            for step in range(4):
                w = global_array(W * step, sh)
                r = global_array(R * step, cols)
                host = np.full(3, float(step))
                # Asynchronous: save() returns once the shards are safe, before the step is
                # committed. Process 1 calls save() only after process 0's save() has
                # returned, so a save() that waited for the other process would hang here.
                if pid == 1:
                    global_state.client.blocking_key_value_get(f"test/returned/{step}", 60_000)
                assert mngr.save(step, {"w": w, "r": r, "step": step, "host": host}, metrics={"loss": 10.0 - step})
                if pid == 0:
                    global_state.client.key_value_set(f"test/returned/{step}", "yes")
                host[:] = -5.0  # written in place while the step is being saved
                w = clobber(w)  # the saved buffers donated to the next step
                r = clobber_r(r)
            mngr.wait_until_finished()
            multihost_utils.sync_global_devices("retention done")  # process 0 deletes
            assert mngr.all_steps() == [2, 3] and mngr.latest_step() == 3, mngr.all_steps()
            assert mngr.metrics(3) == {"loss": 7.0} and mngr.best_step() == 3
            got = mngr.restore(shardings={"w": NamedSharding(m, P(None, "y")), "r": cols})
            check(got["w"], W * 3)
            check(got["r"], R * 3)
            assert got["step"] == 3
            np.testing.assert_array_equal(got["host"], np.full(3, 3.0))
            # A synchronous manager in the same job: the same protocol in the caller's thread.
            with treecask.CheckpointManager(root + "/sync", async_save=False) as sync:
                sync.save(1, {"w": global_array(W, sh)})
                check(sync.restore(shardings={"w": sh})["w"], W)
    elif scenario == "orbax":  # 2 x 2: Orbax 0.12.8's managers and treecask.orbax's, the same calls
        import orbax.checkpoint as real
        import treecask.orbax as tco
        from orbax.checkpoint import v1 as real_v1
        from treecask.orbax import v1 as tco_v1
        m = mesh((2, 2))
        sh = NamedSharding(m, P("x", "y"))
        # Replicated over "x", which spans both processes: both processes write parts of it.
        cols = NamedSharding(m, P(None, "y"))
        R = np.arange(32 * 8, dtype=np.float32).reshape(32, 8)

        def state(step):
            return {"w": global_array(W * step, sh), "r": global_array(R + step, cols),
                    "b": global_array(np.full(4, float(step), np.float32), NamedSharding(m, P()))}

        # Restored onto another sharding than saved.
        abstract = {"w": jax.ShapeDtypeStruct(W.shape, W.dtype, sharding=NamedSharding(m, P(None, "x"))),
                    "r": jax.ShapeDtypeStruct(R.shape, R.dtype, sharding=cols),
                    "b": jax.ShapeDtypeStruct((4,), np.float32, sharding=NamedSharding(m, P()))}

        def check_state(got, step):
            check(got["w"], W * step)
            assert got["w"].sharding.spec == P(None, "x"), got["w"].sharding
            check(got["r"], R + step)
            check(got["b"], np.full(4, float(step), np.float32))

        seen = {}
        for name, ocp, v1 in (("orbax", real, real_v1), ("treecask", tco, tco_v1)):
            run = f"{root}/{name}/run"
            options = ocp.CheckpointManagerOptions(max_to_keep=2, best_fn=lambda m: m["loss"], best_mode="min")
            with ocp.CheckpointManager(run, options=options, metadata={"job": "mp"}) as mngr:
                for step in range(3):  # asynchronous (Orbax's default)
                    assert mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state(step)),
                                                                   meta=ocp.args.JsonSave({"step": step})),
                                     metrics={"loss": 1.0 / (step + 1)})
                mngr.wait_until_finished()
                got = mngr.restore(2, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                                              meta=ocp.args.JsonRestore()))
                check_state(got.state, 2)
                listing = (mngr.all_steps(), mngr.latest_step(), mngr.best_step(), got.meta, mngr.metrics(2),
                           mngr.metadata().custom_metadata)
            with ocp.CheckpointManager(run) as again:  # a fresh manager lists what is there
                listing += (again.all_steps(),)
                check_state(again.restore(1, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract))).state, 1)
            with v1.training.Checkpointer(f"{root}/{name}/v1") as ckptr:
                for step in range(2):
                    assert ckptr.save_pytree(step, state(step), metrics={"loss": float(step)})
                check_state(ckptr.load_pytree(1, abstract), 1)
                listing += ([c.step for c in ckptr.checkpoints], ckptr.latest.metrics)
            # One checkpoint of several items: a composite Checkpointer's, v1's save_checkpointables.
            ckptr = ocp.Checkpointer(ocp.CompositeCheckpointHandler())
            ckptr.save(f"{root}/{name}/composite", args=ocp.args.Composite(
                state=ocp.args.StandardSave(state(3)), meta=ocp.args.JsonSave({"v": 1})))
            got = ckptr.restore(f"{root}/{name}/composite", args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
            check_state(got.state, 3)
            v1.save_checkpointables(f"{root}/{name}/checkpointables", dict(state=state(4), extra=state(9)))
            v1.save_checkpointables(f"{root}/{name}/checkpointables", dict(state=state(4), extra=state(5)),
                                    overwrite=True)  # replaced whole
            check_state(v1.load_pytree(f"{root}/{name}/checkpointables", abstract, checkpointable_name="extra"), 5)
            dirs = lambda d: sorted(e for e in os.listdir(d) if os.path.isdir(os.path.join(d, e)))  # noqa: E731
            listing += (got.meta, dirs(f"{root}/{name}/composite"), dirs(f"{root}/{name}/checkpointables"))
            seen[name] = listing
        assert seen["treecask"] == seen["orbax"], seen
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices("orbax scenario done")
    print("CHILD OK", pid, flush=True)
    '''
)


def _start(tmp_path, scenario: str, nproc: int, ndev: int):
    return launch(tmp_path / "child.py", CHILD, nproc, lambda port, i: (port, nproc, i, ndev, scenario, tmp_path))


def _run(tmp_path, scenario: str, nproc: int, ndev: int, timeout: float = 180) -> None:
    collect(_start(tmp_path, scenario, nproc, ndev), scenario, timeout)


W = np.arange(64, dtype=np.float32).reshape(8, 8) * 0.5
REP = (np.arange(15, dtype=np.int32) * 3).reshape(5, 3)


def test_two_process_save_restores_on_other_topologies(tmp_path):
    treecask.save(tmp_path / "single.cask", {"w": W})
    _run(tmp_path, "save", 2, 4)
    ckpt = tmp_path / "ckpt"
    assert sorted(os.listdir(ckpt)) == ["index.cask", "process_0.cask", "process_1.cask"]
    assert not glob.glob(str(tmp_path / "ckpt.tmp.*"))  # the overwritten one and the temporaries are gone

    # Each process file holds only its own shards, one copy of each: process 0
    # (devices 0-3: mesh rows 0-1) the top half of w, the replicated array, the
    # scalar and the host array; process 1 only the bottom half of w.
    p0 = treecask.open(ckpt / "process_0.cask")
    p1 = treecask.open(ckpt / "process_1.cask")
    assert sorted(p0.keys()) == sorted([
        "params~1w@0:2,0:4", "params~1w@0:2,4:8", "params~1w@2:4,0:4", "params~1w@2:4,4:8",
        "params~1rep@0:5,0:3", "step@", "host@0:4"])
    assert sorted(p1.keys()) == sorted([
        "params~1w@4:6,0:4", "params~1w@4:6,4:8", "params~1w@6:8,0:4", "params~1w@6:8,4:8"])
    raw = {f: sum(a.info(k).byte_length for k in a.keys()) for f, a in (("p0", p0), ("p1", p1))}
    assert raw["p0"] == W.nbytes // 2 + REP.nbytes + 8 + 32
    assert raw["p1"] == W.nbytes // 2
    np.testing.assert_array_equal(p1["params~1w@6:8,4:8"], W[6:8, 4:8])

    # The directory reads as one checkpoint, in this (single) process, as NumPy.
    with treecask.open(ckpt) as c:
        assert isinstance(c, _distributed.ShardedArchive)
        assert c.format_version == (3, 1)
        assert c.metadata["run"] == "mp" and c.metadata["treecask.processes"] == "2"
        info = c.info("params/w")
        assert info.shape == (8, 8) and info.sharding.spec == (("x",), ("y",))
        # Its saved boxes, and no view of a map: c["params/w"] is assembled from them.
        assert sorted(info.shards) == sorted(
            treecask.ShardBox(f"process_{r // 4}.cask", f"params~1w@{r}:{r + 2},{c0}:{c0 + 4}", (r, c0), (r + 2, c0 + 4))
            for r in (0, 2, 4, 6) for c0 in (0, 4))
        assert not info.zero_copy and c["params/w"].flags.owndata
        assert treecask.open(ckpt / "process_0.cask").info("params~1w@0:2,0:4").shards == ()
        assert c.verify() == []
        np.testing.assert_array_equal(c.read_slice("params/w", (slice(1, 7), slice(3, 6))), W[1:7, 3:6])
        np.testing.assert_array_equal(c.read_slice("params/w", (5, slice(2, None))), W[5, 2:])
        np.testing.assert_array_equal(c.read_rows("params/w", 3, 5), W[3:5])
    # Sub-byte leaves saved in boxes of 2x6 / 4x3 elements: as NumPy, and any
    # hyperslab (odd offsets, across boxes), one element per byte.
    import ml_dtypes

    q4 = ((np.arange(96) * 5) % 16 - 8).astype(ml_dtypes.int4).reshape(8, 12)
    u4 = ((np.arange(96) * 7) % 16).astype(ml_dtypes.uint4).reshape(8, 12)
    sub = treecask.load(tmp_path / "sub_byte")
    assert sub["q"].dtype == q4.dtype and sub["u"].dtype == u4.dtype
    np.testing.assert_array_equal(sub["q"], q4)
    np.testing.assert_array_equal(sub["u"], u4)
    with treecask.open(tmp_path / "sub_byte") as c:
        assert isinstance(c, _distributed.ShardedArchive) and c.info("q").shape == (8, 12)
        for idx in [(slice(1, 7), slice(3, 10)), (5, slice(1, None)), (slice(None), 7), (slice(3, 4), slice(5, 6))]:
            np.testing.assert_array_equal(c.read_slice("q", idx), q4[idx])
            np.testing.assert_array_equal(c.read_slice("u", idx), u4[idx])
        np.testing.assert_array_equal(c.read_rows("u", 3, 6), u4[3:6])
    plain = treecask.load(ckpt)
    np.testing.assert_array_equal(plain["params"]["w"], W)
    np.testing.assert_array_equal(plain["params"]["rep"], REP)
    assert plain["step"] == 8

    # The CLI reads the directory: ls shows global shapes, verify checks every
    # shard file, export assembles whole tensors.
    cli = os.environ.get("TREECASK_CLI")
    if cli:
        ls = subprocess.run([cli, "ls", str(ckpt)], capture_output=True, text=True, check=True).stdout
        assert "params/w" in ls and "[8,8]" in ls and "shards:8" in ls and "shards:1" in ls, ls
        ver = subprocess.run([cli, "verify", str(ckpt)], capture_output=True, text=True)
        assert ver.returncode == 0 and "OK: 4 leaves in 2 shard files" in ver.stdout, ver
        out = tmp_path / "arrays.safetensors"
        subprocess.run([cli, "export", str(tmp_path / "arrays"), str(out)], capture_output=True, check=True)
        from safetensors.numpy import load_file

        got = load_file(str(out))
        np.testing.assert_array_equal(got["w"], W)
        np.testing.assert_array_equal(got["rep"], REP)
        # Damage one shard file's bytes: verify names the file and the leaf.
        p1 = ckpt / "process_1.cask"
        blob = bytearray(p1.read_bytes())
        at = blob.find(W[6:8, 4:8].tobytes())
        assert at > 0
        blob[at] ^= 0xFF
        damaged = tmp_path / "damaged"
        damaged.mkdir()
        for f in os.listdir(ckpt):
            (damaged / f).write_bytes(blob if f == "process_1.cask" else (ckpt / f).read_bytes())
        ver = subprocess.run([cli, "verify", str(damaged)], capture_output=True, text=True)
        assert ver.returncode == 5 and "process_1.cask" in ver.stdout and "params~1w@6:8,4:8" in ver.stdout, ver

    # Other topologies: 1 process x 8 devices on (2, 4) with P(None, "y");
    # 4 processes x 2 devices on (8, 1).
    _run(tmp_path, "restore_1x8", 1, 8)
    _run(tmp_path, "restore_4x2", 4, 2)


def test_export_safetensors_of_a_sharded_checkpoint(tmp_path):
    """treecask.export_safetensors of a sharded checkpoint directory (two processes' boxes)
    writes each global array whole, as `treecask export DIR` does; with TREECASK_CLI set,
    `treecask export DIR OUT --max-shard-size` writes byte-identical files and the one-file
    export holds the same tensors."""
    from safetensors.numpy import load_file

    treecask.save(tmp_path / "single.cask", {"w": W})  # the "save" scenario restores it too
    _run(tmp_path, "save", 2, 4)
    arrays = tmp_path / "arrays"
    assert sorted(os.listdir(arrays)) == ["index.cask", "process_0.cask", "process_1.cask"]
    out = tmp_path / "hf"
    r = treecask.export_safetensors(arrays, out, max_shard_size=200)
    assert r.num_tensors == 2 and r.total_size == W.nbytes + REP.nbytes
    assert [os.path.basename(s) for s in r.shards] == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]  # rep; w (256 bytes) alone
    got = {}
    for shard in r.shards:
        got.update(load_file(shard))
    assert sorted(got) == ["rep", "w"]
    np.testing.assert_array_equal(got["w"], W)
    np.testing.assert_array_equal(got["rep"], REP)
    cli = os.environ.get("TREECASK_CLI")
    if cli:
        cli_out = tmp_path / "hf_cli"
        subprocess.run([cli, "export", str(arrays), str(cli_out), "--max-shard-size", "200"],
                       capture_output=True, check=True)
        assert sorted(os.listdir(cli_out)) == sorted(os.listdir(out))
        for name in os.listdir(out):
            assert (cli_out / name).read_bytes() == (out / name).read_bytes(), name
        one = tmp_path / "one.safetensors"
        subprocess.run([cli, "export", str(arrays), str(one)], capture_output=True, check=True)
        whole = load_file(str(one))
        assert sorted(whole) == ["rep", "w"]
        np.testing.assert_array_equal(whole["w"], W)
        np.testing.assert_array_equal(whole["rep"], REP)


def test_a_process_killed_mid_save_leaves_no_checkpoint(tmp_path):
    procs = _start(tmp_path, "kill", 2, 4)
    try:
        # Wait until process 0 has created the temporary directory of the
        # second save (both processes are writing their shards), then SIGKILL
        # process 1.
        deadline = time.monotonic() + 150
        while not glob.glob(str(tmp_path / "next.tmp.*")):
            assert time.monotonic() < deadline, "the second save never started"
            assert procs[0].poll() is None and procs[1].poll() is None, procs[0].communicate()[0]
            time.sleep(0.005)
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait()
        # Process 0 now waits for process 1 (barrier); nothing may appear.
        time.sleep(1.0)
        assert not (tmp_path / "next").exists()
        procs[0].send_signal(signal.SIGKILL)
        out0 = procs[0].communicate()[0]
        assert "SAVED" not in out0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert not (tmp_path / "next").exists()
    stale = glob.glob(str(tmp_path / "next.tmp.*"))
    assert len(stale) == 1
    # The previous checkpoint is intact and restores.
    prev = treecask.load(tmp_path / "prev")
    np.testing.assert_array_equal(prev["params"]["w"], W)
    assert prev["step"] == 1
    # The next save to that path removes the dead job's temporary directory
    # (its process 0 is gone); a live one's would be kept.
    _core.remove_stale_temporaries(str(tmp_path / "next"))
    assert not glob.glob(str(tmp_path / "next.tmp.*"))


def test_checkpoint_manager_in_every_process(tmp_path):
    """CheckpointManager called the same way in both processes of a job: asynchronous saves that
    return before the other process has even started its save, and hold the values of the call
    despite in-place writes and donation; each step a sharded checkpoint directory; retention
    (process 0) keeps the newest two; every process restores the latest onto its own devices, and
    a later single process reads the same directory."""
    _run(tmp_path, "manager", 2, 2)
    run = tmp_path / "run"
    assert sorted(os.listdir(run)) == ["step_00000002.cask", "step_00000003.cask"]
    assert sorted(os.listdir(run / "step_00000003.cask")) == ["index.cask", "process_0.cask", "process_1.cask"]
    with treecask.open(run / "step_00000003.cask") as c:  # r: a column block's halves, one per process
        assert sorted({b.file for b in c.info("r").shards}) == ["process_0.cask", "process_1.cask"]
    with treecask.CheckpointManager(run) as mngr:
        assert mngr.all_steps() == [2, 3] and mngr.metrics(2) == {"loss": 8.0}
        got = mngr.restore()
        np.testing.assert_array_equal(got["w"], W * 3)
        np.testing.assert_array_equal(got["r"], np.arange(128 * 128, dtype=np.float32).reshape(128, 128) * 3)
        assert got["step"] == 3
        np.testing.assert_array_equal(got["host"], np.full(3, 3.0))
    assert sorted(os.listdir(tmp_path / "sync")) == ["step_00000001.cask"]


def test_orbax_managers_in_every_process(tmp_path):
    """treecask.orbax's CheckpointManager, v1 training.Checkpointer, composite Checkpointer and v1
    save_checkpointables called the same way in both processes of a jax job, beside Orbax 0.12.8's
    in the same processes (CHILD "orbax"): the same steps listed, metrics, JSON items, run metadata
    and item directories, and every process restores the same values onto a sharding other than the
    saved one. Each item is the core's sharded checkpoint (<step>/<item>/index.cask +
    process_<k>.cask, both processes writing parts of the replicated leaf), and a later single
    process reads the same directories."""
    pytest.importorskip("orbax.checkpoint")
    import treecask.orbax as tco
    from treecask.orbax import v1 as tco_v1

    _run(tmp_path, "orbax", 2, 2)
    run = tmp_path / "treecask" / "run"
    assert sorted(os.listdir(run)) == ["1", "2", "metadata"]
    assert sorted(os.listdir(run / "2")) == ["index.cask", "meta", "metrics", "state"]
    orbax_step = tmp_path / "orbax" / "run" / "2"
    assert sorted(e for e in os.listdir(orbax_step) if (orbax_step / e).is_dir()) == ["meta", "metrics", "state"]
    assert sorted(os.listdir(run / "2" / "state")) == ["index.cask", "process_0.cask", "process_1.cask"]
    with treecask.open(run / "2" / "state") as c:  # r: a column block's halves, one per process
        assert isinstance(c, _distributed.ShardedArchive)
        assert sorted({b.file for b in c.info("r").shards}) == ["process_0.cask", "process_1.cask"]
    # Orbax's run holds the same entries (its step directories' files are its own).
    assert sorted(os.listdir(tmp_path / "orbax" / "run")) == ["1", "2", "metadata"]
    R = np.arange(32 * 8, dtype=np.float32).reshape(32, 8)
    with tco.CheckpointManager(run) as mngr:
        assert mngr.all_steps() == [1, 2]
        got = mngr.restore(2)
        np.testing.assert_array_equal(got.state["w"], W * 2)
        np.testing.assert_array_equal(got.state["r"], R + 2)
        assert got.meta == {"step": 2}
    for d, items in (("composite", ["index.cask", "meta", "state"]), ("checkpointables", ["extra", "index.cask", "state"])):
        assert sorted(os.listdir(tmp_path / "treecask" / d)) == items
        assert sorted(os.listdir(tmp_path / "treecask" / d / "state")) == ["index.cask", "process_0.cask",
                                                                             "process_1.cask"]
    np.testing.assert_array_equal(tco_v1.load_pytree(tmp_path / "treecask" / "checkpointables",
                                                     checkpointable_name="extra")["r"], R + 5)
    with tco_v1.training.Checkpointer(tmp_path / "treecask" / "v1") as ckptr:
        assert [c.step for c in ckptr.checkpoints] == [0, 1]
        np.testing.assert_array_equal(ckptr.load_pytree(1)["w"], W)
