"""A multi-process checkpoint is bound to its own shard files (format 3.1,
SPEC.md "Sharded checkpoints" R8/R9, "One checkpoint, never two halves").

Real jax.distributed jobs on localhost (gloo CPU collectives) write the
checkpoints; the test then swaps shard files between them, as a torn rsync or a
half-finished restore from backup would, and expects every read path, in
Python and in the CLI, to refuse the mixed directory. A second test re-saves
one checkpoint with overwrite=True from a 2-process job while this process
loads it in a loop: every load must be one whole version.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
import time

import numpy as np
import pytest

import treecask
from jobs import collect, launch

pytest.importorskip("jax")



CHILD = textwrap.dedent(
    r'''
    import os, sys, time
    port, nproc, pid, scenario, root = sys.argv[1:6]
    nproc, pid = int(nproc), int(pid)
    os.environ.pop("XLA_FLAGS", None)
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_num_cpu_devices", 2)
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=nproc, process_id=pid)
    import numpy as np
    import treecask
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    m = Mesh(np.array(jax.devices()).reshape(2, 2), ("x", "y"))
    sh = NamedSharding(m, P("x", "y"))

    def tree(value, step):
        w = np.full((8, 8), value, np.float32)
        return {"w": jax.make_array_from_callback(w.shape, sh, lambda idx: w[idx]), "step": step}

    if scenario == "steps":
        treecask.save(root + "/step1", tree(1.0, 1))
        treecask.save(root + "/step2", tree(2.0, 2))
        treecask.save(root + "/step1_again", tree(1.0, 1))  # the same step, saved once more
    elif scenario == "other_job":
        treecask.save(root + "/other_job", tree(1.0, 1))  # same topology, same values, another job
    elif scenario == "overwrite_loop":
        deadline = float(os.environ["TEST_DEADLINE"])
        v = 0
        while True:
            treecask.save(root + "/live", tree(float(v), v), overwrite=True, durable=False)
            v += 1
            # Both processes agree on when to stop (process 0's clock decides).
            from jax.experimental import multihost_utils
            stop = multihost_utils.broadcast_one_to_all(np.int32(time.time() > deadline if pid == 0 else 0))
            if int(stop):
                break
        print("SAVES", v, flush=True)
    print("CHILD OK", pid, flush=True)
    '''
)


def _start(tmp_path, scenario, env_extra=None):
    return launch(tmp_path / "binding_child.py", CHILD, 2, lambda port, i: (port, 2, i, scenario, tmp_path), env_extra)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("binding")
    collect(_start(root, "steps"), "steps")
    collect(_start(root, "other_job"), "other_job")
    return root


def _mixed(root, donor: str, name: str):
    """step1 with its `name` replaced by the file of the same name from `donor`."""
    d = root / f"mixed_{donor}_{name.split('.')[0]}"
    if not d.exists():
        shutil.copytree(root / "step1", d)
        shutil.copyfile(root / donor / name, d / name)
    return d


def test_a_saved_checkpoint_binds_its_shard_files(checkpoints):
    with treecask.open(checkpoints / "step1") as c:
        assert c.format_version == (3, 1)
        ids = {treecask.open(checkpoints / "step1" / f).metadata["treecask.save_id"] for f in c.files}
        assert len(ids) == 1 and c.metadata["treecask.save_id"] in ids and len(ids.pop()) == 32
        np.testing.assert_array_equal(c["w"], np.full((8, 8), 1.0, np.float32))
    # Each save has its own id, even with the same values.
    assert treecask.open(checkpoints / "step1_again").metadata["treecask.save_id"] != \
        treecask.open(checkpoints / "step1").metadata["treecask.save_id"]


@pytest.mark.parametrize("donor", ["step2", "step1_again", "other_job"])
@pytest.mark.parametrize("name", ["process_0.cask", "process_1.cask"])
def test_a_shard_file_of_another_save_is_refused_on_every_read_path(checkpoints, donor, name):
    d = _mixed(checkpoints, donor, name)
    reads = {
        "load": lambda: treecask.load(d),
        "load(copy=False)": lambda: treecask.load(d, copy=False),
        "open": lambda: treecask.open(d),
        "a[k]": lambda: treecask.open(d)["w"],
        "read_rows": lambda: treecask.open(d).read_rows("w", 0, 8),
        "read_slice": lambda: treecask.open(d).read_slice("w", (slice(0, 8), slice(0, 8))),
        "verify": lambda: treecask.open(d).verify(),
    }
    for what, read in reads.items():
        with pytest.raises(treecask.CorruptionError) as e:
            read()
        msg = str(e.value)
        assert name in msg and str(d) in msg, (what, msg)
        assert "not the shard file this checkpoint was committed with" in msg, (what, msg)
        assert "save '" in msg, (what, msg)  # names both save ids
    cli = os.environ.get("TREECASK_CLI")
    if cli:
        for cmd in ("verify", "ls", "info"):
            r = subprocess.run([cli, cmd, str(d)], capture_output=True, text=True)
            assert r.returncode == 5 and name in r.stderr + r.stdout, (cmd, r)


def test_an_unbound_checkpoint_still_reads(checkpoints):
    """The 3.0 golden vector (written before binding) opens; it binds nothing."""
    v3 = os.path.join(os.path.dirname(__file__), "..", "..", "format", "vectors", "v3_0_sharded")
    with treecask.open(v3) as c:
        assert c.format_version == (3, 0)
        assert c.verify() == []


def test_concurrent_overwrite_never_mixes_versions(tmp_path):
    """A 2-process job re-saves one checkpoint with overwrite=True in a loop while this process
    loads it: every load is one whole version (all of w equal to its step), and no load fails."""
    deadline = time.time() + 12
    procs = _start(tmp_path, "overwrite_loop", {"TEST_DEADLINE": str(deadline)})
    live = tmp_path / "live"
    loads = errors = 0
    mixed = []
    seen = set()
    try:
        while procs[0].poll() is None and time.time() < deadline + 120:
            if not live.exists():
                time.sleep(0.01)
                continue
            try:
                got = treecask.load(live)
            except treecask.Error as e:  # noqa: PERF203
                errors += 1
                mixed.append(f"error: {e}")
                continue
            loads += 1
            w, step = got["w"], got["step"]
            seen.add(step)
            if not (w == float(step)).all():
                mixed.append(f"step {step}, w holds {sorted(set(w.ravel().tolist()))}")
    finally:
        outs = collect(procs, "overwrite_loop")
    saves = int(outs[0].split("SAVES")[1].split()[0])
    print(f"overwrite loop: {saves} saves, {loads} loads, {len(seen)} versions seen")
    assert not mixed, f"{len(mixed)} of {loads + errors} loads mixed or failed: {mixed[:5]}"
    assert loads >= 200 and saves >= 20 and len(seen) >= 10, (loads, saves, len(seen))
