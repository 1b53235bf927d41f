"""``import treecask.orbax as ocp``: the Orbax / Flax checkpointing guides' own
code, run twice -- once with ``orbax.checkpoint`` (the real orbax-checkpoint
0.12.8), once with ``treecask.orbax`` -- and the results compared leaf by leaf:
the legacy API (PyTreeCheckpointer, CheckpointManager(dir, checkpointer,
options), save_kwargs/restore_kwargs, transforms={}, AsyncCheckpointer,
sharded restore_args) and today's (options=, args=StandardSave/StandardRestore,
Composite + JsonSave, item_metadata, best_fn retention, dtype cast). 8 CPU
devices (conftest.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import warnings
from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")
orbax_checkpoint = pytest.importorskip("orbax.checkpoint")
import flax.linen as nn  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from flax.training import orbax_utils, train_state  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import treecask  # noqa: E402
import treecask.orbax as tcp  # noqa: E402

MODULES = {"orbax": orbax_checkpoint, "treecask": tcp}


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# ---- comparing results leaf by leaf -----------------------------------------------------


def _plain(tree):
    """Tuples as lists (Orbax restores tuples as lists without a target), recursively."""
    if isinstance(tree, dict):
        return {k: _plain(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)) and not hasattr(type(tree), "_fields"):
        return [_plain(v) for v in tree]
    return tree


def _flat(tree, plain=True):
    pairs, _ = jax.tree_util.tree_flatten_with_path(_plain(tree) if plain else tree)
    return {jax.tree_util.keystr(p): v for p, v in pairs}


def _node_types(tree):
    """The type of every inner node, by key path (static fields such as apply_fn left out)."""
    out = {}

    def walk(x, path):
        children = jax.tree_util.tree_flatten_with_path(x, is_leaf=lambda y: y is not x)[0]
        if len(children) == 1 and children[0][1] is x or not children:
            return
        out[path] = type(x).__name__
        for p, c in children:
            walk(c, path + jax.tree_util.keystr(p))

    walk(tree, "")
    return out


def assert_same(expected, got, *, types="all"):
    """Same key paths, and per leaf the same values, dtype and shape; with
    `types`, the same node types (dict, list, TrainState...), the same leaf
    types (NumPy / jax.Array / Python scalar) and, for jax arrays, the same
    sharding ("nodes": the node types only)."""
    if types:
        assert _node_types(expected) == _node_types(got)
    fe, fg = _flat(expected, plain=not types), _flat(got, plain=not types)
    assert sorted(fe) == sorted(fg)
    for k, e in fe.items():
        g = fg[k]
        if isinstance(e, str) or isinstance(g, str):
            assert e == g, k
            continue
        ea, ga = np.asarray(e), np.asarray(g)
        assert ea.dtype == ga.dtype and ea.shape == ga.shape, (k, ea.dtype, ga.dtype, ea.shape, ga.shape)
        np.testing.assert_array_equal(ea, ga, err_msg=k)
        if types == "all":
            assert isinstance(g, jax.Array) == isinstance(e, jax.Array), (k, type(e), type(g))
            assert isinstance(g, np.ndarray) == isinstance(e, np.ndarray), (k, type(e), type(g))
            if isinstance(e, jax.Array):
                assert e.sharding.is_equivalent_to(g.sharding, e.ndim), (k, e.sharding, g.sharding)


def assert_same_results(results):
    """results[module] is {name: (value, compare types?)}."""
    o, t = results["orbax"], results["treecask"]
    assert sorted(o) == sorted(t)
    for name, (value, types) in o.items():
        try:
            if isinstance(value, (int, float, str, list, type(None))) and not _has_arrays(value):
                assert value == t[name][0]
            else:
                assert_same(value, t[name][0], types=types)
        except AssertionError as e:
            raise AssertionError(f"result {name!r}: {e}") from None


def _has_arrays(x):
    return any(isinstance(v, (np.ndarray, jax.Array)) for v in jax.tree_util.tree_leaves(x))


# ---- the legacy API: the Flax guide "Save and load checkpoints" ----------------------------


class CustomTrainState(train_state.TrainState):
    batch_stats: Any = None


def legacy_guide(ocp, root):
    """The Flax guide's Orbax section, as written there (legacy API)."""
    out = {}
    key1, key2 = jax.random.split(jax.random.key(0))
    x1 = jax.random.normal(key1, (5,))
    model = nn.Dense(3)
    variables = model.init(key2, x1)
    tx = optax.sgd(learning_rate=0.001)
    state = train_state.TrainState.create(apply_fn=model.apply, params=variables["params"], tx=tx)
    grads = jax.tree_util.tree_map(jnp.ones_like, state.params)
    state = state.apply_gradients(grads=grads)
    config = {"dimensions": np.array([5, 3]), "name": "dense"}
    ckpt = {"model": state, "config": config, "data": [x1]}

    # A single save, restored raw.
    orbax_checkpointer = ocp.PyTreeCheckpointer()
    save_args = orbax_utils.save_args_from_target(ckpt)
    orbax_checkpointer.save(os.path.join(root, "single_save"), ckpt, save_args=save_args)
    out["raw"] = (orbax_checkpointer.restore(os.path.join(root, "single_save")), False)

    # The manager: max_to_keep=2 of 5 steps.
    options = ocp.CheckpointManagerOptions(max_to_keep=2, create=True)
    checkpoint_manager = ocp.CheckpointManager(os.path.join(root, "managed"), orbax_checkpointer, options)
    for step in range(5):
        checkpoint_manager.save(step, ckpt, save_kwargs={"save_args": save_args})
    out["all_steps"] = (checkpoint_manager.all_steps(), "all")
    out["latest_raw"] = (checkpoint_manager.restore(checkpoint_manager.latest_step()), False)

    # Restore into a target: the TrainState comes back, apply_fn and tx from the target.
    empty_state = train_state.TrainState.create(
        apply_fn=model.apply, params=jax.tree_util.tree_map(np.zeros_like, variables["params"]), tx=tx)
    empty_config = {"dimensions": np.array([0, 0]), "name": ""}
    target = {"model": empty_state, "config": empty_config, "data": [jnp.zeros_like(x1)]}
    restored = orbax_checkpointer.restore(os.path.join(root, "single_save"), item=target)
    assert type(restored["model"]) is train_state.TrainState and restored["model"].tx is tx
    out["target"] = (restored, "nodes")  # Orbax: each leaf's type as saved; treecask: the target's

    # A field the checkpoint lacks, filled from the target with transforms={}.
    custom_state = CustomTrainState.create(apply_fn=state.apply_fn, params=state.params, tx=state.tx,
                                           batch_stats=np.arange(10))
    custom_ckpt = {"model": custom_state, "config": config, "data": [x1]}
    restore_args = orbax_utils.restore_args_from_target(custom_ckpt, mesh=None)
    restored = checkpoint_manager.restore(4, items=custom_ckpt,
                                          restore_kwargs={"transforms": {}, "restore_args": restore_args})
    assert type(restored["model"]) is CustomTrainState
    out["transforms"] = (restored, "all")

    # Asynchronous save.
    async_checkpointer = ocp.AsyncCheckpointer(ocp.PyTreeCheckpointHandler(), timeout_secs=50)
    async_manager = ocp.CheckpointManager(os.path.join(root, "async"), async_checkpointer, options)
    for step in range(3):
        async_manager.save(step, ckpt, save_kwargs={"save_args": save_args})
    async_manager.wait_until_finished()
    out["async_steps"] = (async_manager.all_steps(), "all")
    out["async_target"] = (async_manager.restore(2, items=target), "nodes")
    async_manager.close()
    checkpoint_manager.close()

    # Restore onto shardings: restore_args from the target (Orbax's ArrayRestoreArgs, from
    # Flax's orbax_utils), and ArrayRestoreArgs of the module under test.
    mesh = jax.make_mesh((4, 2), ("x", "y"))
    w = np.arange(64, dtype=np.float32).reshape(8, 8)
    sharded = {"w": jax.device_put(w, NamedSharding(mesh, P("x", "y"))), "b": jnp.arange(8.0), "n": np.ones(3)}
    orbax_checkpointer.save(os.path.join(root, "sharded"), sharded,
                            save_args=orbax_utils.save_args_from_target(sharded))
    target = {"w": jax.device_put(np.zeros_like(w), NamedSharding(mesh, P(None, "y"))),
              "b": jax.device_put(jnp.zeros(8), NamedSharding(mesh, P("x"))), "n": np.zeros(3)}
    out["sharded_target"] = (orbax_checkpointer.restore(
        os.path.join(root, "sharded"), item=target, restore_args=orbax_utils.restore_args_from_target(target)), "all")
    restore_args = {"w": ocp.ArrayRestoreArgs(sharding=NamedSharding(mesh, P("y", "x"))),
                    "b": ocp.ArrayRestoreArgs(sharding=NamedSharding(mesh, P()), dtype=jnp.bfloat16),
                    "n": ocp.RestoreArgs(restore_type=np.ndarray, dtype=np.float32)}
    out["sharded_args"] = (orbax_checkpointer.restore(
        os.path.join(root, "sharded"), item=target, restore_args=restore_args), "all")
    return out


