"""``treecask.stores``: a store object passed by the user (an obstore
``MemoryStore``, a bucket's ``S3Store``, a ``LocalStore`` of a directory)
serves ``save``, ``open``, ``load`` and ``CheckpointManager`` as a URL or a
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
