"""treecask.import_flax and `python -m treecask import-flax`: legacy Flax
checkpoints written here by Flax itself (flax.serialization.to_bytes,
flax.training.checkpoints.save_checkpoint with the msgpack and the Orbax
backends), imported and compared leaf by leaf (key path, type, dtype, bits)
with what Flax's own restore_checkpoint / from_bytes return."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import config as flax_config
from flax import serialization
from flax.training import checkpoints, train_state

import treecask
from conftest import bits


def _state(seed):
    """A TrainState (params, Adam state: a tuple of named tuples, step) and its apply_fn / tx."""
    rng = np.random.default_rng(seed)
    params = {
        "dense": {"kernel": jnp.asarray(rng.standard_normal((4, 3)), jnp.float32),
                  "bias": jnp.asarray(rng.standard_normal(3), jnp.bfloat16)},
        "embed": rng.standard_normal((5, 2)).astype(np.float16),
    }
    return train_state.TrainState.create(apply_fn=lambda p, x: x, params=params, tx=optax.adam(1e-3))


def _extras(seed):
    """Leaves of every kind Flax's msgpack carries that treecask holds."""
    rng = np.random.default_rng(seed)
    return {
        "q": rng.integers(-128, 127, size=(3, 2), dtype=np.int8),
        "f8": rng.standard_normal(4).astype(ml_dtypes.float8_e4m3fn),
        "np_scalar": np.int8(seed),
        "np_complex": np.complex64(1j * seed),
        "t": (1, 2.5, True, "text", None, 1 + 2j),
        "empty": {},
        "step": seed,
    }


@pytest.fixture
def msgpack_backend():
    old = flax_config.flax_use_orbax_checkpointing
    flax_config.update("flax_use_orbax_checkpointing", False)
    yield
    flax_config.update("flax_use_orbax_checkpointing", old)


def _leaves(tree):
    """{key path: leaf} with Flax's state-dict keys and treecask's key paths alike."""
    out = {}
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        comps = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path]
        out["/".join(comps)] = x
    return out


def assert_same_leaves(got, want, scalars_as_arrays=True):
    """Leaf by leaf: key paths, Python scalar types, dtypes, shapes and bits."""
    g, w = _leaves(got), _leaves(want)
    assert sorted(g) == sorted(w)
    for kp, x in w.items():
        y = g[kp]
        if isinstance(x, (bool, int, float, str)):
            assert type(y) is type(x) and y == x, (kp, y, x)
            continue
        if isinstance(x, complex):  # stored as a 0-d complex128 array
            assert np.asarray(y).dtype == np.complex128 and complex(np.asarray(y)) == x, kp
            continue
        # NumPy scalars come back as 0-d arrays of the same dtype (docs/python.md).
        x, y = np.asarray(x), np.asarray(y)
        assert y.dtype == x.dtype and y.shape == x.shape, (kp, y.dtype, x.dtype, y.shape, x.shape)
        assert np.array_equal(bits(y), bits(x)), kp