def test_the_legacy_guide_gives_the_same_results(tmp_path):
    results = {name: legacy_guide(ocp, str(tmp_path / name)) for name, ocp in MODULES.items()}
    assert results["treecask"]["all_steps"][0] == [3, 4]
    assert_same_results(results)
    # Every treecask.orbax checkpoint is an ordinary archive.
    tree = treecask.load(tmp_path / "treecask" / "single_save")
    assert tree["config"]["name"] == "dense"
    assert sorted(os.listdir(tmp_path / "treecask" / "managed")) == sorted(os.listdir(tmp_path / "orbax" / "managed"))
    assert sorted(os.listdir(tmp_path / "treecask" / "managed" / "4")) == ["default", "index.cask"]


# ---- today's API: options=, args=, Composite ----------------------------------------------


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(4)(nn.relu(nn.Dense(16)(x)))


def _create_state(seed):
    params = MLP().init(jax.random.key(seed), jnp.ones((1, 8)))["params"]
    return train_state.TrainState.create(apply_fn=MLP().apply, params=params, tx=optax.adam(1e-3))


@jax.jit
def _train_step(state, x):
    grads = jax.grad(lambda p: jnp.mean(state.apply_fn({"params": p}, x) ** 2))(state.params)
    return state.apply_gradients(grads=grads)


def _md_tree(md):
    """{key path: (shape, dtype)} of an item_metadata tree."""
    tree = md.tree if hasattr(md, "tree") else md
    leaves = jax.tree_util.tree_leaves(tree, is_leaf=lambda x: hasattr(x, "shape") and hasattr(x, "dtype"))
    pairs, _ = jax.tree_util.tree_flatten_with_path(
        _plain(tree), is_leaf=lambda x: hasattr(x, "shape") and hasattr(x, "dtype"))
    assert len(pairs) == len(leaves)
    return {jax.tree_util.keystr(p): (tuple(v.shape), np.dtype(v.dtype)) for p, v in pairs}


