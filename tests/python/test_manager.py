"""CheckpointManager: the Orbax guide's workflow with real JAX / Flax /
Optax, retention rules, async isolation (in-place writes, donated buffers), a
full disk, SIGKILL at random moments and a reader process beside a writer."""

import json
import os
import random
import signal
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import treecask
from treecask import AlreadyExistsError, CheckpointManager, InvalidArgumentError, IoError, NotFoundError

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
pytest.importorskip("flax")
import flax.linen as nn  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax.training import train_state  # noqa: E402


def _tmp_entries(d):
    return sorted(n for n in os.listdir(d) if ".tmp." in n)


# ---- the Orbax guide, step by step ----------------------------------------------------


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(4)(nn.relu(nn.Dense(16)(x)))


def _train_state(seed=0):
    model = MLP()
    params = model.init(jax.random.key(seed), jnp.ones((1, 8)))["params"]
    return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-2))


@jax.jit
def _train_step(state, x):
    grads = jax.grad(lambda p: jnp.mean(state.apply_fn({"params": p}, x) ** 2))(state.params)
    return state.apply_gradients(grads=grads)


def test_orbax_guide_sequence(tmp_path):
    x = jax.random.normal(jax.random.key(1), (32, 8))
    state = _train_state()
    saved = {}
    with CheckpointManager(tmp_path / "ckpt", max_to_keep=2) as mngr:
        for step in range(5):
            state = _train_step(state, x)
            assert mngr.save(step, state, metrics={"loss": float(step)})
            saved[step] = jax.tree.map(np.asarray, state.params)
        mngr.wait_until_finished()
        assert mngr.all_steps() == [3, 4]
        assert mngr.latest_step() == 4
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["step_00000003.cask", "step_00000004.cask"]

    again = CheckpointManager(tmp_path / "ckpt", max_to_keep=2)  # a restarted job
    assert again.all_steps() == [3, 4] and again.latest_step() == 4
    assert again.metrics(3) == {"loss": 3.0}

    raw = again.restore()  # no target: nested dicts of NumPy arrays
    assert int(raw["step"]) == 5
    np.testing.assert_array_equal(raw["params"]["Dense_0"]["kernel"], saved[4]["Dense_0"]["kernel"])

    restored = again.restore(like=_train_state(seed=7))  # into a TrainState
    assert type(restored) is train_state.TrainState and int(restored.step) == 5
    assert restored.apply_fn is not None and restored.tx is not None
    for a, b in zip(jax.tree.leaves(restored.params), jax.tree.leaves(saved[4])):
        np.testing.assert_array_equal(np.asarray(a), b)
    # The restored state trains on exactly like the live one.
    np.testing.assert_array_equal(np.asarray(_train_step(restored, x).params["Dense_1"]["bias"]),
                                  np.asarray(_train_step(state, x).params["Dense_1"]["bias"]))

    older = again.restore(3, like=_train_state())
    for a, b in zip(jax.tree.leaves(older.params), jax.tree.leaves(saved[3])):
        np.testing.assert_array_equal(np.asarray(a), b)
    partial = again.restore(like={"params": _train_state().params})  # partial target
    assert set(partial) == {"params"}
    sub = again.restore(subtree="params/Dense_0")
    np.testing.assert_array_equal(sub["bias"], saved[4]["Dense_0"]["bias"])
    grown = again.restore(like={"step": 0, "extra": np.ones(3, np.float32)}, missing="from_like")
    assert grown["step"] == 5 and (grown["extra"] == 1).all()


# ---- retention and scheduling ---------------------------------------------------------


def _tree(step, n=1024):
    return {"a": np.full(n, step, np.int32), "b": np.arange(n, dtype=np.float32) + step, "step": step}


def test_best_fn_keeps_the_best_and_the_newest(tmp_path):
    losses = {0: 5.0, 1: 1.0, 2: 4.0, 3: 0.5, 4: 3.0, 5: 6.0}
    with CheckpointManager(tmp_path, max_to_keep=2, best_fn=lambda m: m["loss"], best_mode="min") as m:
        for s, loss in losses.items():
            m.save(s, _tree(s), metrics={"loss": np.float32(loss)})  # NumPy scalars are stored as JSON numbers
        m.wait_until_finished()
        assert m.all_steps() == [1, 3, 5]  # the two best (lowest loss) and the newest
        assert m.best_step() == 3
        assert m.metrics(5) == {"loss": 6.0}
    with CheckpointManager(tmp_path / "max", max_to_keep=1, best_fn=lambda m: m["acc"]) as m:
        for s, acc in enumerate([0.1, 0.9, 0.3, float("nan"), 0.2]):
            m.save(s, _tree(s), metrics={"acc": acc})
        m.save(5, _tree(5))  # without metrics: never removed by the best-N rule
        m.save(6, _tree(6), metrics={"acc": 0.0})
        m.wait_until_finished()
        assert m.all_steps() == [1, 5, 6] and m.best_step() == 1


