"""``treecask.stores``: a store object passed by the user (an obstore
``MemoryStore``, a bucket's ``S3Store``, a ``LocalStore`` of a directory)
serves ``save``, ``open``, ``load`` and ``CheckpointManager`` (in one process
and in a 2-process jax.distributed job) and ``treecask.orbax`` as a URL or a
path does, and the commit rules are the same whichever store: an existing
checkpoint refused before anything is written, dead writers' temporaries
swept, never a secret in what is shown."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

import treecask
from treecask import _core
from treecask.stores import LocalStore, ObjectStore, Store

obstore = pytest.importorskip("obstore")
from obstore.store import MemoryStore  # noqa: E402

from conftest import trees_equal  # noqa: E402


def tree(v: float = 1.0):
    return {"w": np.full((64, 32), v, np.float32), "b": np.arange(5, dtype=np.int64), "step": int(v)}


def keys(store: ObjectStore):
    return sorted(m["path"] for batch in obstore.list(store.store) for m in batch)


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_save_open_load_in_a_memory_store():
    store = ObjectStore(MemoryStore())
    assert isinstance(store, Store)
    stats = treecask.save("run/model.cask", tree(), store=store)
    assert stats.file_bytes > 0 and keys(store) == ["run/model.cask"]
    assert trees_equal(treecask.load("run/model.cask", store=store), tree())
    with treecask.open("run/model.cask", store=store) as a:
        assert isinstance(a, treecask.Archive) and isinstance(a, treecask.Reader)
        assert a.path == "<MemoryStore>/run/model.cask"
        np.testing.assert_array_equal(a["w"], tree()["w"])
        assert not a.info("w").zero_copy  # read by range, never a view
    # A leading "/" names the same key: object keys have none.
    assert trees_equal(treecask.load("/run/model.cask", store=store), tree())


def test_an_existing_checkpoint_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    """The pre-check lists the key itself (obstore lists whole path segments:
    listing "run/model.cask" would only list "run/model.cask/..."), so an
    existing object is refused before the archive is written to scratch or
    uploaded; overwrite=True replaces it."""
    monkeypatch.setenv("TREECASK_SCRATCH_DIR", str(tmp_path))
    uploads = []

    class Recording(ObjectStore):
        def put_file(self, path, local_file, *, overwrite):
            uploads.append(path)
            super().put_file(path, local_file, overwrite=overwrite)

    store = Recording(MemoryStore(), name="mem://b")
    treecask.save("run/model.cask", tree(1.0), store=store)
    assert uploads == ["run/model.cask"]
    with pytest.raises(treecask.AlreadyExistsError, match="overwrite=True") as e:
        treecask.save("run/model.cask", tree(2.0), store=store)
    assert e.value.file == "mem://b/run/model.cask"
    assert uploads == ["run/model.cask"] and not list(tmp_path.iterdir())  # no scratch made, nothing uploaded
    treecask.save("run/model.cask", tree(2.0), store=store, overwrite=True)
    assert trees_equal(treecask.load("run/model.cask", store=store), tree(2.0))
    # A committed multi-process checkpoint "directory" of that name is refused too.
    obstore.put(store.store, "run/dir.cask/index.cask", b"x")
    with pytest.raises(treecask.AlreadyExistsError):
        treecask.save("run/dir.cask", tree(), store=store)


def test_dead_writers_temporaries_are_swept_by_the_next_save_of_their_key():
    store = ObjectStore(MemoryStore())
    host = socket.gethostname()
    dead = f"run/model.cask.tmp.{host}.{dead_pid()}.00000000deadbeef"
    live = f"run/model.cask.tmp.{host}.{os.getpid()}.00000000000beef0"
    other_host = f"run/model.cask.tmp.elsewhere.{dead_pid()}.0000000000000bad"
    dead_dir = f"run/model.cask.tmp.{host}.{dead_pid()}.0000000000dead00/process_0.cask"
    for k in (dead, live, other_host, dead_dir, "run/other.cask"):
        obstore.put(store.store, k, b"half")
    treecask.save("run/model.cask", tree(), store=store)
    assert keys(store) == sorted(["run/model.cask", live, other_host, "run/other.cask"])


def test_a_checkpoint_manager_on_a_store_object():
    store = ObjectStore(MemoryStore(), name="mem://bucket")
    for async_save in (False, True):
        run = f"runs/{async_save}"
        with treecask.CheckpointManager(run, store=store, max_to_keep=2, async_save=async_save) as m:
            for s in range(4):
                assert m.save(s, tree(float(s)), metrics={"loss": 4.0 - s})
            m.wait_until_finished()
            assert m.all_steps() == [2, 3] and m.latest_step() == 3
            assert m.metrics(3) == {"loss": 1.0}
            assert str(m.path(3)) == f"mem://bucket/{run}/step_00000003.cask"
            assert trees_equal(m.restore(), tree(3.0)) and trees_equal(m.restore(2), tree(2.0))
            with pytest.raises(treecask.AlreadyExistsError):
                m.save(3, tree())
        assert sorted(k for k in keys(store) if k.startswith(run + "/")) == [
            f"{run}/step_00000002.cask", f"{run}/step_00000003.cask"]
    # Another manager of the same run sees the same steps.
    assert treecask.CheckpointManager("runs/True", store=store).all_steps() == [2, 3]


def test_a_local_store_of_a_directory(tmp_path):
    store = LocalStore(tmp_path)
    (tmp_path / "a").mkdir()
    treecask.save("a/model.cask", tree(), store=store, compression="none")
    assert (tmp_path / "a" / "model.cask").is_file()
    with treecask.open("a/model.cask", store=store) as a:
        assert a.info("w").zero_copy and a.path == str(tmp_path / "a" / "model.cask")  # mapped, as a path is
    with treecask.CheckpointManager("run", store=store, max_to_keep=1, async_save=False) as m:
        m.save(1, tree(1.0))
        m.save(2, tree(2.0))
        assert m.all_steps() == [2] and m.path(2) == tmp_path / "run" / "step_00000002.cask"
    assert sorted(os.listdir(tmp_path / "run")) == ["step_00000002.cask"]


def test_a_store_object_on_a_bucket(s3_server):
    """The client's own configuration: an obstore S3Store, no environment."""
    s3_server.create_bucket("seam")
    store = ObjectStore(s3_server.store("seam"), name="s3://seam")
    treecask.save("x/model.cask", tree(), store=store)
    assert trees_equal(treecask.load("x/model.cask", store=store), tree())
    with treecask.CheckpointManager("run", store=store, max_to_keep=1) as m:
        m.save(1, tree(1.0))
        m.save(2, tree(2.0))
        m.wait_until_finished()
        assert m.all_steps() == [2]
        assert trees_equal(m.restore(), tree(2.0))