def todays_api(ocp, root):
    out = {}
    x = jnp.ones((32, 8))
    state = _create_state(0)
    abstract = jax.eval_shape(lambda: _create_state(1))

    # Best-2 retention by loss: Orbax keeps exactly the two best.
    options = ocp.CheckpointManagerOptions(max_to_keep=2, best_fn=lambda m: m["loss"], best_mode="min")
    with ocp.CheckpointManager(os.path.join(root, "run"), options=options) as mngr:
        for step, loss in enumerate([5.0, 1.0, 3.0, 0.5, 4.0]):
            state = _train_step(state, x)
            mngr.save(step, args=ocp.args.StandardSave(state), metrics={"loss": loss})
        mngr.wait_until_finished()
        out["steps"] = ([mngr.all_steps(), mngr.latest_step(), mngr.best_step(), mngr.should_save(2),
                         mngr.should_save(7), mngr.metrics(mngr.best_step())], "all")
        restored = mngr.restore(mngr.best_step(), args=ocp.args.StandardRestore(abstract))
        assert type(restored) is train_state.TrainState
        out["restored"] = (restored, "all")
        out["raw"] = (mngr.restore(mngr.latest_step()), False)
        out["item_metadata"] = (_md_tree(mngr.item_metadata(mngr.best_step())), "all")
        # The restore target from the metadata alone.
        abstract_md = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, mngr.item_metadata(mngr.best_step()))
        restored = mngr.restore(mngr.best_step(), args=ocp.args.StandardRestore(abstract_md))
        assert type(restored) is dict
        out["from_metadata"] = (restored, False)  # Orbax's metadata has lists for tuples
        assert not mngr.save(1, args=ocp.args.StandardSave(state))  # below the latest: not due

    # A float64 checkpoint into a float32 target, fp32 into a bf16 serving template.
    with ocp.CheckpointManager(os.path.join(root, "cast")) as mngr:
        mngr.save(0, args=ocp.args.StandardSave({"w": np.arange(6.0).reshape(2, 3), "b": np.ones(3, np.float32)}))
        mngr.wait_until_finished()
        out["cast"] = (mngr.restore(0, args=ocp.args.StandardRestore(
            {"w": jax.ShapeDtypeStruct((2, 3), jnp.float32), "b": jax.ShapeDtypeStruct((3,), jnp.bfloat16)})),
            "nodes")  # Orbax: NumPy arrays for leaves saved as NumPy; treecask: the target's jax.Array
        out["cast_numpy"] = (mngr.restore(0, args=ocp.args.StandardRestore(
            {"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)})), "all")

    # Several items: a train state and JSON.
    meta = {"lr": 0.1, "names": ["a", "b"], "nested": {"k": 1}}
    d = os.path.join(root, "composite")
    with ocp.CheckpointManager(d, options=ocp.CheckpointManagerOptions(max_to_keep=3)) as mngr:
        mngr.save(1, args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))
        mngr.wait_until_finished()
        r = mngr.restore(1, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                                    meta=ocp.args.JsonRestore()))
        out["composite_state"] = (r.state, "all")
        out["composite_meta"] = (r["meta"], "all")
        out["composite_part"] = (sorted(mngr.restore(1, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).keys()),
                                 "all")
        md = mngr.item_metadata(1)
        out["composite_md"] = ((md["meta"], _md_tree(md["state"])), "all")
    with ocp.CheckpointManager(d) as mngr:  # a fresh manager, no args: every item raw
        r = mngr.restore(1)
        out["composite_raw"] = ({"meta": r["meta"], "params": r["state"]["params"]}, False)

    # The "Checkpointing PyTrees" guide: a StandardCheckpointer.
    ckptr = ocp.StandardCheckpointer()
    tree = {"params": state.params, "n": np.arange(3, dtype=np.int32), "lr": 0.5}
    ckptr.save(os.path.join(root, "std"), tree)
    ckptr.wait_until_finished()
    out["std_target"] = (ckptr.restore(os.path.join(root, "std"),
                                       jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, tree)), "nodes")
    out["std_raw"] = (ckptr.restore(os.path.join(root, "std")), False)
    out["std_md"] = (_md_tree(ckptr.metadata(os.path.join(root, "std")).item_metadata), "all")

    # The legacy API with several named items.
    mngr = ocp.CheckpointManager(os.path.join(root, "legacy_items"),
                                 {"state": ocp.PyTreeCheckpointer(), "meta": ocp.Checkpointer(ocp.JsonCheckpointHandler())})
    mngr.save(0, {"state": tree, "meta": {"a": [1, 2]}})
    r = mngr.restore(0)
    out["legacy_items_raw"] = ({"state": r["state"], "meta": r["meta"]}, False)
    out["legacy_items_some"] = (sorted(mngr.restore(0, items={"state": tree}).keys()), "all")
    mngr.close()

    # Onto shardings: a ShapeDtypeStruct target, and PyTreeRestore with ArrayRestoreArgs.
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    w = jax.device_put(np.arange(128, dtype=np.float32).reshape(16, 8), NamedSharding(mesh, P("data", "model")))
    with ocp.CheckpointManager(os.path.join(root, "sharded"),
                               options=ocp.CheckpointManagerOptions(enable_async_checkpointing=False)) as mngr:
        mngr.save(0, args=ocp.args.StandardSave({"w": w, "step": 0}))
        target = {"w": jax.ShapeDtypeStruct((16, 8), jnp.float32, sharding=NamedSharding(mesh, P("model", None))),
                  "step": 0}
        out["sharded"] = (mngr.restore(0, args=ocp.args.StandardRestore(target)), "all")
    with ocp.CheckpointManager(os.path.join(root, "pytree")) as mngr:  # Orbax: PyTreeRestore after PyTreeSave
        mngr.save(0, args=ocp.args.PyTreeSave({"w": w, "step": 0}))
        mngr.wait_until_finished()
        ra = {"w": ocp.ArrayRestoreArgs(sharding=NamedSharding(mesh, P(None, "data")), global_shape=(16, 8)),
              "step": ocp.RestoreArgs()}
        out["sharded_ra"] = (mngr.restore(0, args=ocp.args.PyTreeRestore(restore_args=ra)), "all")
        target = {"w": jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, w), "step": 0}
        ra = ocp.checkpoint_utils.construct_restore_args(target)
        out["constructed"] = (mngr.restore(0, args=ocp.args.PyTreeRestore(target, restore_args=ra)), "all")
    return out


def test_todays_api_gives_the_same_results(tmp_path):
    results = {name: todays_api(ocp, str(tmp_path / name)) for name, ocp in MODULES.items()}
    assert results["treecask"]["steps"][0][0] == [1, 3]  # exactly the two best, as Orbax
    assert results["treecask"]["cast"][0]["w"].dtype == jnp.float32
    assert_same_results(results)


# ---- treecask.orbax on its own -------------------------------------------------------------