def test_keep_newest_false_keeps_exactly_the_best(tmp_path):
    """Orbax's rule (treecask.orbax passes it): with best_fn, only the max_to_keep best,
    even when the step just saved is worse than them."""
    losses = {0: 5.0, 1: 1.0, 2: 4.0, 3: 0.5, 4: 3.0, 5: 6.0}
    for async_save in (True, False):
        d = tmp_path / str(async_save)
        with CheckpointManager(d, max_to_keep=2, best_fn=lambda m: m["loss"], best_mode="min",
                               keep_newest=False, async_save=async_save) as m:
            for s, loss in losses.items():
                m.save(s, _tree(s), metrics={"loss": loss})
            m.wait_until_finished()
            assert m.all_steps() == [1, 3] and m.best_step() == 3 and m.latest_step() == 3
            m.save(6, _tree(6))  # without metrics: kept
            m.wait_until_finished()
            assert m.all_steps() == [1, 3, 6]
    with CheckpointManager(tmp_path / "n", max_to_keep=2, keep_newest=False) as m:  # no best_fn: the newest N
        for s in range(4):
            m.save(s, _tree(s))
        m.wait_until_finished()
        assert m.all_steps() == [2, 3]


def test_per_step_metadata(tmp_path):
    with CheckpointManager(tmp_path, metadata={"run": "a"}, async_save=False) as m:
        m.save(1, _tree(1), metadata={"note": "first", "run": "b"})
        m.save(2, _tree(2))
        assert treecask.open(m.path(1)).metadata["note"] == "first"
        assert treecask.open(m.path(1)).metadata["run"] == "b"
        assert "note" not in treecask.open(m.path(2)).metadata
        with pytest.raises(InvalidArgumentError, match="reserved"):
            m.save(3, _tree(3), metadata={"treecask.step": "9"})
        with pytest.raises(InvalidArgumentError, match="str to str"):
            m.save(3, _tree(3), metadata={"x": 1})
        assert m.all_steps() == [1, 2]


def test_keep_period_interval_and_force(tmp_path):
    with CheckpointManager(tmp_path / "p", max_to_keep=2, keep_period=3, async_save=False) as m:
        for s in range(8):
            assert m.save(s, _tree(s))
        assert m.all_steps() == [0, 3, 6, 7]
        assert m.steps_to_delete() == []

    with CheckpointManager(tmp_path / "i", save_interval_steps=3) as m:
        done = [s for s in range(8) if m.save(s, _tree(s))]
        assert done == [0, 3, 6]
        assert not m.should_save(7) and m.should_save(9)
        assert m.save(7, _tree(7), force=True)
        m.wait_until_finished()
        assert m.all_steps() == [0, 3, 6, 7]
        np.testing.assert_array_equal(m.restore(7)["a"], np.full(1024, 7, np.int32))


def test_existing_step_is_refused_and_any_digit_count_is_read(tmp_path):
    with CheckpointManager(tmp_path) as m:
        m.save(3, _tree(3))
        with pytest.raises(AlreadyExistsError) as e:
            m.save(3, _tree(30))  # the in-flight step counts once it is waited for
        assert e.value.file.endswith("step_00000003.cask")
        m.wait_until_finished()
        treecask.save(tmp_path / "step_123456789.cask", _tree(123456789))  # 9 digits, by hand
        treecask.save(tmp_path / "step_7.cask", _tree(7))
        assert m.all_steps() == [3, 7, 123456789]
        assert m.path(7) == tmp_path / "step_7.cask"
        assert m.path(8) == tmp_path / "step_00000008.cask"
        assert m.restore()["step"] == 123456789
        assert m.metrics(7) is None
        with pytest.raises(AlreadyExistsError):
            m.save(7, _tree(7))
        np.testing.assert_array_equal(m.restore(3)["a"], np.full(1024, 3, np.int32))