SECRET = "5c0f7a8e9d1b2c3d4e5fSECRET"


def test_a_store_shows_no_secret():
    name = f"https://host.example/b?X-Amz-Signature={SECRET}&X-Amz-Security-Token={SECRET}"
    store = ObjectStore(MemoryStore(), name=name)
    for text in (store.display(), store.display("run/x.cask"), repr(store)):
        assert SECRET not in text and "***" in text
    with pytest.raises(treecask.NotFoundError) as e:
        treecask.open("missing.cask", store=store)
    everything = [str(e.value), repr(e.value), e.value.file, *map(str, e.value.args)]
    assert not any(SECRET in t for t in everything), everything
    assert e.value.__cause__ is None and e.value.__context__ is None


def test_bad_store_arguments_are_named():
    with pytest.raises(treecask.InvalidArgumentError, match="ObjectStore"):
        treecask.load("x.cask", store=MemoryStore())  # an obstore store must be wrapped
    with pytest.raises(treecask.InvalidArgumentError, match="storage_options"):
        treecask.load("x.cask", store=ObjectStore(MemoryStore()), storage_options={"region": "x"})


def test_an_http_store_is_read_only(http_server, tmp_path):
    treecask.save(tmp_path / "m.cask", tree())
    (http_server.root / "m.cask").write_bytes((tmp_path / "m.cask").read_bytes())
    store, path = treecask.stores.resolve(http_server.url("m.cask"))
    assert trees_equal(treecask.load(path, store=store), tree())
    with pytest.raises(treecask.UnsupportedError, match="read-only"):
        treecask.save("n.cask", tree(), store=store)


def test_the_redaction_rule_is_the_cores():
    url = f"s3://b/k?x-amz-signature={SECRET}"
    assert ObjectStore(MemoryStore(), name=url).display() == _core.redact_url(url)