def test_orbax_objects_are_accepted(tmp_path):
    """Orbax's own argument, handler, options and RestoreArgs objects drive treecask.orbax."""
    mesh = jax.make_mesh((4, 2), ("x", "y"))
    tree = {"w": np.arange(16, dtype=np.float32).reshape(4, 4), "n": 3}
    opts = orbax_checkpoint.CheckpointManagerOptions(max_to_keep=1, enable_async_checkpointing=False)
    with tcp.CheckpointManager(tmp_path / "m", options=opts) as m:
        m.save(0, args=orbax_checkpoint.args.StandardSave(tree))
        m.save(1, args=orbax_checkpoint.args.StandardSave(tree))
        assert m.all_steps() == [1]
        ra = {"w": orbax_checkpoint.ArrayRestoreArgs(sharding=NamedSharding(mesh, P("x")), dtype=jnp.bfloat16),
              "n": orbax_checkpoint.RestoreArgs()}
        r = m.restore(1, args=orbax_checkpoint.args.PyTreeRestore(restore_args=ra))
        assert r["w"].dtype == jnp.bfloat16 and r["n"] == 3
        assert r["w"].sharding.is_equivalent_to(NamedSharding(mesh, P("x")), 2)
    ck = tcp.AsyncCheckpointer(orbax_checkpoint.StandardCheckpointHandler())
    ck.save(tmp_path / "c", args=orbax_checkpoint.args.StandardSave(tree))
    ck.wait_until_finished()
    assert ck.restore(tmp_path / "c")["n"] == 3
    legacy = tcp.CheckpointManager(tmp_path / "l", orbax_checkpoint.PyTreeCheckpointer())
    assert legacy.save(0, tree) and legacy.restore(0)["n"] == 3


def test_checkpointers(tmp_path):
    tree = {"a": np.arange(4), "s": "x"}
    ck = tcp.StandardCheckpointer()
    ck.save(tmp_path / "sub" / "c", tree)   # parents created
    with pytest.raises(treecask.AlreadyExistsError):
        ck.save(tmp_path / "sub" / "c", tree)
    ck.wait_until_finished()
    ck.save(tmp_path / "sub" / "c", {"a": np.arange(5), "s": "y"}, force=True)
    assert ck.restore(tmp_path / "sub" / "c")["s"] == "y"
    out = ck.restore(tmp_path / "sub" / "c", {"a": jax.ShapeDtypeStruct((5,), jnp.int32), "s": ""})
    assert out["a"].dtype == jnp.int32 and isinstance(out["a"], jax.Array)
    md = ck.metadata(tmp_path / "sub" / "c").item_metadata
    assert md["a"].shape == (5,) and isinstance(md["s"], tcp.StringMetadata)
    with pytest.raises(FileNotFoundError):
        ck.restore(tmp_path / "missing")
    # force=True over a checkpoint directory (a multi-process save's): deleted first, as Orbax does.
    (tmp_path / "d").mkdir()
    treecask.save(tmp_path / "d" / "process_0.cask", tree)  # (a directory checkpoint's stand-in)
    with pytest.raises(treecask.AlreadyExistsError, match="force=True"):
        ck.save(tmp_path / "d", tree)
    ck.save(tmp_path / "d", {"a": np.arange(6), "s": "z"}, force=True)
    ck.wait_until_finished()
    assert (tmp_path / "d").is_file() and ck.restore(tmp_path / "d")["s"] == "z"
    js = tcp.Checkpointer(tcp.JsonCheckpointHandler())
    js.save(tmp_path / "j", {"a": [1, 2]})
    assert js.restore(tmp_path / "j") == {"a": [1, 2]}
    assert treecask.open(tmp_path / "j").metadata["treecask.orbax.json/default"] == '{"a": [1, 2]}'
    with tcp.PyTreeCheckpointer() as pc:  # a shape mismatch is an error, a dtype one a cast
        pc.save(tmp_path / "p", {"w": np.ones((2, 2))}, save_args={"w": tcp.SaveArgs(dtype=np.float16)})
        assert treecask.open(tmp_path / "p").info("w").dtype == np.float16  # SaveArgs(dtype) casts on save
        with pytest.raises(treecask.ShapeError, match="shape mismatch"):
            pc.restore(tmp_path / "p", item={"w": np.ones((3, 2))})
        assert pc.restore(tmp_path / "p", item={"w": np.ones((2, 2), np.float32)})["w"].dtype == np.float32
        with pytest.raises(treecask.StructureError):
            pc.restore(tmp_path / "p", item={"w": np.ones((2, 2)), "new": np.ones(1)})
        assert pc.restore(tmp_path / "p", item={"w": np.ones((2, 2)), "new": np.ones(1)}, transforms={})["new"] == 1


def test_manager_api(tmp_path):
    tree = lambda s: {"x": np.full(3, s, np.int32)}  # noqa: E731
    opts = tcp.CheckpointManagerOptions(save_interval_steps=2, save_on_steps=[3], keep_period=4, max_to_keep=1)
    with tcp.CheckpointManager(tmp_path, options=opts, metadata={"version": 2}) as m:
        saved = [s for s in range(9) if m.save(s, args=tcp.args.StandardSave(tree(s)), custom_metadata={"s": s})]
        assert saved == [0, 2, 3, 4, 6, 8]
        m.wait_until_finished()
        assert m.all_steps() == [0, 4, 8]  # the newest, and every multiple of keep_period
        assert m.metadata().custom_metadata == {"version": 2}
        assert m.metadata(8).custom_metadata == {"s": 8} and m.metadata(8).metrics == {}  # Orbax's, as below
        assert m.item_metadata(8).custom_metadata == {"s": 8}
        m.delete(4)
        assert m.all_steps() == [0, 8] and not m.is_saving_in_progress()
        m.check_for_errors()
        with pytest.raises(FileNotFoundError):
            m.restore(5)
        with pytest.raises(ValueError):
            m.save(10)
        assert m.restore(None)["x"][0] == 8
        assert m.restore(0, directory=tmp_path)["x"][0] == 0
    assert treecask.load(tmp_path / "8" / "default")["x"][0] == 8  # a step's item: an ordinary archive
    ro = tcp.CheckpointManager(tmp_path, options=tcp.CheckpointManagerOptions(read_only=True))
    assert not ro.save(20, args=tcp.args.StandardSave(tree(20))) and ro.all_steps() == [0, 8]
    # A treecask.CheckpointManager run (step_<n>.cask) and a treecask.orbax one (Orbax's <n>/) are
    # never mixed: each manager refuses the other's run, naming the manager that reads it.
    with treecask.CheckpointManager(tmp_path / "own") as own:
        own.save(1, tree(1), metrics={"loss": 1.0})
    with pytest.raises(treecask.UnsupportedError, match=r"step_00000001\.cask.*treecask.CheckpointManager"):
        tcp.CheckpointManager(tmp_path / "own")
    with pytest.raises(treecask.UnsupportedError, match=r"\(0, 8\).*treecask.orbax.CheckpointManager"):
        treecask.CheckpointManager(tmp_path)
    assert tcp.Checkpointer(tcp.PyTreeCheckpointHandler()).restore(tmp_path / "own" / "step_00000001.cask")["x"][0] == 1