def test_msgpack_checkpoint_directory(tmp_path, msgpack_backend):
    root = tmp_path / "ckpts"
    states = {}
    for step in (5, 7, 10):  # natural sort: checkpoint_10 is the latest, not checkpoint_7
        states[step] = {"state": _state(step), "extras": _extras(step)}
        checkpoints.save_checkpoint(root, states[step], step, keep=5)
    assert sorted(os.listdir(root)) == ["checkpoint_10", "checkpoint_5", "checkpoint_7"]
    with open(root / "checkpoint_7", "rb") as f:
        assert f.read(1)[0] & 0xF0 == 0x80  # a msgpack map: the legacy backend wrote it

    r = treecask.import_flax(root, tmp_path / "latest.cask")
    assert (r.checkpoint, r.step, r.backend) == (str(root / "checkpoint_10"), 10, "msgpack")
    flax_raw = checkpoints.restore_checkpoint(root, None)
    got = treecask.load(tmp_path / "latest.cask")
    assert_same_leaves(got, flax_raw)
    assert r.num_leaves == len(_leaves(flax_raw)) and r.num_sharded == 0
    with treecask.open(tmp_path / "latest.cask") as a:
        assert a.metadata["flax.backend"] == "msgpack" and a.metadata["flax.step"] == "10"
        assert a.metadata["flax.source"] == str(root / "checkpoint_10")

    # Into a target, as Flax does: from_state_dict(target, state dict).
    target = {"state": _state(0), "extras": _extras(0)}
    flax_restored = checkpoints.restore_checkpoint(root, target)
    mine = serialization.from_state_dict(target, got)
    assert jax.tree_util.tree_structure(mine) == jax.tree_util.tree_structure(flax_restored)
    assert_same_leaves(mine, flax_restored)
    assert mine["state"].apply_fn is target["state"].apply_fn
    assert mine["state"].opt_state[0].mu["dense"]["kernel"].dtype == np.float32

    r = treecask.import_flax(root, tmp_path / "five.cask", step=5)
    assert (r.checkpoint, r.step) == (str(root / "checkpoint_5"), 5)
    assert_same_leaves(treecask.load(tmp_path / "five.cask"), checkpoints.restore_checkpoint(root, None, step=5))
    # One checkpoint_<N> file named directly.
    r = treecask.import_flax(root / "checkpoint_7", tmp_path / "seven.cask")
    assert r.step == 7
    assert_same_leaves(treecask.load(tmp_path / "seven.cask"), checkpoints.restore_checkpoint(root, None, step=7))


def test_to_bytes_file(tmp_path):
    target = {"state": _state(3), "extras": _extras(3)}
    data = serialization.to_bytes(target)
    src = tmp_path / "model.msgpack"
    src.write_bytes(data)
    r = treecask.import_flax(src, tmp_path / "m.cask", compression="lz4", metadata={"origin": "test"})
    assert (r.step, r.backend) == (None, "msgpack")
    got = treecask.load(tmp_path / "m.cask")
    assert_same_leaves(got, serialization.msgpack_restore(data))
    assert_same_leaves(serialization.from_state_dict(target, got), serialization.from_bytes(target, data))
    with treecask.open(tmp_path / "m.cask") as a:
        assert a.metadata["origin"] == "test" and "flax.step" not in a.metadata
        assert a.info("state/params/dense/kernel").dtype == "float32"


def test_orbax_backend_checkpoint_directory(tmp_path):
    # Flax's default backend: each checkpoint_<N> is an Orbax PyTree directory.
    root = tmp_path / "ckpts"
    ck = ocp.PyTreeCheckpointer()
    states = {s: {"state": _state(s), "extras": {"w": np.arange(6.0).reshape(2, 3) * s, "t": (s, 0.5)}}
              for s in (5, 7)}
    for s, t in states.items():
        checkpoints.save_checkpoint(root, t, s, orbax_checkpointer=ck, keep=5)
    assert sorted(os.listdir(root)) == ["checkpoint_5", "checkpoint_7"]

    r = treecask.import_flax(root, tmp_path / "latest.cask")
    assert (r.checkpoint, r.step, r.backend) == (str(root / "checkpoint_7"), 7, "orbax")
    got = treecask.load(tmp_path / "latest.cask")
    assert_same_leaves(got, checkpoints.restore_checkpoint(root, None))
    assert isinstance(got["extras"]["t"], dict)  # Flax's state dict: Orbax's list as "0", "1"
    # Into a target, as Flax does (not the TrainState: Orbax keeps optax's empty
    # EmptyState as None, which from_state_dict cannot take, with or without treecask).
    target = {"params": _state(0).params, "extras": {"w": np.zeros((2, 3)), "t": (0, 0.0)}}
    got = {"params": got["state"]["params"], "extras": got["extras"]}
    flax_restored = checkpoints.restore_checkpoint(root, None)
    flax_restored = serialization.from_state_dict(
        target, {"params": flax_restored["state"]["params"], "extras": flax_restored["extras"]})
    mine = serialization.from_state_dict(target, got)
    assert isinstance(mine["extras"]["t"], tuple)
    assert_same_leaves(mine, flax_restored)
    with treecask.open(tmp_path / "latest.cask") as a:
        assert a.metadata["flax.backend"] == "orbax" and a.metadata["flax.step"] == "7"
        assert a.metadata["orbax.items"] == ""

    r = treecask.import_flax(root / "checkpoint_5", tmp_path / "five.cask")
    assert (r.step, r.backend) == (5, "orbax")
    assert_same_leaves(treecask.load(tmp_path / "five.cask"), checkpoints.restore_checkpoint(root, None, step=5))


