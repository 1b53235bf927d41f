"""Saving to object stores (docs/remote.md "Saving to object stores";
python/treecask/stores/_upload.py) against a real S3 server, SeaweedFS on loopback:
the object appears whole or not at all, never replaces a checkpoint, and every
failure is an error naming the URL with nothing half-committed."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import numpy as np
import pytest

import treecask
import treecask.stores
from treecask.stores import _upload
from treecask.stores import _s3
from treecask.errors import AlreadyExistsError, IoError, NotFoundError, UnsupportedError

import stores
from test_remote import assert_same, model_tree


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    s3_server.create_bucket("saves")
    # Small thresholds, so that a 12 MiB archive takes the multipart path (S3's
    # smallest part is 5 MiB) and the test server's 1 GiB of volumes suffices.
    monkeypatch.setattr(_upload, "SINGLE_PUT_BYTES", 4 << 20)
    monkeypatch.setattr(_upload, "PART_BYTES", 5 << 20)
    return s3_server


SMALL_PARTS = "from treecask.stores import _upload; _upload.SINGLE_PUT_BYTES = 4 << 20; _upload.PART_BYTES = 5 << 20"


def fresh_url(name="model.cask"):
    return f"s3://saves/{uuid.uuid4().hex}/{name}"


def listing(s3, prefix):
    import obstore
    return sorted(m["path"] for batch in obstore.list(s3.store("saves"), prefix) for m in batch)


def big_tree(mib=12):
    """A tree over SINGLE_PUT_BYTES, so its upload takes the multipart path."""
    rng = np.random.default_rng(1)
    return {"a": rng.standard_normal((mib << 20) // 8), "b": np.arange(10, dtype=np.int32)}


@pytest.mark.parametrize("tree_of", [model_tree, big_tree], ids=["single-put", "multipart"])
def test_save_to_s3_round_trips_and_never_replaces(s3_env, tree_of):
    tree = tree_of()
    url = fresh_url()
    st = treecask.save(url, tree, compression="none")
    assert st.num_leaves > 0
    assert_same(treecask.load(url), tree)
    key = url[len("s3://saves/"):]
    assert listing(s3_env, key.split("/")[0]) == [key]  # no temporary left behind
    with pytest.raises(AlreadyExistsError) as e:
        treecask.save(url, {"other": np.zeros(3)})
    assert url in str(e.value)
    assert_same(treecask.load(url), tree)
    # The commit itself refuses an existing object, whatever a listing said before it
    # (a saver that lost a race): both the single PUT and the multipart copy.
    store = treecask.stores.ObjectStore.from_url(fresh_url())[0].store
    local = treecask.save
    tmp_file = os.path.join(_upload.scratch_dir(), f"tc-{uuid.uuid4().hex}.cask")
    try:
        local(tmp_file, {"other": np.zeros(3)})
        with pytest.raises(AlreadyExistsError):
            _upload.put_file(store, key, tmp_file, url=url, overwrite=False)
    finally:
        os.unlink(tmp_file)
    assert_same(treecask.load(url), tree)
    treecask.save(url, {"other": np.zeros(3)}, overwrite=True)
    assert_same(treecask.load(url), {"other": np.zeros(3)})


def test_two_savers_racing_for_one_object_one_commits(s3_env, tmp_path):
    """Two processes save different trees to one URL at once: exactly one
    commits, the other gets AlreadyExistsError, the object is the winner's."""
    url = fresh_url()
    script = textwrap.dedent(f"""
        import sys, numpy as np, treecask
        from treecask.errors import AlreadyExistsError
        {SMALL_PARTS}
        tree = {{"who": np.full((12 << 20) // 8, float(sys.argv[1]))}}
        try:
            treecask.save({url!r}, tree, compression="none")
            print("committed")
        except AlreadyExistsError as e:
            print("refused", e)
    """)
    env = dict(os.environ, **s3_env.env())
    procs = [subprocess.Popen([sys.executable, "-c", script, str(i)], stdout=subprocess.PIPE, text=True, env=env)
             for i in (1, 2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert sorted(o.split()[0] for o in outs) == ["committed", "refused"], outs
    winner = 1 + [o.startswith("committed") for o in outs].index(True)
    got = treecask.load(url)["who"]
    assert got.shape == ((12 << 20) // 8,) and np.all(got == winner)


def test_a_store_without_conditional_writes_uses_the_documented_fallback(s3_env):
    opts = {"conditional_put": "disabled"}
    for tree in (model_tree(), big_tree()):
        url = fresh_url()
        treecask.save(url, tree, storage_options=opts, compression="none")
        assert_same(treecask.load(url), tree)
        key = url[len("s3://saves/"):]
        store = treecask.stores.ObjectStore.from_url(fresh_url(), opts)[0].store
        tmp_file = os.path.join(_upload.scratch_dir(), f"tc-{uuid.uuid4().hex}.cask")
        try:
            treecask.save(tmp_file, {"other": np.zeros(3)})
            with pytest.raises(AlreadyExistsError):  # the HEAD just before the upload
                _upload.put_file(store, key, tmp_file, url=url, overwrite=False)
        finally:
            os.unlink(tmp_file)
        assert_same(treecask.load(url), tree)


def test_bad_targets_fail_before_any_upload_and_never_print_a_secret(s3_env, tmp_path, monkeypatch):
    secret = "not-the-secret-" + uuid.uuid4().hex
    with pytest.raises(IoError) as e:
        treecask.save(fresh_url(), model_tree(), storage_options={"secret_access_key": secret})
    assert "access denied" in str(e.value) and secret not in str(e.value)
    with pytest.raises(NotFoundError) as e:
        treecask.save("s3://no-such-bucket-here/x.cask", model_tree())
    assert "no such bucket" in str(e.value)
    with pytest.raises(UnsupportedError):
        treecask.save("https://example.invalid/x.cask", model_tree())
    with pytest.raises(UnsupportedError):
        treecask.save("hdfs://namenode/x.cask", model_tree())
    # Nothing was written to scratch and left there.
    monkeypatch.setenv("TREECASK_SCRATCH_DIR", str(tmp_path))
    with pytest.raises(AlreadyExistsError):
        url = fresh_url()
        treecask.save(url, model_tree())
        treecask.save(url, model_tree())
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("drop", [False, True], ids=["503-slowdown", "dropped-connection"])
def test_throttled_uploads_are_retried_then_an_io_error_with_nothing_committed(s3_env, drop):
    tree = model_tree()
    proxy = stores.S3Proxy(s3_env.endpoint, failures=2, drop=drop)
    try:
        url = fresh_url()
        treecask.save(url, tree, storage_options={"endpoint": proxy.endpoint})
        assert proxy.refused == 2
        assert_same(treecask.load(url), tree)
    finally:
        proxy.close()
    proxy = stores.S3Proxy(s3_env.endpoint, failures=10**6, drop=drop)
    try:
        url = fresh_url()
        t0 = time.monotonic()
        with pytest.raises(IoError) as e:
            treecask.save(url, tree, storage_options={"endpoint": proxy.endpoint})
        assert url in str(e.value) and time.monotonic() - t0 < 120
        assert 2 <= proxy.refused <= 20
    finally:
        proxy.close()
    with pytest.raises(NotFoundError):
        treecask.open(url)
    assert listing(s3_env, url[len("s3://saves/"):].split("/")[0]) == []


def test_a_saver_killed_mid_upload_leaves_no_object_and_the_next_save_commits(s3_env, tmp_path, monkeypatch):
    """SIGKILL while the multipart upload runs: the key never appears (a
    reader gets NotFoundError, the previous checkpoint still loads); the next
    save of the same key succeeds and sweeps this host's dead temporaries,
    the killed saver's local scratch archive included."""
    previous = fresh_url("prev.cask")
    treecask.save(previous, model_tree())
    url = fresh_url()
    script = textwrap.dedent(f"""
        import numpy as np, treecask
        {SMALL_PARTS}
        _upload.PARTS_IN_FLIGHT = 1  # a slow upload, to be killed in the middle
        treecask.save({url!r}, {{"a": np.ones((100 << 20) // 8)}}, compression="none")
    """)
    env = dict(os.environ, **s3_env.env(), TREECASK_SCRATCH_DIR=str(tmp_path))
    p = subprocess.Popen([sys.executable, "-c", script], env=env)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # an upload in progress: a multipart upload listed by the server
            status, _, body = s3_env.request("GET", "/saves?uploads")
            if b"<UploadId>" in body and url.split("/")[3].encode() in body:
                break
            assert p.poll() is None, "the save finished before it could be killed"
            time.sleep(0.05)
        else:
            pytest.fail("no multipart upload appeared")
        time.sleep(0.3)
        p.kill()
        p.wait()
    finally:
        if p.poll() is None:
            p.kill()
    with pytest.raises(NotFoundError):
        treecask.open(url)
    assert_same(treecask.load(previous), model_tree())
    left = [e.name for e in tmp_path.iterdir() if e.name.startswith("treecask-upload")]
    assert len(left) == 1 and f".{p.pid}." in left[0], left  # the killed saver's scratch, named by its pid
    monkeypatch.setenv("TREECASK_SCRATCH_DIR", str(tmp_path))
    tree = big_tree()
    treecask.save(url, tree, compression="none")
    assert_same(treecask.load(url), tree)
    key = url[len("s3://saves/"):]
    assert listing(s3_env, key.split("/")[0]) == [key]
    assert not [e for e in tmp_path.iterdir() if e.name.startswith("treecask-upload")]  # swept
    if _s3.for_store(s3_env.store("saves")) is not None:  # botocore: the killed upload is aborted
        assert key.split("/")[0].encode() not in s3_env.request("GET", "/saves?uploads")[2]


def test_a_new_large_key_is_one_conditional_multipart_upload_with_botocore(s3_env, tmp_path):
    """With botocore, a new key over SINGLE_PUT_BYTES is uploaded straight to
    the key and completed with If-None-Match: the completion onto an existing
    key is refused (AlreadyExistsError) and its upload aborted, nothing left."""
    pytest.importorskip("botocore")
    import obstore
    store = treecask.stores.ObjectStore(s3_env.store("saves"), name="s3://saves")
    s3 = _s3.for_store(store.store)
    assert s3 is not None
    tree = big_tree()
    prefix = uuid.uuid4().hex
    treecask.save(f"{prefix}/model.cask", tree, store=store, compression="none")
    assert_same(treecask.load(f"{prefix}/model.cask", store=store), tree)
    other = str(tmp_path / "other.cask")
    treecask.save(other, {"x": np.zeros((6 << 20) // 8)}, compression="none")
    with pytest.raises(AlreadyExistsError) as e:  # a saver that lost the race: the completion refuses
        s3.put_new(f"{prefix}/model.cask", other, "s3://saves/x")
    assert "exists" in str(e.value)
    assert prefix.encode() not in s3_env.request("GET", "/saves?uploads")[2]  # aborted
    assert listing(s3_env, prefix) == [f"{prefix}/model.cask"]
    # A completion retried after its first try committed is refused, yet the object holds this
    # save's bytes: that is success (as two puts of one file show).
    etag = s3.put_new(f"{prefix}/other.cask", other, "s3://saves/x")
    assert s3.put_new(f"{prefix}/other.cask", other, "s3://saves/x") == etag
    obstore.delete(s3_env.store("saves"), f"{prefix}/other.cask")
    assert_same(treecask.load(f"{prefix}/model.cask", store=store), tree)


def test_without_botocore_a_large_new_key_takes_the_temporary_and_copy(s3_env, monkeypatch):
    """botocore not importable: the S3 store keeps obstore's path (a multipart
    upload to a temporary, a conditional copy), nothing left behind."""
    monkeypatch.setitem(sys.modules, "botocore.session", None)  # `import botocore.session` fails
    store = s3_env.store("saves")
    assert _s3.for_store(store) is None
    tree = big_tree()
    url = fresh_url()
    treecask.save(url, tree, compression="none")
    assert_same(treecask.load(url), tree)
    key = url[len("s3://saves/"):]
    assert listing(s3_env, key.split("/")[0]) == [key]
    with pytest.raises(AlreadyExistsError):
        treecask.save(url, tree, compression="none")


@pytest.mark.parametrize("memory", [False, True], ids=["s3", "memory"])
def test_a_commit_is_confirmed_to_be_the_savers_own_object(s3_env, tmp_path, memory):
    """_upload.confirm: the object at the key must be the one this saver wrote
    (the ETag its commit returned, or its size and last bytes):
    AlreadyExistsError when another saver's object is there."""
    import obstore
    import obstore.store
    store = obstore.store.MemoryStore() if memory else s3_env.store("saves")
    key = f"{uuid.uuid4().hex}/model.cask"
    mine, theirs = str(tmp_path / "mine.cask"), str(tmp_path / "theirs.cask")
    treecask.save(mine, {"who": np.full(1000, 1.0)})
    treecask.save(theirs, {"who": np.full(1000, 2.0)})
    put = obstore.put(store, key, open(mine, "rb").read())
    _upload.confirm(store, key, mine, url="s3://saves/" + key, etag=put["e_tag"])
    _upload.confirm(store, key, mine, url="s3://saves/" + key)  # by size and last bytes
    obstore.put(store, key, open(theirs, "rb").read())  # replaced, as a non-atomic store may
    for etag in (put["e_tag"], None):
        with pytest.raises(AlreadyExistsError) as e:
            _upload.confirm(store, key, mine, url="s3://saves/" + key, etag=etag)
        assert "not this save's" in str(e.value)


def test_racing_savers_told_saved_find_their_own_object(s3_env):
    """Two processes save one new key at the same instant, a few times, on
    SeaweedFS (whose conditional completion is not atomic, docs/stores.md):
    every saver told "saved" finds its own bytes at the key right after
    (the confirm after the commit); the others get AlreadyExistsError."""
    script = textwrap.dedent(f"""
        import sys, time, numpy as np, treecask
        from treecask.errors import AlreadyExistsError
        {SMALL_PARTS}
        url, who, at = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
        tree = {{"who": np.full((12 << 20) // 8, who)}}
        time.sleep(max(0.0, at - time.time()))
        try:
            treecask.save(url, tree, compression="none")
        except AlreadyExistsError as e:
            print("refused")
        else:
            got = treecask.load(url)["who"]
            print("saved", "own" if np.all(got == who) else "NOT-OWN")
    """)
    env = dict(os.environ, **s3_env.env())
    both = 0
    for _ in range(4):
        url = fresh_url()
        at = time.time() + 4.0  # both past their imports
        procs = [subprocess.Popen([sys.executable, "-c", script, url, str(i), str(at)], stdout=subprocess.PIPE,
                                  text=True, env=env) for i in (1, 2)]
        outs = [p.communicate(timeout=300)[0].strip() for p in procs]
        assert all(o in ("refused", "saved own") for o in outs), outs
        assert "saved own" in outs, outs
        both += outs.count("saved own") == 2
    print(f"rounds where both were told saved (each finding its own object then): {both} of 4")


MP_CHILD = textwrap.dedent(r'''
    import os, sys
    port, nproc, pid, scenario, base = sys.argv[1:6]
    nproc, pid = int(nproc), int(pid)
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_num_cpu_devices", 2)
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=nproc, process_id=pid)
    import numpy as np
    import treecask
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    W = np.arange(4096, dtype=np.float32).reshape(64, 64)
    m = Mesh(np.array(jax.devices()).reshape(2, 2), ("x", "y"))

    def tree(step):
        w = jax.make_array_from_callback(W.shape, NamedSharding(m, P("x", "y")), lambda i: (W * step)[i])
        return {"w": w, "host": np.full(3, float(step)), "step": step}

    def check(url, step, spec):
        got = treecask.load(url, shardings={"w": NamedSharding(m, spec)})
        assert got["step"] == step and got["w"].sharding.spec == spec
        for s in got["w"].addressable_shards:
            np.testing.assert_array_equal(np.asarray(s.data), (W * step)[s.index])
        np.testing.assert_array_equal(got["host"], np.full(3, float(step)))

    if scenario == "save":
        url = base + "/ckpt"
        treecask.save(url, tree(1))
        check(url, 1, P("y", "x"))
        try:
            treecask.save(url, tree(2))
            raise SystemExit("expected AlreadyExistsError")
        except treecask.AlreadyExistsError as e:
            assert url in str(e), e
        treecask.save(url, tree(3), overwrite=True)
        check(url, 3, P(None, "x"))
    elif scenario == "manager":
        with treecask.CheckpointManager(base + "/run", max_to_keep=2) as mngr:
            for step in (1, 2, 3):
                assert mngr.save(step, tree(step), metrics={"loss": float(10 - step)})
            mngr.wait_until_finished()
            assert mngr.all_steps()[-2:] == [2, 3], mngr.all_steps()  # process 0 deletes step 1 after the commit
            check(mngr.path(3), 3, P("x", None))
    elif scenario == "boxes":  # a row-sharded 32 MiB array, restored onto the same sharding
        sys.path.insert(0, os.environ["TESTS_DIR"])
        import stores
        big = np.arange(8192 * 1024, dtype=np.float32).reshape(8192, 1024)
        rows = NamedSharding(m, P("x", None))
        treecask.save(base + "/boxes", {"w": jax.make_array_from_callback(big.shape, rows, lambda i: big[i])})
        proxy = stores.S3Proxy(os.environ["AWS_ENDPOINT_URL"])
        try:
            got = treecask.load(base + "/boxes", shardings={"w": rows},
                                storage_options={"endpoint": proxy.endpoint})
        finally:
            proxy.close()
        for s in got["w"].addressable_shards:
            np.testing.assert_array_equal(np.asarray(s.data), big[s.index])
        print(f"FETCHED {proxy.bytes_read}", flush=True)
    elif scenario == "replicated":  # a 32 MiB array replicated over both processes
        sys.path.insert(0, os.environ["TESTS_DIR"])
        import stores
        big = np.arange(8192 * 1024, dtype=np.float32).reshape(8192, 1024)
        everywhere = NamedSharding(m, P())
        treecask.save(base + "/rep", {"w": jax.make_array_from_callback(big.shape, everywhere, lambda i: big[i])},
                      compression="none")
        for single_read in (True, False):
            proxy = stores.S3Proxy(os.environ["AWS_ENDPOINT_URL"])
            try:
                with treecask.open(base + "/rep", storage_options={"endpoint": proxy.endpoint},
                                   single_read=single_read) as a:
                    opened = proxy.bytes_read
                    got = a.load(shardings={"w": everywhere})
            finally:
                proxy.close()
            for s in got["w"].addressable_shards:
                np.testing.assert_array_equal(np.asarray(s.data), big[s.index])
            print(f"FETCHED single_read={single_read} {opened} {proxy.bytes_read}", flush=True)
    print(f"CHILD OK {pid}", flush=True)
''')


def two_processes(tmp_path, scenario, base, s3):
    """Runs MP_CHILD's ``scenario`` in a 2-process jax.distributed job against
    the S3 server ``s3``, under the bucket prefix ``base``; returns the
    children's outputs (jobs.collect fails the test unless both succeed)."""
    from jobs import collect, launch
    procs = launch(tmp_path / "child.py", MP_CHILD, 2, lambda port, i: [port, 2, i, scenario, base],
                   env_extra=dict(s3.env(), TESTS_DIR=os.path.dirname(os.path.abspath(__file__))))
    return collect(procs, f"{scenario} (2 processes, {base})", timeout=240)


def test_a_two_process_checkpoint_saves_to_a_bucket_and_restores_sharded(s3_env, tmp_path):
    """A jax.distributed job of two processes saves to s3://: each process
    uploads only its own shard object, process 0 commits by creating the
    index last; an existing checkpoint is refused, overwrite replaces it and
    leaves no object of the old one; every process restores onto its devices."""
    base = f"s3://saves/{uuid.uuid4().hex}"
    two_processes(tmp_path, "save", base, s3_env)
    prefix = base[len("s3://saves/"):] + "/ckpt/"
    names = [n[len(prefix):] for n in listing(s3_env, prefix)]
    assert names[0] == "index.cask" and len(names) == 3, names
    assert [n.split(".")[0] for n in names[1:]] == ["process_0", "process_1"]
    assert names[1].split(".")[1] == names[2].split(".")[1]  # one save id: the overwrite's
    got = treecask.load(base + "/ckpt")
    assert got["step"] == 3
    np.testing.assert_array_equal(got["w"], np.arange(4096, dtype=np.float32).reshape(64, 64) * 3)


@pytest.mark.parametrize("async_save", [True, False], ids=["async", "sync"])
def test_checkpoint_manager_on_a_bucket(s3_env, async_save):
    """CheckpointManager("s3://bucket/run"): steps listed from the bucket,
    max_to_keep with best_fn (the best two and the newest), metrics, restore
    of the latest and of a given step, an existing step refused; a second
    manager on the same URL sees the same steps."""
    url = f"s3://saves/{uuid.uuid4().hex}/run"
    tree = lambda step: {"w": np.full((256, 256), float(step), np.float32), "step": step}  # noqa: E731
    losses = {1: 5.0, 2: 1.0, 3: 4.0, 4: 3.0, 5: 6.0}
    with treecask.CheckpointManager(url, max_to_keep=2, best_fn=lambda m: m["loss"], best_mode="min",
                                    async_save=async_save) as mngr:
        assert mngr.all_steps() == [] and mngr.latest_step() is None
        for step, loss in losses.items():
            assert mngr.save(step, tree(step), metrics={"loss": loss})
        mngr.wait_until_finished()
        assert mngr.all_steps() == [2, 4, 5]
        assert mngr.best_step() == 2 and mngr.metrics(4) == {"loss": 3.0}
        assert_same(mngr.restore(), tree(5))
        assert_same(mngr.restore(2), tree(2))
        with pytest.raises(AlreadyExistsError):
            mngr.save(5, tree(5), force=True)
            mngr.wait_until_finished()
        assert str(mngr.path(4)) == url + "/step_00000004.cask"
    prefix = url[len("s3://saves/"):] + "/"
    assert [n[len(prefix):] for n in listing(s3_env, prefix)] == [
        "step_00000002.cask", "step_00000004.cask", "step_00000005.cask"]
    with treecask.CheckpointManager(url) as again:
        assert again.all_steps() == [2, 4, 5] and again.latest_step() == 5
        assert_same(treecask.load(again.path(4)), tree(4))


def test_a_manager_on_a_bucket_never_lists_an_uncommitted_step(s3_env):
    """A multi-process step's shard objects without its index (a save that
    died before committing) are not a step; retention removes the commit
    object first."""
    import obstore
    url = f"s3://saves/{uuid.uuid4().hex}/run"
    store = s3_env.store("saves")
    key = url[len("s3://saves/"):]
    obstore.put(store, f"{key}/step_00000009.cask/process_0.0123456789abcdef.cask", b"half a save")
    with treecask.CheckpointManager(url, max_to_keep=1, async_save=False) as mngr:
        assert mngr.all_steps() == []
        mngr.save(1, {"a": np.ones(3)})
        mngr.save(2, {"a": np.ones(3) * 2})
        assert mngr.all_steps() == [2]
        assert_same(mngr.restore(), {"a": np.ones(3) * 2})


def test_a_two_process_manager_on_a_bucket(s3_env, tmp_path):
    """Both processes of a job call CheckpointManager(url).save for the same
    steps (asynchronous): each step is a checkpoint prefix committed by its
    index, retention (process 0) keeps the newest two, and every process
    restores the latest onto its devices."""
    base = f"s3://saves/{uuid.uuid4().hex}"
    two_processes(tmp_path, "manager", base, s3_env)
    prefix = base[len("s3://saves/"):] + "/run/"
    names = [n[len(prefix):] for n in listing(s3_env, prefix)]
    assert sorted({n.split("/")[0] for n in names}) == ["step_00000002.cask", "step_00000003.cask"], names
    assert sum(n.endswith("/index.cask") for n in names) == 2 and len(names) == 6
    with treecask.CheckpointManager(base + "/run") as mngr:
        assert mngr.all_steps() == [2, 3] and mngr.metrics(2) == {"loss": 8.0}
        assert mngr.restore()["step"] == 3


@contextlib.contextmanager
def own_seaweedfs(data, monkeypatch):
    """A SeaweedFS of the test's own on the directory `data` (the session's
    server must live on), the environment pointing at it; started again on
    the same `data` it holds what was saved before (new ports)."""
    import stores

    pytest.importorskip("obstore")
    if os.environ.get("TREECASK_NO_STORES") == "1":
        pytest.skip("TREECASK_NO_STORES=1: no object-store servers")
    with stores.seaweedfs(data) as s3:
        for k, v in s3.env().items():
            monkeypatch.setenv(k, v)
        yield s3


def test_the_server_killed_mid_upload_then_restarted(tmp_path, monkeypatch):
    """A store that dies while a save uploads: IoError naming the URL within
    the retry budget; restarted on the same data, it holds the previous
    checkpoint and nothing of the interrupted one (its own SeaweedFS: the
    session's server must live on)."""
    import signal
    monkeypatch.setattr(_upload, "SINGLE_PUT_BYTES", 4 << 20)
    monkeypatch.setattr(_upload, "PART_BYTES", 5 << 20)
    monkeypatch.setattr(_upload, "PARTS_IN_FLIGHT", 1)  # a slow upload, to be cut in the middle
    data = tmp_path / "weed"
    with own_seaweedfs(data, monkeypatch) as s3:
        s3.create_bucket("dying")
        treecask.save("s3://dying/prev.cask", model_tree())

        def kill():
            deadline = time.monotonic() + 60
            while b"<UploadId>" not in s3.request("GET", "/dying?uploads")[2]:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.02)
            os.killpg(s3.server.pid, signal.SIGKILL)
        killer = threading.Thread(target=kill)
        killer.start()
        t0 = time.monotonic()
        with pytest.raises(IoError) as e:
            treecask.save("s3://dying/new.cask", {"a": np.ones((60 << 20) // 8)}, compression="none")
        killer.join()
        assert "s3://dying/new.cask" in str(e.value) and time.monotonic() - t0 < 120
    with own_seaweedfs(data, monkeypatch) as s3:  # the same data, new ports
        assert_same(treecask.load("s3://dying/prev.cask"), model_tree())
        with pytest.raises(NotFoundError):
            treecask.open("s3://dying/new.cask")
        import obstore
        left = sorted(m["path"] for b in obstore.list(s3.store("dying")) for m in b)
        # With botocore, the failed upload's marker (its delete failed too): this process's
        # temporary, swept by a save of the key once this process is gone.
        assert "prev.cask" in left and all(
            n.startswith("new.cask.tmp.") and f".{os.getpid()}." in n and n.endswith("/upload")
            for n in left if n != "prev.cask"), left


def test_the_server_killed_mid_commit_then_restarted(tmp_path, monkeypatch):
    """A store that dies while a save commits (every part uploaded, the
    completion request on its way and held by a proxy: the server never gets
    it): IoError naming the URL; restarted on the same data, it holds the
    previous checkpoint and nothing of the interrupted one (only this live
    process's own temporary), and the next save of the key commits (its own
    SeaweedFS: the session's server must live on)."""
    import stores
    monkeypatch.setattr(_upload, "SINGLE_PUT_BYTES", 4 << 20)
    monkeypatch.setattr(_upload, "PART_BYTES", 5 << 20)
    data = tmp_path / "weed"
    with own_seaweedfs(data, monkeypatch) as s3:
        s3.create_bucket("dying")
        treecask.save("s3://dying/prev.cask", model_tree())
        proxy = stores.S3Proxy(s3.endpoint, hold=lambda method, path: method == "POST" and path.startswith(
            "/dying/new.cask?") and "uploadId=" in path)

        def kill():
            if proxy.held.wait(120):
                os.killpg(s3.server.pid, signal.SIGKILL)
            proxy.release.set()  # the held completion dropped: the dead server never got it
        killer = threading.Thread(target=kill)
        killer.start()
        try:
            with pytest.raises(IoError) as e:
                treecask.save("s3://dying/new.cask", {"a": np.ones((12 << 20) // 8)}, compression="none",
                              storage_options={"endpoint": proxy.endpoint})
        finally:
            killer.join()
            proxy.close()
        assert proxy.held.is_set() and "s3://dying/new.cask" in str(e.value)
    with own_seaweedfs(data, monkeypatch) as s3:  # the same data, new ports
        assert_same(treecask.load("s3://dying/prev.cask"), model_tree())
        with pytest.raises(NotFoundError):
            treecask.open("s3://dying/new.cask")
        import obstore

        def left():
            names = sorted(m["path"] for b in obstore.list(s3.store("dying")) for m in b)
            # What the failed save could not delete from a dead store: this live process's
            # temporary (with botocore its upload's marker), swept once this process is gone.
            assert all(n.startswith("new.cask.tmp.") and f".{os.getpid()}." in n
                       for n in names if n not in ("prev.cask", "new.cask")), names
            return [n for n in names if n in ("prev.cask", "new.cask")]
        assert left() == ["prev.cask"]
        tree = big_tree()
        treecask.save("s3://dying/new.cask", tree, compression="none")
        assert_same(treecask.load("s3://dying/new.cask"), tree)
        assert left() == ["new.cask", "prev.cask"]
        if _s3.for_store(s3.store("dying")) is not None:  # the interrupted upload of the key aborted
            assert b"<Key>new.cask</Key>" not in s3.request("GET", "/dying?uploads")[2]


def test_a_manager_killed_mid_upload_keeps_the_previous_step(s3_env, tmp_path, monkeypatch):
    """A training process SIGKILLed while its CheckpointManager uploads step 2
    in the background: step 2 is never listed, step 1 restores, and the next
    run's save (of step 3) sweeps the killed run's local scratch and, on S3
    with botocore, aborts its multipart upload (named by its marker)."""
    url = f"s3://saves/{uuid.uuid4().hex}/run"
    with treecask.CheckpointManager(url) as mngr:
        mngr.save(1, {"a": np.ones(3)})
    script = textwrap.dedent(f"""
        import time, numpy as np, treecask
        {SMALL_PARTS}
        _upload.PARTS_IN_FLIGHT = 1  # a slow upload, to be killed in the middle
        mngr = treecask.CheckpointManager({url!r}, compression="none")
        mngr.save(2, {{"a": np.ones((100 << 20) // 8)}})
        print("returned", flush=True)
        time.sleep(600)
    """)
    env = dict(os.environ, **s3_env.env(), TREECASK_SCRATCH_DIR=str(tmp_path))
    p = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "returned"  # save() returned: the upload runs in the background
        deadline = time.monotonic() + 120
        run = url.split("/")[3].encode()
        botocore = _s3.for_store(s3_env.store("saves")) is not None
        while run not in s3_env.request("GET", "/saves?uploads")[2] or (  # this run's upload has begun
                botocore and not [n for n in listing(s3_env, run.decode()) if n.endswith("/upload")]):
            assert time.monotonic() < deadline, "no multipart upload appeared"
            time.sleep(0.02)
        p.kill()
        p.wait()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert [e.name for e in tmp_path.iterdir() if e.name.startswith("treecask-upload")]  # the killed run's
    monkeypatch.setenv("TREECASK_SCRATCH_DIR", str(tmp_path))
    with treecask.CheckpointManager(url) as mngr:
        assert mngr.all_steps() == [1]
        assert_same(mngr.restore(), {"a": np.ones(3)})
        mngr.save(3, {"a": np.full(3, 3.0)})
        mngr.wait_until_finished()
        assert mngr.all_steps() == [1, 3]
    assert not [e for e in tmp_path.iterdir() if e.name.startswith("treecask-upload")]  # swept
    if botocore:  # the killed upload of step 2 aborted, its marker deleted
        assert run not in s3_env.request("GET", "/saves?uploads")[2]
        assert not [n for n in listing(s3_env, run.decode()) if ".tmp." in n]


def upload_scratch(d):
    """The upload scratch directories in directory ``d`` (``_upload.scratch``)."""
    return [e.name for e in d.iterdir() if e.name.startswith(_upload.SCRATCH_NAME)]


def scratch_files(d):
    """The files inside the upload scratch directories in ``d``."""
    out = []
    for name in upload_scratch(d):
        try:
            out += list((d / name).iterdir())
        except FileNotFoundError:  # removed meanwhile
            pass
    return out


def uploads(s3, prefix):
    """Whether the S3 server lists an incomplete multipart upload under ``prefix``."""
    return prefix.encode() in s3.request("GET", "/saves?uploads")[2]


def saver(script, env):
    """A child process running ``script`` (treecask with small parts), its stdout a pipe."""
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], env=env, stdout=subprocess.PIPE,
                            text=True)


def killed(p):
    """SIGKILLs child ``p`` (also when stopped) and reaps it."""
    if p.poll() is None:
        p.kill()
    p.wait(timeout=60)
    if p.stdout is not None:
        p.stdout.close()


# A tree and save options whose local write lasts long enough (192 MiB of random
# doubles through LZ4 with shuffle on one thread: some 0.3 s here) for a test to
# stop the saver in the middle of it, as a slow disk or a large checkpoint would.
SLOW_TREE = '{"a": np.random.default_rng(0).standard_normal((192 << 20) // 8)}'
SLOW_OPTIONS = 'compression="lz4", shuffle=True, threads=1'


@pytest.mark.parametrize("who", ["save", "manager"])
def test_a_saver_killed_writing_its_scratch_leaves_nothing_behind_on_the_store(s3_env, tmp_path, monkeypatch, who):
    """SIGKILL while the archive is still being written to local scratch,
    before any upload (the saver stopped as soon as its scratch holds a file,
    and the store seen to hold nothing of it yet): nothing at the key (the
    manager's step never listed), the previous checkpoint restores; the
    next upload on this host commits and sweeps the killed saver's scratch."""
    run = uuid.uuid4().hex
    if who == "save":
        previous, url = f"s3://saves/{run}/prev.cask", f"s3://saves/{run}/model.cask"
        treecask.save(previous, model_tree())
        child = f"""
            import numpy as np, treecask
            treecask.save({url!r}, {SLOW_TREE}, {SLOW_OPTIONS})
        """
    else:
        url = f"s3://saves/{run}/run"
        with treecask.CheckpointManager(url) as mngr:
            mngr.save(1, {"a": np.ones(3)})
        child = f"""
            import time, numpy as np, treecask
            mngr = treecask.CheckpointManager({url!r}, {SLOW_OPTIONS})
            mngr.save(2, {SLOW_TREE})
            time.sleep(600)
        """
    before = listing(s3_env, run)
    p = saver(child, dict(os.environ, **s3_env.env(), TREECASK_SCRATCH_DIR=str(tmp_path)))
    try:
        deadline = time.monotonic() + 120
        while not scratch_files(tmp_path):
            assert p.poll() is None, "the saver exited before it could be killed"
            assert time.monotonic() < deadline, "no scratch file appeared"
            time.sleep(0.005)
        os.kill(p.pid, signal.SIGSTOP)
        # Stopped while writing scratch: nothing of this save on the store yet.
        assert listing(s3_env, run) == before and not uploads(s3_env, run), "stopped after its upload began"
    finally:
        killed(p)
    assert listing(s3_env, run) == before
    left = upload_scratch(tmp_path)
    assert len(left) == 1 and f".{p.pid}." in left[0], left  # the killed saver's scratch, named by its pid
    monkeypatch.setenv("TREECASK_SCRATCH_DIR", str(tmp_path))
    if who == "save":
        with pytest.raises(NotFoundError):
            treecask.open(url)
        assert_same(treecask.load(previous), model_tree())
        tree = big_tree()
        treecask.save(url, tree, compression="none")  # the next upload on this host
        assert_same(treecask.load(url), tree)
        assert listing(s3_env, run) == sorted([previous[len("s3://saves/"):], url[len("s3://saves/"):]])
    else:
        with treecask.CheckpointManager(url) as mngr:
            assert mngr.all_steps() == [1]
            assert_same(mngr.restore(), {"a": np.ones(3)})
            mngr.save(3, {"a": np.full(3, 3.0)})  # the next upload on this host
            mngr.wait_until_finished()
            assert mngr.all_steps() == [1, 3]
    assert upload_scratch(tmp_path) == []  # swept


def _completion_of(key):
    """A proxy's ``hold``: the request that completes a multipart upload onto
    ``key`` in bucket "saves" (CompleteMultipartUpload: POST /saves/<key>?uploadId=...),
    the commit of a large object: with botocore the saver's own upload, without it
    the conditional copy of its uploaded temporary onto ``key``."""
    return lambda method, path: (method == "POST" and path.partition("?")[0] == f"/saves/{key}"
                                 and "uploadId=" in path.partition("?")[2])


@pytest.mark.parametrize("who,path", [("save", "botocore"), ("save", "copy"), ("manager", "botocore")])
def test_a_saver_killed_while_committing_leaves_no_partial_object(s3_env, tmp_path, monkeypatch, who, path):
    """SIGKILL between the last part and the commit (a proxy holds the
    completion request, which the server never gets): the key never holds a
    partial object (a reader gets NotFoundError, the previous checkpoint or
    step restores); the next save of the key (the manager: of the next step)
    commits and sweeps what the killed saver left: its marker and
    incomplete upload (botocore) or its uploaded temporary (the copy path),
    and its local scratch."""
    if path == "botocore" and _s3.for_store(s3_env.store("saves")) is None:
        pytest.skip("botocore not installed")
    run = uuid.uuid4().hex
    no_botocore = "import sys; sys.modules['botocore.session'] = None" if path == "copy" else ""
    if who == "save":
        previous, url = f"s3://saves/{run}/prev.cask", f"s3://saves/{run}/model.cask"
        key = url[len("s3://saves/"):]
        treecask.save(previous, model_tree())
        child = f"""
            {no_botocore}
            import numpy as np, treecask
            {SMALL_PARTS}
            treecask.save({url!r}, {{"a": np.ones((12 << 20) // 8)}}, compression="none")
        """
    else:
        url = f"s3://saves/{run}/run"
        key = f"{run}/run/step_00000002.cask"
        with treecask.CheckpointManager(url) as mngr:
            mngr.save(1, {"a": np.ones(3)})
        child = f"""
            {no_botocore}
            import time, numpy as np, treecask
            {SMALL_PARTS}
            mngr = treecask.CheckpointManager({url!r}, compression="none")
            mngr.save(2, {{"a": np.ones((12 << 20) // 8)}})
            time.sleep(600)
        """
    before = listing(s3_env, run)
    proxy = stores.S3Proxy(s3_env.endpoint, hold=_completion_of(key))
    try:
        env = dict(os.environ, **s3_env.env())
        env.update(AWS_ENDPOINT_URL=proxy.endpoint, TREECASK_SCRATCH_DIR=str(tmp_path))
        p = saver(child, env)
        try:
            while not proxy.held.wait(0.1):  # every part uploaded, the commit on its way
                assert p.poll() is None, "the save finished without its completion request"
        finally:
            killed(p)
    finally:
        proxy.close()  # the held completion dropped unsent
    with pytest.raises(NotFoundError):
        treecask.open(f"s3://saves/{key}")
    left = listing(s3_env, run)
    assert key not in left
    stale = [n for n in left if n not in before]
    assert stale and all(n.startswith(key + ".tmp.") and f".{p.pid}." in n for n in stale), stale
    if path == "botocore":  # its marker, naming its incomplete upload
        assert [n.rpartition("/")[2] for n in stale] == [_s3.UPLOAD_MARKER] and uploads(s3_env, run)
    assert len(upload_scratch(tmp_path)) == 1  # the killed saver's scratch
    monkeypatch.setenv("TREECASK_SCRATCH_DIR", str(tmp_path))
    if who == "save":
        assert_same(treecask.load(previous), model_tree())
        tree = big_tree()
        treecask.save(url, tree, compression="none")
        assert_same(treecask.load(url), tree)
        assert listing(s3_env, run) == sorted([previous[len("s3://saves/"):], key])
    else:
        with treecask.CheckpointManager(url) as mngr:
            assert mngr.all_steps() == [1]
            assert_same(mngr.restore(), {"a": np.ones(3)})
            mngr.save(3, {"a": np.full(3, 3.0)})
            mngr.wait_until_finished()
            assert mngr.all_steps() == [1, 3]
        assert not [n for n in listing(s3_env, run) if ".tmp." in n]
    assert upload_scratch(tmp_path) == []
    if _s3.for_store(s3_env.store("saves")) is not None:  # the killed saver's upload aborted
        assert not uploads(s3_env, run)


def test_a_saver_started_after_another_committed_is_refused_before_uploading(s3_env, tmp_path):
    """Two processes save one new key apart: the second starts once the
    first committed and gets AlreadyExistsError naming the URL from its
    pre-check, before it writes anything (no request that writes reaches
    the server, counted by a proxy; its scratch directory stays empty); the
    object is the first saver's."""
    url = fresh_url()
    script = f"""
        import sys, numpy as np, treecask
        from treecask.errors import AlreadyExistsError
        {SMALL_PARTS}
        try:
            treecask.save({url!r}, {{"who": np.full((12 << 20) // 8, float(sys.argv[1]))}}, compression="none")
            print("committed")
        except AlreadyExistsError as e:
            print("refused", e)
    """
    env = dict(os.environ, **s3_env.env())
    first = subprocess.run([sys.executable, "-c", textwrap.dedent(script), "1"], env=env, check=True,
                           stdout=subprocess.PIPE, text=True, timeout=300)
    assert first.stdout.strip() == "committed", first.stdout
    proxy = stores.S3Proxy(s3_env.endpoint)
    try:
        env.update(AWS_ENDPOINT_URL=proxy.endpoint, TREECASK_SCRATCH_DIR=str(tmp_path))
        second = subprocess.run([sys.executable, "-c", textwrap.dedent(script), "2"], env=env, check=True,
                                stdout=subprocess.PIPE, text=True, timeout=300)
    finally:
        proxy.close()
    assert second.stdout.startswith("refused") and url in second.stdout, second.stdout
    assert proxy.writes == []  # nothing uploaded, no upload started, no marker written
    assert list(tmp_path.iterdir()) == []  # nor written to scratch
    got = treecask.load(url)["who"]
    assert got.shape == ((12 << 20) // 8,) and np.all(got == 1.0)


def test_a_sharded_restore_from_a_bucket_fetches_only_its_own_boxes(s3_env, tmp_path):
    """Each process of a 2-process job restores a 32 MiB row-sharded array
    that the job saved to the bucket onto the same sharding: the bytes it
    fetches (counted by a proxy of its own) are its 16 MiB box plus the
    opens (the index, the 256 KiB head of its own shard file, the head and
    tail of the other process's: 4.25 MiB), never the whole array."""
    base = f"s3://saves/{uuid.uuid4().hex}"
    outs = two_processes(tmp_path, "boxes", base, s3_env)
    box = 16 << 20
    for out in outs:
        fetched = int(out.split("FETCHED ")[1].split()[0])
        assert box <= fetched <= box + (5 << 20), fetched


def test_replicas_share_a_bucket_save_and_fetch_each_byte_once(s3_env, tmp_path):
    """A 32 MiB array replicated over both processes of a job: each uploads
    half of it (replica-parallel save), and a restore onto the same
    replicated sharding fetches it once in the job beyond the opens (each
    process its half, the halves exchanged over the job's collectives);
    with single_read=False each process fetches all of it."""
    base = f"s3://saves/{uuid.uuid4().hex}"
    outs = two_processes(tmp_path, "replicated", base, s3_env)
    import obstore
    prefix = base[len("s3://saves/"):] + "/rep/"
    sizes = {m["path"][len(prefix):]: m["size"] for b in obstore.list(s3_env.store("saves"), prefix) for m in b}
    shards = [n for n in sizes if n.startswith("process_")]
    assert len(shards) == 2 and all(15 << 20 < sizes[n] < 17 << 20 for n in shards), sizes
    stored = 32 << 20
    fetched = {}
    for out in outs:
        for line in out.splitlines():
            if line.startswith("FETCHED single_read="):
                what, opened, total = line.split()[1:]
                fetched.setdefault(what, []).append((int(opened), int(total)))
    once, each = fetched["single_read=True"], fetched["single_read=False"]
    assert sum(t for _, t in once) <= 1.25 * stored + sum(o for o, _ in once), once
    assert sum(t - o for o, t in each) > 1.25 * stored, each  # every process its own copy


def test_gc_removes_what_dead_savers_left_under_a_prefix(s3_env, capsys):
    """`treecask gc URL` (treecask/_cli.py -> python -m treecask gc): any
    host's temporaries, a multi-process checkpoint's shards without its
    index, incomplete multipart uploads; --dry-run lists them; --older-than
    keeps what is younger; committed objects and checkpoints are kept."""
    import obstore
    from treecask import _cli
    store = s3_env.store("saves")
    run = uuid.uuid4().hex
    kept = [f"{run}/x.cask", f"{run}/done/process_0.0123456789abcdef.cask", f"{run}/done/index.cask"]
    junk = [f"{run}/a.cask.tmp.elsewhere.4242.0123456789abcdef",
            f"{run}/b.cask.tmp.elsewhere.4243.0123456789abcdef/upload",
            f"{run}/half/process_0.0123456789abcdef.cask", f"{run}/half/process_1.0123456789abcdef.cask"]
    for k in kept + junk:
        obstore.put(store, k, b"x" * 10)
    s3 = _s3.for_store(store)
    if s3 is not None:
        s3.client.create_multipart_upload(Bucket="saves", Key=f"{run}/big.cask")
    url = f"s3://saves/{run}"

    assert _cli.main(["gc", url, "--older-than", "3600"]) == 0  # all of it younger than an hour
    assert "removed 0 leftovers" in capsys.readouterr().out
    assert _cli.main(["gc", url, "--older-than", "0", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert all("would remove" in out and f"s3://saves/{k}" in out for k in junk), out
    assert not any(f"s3://saves/{k} " in out for k in kept), out
    assert (f"multipart upload s3://saves/{run}/big.cask" in out) == (s3 is not None)
    assert listing(s3_env, run) == sorted(kept + junk)  # nothing removed
    assert _cli.main(["gc", url, "--older-than", "0"]) == 0
    assert f"removed {len(junk) + (s3 is not None)} leftovers, 40 bytes" in capsys.readouterr().out
    assert listing(s3_env, run) == sorted(kept)
    assert run.encode() not in s3_env.request("GET", "/saves?uploads")[2]
    assert _cli.main(["gc", "s3://no-such-bucket-here/x", "--older-than", "0"]) == 2
    assert _cli.main(["gc", "https://example.invalid/x"]) == 10