def manager_metrics(ocp, root):
    """metrics(step) and metadata(step).metrics of v0 managers with and without best_fn."""
    out = {}
    tree = {"w": np.arange(3.0)}
    for name, best_fn in (("plain", None), ("best", lambda m: m["loss"])):
        opts = ocp.CheckpointManagerOptions(best_fn=best_fn, enable_async_checkpointing=False)
        with ocp.CheckpointManager(os.path.join(root, name), options=opts) as m:
            m.save(0, args=ocp.args.StandardSave(tree), metrics={"loss": 1.5})
            m.save(1, args=ocp.args.StandardSave(tree))  # no metrics
            out[name] = ([m.metrics(0), m.metrics(1), m.metrics(7), m.metadata(0).metrics, m.metadata(1).metrics,
                          sorted(os.listdir(os.path.join(root, name, "0")))], "all")
        with ocp.CheckpointManager(os.path.join(root, name)) as again:  # the step's entry decides, not the options
            out[name + "_reopened"] = ([again.metrics(0), again.metadata(0).metrics], "all")
    return out


def test_manager_metrics_follow_orbax(tmp_path):
    """Orbax 0.12.8's CheckpointManager.metrics(step) reads the step's metrics item, which it writes
    only with best_fn: without best_fn metrics(step) is None (and metadata(step).metrics {}) even
    when save was given metrics; with it, the saved metrics, whichever manager reads the step."""
    results = {n: manager_metrics(ocp, str(tmp_path / n)) for n, ocp in MODULES.items()}
    t = results["treecask"]
    assert t["plain"][0][:5] == [None, None, None, {}, {}]
    assert t["best"][0][:5] == [{"loss": 1.5}, None, None, {"loss": 1.5}, {}]
    assert t["best_reopened"][0] == [{"loss": 1.5}, {"loss": 1.5}]
    # The step directories' item entries (Orbax's also hold its own bookkeeping files).
    for k in ("plain", "best"):
        for n in MODULES:
            results[n][k][0][5] = [e for e in results[n][k][0][5] if e in ("default", "metrics")]
    assert_same_results(results)


def test_unsupported_orbax_features_are_named(tmp_path):
    cases = [
        (dict(options=tcp.CheckpointManagerOptions(step_prefix="ckpt")), "step_prefix"),
        (dict(options=tcp.CheckpointManagerOptions(keep_time_interval=5)), "keep_time_interval"),
        (dict(options=tcp.CheckpointManagerOptions(keep_checkpoints_without_metrics=False)),
         "keep_checkpoints_without_metrics"),
        (dict(options=tcp.CheckpointManagerOptions(preservation_policy=object())), "preservation_policy"),
    ]
    for kwargs, name in cases:
        with pytest.raises(treecask.UnsupportedError, match=name) as e:
            tcp.CheckpointManager(tmp_path / "u", **kwargs)
        assert "Orbax" in str(e.value)
    with tcp.CheckpointManager(tmp_path / "m") as m:
        m.save(0, args=tcp.args.StandardSave({"w": np.ones(3)}))
        m.wait_until_finished()
        # strict=False pads or truncates to the target's shape (Orbax's rule; test_orbax_guides.py compares)
        assert m.restore(0, args=tcp.args.StandardRestore({"w": np.zeros(4)}, strict=False))["w"].tolist() == \
            [1.0, 1.0, 1.0, 0.0]
        with pytest.raises(treecask.InvalidArgumentError, match="not an ocp.Transform"):
            m.restore(0, args=tcp.args.PyTreeRestore({"w": np.ones(3)}, transforms={"w": object()}))
        with pytest.raises(treecask.UnsupportedError, match="global_shape"):
            m.restore(0, args=tcp.args.PyTreeRestore(restore_args={"w": tcp.ArrayRestoreArgs(global_shape=(4,))}))
    with pytest.raises(treecask.UnsupportedError, match="handler"):
        tcp.Checkpointer(object())