def test_bad_arguments_and_missing_steps(tmp_path):
    with pytest.raises(InvalidArgumentError):
        CheckpointManager(tmp_path, max_to_keep=0)
    with pytest.raises(InvalidArgumentError, match="never overwritten"):
        CheckpointManager(tmp_path, overwrite=True)
    with pytest.raises(InvalidArgumentError, match="reserved"):
        CheckpointManager(tmp_path, metadata={"treecask.step": "1"})
    m = CheckpointManager(tmp_path / "empty")
    with pytest.raises(NotFoundError):
        m.restore()
    assert m.latest_step() is None and m.best_step() is None and m.all_steps() == []
    with pytest.raises(InvalidArgumentError):
        m.save(-1, _tree(0))
    with pytest.raises(InvalidArgumentError, match="JSON"):
        m.save(0, _tree(0), metrics={"f": object()})
    assert m.all_steps() == []
    m.save(jnp.asarray(2), _tree(2))  # a 0-d jax integer, e.g. TrainState.step
    m.close()
    with pytest.raises(NotFoundError) as e:
        m.restore(5)
    assert e.value.file.endswith("step_00000005.cask")
    with pytest.raises(InvalidArgumentError, match="closed"):
        m.save(3, _tree(3))
    assert m.all_steps() == [2]


def test_user_metadata_and_save_options_pass_through(tmp_path):
    with CheckpointManager(tmp_path, compression="lz4", shuffle=True, chunk_size=8192,
                           metadata={"run": "r1"}) as m:
        m.save(1, _tree(1, n=8192), metrics={"loss": 0.25})
    with treecask.open(m.path(1)) as a:
        assert a.metadata == {"run": "r1", "treecask.step": "1", "treecask.metrics": '{"loss": 0.25}'}
        assert a.info("b").codec == "lz4" and a.info("b").filter == "shuffle"
        assert a.info("b").chunk_size == 8192
        assert a.verify() == []


def test_retention_deletes_a_directory_step_and_sweeps_dead_temporaries(tmp_path):
    # A step that is a directory (a multi-process save) is deleted whole.
    (tmp_path / "step_00000000.cask").mkdir()
    (tmp_path / "step_00000000.cask" / "process_0.cask").write_bytes(b"x")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"step_00000001.cask.tmp.{dead.pid}.0badc0de"
    stale.write_bytes(b"half-written")
    ours = tmp_path / f"step_00000009.cask.tmp.{os.getpid()}.0000beef"  # a live process's
    ours.write_bytes(b"in progress")
    assert CheckpointManager(tmp_path).all_steps() == [0]  # temporaries are never listed
    with CheckpointManager(tmp_path, max_to_keep=1) as m:
        m.save(1, _tree(1))
        m.wait_until_finished()
        assert m.all_steps() == [1]
    assert not stale.exists() and ours.exists()
    assert sorted(os.listdir(tmp_path)) == sorted(["step_00000001.cask", ours.name])


# ---- async isolation ------------------------------------------------------------------


@pytest.mark.parametrize("keep", [False, True], ids=["fresh_snapshot", "kept_snapshot"])
def test_async_save_holds_the_values_of_the_call_despite_in_place_writes(tmp_path, keep):
    big = np.arange(4 << 20, dtype=np.float32)  # 16 MiB
    small = np.arange(10, dtype=np.int64)
    nested = {"big": big, "small": small, "view": big[::2]}  # a non-contiguous view too
    want = {k: np.array(v) for k, v in nested.items()}
    m = CheckpointManager(tmp_path, keep_snapshot_memory=keep)
    for step in range(3):
        m.save(step, nested)
        big[:] = -1.0 - step  # right after save returns, while the write runs
        small += 100
        want_next = {"big": big.copy(), "small": small.copy(), "view": big[::2].copy()}
        m.wait_until_finished()
        back = m.restore(step)
        for k in want:
            np.testing.assert_array_equal(back[k], want[k], err_msg=f"step {step} leaf {k}")
        want = want_next
        if keep:  # the buffer (both 16 MiB and 8 MiB leaves) waits for the next save
            assert m._pool.held_bytes >= (16 << 20) + (8 << 20)
    m.close()
    if keep:
        assert m._pool.held_bytes == 0  # close() frees it