def test_errors_name_the_path(tmp_path, msgpack_backend):
    with pytest.raises(treecask.NotFoundError) as e:
        treecask.import_flax(tmp_path / "missing", tmp_path / "a.cask")
    assert e.value.file == str(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(treecask.NotFoundError, match="no checkpoint_"):
        treecask.import_flax(empty, tmp_path / "a.cask")
    junk = tmp_path / "junk.bin"
    treecask.save(junk, {"w": np.ones(3)})  # a treecask archive is no msgpack
    with pytest.raises(treecask.InvalidArgumentError, match="not a Flax msgpack checkpoint") as e:
        treecask.import_flax(junk, tmp_path / "a.cask")
    assert e.value.file == str(junk)
    with pytest.raises(treecask.InvalidArgumentError, match="not a checkpoint directory"):
        treecask.import_flax(junk, tmp_path / "a.cask", step=3)

    root = tmp_path / "ckpts"
    checkpoints.save_checkpoint(root, {"w": np.ones(2)}, 3)
    with pytest.raises(treecask.NotFoundError, match=r"no checkpoint checkpoint_4 here; checkpoints found: \['checkpoint_3'\]"):
        treecask.import_flax(root, tmp_path / "a.cask", step=4)
    b = tmp_path / "bytes.msgpack"
    b.write_bytes(serialization.msgpack_serialize({"a": {"blob": b"\x00\x01"}}))
    with pytest.raises(treecask.UnsupportedError, match="a bytes leaf") as e:
        treecask.import_flax(b, tmp_path / "a.cask")
    assert e.value.key_path == "a/blob"
    assert not (tmp_path / "a.cask").exists()


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "treecask", *map(str, args)], capture_output=True,
                          text=True, timeout=300)


def test_cli(tmp_path, msgpack_backend):
    root = tmp_path / "ckpts"
    for step in (1, 2):
        checkpoints.save_checkpoint(root, {"w": np.full(3, step, np.float32), "step": step}, step, keep=2)
    dst = tmp_path / "cli.cask"
    p = _cli("import-flax", root, dst, "--step", "1", "--compression", "none", "--metadata", "k=v")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"wrote {dst} from {root / 'checkpoint_1'} step 1 (msgpack): 2 leaves (0 sharded), ")
    assert_same_leaves(treecask.load(dst), checkpoints.restore_checkpoint(root, None, step=1))
    assert treecask.open(dst).metadata["k"] == "v"
    p = _cli("import-flax", root, dst)
    assert p.returncode == 9 and "already exists" in p.stderr
    p = _cli("import-flax", root, dst, "--overwrite")
    assert p.returncode == 0 and "checkpoint_2 step 2" in p.stdout
    p = _cli("import-flax", tmp_path / "missing", tmp_path / "b.cask")
    assert p.returncode == 2 and str(tmp_path / "missing") in p.stderr
    p = _cli("import-flax", root, tmp_path / "b.cask", "--step", "9")
    assert p.returncode == 2 and "checkpoint_9" in p.stderr
    p = _cli("import-flax", "--help")
    assert p.returncode == 0 and "msgpack_restore" in p.stdout