def test_importing_treecask_orbax_needs_no_orbax(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        sys.modules["orbax"] = None          # any import of orbax fails
        import numpy as np
        import treecask.orbax as ocp
        with ocp.CheckpointManager({str(tmp_path)!r}, options=ocp.CheckpointManagerOptions(max_to_keep=1)) as m:
            m.save(0, args=ocp.args.Composite(w=ocp.args.StandardSave({{"w": np.ones(2)}}),
                                              meta=ocp.args.JsonSave({{"a": 1}})))
            m.wait_until_finished()
            r = m.restore(0)
        assert r.meta == {{"a": 1}} and r.w["w"].tolist() == [1.0, 1.0]
        assert "orbax" not in [k for k, v in sys.modules.items() if v is not None and k.startswith("orbax")]
        print("ok")
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr


def test_an_orbax_directory_names_import_orbax(tmp_path):
    d = str(tmp_path / "orbax")
    with orbax_checkpoint.CheckpointManager(d) as m:
        m.save(3, args=orbax_checkpoint.args.StandardSave({"w": np.ones(2)}))
    with pytest.raises(treecask.InvalidArgumentError, match="import_orbax"):
        tcp.PyTreeCheckpointer().restore(os.path.join(d, "3", "default"))
    # A migrating user's run never silently restarts from scratch: both managers refuse the
    # directory at construction (issue #31), before listing nothing and saving beside it.
    for manager in (tcp.CheckpointManager, treecask.CheckpointManager):
        with pytest.raises(treecask.UnsupportedError, match=r"Orbax run \(1 step directory: 3\).*import_orbax"):
            manager(d)
    assert sorted(os.listdir(d)) == ["3"]  # nothing written beside Orbax's step
    treecask.import_orbax(d, tmp_path / "w.cask")  # the way in
    with tcp.CheckpointManager(tmp_path / "m") as m:
        m.save(3, args=tcp.args.StandardSave(treecask.load(tmp_path / "w.cask")))
        m.wait_until_finished()
        assert m.restore(3)["w"].tolist() == [1.0, 1.0]


def test_an_orbax_run_is_never_taken_for_an_empty_one(tmp_path, s3_server, monkeypatch):
    """The issue's migrating user: an Orbax run (steps 4 and 5, and one with Orbax's
    step_prefix), a Flax directory of checkpoint_<N>, and the same Orbax run in a
    bucket: each manager refuses at construction, naming the converter, instead of
    reporting latest_step() None and saving step_00000000.cask beside them."""
    import obstore

    runs = {}
    runs["orbax"] = str(tmp_path / "orbax")
    with orbax_checkpoint.CheckpointManager(runs["orbax"]) as m:
        for step in (4, 5):
            m.save(step, args=orbax_checkpoint.args.StandardSave({"w": np.full(2, float(step))}))
    runs["prefixed"] = str(tmp_path / "prefixed")
    opts = orbax_checkpoint.CheckpointManagerOptions(step_prefix="step")
    with orbax_checkpoint.CheckpointManager(runs["prefixed"], options=opts) as m:
        m.save(7, args=orbax_checkpoint.args.StandardSave({"w": np.ones(2)}))
    from flax.training import checkpoints as flax_checkpoints

    runs["flax"] = str(tmp_path / "flax")
    flax_checkpoints.save_checkpoint(runs["flax"], {"w": np.ones(2)}, step=3, keep=2)
    for name, d in runs.items():
        before = sorted(os.listdir(d))
        for manager in (tcp.CheckpointManager, treecask.CheckpointManager):
            with pytest.raises(treecask.UnsupportedError, match="Orbax run.*treecask.import_orbax") as e:
                manager(d)
            assert e.value.file == d, name
        assert sorted(os.listdir(d)) == before, name

    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    s3_server.create_bucket("orbaxrun")
    store = s3_server.store("orbaxrun")
    for root, _, files in os.walk(runs["orbax"]):
        for f in files:
            full = os.path.join(root, f)
            obstore.put(store, "run/" + os.path.relpath(full, runs["orbax"]), open(full, "rb").read())
    for manager in (tcp.CheckpointManager, treecask.CheckpointManager):
        with pytest.raises(treecask.UnsupportedError, match=r"2 step directories: 4, 5\).*import_orbax"):
            manager("s3://orbaxrun/run")


def test_on_a_bucket(s3_server, monkeypatch):
    """treecask.orbax over an object store: the manager's steps, best-N retention and
    several items in s3://, a checkpointer's file there (force replaces it)."""
    import uuid

    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    s3_server.create_bucket("ocp")
    url = f"s3://ocp/{uuid.uuid4().hex}"
    tree = lambda s: {"w": np.full((64, 64), float(s), np.float32), "s": s}  # noqa: E731
    opts = tcp.CheckpointManagerOptions(max_to_keep=1, best_fn=lambda m: m["loss"], best_mode="min",
                                        save_interval_steps=2)
    with tcp.CheckpointManager(url + "/run", options=opts) as m:
        for s, loss in enumerate([3.0, 9.0, 1.0, 9.0, 2.0]):
            m.save(s, args=tcp.args.Composite(state=tcp.args.StandardSave(tree(s)), meta=tcp.args.JsonSave({"s": s})),
                   metrics={"loss": loss})
        m.wait_until_finished()
        assert m.all_steps() == [2] and m.best_step() == 2  # steps 0, 2, 4 saved; the best one kept
        r = m.restore(None)
        assert r.meta == {"s": 2} and r.state["s"] == 2 and (r.state["w"] == 2).all()
        assert m.item_metadata(2)["state"]["w"].shape == (64, 64)
    ck = tcp.StandardCheckpointer()
    ck.save(url + "/one.cask", tree(1))
    ck.wait_until_finished()
    with pytest.raises(treecask.AlreadyExistsError):
        ck.save(url + "/one.cask", tree(2))
    ck.save(url + "/one.cask", tree(3), force=True)
    assert ck.restore(url + "/one.cask")["s"] == 3


# ---- Orbax's structure rule: no field dropped or invented without a word -------------------


def _outcome(fn):
    """fn()'s value, or "raises ValueError" (Orbax's error; treecask's StructureError is one)."""
    try:
        return fn()
    except ValueError:
        return "raises ValueError"


def structure_cases(ocp, root):
    """A checkpoint {a, b, new} restored into {a, b} and into {a, b, new, extra}, through every path."""
    out = {}
    full = {"a": np.arange(3), "b": np.ones(2), "new": np.zeros(4)}
    lacks = {"a": np.arange(3), "b": np.ones(2)}
    extra = dict(full, extra=np.full(2, 7.0))
    ra = ocp.checkpoint_utils.construct_restore_args
    sc = ocp.StandardCheckpointer()
    sc.save(os.path.join(root, "std"), full)
    sc.wait_until_finished()
    out["std_lacks"] = (_outcome(lambda: sc.restore(os.path.join(root, "std"), lacks)), "nodes")
    out["std_extra"] = (_outcome(lambda: sc.restore(os.path.join(root, "std"), extra)), "nodes")
    out["std_abstract_lacks"] = (_outcome(lambda: sc.restore(
        os.path.join(root, "std"), jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, lacks))), "nodes")
    pc = ocp.PyTreeCheckpointer()
    p = os.path.join(root, "pt")
    pc.save(p, full)
    out["legacy_lacks"] = (_outcome(lambda: pc.restore(p, item=lacks)), "nodes")
    out["legacy_extra"] = (_outcome(lambda: pc.restore(p, item=extra)), "nodes")
    out["transforms_lacks"] = (pc.restore(p, item=lacks, transforms={}, restore_args=ra(lacks)), "all")
    out["transforms_extra"] = (pc.restore(p, item=extra, transforms={}, restore_args=ra(extra)), "all")
    out["partial_lacks"] = (pc.restore(p, args=ocp.args.PyTreeRestore(lacks, partial_restore=True)), "all")
    out["partial_extra"] = (pc.restore(p, args=ocp.args.PyTreeRestore(extra, partial_restore=True)), "all")
    out["placeholder"] = ({k: v is ... for k, v in pc.restore(p, item=dict(lacks, new=...)).items()}, "all")
    nested = {"p": {"w": np.ones(2), "b": np.ones(1)}, "s": 1}
    pc.save(os.path.join(root, "nested"), nested)
    out["nested_lacks"] = (_outcome(lambda: pc.restore(os.path.join(root, "nested"),
                                                       item={"p": {"w": np.ones(2)}, "s": 1})), "nodes")
    out["subtree_target"] = (_outcome(lambda: pc.restore(os.path.join(root, "nested"), item=nested["p"])), "nodes")
    with ocp.CheckpointManager(os.path.join(root, "mgr")) as m:
        m.save(0, args=ocp.args.Composite(state=ocp.args.PyTreeSave(full), meta=ocp.args.JsonSave({"x": 1})))
        m.wait_until_finished()
        out["mgr_lacks"] = (_outcome(lambda: m.restore(0, args=ocp.args.Composite(
            state=ocp.args.PyTreeRestore(lacks)))), "nodes")
        out["mgr_partial"] = (m.restore(0, args=ocp.args.Composite(
            state=ocp.args.PyTreeRestore(lacks, partial_restore=True))).state, "all")
    with ocp.CheckpointManager(os.path.join(root, "std_mgr")) as m:
        m.save(0, args=ocp.args.StandardSave(full))
        m.wait_until_finished()
        out["std_mgr_lacks"] = (_outcome(lambda: m.restore(0, args=ocp.args.StandardRestore(lacks))), "nodes")
    legacy = ocp.CheckpointManager(os.path.join(root, "legacy_mgr"), ocp.PyTreeCheckpointer())
    legacy.save(0, full)
    out["legacy_mgr_lacks"] = (_outcome(lambda: legacy.restore(0, items=lacks)), "nodes")
    out["legacy_mgr_transforms"] = (legacy.restore(0, items=extra, restore_kwargs={
        "transforms": {}, "restore_args": ra(extra)}), "all")
    legacy.close()
    return out


