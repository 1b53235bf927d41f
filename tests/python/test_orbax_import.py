"""treecask.import_orbax and `python -m treecask import-orbax`: checkpoints written
here by Orbax itself (StandardCheckpointer, CheckpointManager), imported and
compared leaf by leaf (key path, dtype, value) and sharding by sharding."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import treecask
from conftest import bits

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 CPU devices (conftest XLA_FLAGS)")


def _mesh():
    return jax.make_mesh((4, 2), ("x", "y"))


def make_tree(seed=0):
    """Nested dicts and lists; bf16, int8, float8, int4; Python and NumPy scalars;
    jax arrays sharded over 8 CPU devices in three ways and one replicated."""
    rng = np.random.default_rng(seed)
    mesh = _mesh()
    w = rng.standard_normal((16, 8)).astype(np.float32)
    return {
        "params": {
            "dense": {
                "kernel": jax.device_put(w, NamedSharding(mesh, P("x", "y"))),
                "bias": jax.device_put(rng.standard_normal(8).astype(np.float32), NamedSharding(mesh, P("y"))),
            },
            "embed": jax.device_put(rng.standard_normal((8, 4)).astype(ml_dtypes.bfloat16),
                                    NamedSharding(mesh, P(("x", "y"), None))),
            "replicated": jax.device_put(np.arange(6, dtype=np.int32).reshape(2, 3), NamedSharding(mesh, P())),
            "q": rng.integers(-128, 127, size=(5, 3), dtype=np.int8),
            "f8": rng.standard_normal(7).astype(ml_dtypes.float8_e4m3fn),
            "bf16_host": rng.standard_normal((3, 2)).astype(ml_dtypes.bfloat16),
        },
        "layers": [
            {"w": rng.standard_normal((2, 2)).astype(np.float64)},
            {"w": rng.integers(0, 2**31, size=(3,), dtype=np.uint32)},
            np.float32(2.5),
        ],
        "step": 1234 + seed,
        "lr": 0.125,
        "flag": np.bool_(True),
    }


# The key path, dtype and host value of every leaf Orbax keeps; Python ints and
# floats stay Python scalars (Orbax restores them as such).
def expected_leaves(tree, prefix=""):
    out = {}
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        comps = [str(getattr(k, "key", getattr(k, "idx", k))) for k in path]
        kp = "/".join(([prefix] if prefix else []) + comps)
        out[kp] = x if isinstance(x, (int, float)) else np.asarray(x)
    return out


EXPECTED_SHARDING = {  # key path -> (mesh names, mesh sizes, spec)
    "params/dense/kernel": (("x", "y"), (4, 2), (("x",), ("y",))),
    "params/dense/bias": (("x", "y"), (4, 2), (("y",),)),
    "params/embed": (("x", "y"), (4, 2), (("x", "y"), ())),
    "params/replicated": (("x", "y"), (4, 2), ()),
}


def assert_archive_matches(path, tree, prefix="", other_prefixes=()):
    want = expected_leaves(tree, prefix)
    with treecask.open(path) as a:
        keys = a.keys()
        mine = [k for k in keys if not any(k.startswith(p + "/") for p in other_prefixes)]
        assert sorted(mine) == sorted(want), (sorted(mine), sorted(want))
        for kp, x in want.items():
            info = a.info(kp)
            got = a[kp]
            if isinstance(x, (int, float)):
                assert info.value_kind == type(x).__name__ and got[()] == x, kp
                continue
            got = np.asarray(got)
            assert got.dtype == x.dtype, (kp, got.dtype, x.dtype)
            assert got.shape == x.shape, kp
            assert np.array_equal(bits(got), bits(x)), kp
            sub = kp[len(prefix) + 1:] if prefix else kp
            if sub in EXPECTED_SHARDING:
                names, sizes, spec = EXPECTED_SHARDING[sub]
                assert info.sharding is not None, kp
                assert info.sharding.mesh_axis_names == names, kp
                assert info.sharding.mesh_axis_sizes == sizes, kp
                assert tuple(info.sharding.spec) == spec, (kp, info.sharding.spec)
            else:
                assert info.sharding is None, kp


def snapshot(root):
    """(relative path, size, mtime_ns) of everything under root."""
    out = []
    for d, dirs, files in os.walk(root):
        for n in sorted(dirs + files):
            p = os.path.join(d, n)
            st = os.lstat(p)
            out.append((os.path.relpath(p, root), st.st_size if n in files else 0, st.st_mtime_ns))
    return sorted(out)


@pytest.fixture(scope="module")
def standard_ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("orbax") / "std"
    tree = make_tree(0)
    with ocp.StandardCheckpointer() as ck:
        ck.save(d, tree)
        ck.wait_until_finished()
    return d, tree


def test_standard_checkpointer(standard_ckpt, tmp_path):
    src, tree = standard_ckpt
    before = snapshot(src)
    dst = tmp_path / "out.cask"
    r = treecask.import_orbax(src, dst)
    assert snapshot(src) == before  # read-only: nothing created or touched under src
    assert r.items == (("", str(src)),) and r.step is None and r.skipped == ()
    assert r.num_leaves == len(expected_leaves(tree))
    assert r.num_sharded == len(EXPECTED_SHARDING)
    assert_archive_matches(dst, tree)
    with treecask.open(dst) as a:
        assert a.metadata["orbax.items"] == ""
        assert "orbax.step" not in a.metadata


def test_sharding_restores_onto_devices(standard_ckpt, tmp_path):
    src, tree = standard_ckpt
    dst = tmp_path / "out.cask"
    treecask.import_orbax(src, dst)
    got = treecask.load(dst, shardings=lambda kp, info: info.sharding.to_jax() if info.sharding else None)
    k = got["params"]["dense"]["kernel"]
    assert isinstance(k, jax.Array) and k.sharding.spec == P("x", "y")
    assert dict(k.sharding.mesh.shape) == {"x": 4, "y": 2}
    for shard in k.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), np.asarray(tree["params"]["dense"]["kernel"])[shard.index])
    e = got["params"]["embed"]
    assert e.sharding.spec == P(("x", "y"), None) and e.dtype == jnp.bfloat16


def test_checkpoint_manager_items_and_steps(tmp_path):
    root = tmp_path / "mgr"
    t1, t2 = make_tree(1), make_tree(2)
    extra = {"ema": np.arange(4, dtype=np.float16), "count": 3}
    with ocp.CheckpointManager(root, item_names=("state", "extra", "meta")) as mgr:
        for step, t in ((10, t1), (20, t2)):
            mgr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(t),
                                                   extra=ocp.args.StandardSave(extra),
                                                   meta=ocp.args.JsonSave({"note": "hello"})))
        mgr.wait_until_finished()
    before = snapshot(root)

    # A step directory: both PyTree items, keyed by item name; the JSON item skipped.
    dst = tmp_path / "step10.cask"
    r = treecask.import_orbax(root / "10", dst)
    assert r.step == 10 and [n for n, _ in r.items] == ["extra", "state"] and r.skipped == ("meta",)
    assert_archive_matches(dst, t1, "state", other_prefixes=("extra",))
    assert_archive_matches(dst, extra, "extra", other_prefixes=("state",))
    with treecask.open(dst) as a:
        assert a.metadata["orbax.items"] == "extra,state" and a.metadata["orbax.step"] == "10"

    # One item, at the archive root.
    dst = tmp_path / "state10.cask"
    r = treecask.import_orbax(root / "10", dst, item="state", metadata={"run": "a"})
    assert [n for n, _ in r.items] == ["state"]
    assert_archive_matches(dst, t1)
    with treecask.open(dst) as a:
        assert a.metadata["run"] == "a" and a.metadata["orbax.items"] == "state"

    # The manager root: the highest step, or the one asked for.
    dst = tmp_path / "latest.cask"
    r = treecask.import_orbax(root, dst, item="state")
    assert r.step == 20 and r.checkpoint == str(root / "20")
    assert_archive_matches(dst, t2)
    r = treecask.import_orbax(root, dst, item="state", step=10, overwrite=True)
    assert r.step == 10
    assert_archive_matches(dst, t1)
    assert snapshot(root) == before

    with pytest.raises(treecask.NotFoundError, match="no item 'nope'") as e:
        treecask.import_orbax(root / "10", tmp_path / "x.cask", item="nope")
    assert e.value.file == str(root / "10")
    with pytest.raises(treecask.UnsupportedError, match="'meta'"):
        treecask.import_orbax(root / "10", tmp_path / "x.cask", item="meta")
    with pytest.raises(treecask.NotFoundError, match="no step 15"):
        treecask.import_orbax(root, tmp_path / "x.cask", step=15)
    assert not (tmp_path / "x.cask").exists()


def test_default_item_of_checkpoint_manager(tmp_path):
    root = tmp_path / "mgr"
    tree = make_tree(3)
    with ocp.CheckpointManager(root) as mgr:
        mgr.save(7, args=ocp.args.StandardSave(tree))
        mgr.wait_until_finished()
    r = treecask.import_orbax(root / "7", tmp_path / "a.cask")
    assert [n for n, _ in r.items] == ["default"] and r.step == 7
    assert_archive_matches(tmp_path / "a.cask", tree)


def test_errors_name_the_path(tmp_path):
    missing = tmp_path / "missing"
    with pytest.raises(treecask.NotFoundError) as e:
        treecask.import_orbax(missing, tmp_path / "a.cask")
    assert e.value.file == str(missing)
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_text("not a checkpoint")
    with pytest.raises(treecask.InvalidArgumentError, match="not an Orbax checkpoint") as e:
        treecask.import_orbax(plain, tmp_path / "a.cask")
    assert e.value.file == str(plain)
    with pytest.raises(treecask.InvalidArgumentError, match="not a directory") as e:
        treecask.import_orbax(plain / "notes.txt", tmp_path / "a.cask")
    assert e.value.file == str(plain / "notes.txt")
    assert not (tmp_path / "a.cask").exists()


def test_existing_destination_is_kept(standard_ckpt, tmp_path):
    src, _ = standard_ckpt
    dst = tmp_path / "a.cask"
    treecask.save(dst, {"old": np.zeros(2)})
    with pytest.raises(treecask.AlreadyExistsError):
        treecask.import_orbax(src, dst)
    assert list(treecask.load(dst)) == ["old"]


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "treecask", *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=300)


def test_cli(standard_ckpt, tmp_path):
    src, tree = standard_ckpt
    dst = tmp_path / "cli.cask"
    p = _cli("import-orbax", src, dst, "--compression", "lz4", "--metadata", "origin=test")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"wrote {dst} from {src} items (root): {len(expected_leaves(tree))} leaves "
                               f"({len(EXPECTED_SHARDING)} sharded), ")
    assert_archive_matches(dst, tree)
    with treecask.open(dst) as a:
        assert a.metadata["origin"] == "test"
        assert a.info("params/dense/kernel").codec == "lz4"

    p = _cli("import-orbax", src, dst)  # exists
    assert p.returncode == 9 and "already exists" in p.stderr
    p = _cli("import-orbax", tmp_path / "missing", tmp_path / "b.cask")
    assert p.returncode == 2 and str(tmp_path / "missing") in p.stderr
    p = _cli("import-orbax", src)  # DST missing: usage
    assert p.returncode == 1 and "usage" in p.stderr
    p = _cli("import-orbax", "--help")
    assert p.returncode == 0 and "CheckpointManager" in p.stdout and "--max" not in p.stdout


def test_without_orbax_installed(standard_ckpt, tmp_path):
    # A child where `import orbax` fails, as when the optional dependency is absent.
    src, _ = standard_ckpt
    code = ("import sys, json; sys.modules['orbax'] = None; sys.modules['orbax.checkpoint'] = None\n"
            "import treecask\n"
            "try:\n"
            f"    treecask.import_orbax({str(src)!r}, {str(tmp_path / 'a.cask')!r})\n"
            "except treecask.UnsupportedError as e:\n"
            "    print(json.dumps(str(e)))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "pip install orbax-checkpoint" in json.loads(p.stdout)
    assert not (tmp_path / "a.cask").exists()


def test_same_tree_as_orbax_restore(tmp_path):
    # Optax state (a tuple of named tuples), None, an empty dict, a tuple: the
    # archive loads to the same tree Orbax's own target-less restore gives.
    import optax

    params = {"w": jnp.arange(6.0).reshape(3, 2), "b": jnp.ones(2, jnp.bfloat16)}
    tree = {"params": params, "opt": optax.adam(1e-3).init(params), "none": None, "empty": {},
            "tup": (jnp.ones(2), 3)}
    src = tmp_path / "ck"
    with ocp.StandardCheckpointer() as ck:
        ck.save(src, tree)
        ck.wait_until_finished()
        ref = ck.restore(src)
    treecask.import_orbax(src, tmp_path / "a.cask")
    got = treecask.load(tmp_path / "a.cask")
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(ref)
    for (p, x), (q, y) in zip(jax.tree_util.tree_flatten_with_path(ref)[0],
                              jax.tree_util.tree_flatten_with_path(got)[0]):
        assert p == q
        if isinstance(x, (int, float)):
            assert type(y) is type(x) and x == y, p
        else:
            x = np.asarray(x)
            assert y.dtype == x.dtype and y.shape == x.shape and bits(y).tobytes() == bits(x).tobytes(), p


_TWO_PROCESS_SAVE = r"""
import os, sys
pid, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
import jax
jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid)
import numpy as np, orbax.checkpoint as ocp
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((4, 2), ("x", "y"))  # 8 devices, 4 in each process
g = np.arange(16 * 6, dtype=np.float32).reshape(16, 6)
w = jax.make_array_from_callback(g.shape, NamedSharding(mesh, P("x", "y")), lambda i: g[i])
r = jax.make_array_from_callback((5,), NamedSharding(mesh, P()), lambda i: np.arange(5, dtype=np.int32)[i])
with ocp.StandardCheckpointer() as ck:
    ck.save(out, {"w": w, "r": r, "step": 3})
    ck.wait_until_finished()