MP_STORE_CHILD = r'''
import os, sys
port, pid, kind, where = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.config.update("jax_num_cpu_devices", 2)
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid)
import numpy as np
import treecask
from treecask.stores import LocalStore, ObjectStore
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

if kind == "s3":
    from obstore.store import S3Store
    e = os.environ
    store = ObjectStore(S3Store(where, config={
        "endpoint": e["AWS_ENDPOINT_URL"], "access_key_id": e["AWS_ACCESS_KEY_ID"],
        "secret_access_key": e["AWS_SECRET_ACCESS_KEY"], "region": e["AWS_REGION"],
        "virtual_hosted_style_request": False}, client_options={"allow_http": True}), name=f"s3://{where}")
    base = e["RUN_PREFIX"]
else:
    store, base = LocalStore(where), "jobs"
    if pid == 0:
        os.makedirs(os.path.join(where, base), exist_ok=True)
W = np.arange(1024, dtype=np.float32).reshape(32, 32)
m = Mesh(np.array(jax.devices()).reshape(2, 2), ("x", "y"))

def tree(step):
    w = jax.make_array_from_callback(W.shape, NamedSharding(m, P("x", "y")), lambda i: (W * step)[i])
    return {"w": w, "host": np.full(3, float(step)), "step": step}

def check(got, step):
    assert got["step"] == step, got["step"]
    for s in got["w"].addressable_shards:
        np.testing.assert_array_equal(np.asarray(s.data), (W * step)[s.index])
    np.testing.assert_array_equal(got["host"], np.full(3, float(step)))

from jax.experimental import multihost_utils
multihost_utils.sync_global_devices("made")
ckpt = base + "/ckpt"
treecask.save(ckpt, tree(1), store=store)
check(treecask.load(ckpt, store=store, shardings={"w": NamedSharding(m, P("y", "x"))}), 1)
try:
    treecask.save(ckpt, tree(2), store=store)
    raise SystemExit("expected AlreadyExistsError")
except treecask.AlreadyExistsError as e:
    assert e.file == store.display(ckpt), e.file
treecask.save(ckpt, tree(3), store=store, overwrite=True)
check(treecask.load(ckpt, store=store, shardings={"w": NamedSharding(m, P(None, "x"))}), 3)
with treecask.CheckpointManager(base + "/run", store=store, max_to_keep=2) as mngr:
    for step in (1, 2, 3):
        assert mngr.save(step, tree(step), metrics={"loss": float(10 - step)})
    mngr.wait_until_finished()
    multihost_utils.sync_global_devices("retained")  # process 0 deletes
    assert mngr.all_steps() == [2, 3], mngr.all_steps()
    check(mngr.restore(shardings={"w": NamedSharding(m, P("x", None))}), 3)
print(f"CHILD OK {pid}", flush=True)
'''


def _two_processes_on_a_store(tmp_path, kind, where, env=None):
    from jobs import collect, launch
    procs = launch(tmp_path / "child.py", MP_STORE_CHILD, 2, lambda port, i: [port, i, kind, where],
                   env_extra=env)
    collect(procs, f"2 processes on a {kind} store", timeout=240)


def test_a_two_process_job_saves_to_a_local_store_object(tmp_path):
    """treecask.save(path, tree, store=LocalStore(root)) and a manager with
    store= in a jax.distributed job: the sharded checkpoint directory goes
    through the store (a temporary directory renamed into place), an
    existing one refused, overwrite replaces it; every process restores."""
    pytest.importorskip("jax")
    root = tmp_path / "root"
    root.mkdir()
    _two_processes_on_a_store(tmp_path, "local", str(root))
    jobs = root / "jobs"
    assert sorted(os.listdir(jobs)) == ["ckpt", "run"]  # no temporary left
    assert sorted(os.listdir(jobs / "ckpt")) == ["index.cask", "process_0.cask", "process_1.cask"]
    assert sorted(os.listdir(jobs / "run")) == ["step_00000002.cask", "step_00000003.cask"]
    got = treecask.load("jobs/ckpt", store=LocalStore(root))
    assert got["step"] == 3
    np.testing.assert_array_equal(got["w"], np.arange(1024, dtype=np.float32).reshape(32, 32) * 3)


def test_a_two_process_job_saves_to_an_object_store_object(s3_server, tmp_path):
    """The same job with store=ObjectStore(S3Store(...)), configured by the
    client's own options: each process uploads its shard object, process 0
    commits by creating index.cask; the overwritten checkpoint's objects are
    gone; the manager's retention removes whole steps."""
    pytest.importorskip("jax")
    import uuid

    s3_server.create_bucket("seam")
    prefix = uuid.uuid4().hex
    env = dict(s3_server.env(), RUN_PREFIX=prefix)
    _two_processes_on_a_store(tmp_path, "s3", "seam", env)
    store = ObjectStore(s3_server.store("seam"), name="s3://seam")
    names = sorted(n[len(prefix) + 1:] for n in store.list_prefix(prefix + "/"))
    ckpt = [n for n in names if n.startswith("ckpt/")]
    assert ckpt[0] == "ckpt/index.cask" and len(ckpt) == 3, names
    assert ckpt[1].split(".")[1] == ckpt[2].split(".")[1]  # one save id: the overwrite's
    assert sorted({n.split("/")[1] for n in names if n.startswith("run/")}) == [
        "step_00000002.cask", "step_00000003.cask"], names
    assert treecask.load(prefix + "/ckpt", store=store)["step"] == 3