def test_async_save_survives_donation_and_deletion_without_copying_jax_arrays(tmp_path):
    params = {"w": jnp.arange(1 << 20, dtype=jnp.float32), "b": jnp.ones((256, 256), jnp.bfloat16)}
    step_fn = jax.jit(lambda p: jax.tree.map(lambda a: a * 3 + 1, p), donate_argnums=0)
    # Control: with no save in flight JAX really donates (reuses and deletes the
    # buffers), so the loop below exercises donation and is not void.
    probe = jax.tree.map(jnp.copy, params)
    step_fn(probe)
    assert all(a.is_deleted() for a in jax.tree.leaves(probe))
    with CheckpointManager(tmp_path, max_to_keep=3, keep_snapshot_memory=True) as m:
        for step in range(4):
            before = jax.tree.map(np.array, params)
            old = params
            m.save(step, params)
            # jax.Array leaves are held as views, not copied into the snapshot.
            assert m._pool.held_bytes == 0
            params = step_fn(params)  # asks to donate the buffers the checkpoint reads
            if step % 2:
                for a in jax.tree.leaves(old):
                    a.delete()  # and the caller drops them outright
            del old
            m.wait_until_finished()
            back = m.restore(step, like=jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), params))
            for k in before:
                np.testing.assert_array_equal(np.asarray(back[k]), before[k], err_msg=f"step {step} leaf {k}")
            np.testing.assert_allclose(np.asarray(params["w"]), before["w"] * 3 + 1, rtol=1e-6)


def test_save_does_not_hold_the_gil_while_writing(tmp_path):
    # While the background write runs (durable, 64 MiB), the main thread keeps
    # executing Python: it counts loop iterations until the save is done.
    tree = {f"l{i}": np.random.default_rng(i).standard_normal(1 << 20).astype(np.float64) for i in range(8)}
    with CheckpointManager(tmp_path) as m:
        m.save(0, tree)
        spins = 0
        while m.is_saving_in_progress():
            spins += 1
        m.wait_until_finished()
    assert spins > 1000, spins


# ---- errors ---------------------------------------------------------------------------


def test_full_disk_in_the_background_is_raised_and_earlier_steps_survive(small_tmpfs):
    d = small_tmpfs / "ckpt"
    with CheckpointManager(d, max_to_keep=2) as m:
        m.save(0, _tree(0))
        m.save(1, _tree(1))
        assert m.save(2, {"big": np.ones(2 << 20, np.float32)})  # 8 MiB onto a 12 MiB tmpfs (the writer reserves ~2x): accepted...
        with pytest.raises(IoError) as e:
            m.wait_until_finished()  # ...and its failure raised here
        assert e.value.file.endswith("step_00000002.cask")
        m.wait_until_finished()  # raised once only
        assert m.all_steps() == [0, 1]
        assert _tmp_entries(d) == []  # nothing half-written left behind
        for s in (0, 1):
            with treecask.open(m.path(s)) as a:
                assert a.verify() == []
            assert m.restore(s)["step"] == s

        m.save(3, {"big": np.ones(2 << 20, np.float32)})
        with pytest.raises(IoError):
            m.save(4, _tree(4))  # the next save raises the previous failure...
        assert m.all_steps() == [0, 1]  # ...and does not save its own step
        m.save(4, _tree(4))  # retried: fine
        m.wait_until_finished()
        assert m.all_steps() == [1, 4]


# ---- processes: exit, SIGKILL, concurrent reader --------------------------------------

_CHILD_PRELUDE = textwrap.dedent("""
    import os, sys
    import numpy as np
    import treecask

    def tree(step):
        return {"a": np.full(65536, step, np.int32),                 # 256 KiB
                "b": (np.arange(131072, dtype=np.float32) + step),   # 512 KiB
                "c": {"x": np.full((3, 5), step, np.int64)}, "step": step}
""")


def _check_step(m, step):
    """The step restores, verifies, and every leaf holds its own step's values."""
    t = m.restore(step)
    assert t["step"] == step
    np.testing.assert_array_equal(t["a"], np.full(65536, step, np.int32))
    np.testing.assert_array_equal(t["b"], np.arange(131072, dtype=np.float32) + step)
    np.testing.assert_array_equal(t["c"]["x"], np.full((3, 5), step, np.int64))
    with treecask.open(m.path(step)) as a:
        assert a.verify() == []
        assert a.metadata["treecask.step"] == str(step)


def test_a_save_in_flight_at_interpreter_exit_is_finished(tmp_path):
    code = _CHILD_PRELUDE + textwrap.dedent("""
        m = treecask.CheckpointManager(sys.argv[1])
        m.save(0, tree(0))
        m.save(1, {"big": np.full(16 << 20, 1, np.uint8), **tree(1)})
        # the script ends with step 1 in flight and nobody waiting for it
    """)
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, timeout=60)
    m = CheckpointManager(tmp_path)
    assert m.all_steps() == [0, 1]
    _check_step(m, 1)
    assert _tmp_entries(tmp_path) == []