jax.distributed.shutdown()
"""


def test_checkpoint_saved_by_two_processes(tmp_path):
    # Orbax's multi-process layout (one OCDBT database per process, merged):
    # two jax.distributed processes with 4 CPU devices each save one tree.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "save.py"
    script.write_text(_TWO_PROCESS_SAVE)
    src = tmp_path / "ck"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    procs = [subprocess.Popen([sys.executable, str(script), str(i), str(port), str(src)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    try:
        outs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], outs
    assert (src / "ocdbt.process_0").is_dir() and (src / "ocdbt.process_1").is_dir()

    r = treecask.import_orbax(src, tmp_path / "a.cask")
    assert r.num_leaves == 3 and r.num_sharded == 2
    with treecask.open(tmp_path / "a.cask") as a:
        np.testing.assert_array_equal(a["w"], np.arange(96, dtype=np.float32).reshape(16, 6))
        np.testing.assert_array_equal(a["r"], np.arange(5, dtype=np.int32))
        assert a.info("step").value_kind == "int" and a["step"][()] == 3
        s = a.info("w").sharding
        assert (s.mesh_axis_names, s.mesh_axis_sizes, s.spec) == (("x", "y"), (4, 2), (("x",), ("y",)))
        assert a.info("r").sharding.spec == ()


def test_flax_directory_of_steps_picks_the_latest(tmp_path):
    # flax.training.checkpoints.save_checkpoint with the Orbax backend writes each
    # step as one PyTree item directory, <dir>/checkpoint_<N>. The parent is a
    # directory of steps: the latest is imported (or step=), as Flax's
    # restore_checkpoint reads it, never every step as an item of one archive.
    from flax.training import checkpoints

    root = tmp_path / "flax"
    trees = {5: make_tree(5), 7: make_tree(7)}
    for t in trees.values():
        # PyTreeCheckpointer (the Flax guide's) has no handler for a NumPy bool
        # scalar and writes a NumPy float32 scalar as a Python float: arrays here.
        del t["flag"]
        t["layers"][2] = np.asarray(t["layers"][2])
    ck = ocp.PyTreeCheckpointer()
    for s, t in trees.items():
        checkpoints.save_checkpoint(root, t, s, orbax_checkpointer=ck, keep=5)
    assert sorted(os.listdir(root)) == ["checkpoint_5", "checkpoint_7"]
    before = snapshot(root)

    r = treecask.import_orbax(root, tmp_path / "latest.cask")
    assert r.step == 7 and r.checkpoint == str(root / "checkpoint_7")
    assert [n for n, _ in r.items] == [""] and r.skipped == ()
    assert_archive_matches(tmp_path / "latest.cask", trees[7])
    flax_leaves = jax.tree_util.tree_flatten_with_path(checkpoints.restore_checkpoint(root, None))[0]
    with treecask.open(tmp_path / "latest.cask") as a:
        assert sorted(a.keys()) == sorted(
            "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in p) for p, _ in flax_leaves)
        assert a.metadata["orbax.step"] == "7"

    r = treecask.import_orbax(root, tmp_path / "five.cask", step=5)
    assert r.step == 5 and r.checkpoint == str(root / "checkpoint_5")
    assert_archive_matches(tmp_path / "five.cask", trees[5])
    with pytest.raises(treecask.NotFoundError, match=r"no step 6 here; steps found: \[5, 7\]"):
        treecask.import_orbax(root, tmp_path / "x.cask", step=6)
    p = _cli("import-orbax", root, tmp_path / "cli.cask", "--step", "5")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"wrote {tmp_path / 'cli.cask'} from {root / 'checkpoint_5'} step 5 items (root): ")
    assert_archive_matches(tmp_path / "cli.cask", trees[5])
    assert snapshot(root) == before  # only read