def test_no_field_is_dropped_or_invented_silently(tmp_path):
    """Orbax 0.12.8 refuses a target whose structure differs from the checkpoint's unless
    partial_restore=True or transforms say otherwise; treecask.orbax does the same, naming
    every key path and what permits it."""
    results = {name: structure_cases(ocp, str(tmp_path / name)) for name, ocp in MODULES.items()}
    t = results["treecask"]
    for case in ("std_lacks", "std_extra", "legacy_lacks", "legacy_extra", "nested_lacks", "subtree_target",
                 "mgr_lacks", "std_mgr_lacks", "legacy_mgr_lacks"):
        assert t[case][0] == "raises ValueError", case
    assert sorted(t["partial_lacks"][0]) == ["a", "b"] and t["partial_extra"][0]["extra"].tolist() == [7.0, 7.0]
    assert_same_results(results)
    p = tmp_path / "treecask" / "pt"
    with pytest.raises(treecask.StructureError, match=r"the target lacks 1 field the checkpoint holds: 'new' "
                                                      r"\(PyTreeRestore\(partial_restore=True\)") as e:
        tcp.StandardCheckpointer().restore(p, {"a": np.arange(3), "b": np.ones(2)})
    assert e.value.key_path == "new" and "transforms={}" in str(e.value)
    with pytest.raises(treecask.StructureError, match=r"the checkpoint lacks 2 fields the target has: 'x', 'y'"):
        tcp.PyTreeCheckpointer().restore(p, item={"a": np.arange(3), "b": np.ones(2), "new": np.zeros(4),
                                                  "x": 1, "y": np.ones(1)})
    with pytest.raises(treecask.StructureError, match=r"'new'") as e:  # a Composite item: its archive, key path
        tcp.CheckpointManager(tmp_path / "treecask" / "mgr").restore(
            0, args=tcp.args.Composite(state=tcp.args.StandardRestore({"a": np.arange(3), "b": np.ones(2)})))
    assert e.value.file == str(tmp_path / "treecask" / "mgr" / "0" / "state") and e.value.key_path == "new"
    # treecask.load keeps its documented partial restore: the template asks, the rest is not read.
    assert sorted(treecask.load(p, {"a": np.arange(3)})) == ["a"]


# ---- Orbax's current guides: the 101 guide, ocp.tree, ocp.utils ---------------------------


def guide_101(ocp, root):
    """The first cells of Orbax's "Checkpointing with Orbax" (101) guide, as written there."""
    out = {}
    os.makedirs(root)
    path = ocp.test_utils.erase_and_create_empty(os.path.join(root, "my-checkpoints/"))
    out["empty"] = (sorted(os.listdir(path)), "all")
    my_tree = {"a": np.arange(8), "b": {"c": 42, "d": np.arange(16)}}
    abstract_my_tree = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, my_tree)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path / "checkpoint_name", my_tree)
    checkpointer.wait_until_finished()
    out["restored"] = (checkpointer.restore(path / "checkpoint_name", abstract_my_tree), "nodes")
    out["raw"] = (checkpointer.restore(path / "checkpoint_name"), False)
    path = ocp.test_utils.erase_and_create_empty(os.path.join(root, "my-checkpoints/"))  # again: emptied
    out["emptied"] = (sorted(os.listdir(path)), "all")
    return out


def test_the_101_guide_gives_the_same_results(tmp_path):
    # The guide's int64 leaves restore into ShapeDtypeStruct targets with jax_enable_x64 off: as
    # Orbax, treecask returns them at full width, as NumPy (docs/python.md "Dtypes on restore").
    results = {name: guide_101(ocp, str(tmp_path / name)) for name, ocp in MODULES.items()}
    assert_same_results(results)