def test_a_save_failing_at_interpreter_exit_is_reported_on_stderr(small_tmpfs):
    code = _CHILD_PRELUDE + textwrap.dedent("""
        m = treecask.CheckpointManager(sys.argv[1])
        m.save(0, tree(0))
        m.wait_until_finished()
        m.save(1, {"big": np.ones(2 << 20, np.float32)})  # too big for the tmpfs
        m.wait_until_finished(raise_error=False)
        import treecask.orbax as ocp  # an Orbax AsyncCheckpointer's save: the same rule
        ocp.AsyncCheckpointer(ocp.StandardCheckpointHandler()).save(
            sys.argv[1] + "/one.cask", args=ocp.args.StandardSave({"big": np.ones(2 << 20, np.float32)}))
        # the script ends: nobody waits for these saves or asks for their errors
    """)
    d = small_tmpfs / "ckpt"
    r = subprocess.run([sys.executable, "-c", code, str(d)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    reports = [line for line in r.stderr.splitlines() if "failed and was never reported" in line]
    assert len(reports) == 2 and "step_00000001.cask" in r.stderr and "one.cask" in r.stderr, r.stderr
    assert CheckpointManager(d).all_steps() == [0] and _tmp_entries(d) == []
    assert not (d / "one.cask").exists()


def test_sigkill_at_random_moments_never_lists_a_partial_step(tmp_path):
    """200 child processes each resume from the latest step and save in a loop
    (async, durable=False, max_to_keep=3) until SIGKILLed at a random moment;
    after each kill every listed step is complete."""
    code = _CHILD_PRELUDE + textwrap.dedent("""
        m = treecask.CheckpointManager(sys.argv[1], max_to_keep=3, durable=False)
        step = int(sys.argv[2])
        print("ready", flush=True)
        while True:
            m.save(step, tree(step), metrics={"loss": float(step % 7)})
            step += 1
    """)
    d = tmp_path / "ckpt"
    rng = random.Random(int(os.environ.get("TREECASK_SOAK_SEED", "1234")))
    kills = int(os.environ.get("TREECASK_SOAK", "200"))  # scripts/manager_soak.sh runs thousands
    mid_save = 0
    checked = set()
    for _ in range(kills):
        m = CheckpointManager(d)
        latest = m.latest_step()
        start = 0 if latest is None else latest + 1
        p = subprocess.Popen([sys.executable, "-c", code, str(d), str(start)], stdout=subprocess.PIPE)
        assert p.stdout.readline() == b"ready\n"
        time.sleep(rng.uniform(0, 0.12))
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
        if any(f".tmp.{socket.gethostname()}.{p.pid}." in n for n in os.listdir(d)):
            mid_save += 1  # the kill landed inside a save
        steps = m.all_steps()
        for s in steps:
            if s not in checked or s == steps[-1]:
                _check_step(m, s)
                checked.add(s)
    print(f"{mid_save} of {kills} kills hit a save in progress")
    assert mid_save >= kills // 6, f"only {mid_save} of {kills} kills hit a save in progress"
    # One clean run: the temporaries of all the killed saves are swept, retention caught up.
    m = CheckpointManager(d, max_to_keep=3)
    m.save(m.latest_step() + 1, _child_tree(m.latest_step() + 1))
    m.close()
    assert _tmp_entries(d) == []
    assert len(m.all_steps()) == 3
    for s in m.all_steps():
        _check_step(m, s)


def _child_tree(step):
    ns = {}
    exec(_CHILD_PRELUDE, ns)
    return ns["tree"](step)


def test_a_reader_process_always_restores_a_complete_step(tmp_path):
    writer = _CHILD_PRELUDE + textwrap.dedent("""
        import time
        while not os.path.exists(sys.argv[2]):  # the reader is up and restoring
            time.sleep(0.005)
        m = treecask.CheckpointManager(sys.argv[1], max_to_keep=2)
        for step in range(120):
            m.save(step, tree(step))
        m.close()
    """)
    reader = _CHILD_PRELUDE + textwrap.dedent("""
        import json, time
        m = treecask.CheckpointManager(sys.argv[1])
        seen, restores = set(), 0
        open(sys.argv[3], "w").close()  # ready
        while True:
            done = os.path.exists(sys.argv[2])
            try:
                t = m.restore()
            except treecask.NotFoundError:
                if done:
                    break
                time.sleep(0.001)
                continue
            s = t["step"]
            assert (t["a"] == s).all() and (t["b"] == np.arange(131072, dtype=np.float32) + s).all()
            assert (t["c"]["x"] == s).all()
            seen.add(s)
            restores += 1
            if done:
                break
        print(json.dumps({"restores": restores, "distinct": len(seen), "last": max(seen)}))
    """)
    d, flag, ready = tmp_path / "ckpt", tmp_path / "writer_done", tmp_path / "reader_ready"
    d.mkdir()
    r = subprocess.Popen([sys.executable, "-c", reader, str(d), str(flag), str(ready)], stdout=subprocess.PIPE)
    w = subprocess.run([sys.executable, "-c", writer, str(d), str(ready)], timeout=120)
    flag.write_text("done")
    out, _ = r.communicate(timeout=60)
    assert w.returncode == 0 and r.returncode == 0
    summary = json.loads(out)
    assert summary["last"] == 119
    assert summary["distinct"] >= 5 and summary["restores"] >= 10, summary


# ---- the public calls code built on the manager uses (treecask.orbax uses only these) ----


def _jax_tree(step, n=4096):
    """Real jax.Array leaves (held by the asynchronous save as read-only views, not copied)."""
    return {"w": jnp.full((n,), step, jnp.float32), "b": jnp.arange(8, dtype=jnp.int32) + step, "step": step}


def _same(restored, step, n=4096):
    np.testing.assert_array_equal(restored["w"], np.full((n,), step, np.float32))
    np.testing.assert_array_equal(restored["b"], np.arange(8, dtype=np.int32) + step)
    assert restored["step"] == step


class _GatedStore(treecask.stores.ObjectStore):
    """An obstore MemoryStore whose commits (``put_file``) from a background
    save thread wait until ``gate`` is set: a save stays in flight,
    deterministically, for as long as a test needs to look at it, while
    commits from the test's own thread go through."""

    def __init__(self):
        import threading

        from obstore.store import MemoryStore

        super().__init__(MemoryStore(), name="mem://gated")
        self.gate = threading.Event()
        self.gate.set()

    def put_file(self, path, local_file, *, overwrite):
        import threading

        if threading.current_thread().name.startswith("treecask-save"):
            assert self.gate.wait(60), "the test never opened the gate"
        return super().put_file(path, local_file, overwrite=overwrite)


def _bounded(fn, seconds=30):
    """fn() on a thread, asserting that it returns: a call documented never to
    block must not hang the test run if it does."""
    import threading

    out = {}
    t = threading.Thread(target=lambda: out.update(r=fn()), daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{fn} blocked"
    return out.get("r")


def test_delete_a_step_and_a_read_only_manager(tmp_path):
    d = tmp_path / "run"
    with CheckpointManager(d) as m:  # asynchronous saves of jax arrays
        for s in range(4):
            assert m.save(s, _jax_tree(s), metrics={"loss": 4.0 - s})
        m.delete(3)  # the save of step 3 still in flight is waited for first
        assert m.all_steps() == [0, 1, 2] and not m.is_saving_in_progress()
        assert sorted(os.listdir(d)) == ["step_00000000.cask", "step_00000001.cask", "step_00000002.cask"]
        m.delete(1)
        assert m.all_steps() == [0, 2] and m.latest_step() == 2 and m.best_step() == 2
        with pytest.raises(NotFoundError) as e:
            m.delete(1)
        assert e.value.file == str(d / "step_00000001.cask")
        with pytest.raises(InvalidArgumentError):
            m.delete(-1)
        _same(m.restore(2), 2)
        assert m.save(1, _jax_tree(10))  # a deleted step may be saved again
        m.wait_until_finished()
        _same(m.restore(1), 10)
        assert m.metrics(1) is None and m.metrics(2) == {"loss": 2.0}

    ro = CheckpointManager(d, read_only=True)  # Orbax's read_only: lists and restores only
    assert ro.all_steps() == [0, 1, 2]
    _same(ro.restore(2), 2)
    with pytest.raises(InvalidArgumentError, match="read-only"):
        ro.delete(0)
    with pytest.raises(InvalidArgumentError, match="read-only"):
        ro.save(5, _jax_tree(5))
    assert ro.all_steps() == [0, 1, 2]
    missing = tmp_path / "never"
    assert CheckpointManager(missing, read_only=True).all_steps() == [] and not missing.exists()


def test_path_location_and_step_infos(tmp_path):
    with CheckpointManager(tmp_path / "run") as m:
        m.save(7, _jax_tree(7), metrics={"acc": 0.5})
        m.save(9, _jax_tree(9))
        m.wait_until_finished()
        store, key = m.location(7)
        assert key == str(tmp_path / "run" / "step_00000007.cask") and m.store is store
        _same(treecask.load(key, store=store), 7)
        assert m.path(7) == tmp_path / "run" / "step_00000007.cask"
        assert m.location(8)[1].endswith("step_00000008.cask")  # not saved: the name it would have
        infos = m.step_infos()
        assert [(i.step, i.metrics) for i in infos] == [(7, {"acc": 0.5}), (9, None)]
        assert infos[0].path == m.path(7) and isinstance(infos[0], treecask.StepInfo)
        assert infos[0].commit_time_ns == os.stat(m.path(7)).st_mtime_ns
        assert m.in_flight() is None
        assert m.reached_preemption(9) is False  # no jax.distributed job, as Orbax's answer

    store = treecask.stores.ObjectStore(__import__("obstore").store.MemoryStore(), name="mem://b")
    with CheckpointManager("run", store=store) as m:
        m.save(3, _jax_tree(3))
        m.wait_until_finished()
        st, key = m.location(3)
        assert st is store and key == "run/step_00000003.cask"
        _same(treecask.load(key, store=st), 3)
        (info,) = m.step_infos()
        assert info.step == 3 and info.path == "mem://b/run/step_00000003.cask" and info.commit_time_ns is None


def test_a_save_in_flight_is_shown_and_check_for_errors_never_blocks():
    pytest.importorskip("obstore")
    store = _GatedStore()
    with CheckpointManager("run", store=store) as m:
        m.save(1, _jax_tree(1))
        m.wait_until_finished()
        store.gate.clear()
        assert m.save(2, _jax_tree(2), metrics={"loss": 0.25})  # snapshotted; its upload waits at the gate
        flight = m.in_flight()
        assert (flight.step, flight.metrics, flight.commit_time_ns) == (2, {"loss": 0.25}, None)
        assert flight.path == "mem://gated/run/step_00000002.cask"
        assert m.is_saving_in_progress() and m.all_steps() == [1]  # listed once committed
        _bounded(m.check_for_errors)  # nothing to report, and no wait for the save
        store.gate.set()
        m.wait_until_finished()
        assert m.in_flight() is None and m.all_steps() == [1, 2] and m.metrics(2) == {"loss": 0.25}
        _same(m.restore(2), 2)


def test_check_for_errors_reports_a_save_that_lost_a_race_once():
    """Two managers on one bucket prefix: the first one's save of step 5 is in
    flight when the second one commits step 5; the first one's conditional
    commit then fails in the background, and check_for_errors raises its
    AlreadyExistsError, once. The step holds the winner's values."""
    pytest.importorskip("obstore")
    store = _GatedStore()
    with CheckpointManager("run", store=store) as slow, \
            CheckpointManager("run", store=store, async_save=False) as fast:
        store.gate.clear()
        assert slow.save(5, _jax_tree(5))  # in flight, held at the gate
        assert fast.save(5, _jax_tree(50))  # committed first
        store.gate.set()
        slow.wait_until_finished(raise_error=False)
        assert not slow.is_saving_in_progress()
        with pytest.raises(AlreadyExistsError) as e:
            slow.check_for_errors()
        assert e.value.file == "mem://gated/run/step_00000005.cask"
        slow.check_for_errors()  # once
        slow.wait_until_finished()
        assert slow.all_steps() == [5]
        _same(slow.restore(5), 50)


def test_check_for_errors_reports_a_full_disk_once(small_tmpfs):
    d = small_tmpfs / "ckpt"
    with CheckpointManager(d) as m:
        m.save(0, _jax_tree(0))
        assert m.save(1, {"big": jnp.ones(2 << 20, jnp.float32)})  # 8 MiB onto a 12 MiB tmpfs: accepted...
        m.wait_until_finished(raise_error=False)
        with pytest.raises(IoError) as e:
            m.check_for_errors()  # ...its failure reported here
        assert e.value.file.endswith("step_00000001.cask")
        m.check_for_errors()  # once
        m.wait_until_finished()
        assert m.all_steps() == [0] and _tmp_entries(d) == []
        _same(m.restore(0), 0)


def test_keep_fn_is_a_retention_rule_of_the_callers(tmp_path):
    seen = []

    def keep_even_and_newest(infos):
        seen.append([i.step for i in infos])
        return [i.step % 2 == 0 or i is infos[-1] for i in infos]

    with CheckpointManager(tmp_path / "k", keep_fn=keep_even_and_newest) as m:
        for s in range(6):
            m.save(s, _jax_tree(s, 64))
        m.wait_until_finished()
        assert m.all_steps() == [0, 2, 4, 5] and m.steps_to_delete() == []
        assert seen[-1] == [0, 2, 4, 5] and seen[1] == [0, 1]
    with CheckpointManager(tmp_path / "bad", keep_fn=lambda infos: [True]) as m:
        m.save(0, _jax_tree(0, 64))
        m.save(1, _jax_tree(1, 64))
        with pytest.raises(InvalidArgumentError, match="2 steps"):
            m.wait_until_finished()
    with pytest.raises(InvalidArgumentError, match="keep_fn"):
        CheckpointManager(tmp_path / "both", keep_fn=lambda infos: [], max_to_keep=2)


def test_a_tree_that_cannot_be_saved_is_refused_by_save_itself(tmp_path):
    """The snapshot's errors are save()'s own (nothing runs in the background,
    nothing is left behind), and the manager saves the next step as usual."""
    with CheckpointManager(tmp_path) as m:
        with pytest.raises(InvalidArgumentError) as e:
            m.save(1, {"w": jnp.ones(3), "bad": object()})
        assert "step_00000001.cask" in e.value.file and "bad" in str(e.value)
        assert not m.is_saving_in_progress() and m.in_flight() is None
        m.check_for_errors()
        assert m.save(1, _jax_tree(1))
        m.wait_until_finished()
        assert m.all_steps() == [1] and sorted(os.listdir(tmp_path)) == ["step_00000001.cask"]


# ---- Orbax's step layout (treecask.orbax's managers) --------------------------------------


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_the_item_directories_layout(tmp_path, async_save):
    """step_layout=ITEM_DIRECTORIES, what treecask.orbax's managers pass (format/SPEC.md
    "Checkpoint directories"): a step is the directory <n>/ holding one archive per item and
    index.cask, listed, retained (best_fn), deleted and restored through the manager's public
    calls; a dead save's staging directory is swept; each layout refuses a run of the other."""
    from treecask._run import ITEM_DIRECTORIES

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"7.tmp.{dead.pid}.0badc0de"  # a crashed save's staging directory
    stale.mkdir()
    (stale / "state").write_bytes(b"half-written")

    def items(step):
        return {"state": (_tree(step), {}), "extra": (None, {"k": str(step)})}

    with CheckpointManager(tmp_path, max_to_keep=2, best_fn=lambda m: -m["loss"], keep_newest=False,
                           async_save=async_save, step_layout=ITEM_DIRECTORIES) as m:
        for step, loss in ((1, 3.0), (2, 1.0), (3, 2.0), (4, 5.0)):
            assert m.save(step, items(step), metrics={"loss": loss})
        m.wait_until_finished()
        assert m.all_steps() == [2, 3] and m.best_step() == 2 and m.metrics(3) == {"loss": 2.0}
        assert sorted(os.listdir(tmp_path)) == ["2", "3"]  # step 1 and 4 retired, the stale staging swept
        assert sorted(os.listdir(tmp_path / "3")) == ["extra", "index.cask", "state"]
        assert m.path(3) == tmp_path / "3" and [i.step for i in m.step_infos()] == [2, 3]
        got = m.restore(3)
        assert sorted(got) == ["extra", "state"] and got["extra"] is None
        np.testing.assert_array_equal(got["state"]["b"], _tree(3)["b"])
        np.testing.assert_array_equal(m.restore()["state"]["b"], _tree(3)["b"])
        assert treecask.open(tmp_path / "3" / "extra").metadata["k"] == "3"  # each item an ordinary archive
        assert treecask.open(tmp_path / "3" / "index.cask").metadata["treecask.step"] == "3"
        with pytest.raises(AlreadyExistsError):
            m.save(3, items(3), force=True)
        with pytest.raises(InvalidArgumentError, match="item name"):
            m.save(5, _tree(5))  # not {item name: (pytree, archive metadata)}
        m.delete(2)
        assert m.all_steps() == [3] and sorted(os.listdir(tmp_path)) == ["3"]
    with pytest.raises(treecask.UnsupportedError, match=r"\(3\).*treecask\.orbax\.CheckpointManager"):
        CheckpointManager(tmp_path)
    with CheckpointManager(tmp_path / "plain") as plain:
        plain.save(1, _tree(1))
    with pytest.raises(treecask.UnsupportedError, match=r"step_00000001\.cask.*treecask\.CheckpointManager"):
        CheckpointManager(tmp_path / "plain", step_layout=ITEM_DIRECTORIES)