def test_orbax_checkpointers_on_a_store_object():
    """treecask.orbax's checkpointers take store= (a treecask extension):
    save, restore into a target, metadata and the force rule, in an obstore
    MemoryStore."""
    import treecask.orbax as ocp

    store = ObjectStore(MemoryStore(), name="mem://o")
    ckptr = ocp.StandardCheckpointer()
    ckptr.save("ckpt/state.cask", tree(1.0), store=store)
    ckptr.wait_until_finished()
    assert keys(store) == ["ckpt/state.cask"]
    assert trees_equal(ckptr.restore("ckpt/state.cask", store=store), tree(1.0))
    assert trees_equal(ckptr.restore("ckpt/state.cask", tree(0.0), store=store), tree(1.0))
    assert ckptr.metadata("ckpt/state.cask", store=store).item_metadata.tree["w"].shape == (64, 32)
    with pytest.raises(treecask.AlreadyExistsError) as e:
        ckptr.save("ckpt/state.cask", tree(2.0), store=store)
        ckptr.wait_until_finished()
    assert e.value.file == "mem://o/ckpt/state.cask"
    ckptr.save("ckpt/state.cask", tree(2.0), store=store, force=True)
    ckptr.wait_until_finished()
    assert trees_equal(ckptr.restore("ckpt/state.cask", store=store), tree(2.0))
    legacy = ocp.PyTreeCheckpointer()
    legacy.save("ckpt/legacy.cask", tree(3.0), store=store)
    assert trees_equal(legacy.restore("ckpt/legacy.cask", store=store), tree(3.0))
    with pytest.raises(treecask.NotFoundError):
        legacy.restore("ckpt/missing.cask", store=store)


def test_orbax_managers_on_a_store_object():
    """treecask.orbax.CheckpointManager(directory, store=...) and Orbax v1's
    training.Checkpointer and free functions, in an obstore MemoryStore:
    steps listed, retained, restored and deleted through the store."""
    import treecask.orbax as ocp
    from treecask.orbax import v1

    store = ObjectStore(MemoryStore(), name="mem://o")
    opts = ocp.CheckpointManagerOptions(max_to_keep=2)
    with ocp.CheckpointManager("run", options=opts, store=store) as mngr:
        for step in range(3):
            assert mngr.save(step, args=ocp.args.StandardSave(tree(float(step))), metrics={"loss": 3.0 - step})
        mngr.wait_until_finished()
        assert mngr.all_steps() == [1, 2] and mngr.latest_step() == 2
        assert trees_equal(mngr.restore(2, args=ocp.args.StandardRestore(tree(0.0))), tree(2.0))
        assert trees_equal(mngr.restore(None), tree(2.0))
        assert mngr.item_metadata(1).tree["b"].shape == (5,)
        assert mngr.metadata(1).metrics == {}  # as Orbax: metrics are kept only with a best_fn
        mngr.delete(1)
        assert mngr.all_steps() == [2]
    assert sorted(keys(store)) == ["run/2/default", "run/2/index.cask"]  # Orbax's step layout (no best_fn: no metrics entry)
    # Orbax v1: the free functions and the training Checkpointer.
    v1.save_pytree("v1/state.cask", tree(4.0), store=store)
    assert trees_equal(v1.load_pytree("v1/state.cask", store=store), tree(4.0))
    assert v1.metadata("v1/state.cask", store=store).metadata["w"].shape == (64, 32)
    assert v1.is_orbax_checkpoint("v1/state.cask", store=store)
    assert v1.delete("v1/state.cask", store=store) and not v1.is_orbax_checkpoint("v1/state.cask", store=store)
    with v1.training.Checkpointer("train", store=store) as ckptr:
        assert ckptr.save(5, tree(5.0))
        assert [c.step for c in ckptr.checkpoints] == [5]
        assert trees_equal(ckptr.load(5), tree(5.0))
        assert ckptr.metadata(5).metadata["w"].shape == (64, 32)
    assert {"train/5/state", "train/5/index.cask"} <= set(keys(store))