def test_tree_and_utils_helpers_are_orbaxs():
    import collections

    NT = collections.namedtuple("NT", "x y")
    trees = [{"a": np.arange(3), "b": {"c": 1, "d": [np.ones(2), 2.0, (3, 4)]}, "e": {}, "n": NT(1, np.zeros(1))},
             [1, {"z": 2}], {"only": 5}]
    o, t = orbax_checkpoint, tcp
    for tree in trees:
        for ns in ("tree", "utils"):
            for kw in ({}, {"keep_empty_nodes": True}):
                assert_same(getattr(o, ns).to_flat_dict(tree, **kw), getattr(t, ns).to_flat_dict(tree, **kw), types=None)
                assert_same(getattr(o, ns).serialize_tree(tree, **kw), getattr(t, ns).serialize_tree(tree, **kw),
                            types=None)
        assert o.tree.to_flat_dict(tree, sep="/").keys() == t.tree.to_flat_dict(tree, sep="/").keys()
        assert jax.tree.map(str, o.tree.get_param_names(tree)) == jax.tree.map(str, t.tree.get_param_names(tree))
        flat = o.tree.to_flat_dict(tree)
        for target in (None, tree):
            a, b = o.tree.from_flat_dict(dict(flat), target=target), t.tree.from_flat_dict(dict(flat), target=target)
            assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
        s = o.tree.serialize_tree(tree)
        assert jax.tree_util.tree_structure(o.tree.deserialize_tree(s, tree)) == \
            jax.tree_util.tree_structure(t.tree.deserialize_tree(s, tree))
        assert o.tree.is_flat_dict(tree) == t.tree.is_flat_dict(tree) and t.tree.is_flat_dict(flat)
    assert o.tree.merge_trees({"a": 1}, {"b": {"c": 2}}) == t.tree.merge_trees({"a": 1}, {"b": {"c": 2}})
    x = jax.device_put(jnp.arange(8.0), NamedSharding(jax.make_mesh((8,), ("x",)), P("x")))
    assert o.tree.to_shape_dtype_struct(x) == t.tree.to_shape_dtype_struct(x)
    assert t.utils.is_primary_host(0) and not t.utils.reached_preemption(3)
    t.utils.sync_global_processes("one process: returns at once")


def test_a_failed_asynchronous_save_is_reported_by_check_for_errors(small_tmpfs):
    """A full disk in the background: treecask.orbax's manager, its
    AsyncCheckpointer and v1's training Checkpointer each report the error
    once (Orbax's check_for_errors / wait_until_finished / the response's
    result), keep the earlier step, and leave nothing half-written."""
    import time

    from treecask.orbax import v1

    big = {"big": jnp.ones(2 << 20, jnp.float32)}  # 8 MiB onto a 12 MiB tmpfs
    small = {"x": jnp.arange(8, dtype=jnp.int32)}
    with tcp.CheckpointManager(small_tmpfs / "m") as m:
        assert m.save(0, args=tcp.args.StandardSave(small))
        assert m.save(1, args=tcp.args.StandardSave(big))  # snapshotted; fails in the background
        while m.is_saving_in_progress():
            time.sleep(0.01)
        with pytest.raises(treecask.IoError) as e:
            m.check_for_errors()
        assert e.value.file == str(small_tmpfs / "m" / "1" / "default")  # the item it was writing
        m.check_for_errors()  # once
        assert m.all_steps() == [0]
        np.testing.assert_array_equal(m.restore(0)["x"], np.arange(8))
        m.delete(0)
        assert m.all_steps() == [] and sorted(os.listdir(small_tmpfs / "m")) == []

    ckptr = tcp.AsyncCheckpointer(tcp.StandardCheckpointHandler())
    ckptr.save(small_tmpfs / "one.cask", args=tcp.args.StandardSave(big))
    with pytest.raises(treecask.IoError):
        ckptr.wait_until_finished()
    ckptr.check_for_errors()  # once
    assert [n for n in os.listdir(small_tmpfs) if n.startswith("one.cask")] == []

    with v1.training.Checkpointer(small_tmpfs / "v1") as c:
        assert c.save(0, small)
        r = c.save_async(1, big)
        with pytest.raises(treecask.IoError):
            r.result()
        assert [i.step for i in c.checkpoints] == [0]
        assert c.delete(0) and c.checkpoints == [] and not c.delete(0, missing_ok=True)


def test_treecask_orbax_uses_only_the_managers_public_calls():
    """The Orbax layers are built on treecask.CheckpointManager's public calls
    (and the stores'): no private attribute of the manager, no private
    function of its module, no local-path fork of their own."""
    import re

    root = os.path.join(os.path.dirname(treecask.__file__), "orbax")
    mine = ["__init__.py", "_checkpointers.py", "_steps.py", os.path.join("v1", "training", "_checkpointer.py")]
    private = re.compile(r"_mgr\._|_M\._|\bmanager\._|_take_error|_remove_entry|_save_async|_PolicyManager|"
                         r"from \.+_manager import _|from \.+ import _manager|local_path\(|\.local\(\)")
    found = []
    for name in mine:
        with open(os.path.join(root, name)) as f:
            for i, line in enumerate(f, 1):
                if private.search(line):
                    found.append(f"{name}:{i}: {line.strip()}")
    assert found == []
    # The manager's own storage goes through the store seam: no local-path fork, no upload of its own.
    pkg = os.path.dirname(treecask.__file__)
    for name in ("_manager.py", "_async.py", "_retention.py"):
        with open(os.path.join(pkg, name)) as f:
            text = f.read()
        assert "local_path(" not in text and "_upload" not in text, name


@pytest.mark.parametrize("options", [dict(save_interval_steps=3), dict(save_interval_steps=5, save_on_steps=[2, 7]),
                                     dict(should_save_fn=lambda s, last: s % 4 == 1)],
                         ids=["interval", "interval+on_steps", "should_save_fn"])
def test_which_steps_are_saved_is_orbaxs(tmp_path, options):
    """Orbax's default save decision, against Orbax itself: the interval,
    save_on_steps or should_save_fn, a step above the latest, and the first
    step of a run that has none (Orbax's InitialSavePolicy); a restarted
    manager decides from the steps on disk."""
    got = {}
    for name, mod in MODULES.items():
        d = tmp_path / name
        with mod.CheckpointManager(d, options=mod.CheckpointManagerOptions(**options)) as m:
            saved = [s for s in (1, 2, 3, 4, 5, 6, 7, 9, 10) if m.save(s, args=mod.args.StandardSave({"x": np.arange(3)}))]
            m.wait_until_finished()
            listed = m.all_steps()
        with mod.CheckpointManager(d, options=mod.CheckpointManagerOptions(**options)) as again:
            due = [s for s in (8, 11, 12, 13) if again.should_save(s)]
        got[name] = (saved, listed, due)
    assert got["treecask"] == got["orbax"], got
