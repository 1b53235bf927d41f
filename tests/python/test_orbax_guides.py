"""Orbax's published guides, cell by cell, with the import line swapped.

Each flow below follows the code cells of one of Orbax's guides (google/orbax
``docs/guides/checkpoint/``: ``orbax_checkpoint_101``, ``checkpointing_pytrees``,
``api_refactor``, ``async_checkpointing``; ``v1/``: ``orbax_checkpoint_101``,
``checkpointing_pytrees``, ``checkpointables``, ``training``,
``async_checkpointing``) in order, with small arrays, and records what each
cell shows. The flow runs twice, with ``import orbax.checkpoint as ocp`` (the
real orbax-checkpoint the test pins allow) and with ``import treecask.orbax as
ocp`` (``from treecask.orbax import v1 as ocp`` for v1), and every record is
compared (:func:`assert_same`): values bit-exact, dtypes, shapes, the Python /
JAX type of every leaf (``jax.Array`` or NumPy, ``int`` or ``float``), its
sharding, the container types, errors by the built-in class they are, and the
item entries of the checkpoint directories the guides list. What Orbax writes
for its own bookkeeping (``_CHECKPOINT_METADATA``, ``commit_success.txt``,
``orbax.checkpoint``, the TensorStore files of a PyTree item) and treecask for
its own (``index.cask``, a checkpoint directory's commit object) is left out
of the listings compared; records whose only difference is one documented in
docs/python.md are in :data:`DIFFERS` with the value treecask must show.
The MNIST training cells of the v1 training guide download a data set and are
not run. Grain iterators are real ``grain`` ones (pinned in
python/requirements-test.txt).
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Callable, Dict

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("orbax.checkpoint")
from etils import epath  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402
import orbax.checkpoint as orbax_ocp  # noqa: E402
from orbax.checkpoint import v1 as orbax_v1  # noqa: E402

import treecask  # noqa: E402
import treecask.orbax as tc_ocp  # noqa: E402
from treecask.orbax import v1 as tc_v1  # noqa: E402

V0 = {"orbax": orbax_ocp, "treecask": tc_ocp}
V1 = {"orbax": orbax_v1, "treecask": tc_v1}

#: What each implementation writes for its own bookkeeping in a checkpoint directory.
BOOKKEEPING = {"_CHECKPOINT_METADATA", "commit_success.txt", "orbax.checkpoint", "_METADATA", "_sharding",
               "manifest.ocdbt", "d", "array_metadatas", "descriptor", "_ROOT_METADATA", "index.cask"}


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# ---------------------------------------------------------------- recording and comparing


def entries(path) -> list:
    """The item entries of a checkpoint directory: its listing without bookkeeping files."""
    return sorted(n for n in os.listdir(path) if n not in BOOKKEEPING and not n.startswith("ocdbt.process_"))


def outcome(fn: Callable[[], Any]) -> Any:
    """fn()'s value, or ("raises", built-in class) for its error: treecask's
    errors derive from the built-in class Orbax raises where Orbax raises one."""
    try:
        return fn()
    except (FileExistsError, FileNotFoundError, NotADirectoryError, KeyError, ValueError, TypeError,
            NotImplementedError) as e:
        for cls in (FileExistsError, FileNotFoundError, NotADirectoryError, KeyError, ValueError, TypeError,
                    NotImplementedError):
            if isinstance(e, cls):
                return ("raises", cls)
    except Exception as e:  # noqa: BLE001 - recorded, so the comparison names it
        return ("raises", f"{type(e).__module__}.{type(e).__name__}: {e}")


def _is_composite(x):
    return type(x).__name__ in ("CompositeArgs", "Composite", "CompositeResults")


def assert_same(o: Any, t: Any, where: str = "") -> None:
    """Orbax's `o` and treecask's `t` are the same: containers of the same
    type and keys, leaves of the same type (jax.Array / NumPy / Python scalar),
    dtype, shape, sharding and bytes."""
    here = where or "<root>"
    if _is_composite(o):
        assert _is_composite(t), f"{here}: Orbax gives a Composite, treecask {type(t).__name__}"
        assert sorted(o.keys()) == sorted(t.keys()), f"{here}: items {sorted(o.keys())} != {sorted(t.keys())}"
        for k in o.keys():
            assert_same(o[k], t[k], f"{where}.{k}")
        return
    if isinstance(o, dict):
        assert type(t) is type(o), f"{here}: {type(o).__name__} != {type(t).__name__}"
        assert list(o) == list(t) or sorted(o) == sorted(t), f"{here}: keys {list(o)} != {list(t)}"
        for k in o:
            assert_same(o[k], t[k], f"{where}/{k}")
        return
    if isinstance(o, (list, tuple)) and not hasattr(o, "_fields"):
        assert type(t) is type(o), f"{here}: {type(o).__name__} != {type(t).__name__}"
        assert len(o) == len(t), f"{here}: length {len(o)} != {len(t)}"
        for i, (a, b) in enumerate(zip(o, t)):
            assert_same(a, b, f"{where}/{i}")
        return
    if isinstance(o, (jax.Array, np.ndarray, np.generic)):
        assert isinstance(t, jax.Array) == isinstance(o, jax.Array), \
            f"{here}: Orbax gives {type(o).__name__}, treecask {type(t).__name__}"
        assert type(t) is not np.generic or type(o) is type(t), f"{here}: {type(o)} != {type(t)}"
        assert np.dtype(o.dtype) == np.dtype(t.dtype), f"{here}: dtype {o.dtype} != {t.dtype}"
        assert tuple(o.shape) == tuple(t.shape), f"{here}: shape {o.shape} != {t.shape}"
        assert np.asarray(o).tobytes() == np.asarray(t).tobytes(), f"{here}: values differ"
        if isinstance(o, jax.Array):
            assert o.sharding.is_equivalent_to(t.sharding, o.ndim), f"{here}: {o.sharding} != {t.sharding}"
        return
    if isinstance(o, jax.sharding.Sharding):
        assert isinstance(t, jax.sharding.Sharding) and o.is_equivalent_to(t, 1), f"{here}: {o} != {t}"
        return
    assert type(o) is type(t), f"{here}: Orbax gives {type(o).__name__} {o!r}, treecask {type(t).__name__} {t!r}"
    assert o == t, f"{here}: {o!r} != {t!r}"


def shapes(tree) -> Dict[str, Any]:
    """{key path: (shape, dtype)} of a metadata tree; a scalar or string leaf's type."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: hasattr(x, "shape"))
    return {jax.tree_util.keystr(p): ((tuple(v.shape), np.dtype(v.dtype)) if hasattr(v, "shape") else type(v))
            for p, v in leaves}


#: (flow, record) -> what treecask shows where it differs from Orbax on purpose (docs/python.md,
#: "What differs"). A manager's steps are Orbax's <n>/ directories of items (format/SPEC.md
#: "Checkpoint directories", the item-directories layout), so every listing of a run or a step
#: is compared with Orbax's.
DIFFERS: Dict[tuple, Any] = {
    # The use_ocdbt cells list an item's own files (Orbax's OCDBT / zarr files); a treecask item is one archive.
    ("v1_pytrees", "advanced.4.state listing"): ("raises", NotADirectoryError),
    ("v1_pytrees", "advanced.5.state listing"): ("raises", NotADirectoryError),
    # A manager not told an item's handler: Orbax cannot tell a JSON item from a PyTree one (its
    # item_metadata is None, its restore of the JSON item a ValueError); treecask reads each
    # item's kind from the checkpoint and returns it.
    ("v0_api_refactor", "unmapped.item_metadata"): {"['a']": ((), np.dtype(np.int64))},
    ("v0_api_refactor", "composite.unmapped.restore"): tc_ocp.args.Composite(
        extra_metadata={"version": 1.0}, state={"a": 0}),
}


def run_both(flow, modules, tmp_path) -> None:
    """Runs `flow(ocp, root)` with each implementation and compares every record."""
    got = {}
    for name, ocp in modules.items():
        root = epath.Path(tmp_path / name)
        root.mkdir()
        got[name] = flow(ocp, root)
    o, t = got["orbax"], got["treecask"]
    assert list(o) == list(t)
    for k in o:
        if (flow.__name__, k) in DIFFERS:
            assert_same(DIFFERS[(flow.__name__, k)], t[k], k)
            continue
        try:
            assert_same(o[k], t[k], k)
        except AssertionError as e:
            raise AssertionError(f"{flow.__name__}, cell {k!r}: {e}") from None


def mesh_1d(name="model"):
    return jax.sharding.Mesh(jax.devices(), (name,))


# ---------------------------------------------------------------- v0: "Checkpointing with Orbax" (101)


def v0_101(ocp, root):
    out = {}
    path = root / "my-checkpoints"
    path.mkdir()
    my_tree = {"a": np.arange(8), "b": {"c": 42, "d": np.arange(16)}}
    abstract_my_tree = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, my_tree)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path / "checkpoint_name", my_tree)
    checkpointer.wait_until_finished()
    out["restore_abstract"] = checkpointer.restore(path / "checkpoint_name/", abstract_my_tree)
    out["metadata"] = shapes(checkpointer.metadata(path / "checkpoint_name").item_metadata.tree)

    metadata = {"version": 1.0, "lang": "en"}
    checkpointer = ocp.Checkpointer(ocp.CompositeCheckpointHandler())
    checkpointer.save(path / "composite_checkpoint", args=ocp.args.Composite(
        state=ocp.args.StandardSave(my_tree), metadata=ocp.args.JsonSave(metadata)))
    restored = checkpointer.restore(path / "composite_checkpoint")
    out["composite.state"] = restored.state
    out["composite.metadata"] = restored.metadata
    out["composite listing"] = entries(path / "composite_checkpoint")

    path = root / "checkpoint_manager"
    state = {"a": np.arange(8), "b": np.arange(16)}
    extra_params = [42, 43]
    options = ocp.CheckpointManagerOptions(max_to_keep=3, save_interval_steps=2)
    mngr = ocp.CheckpointManager(path, options=options, item_names=("state", "extra_params"))
    for step in range(11):
        mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                extra_params=ocp.args.JsonSave(extra_params)))
    mngr.wait_until_finished()
    restored = mngr.restore(10)
    out["manager.state"], out["manager.extra_params"] = restored.state, restored.extra_params
    out["all_steps"] = mngr.all_steps()
    out["latest_step"] = mngr.latest_step()
    out["should_save(11)"] = mngr.should_save(11)
    mngr.close()

    # A standard recipe: sharded jax.Arrays through a manager.
    path = root / "checkpoint_manager_sharded"
    sharding = NamedSharding(mesh_1d(), P("model"))
    train_state = {"a": np.arange(16), "b": np.ones(16)}
    train_state = jax.tree_util.tree_map(lambda x: jax.device_put(x, sharding), train_state)
    mngr = ocp.CheckpointManager(path, options=ocp.CheckpointManagerOptions(max_to_keep=3, save_interval_steps=2))

    @jax.jit
    def train_fn(state):
        return jax.tree_util.tree_map(lambda x: x + 1, state)

    for step in range(10):
        train_state = train_fn(train_state)
        mngr.save(step, args=ocp.args.StandardSave(train_state))
    mngr.wait_until_finished()
    out["recipe.restore_latest"] = mngr.restore(mngr.latest_step())
    train_state = jax.tree_util.tree_map(np.zeros_like, train_state)
    sharding = NamedSharding(mesh_1d(), P(None))
    train_state = jax.tree_util.tree_map(lambda x: jax.device_put(x, sharding), train_state)
    abstract_train_state = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, train_state)
    restored = mngr.restore(mngr.latest_step(), args=ocp.args.StandardRestore(abstract_train_state))
    out["recipe.restore_abstract"] = restored
    out["recipe.shardings"] = jax.tree_util.tree_map(lambda x: x.sharding, restored)
    mngr.close()
    return out


def test_v0_orbax_checkpoint_101(tmp_path):
    run_both(v0_101, V0, tmp_path)


# ---------------------------------------------------------------- v0: "Checkpointing PyTrees of Arrays"


def v0_pytrees(ocp, root):
    out = {}
    sharding = NamedSharding(mesh_1d(), P("model"))
    state = {"a": np.arange(16), "b": np.ones(16)}
    state = jax.tree_util.tree_map(lambda x: jax.device_put(x, sharding), state)
    abstract_state = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, state)

    path = root / "basic"
    path.mkdir()
    ckptr = ocp.AsyncCheckpointer(ocp.StandardCheckpointHandler())
    ckptr.save(path / "1", args=ocp.args.StandardSave(state))
    ckptr.wait_until_finished()
    restored = ckptr.restore(path / "1", args=ocp.args.StandardRestore(abstract_state))
    out["restore_abstract"] = restored
    out["restored.a.sharding"] = restored["a"].sharding
    out["restore_concrete"] = ckptr.restore(path / "1", args=ocp.args.StandardRestore(state))

    cast = jax.tree_util.tree_map(lambda x: x.update(dtype=np.int16), abstract_state)
    out["restore_int16"] = ckptr.restore(path / "1", args=ocp.args.StandardRestore(cast))

    different_shape = {
        "a": jax.ShapeDtypeStruct(shape=(8,), dtype=abstract_state["a"].dtype, sharding=abstract_state["a"].sharding),
        "b": jax.ShapeDtypeStruct(shape=(32,), dtype=abstract_state["b"].dtype,
                                  sharding=abstract_state["b"].sharding),
    }
    out["restore_other_shape"] = outcome(
        lambda: ckptr.restore(path / "1", args=ocp.args.StandardRestore(different_shape)))
    out["restore_strict_false"] = ckptr.restore(
        path / "1", args=ocp.args.StandardRestore(different_shape, strict=False))

    restored = ckptr.restore(path / "1")
    out["restore_no_target"] = restored
    out["restore_no_target.a.sharding"] = restored["a"].sharding
    sharding = NamedSharding(jax.sharding.Mesh(jax.devices(), ("x",)), P())
    change = jax.tree_util.tree_map(lambda x: x.update(sharding=sharding), abstract_state)
    restored = ckptr.restore(path / "1", args=ocp.args.StandardRestore(change))
    out["restore_resharded"] = restored

    # Partial restore.
    original_item = {
        "params": {"layer1": {"kernel": np.arange(8), "bias": np.arange(8)},
                   "layer2": {"kernel": np.arange(8), "bias": np.arange(8)}},
        "opt_state": [np.arange(8), np.arange(8)],
        "step": 101,
    }
    path = root / "partial"
    path.mkdir()
    ckptr = ocp.PyTreeCheckpointer()
    ckptr.save(path / "1", args=ocp.args.PyTreeSave(original_item))
    reference_item = {
        "params": {"layer1": {"kernel": ocp.PLACEHOLDER, "bias": ocp.PLACEHOLDER},
                   "layer2": {"kernel": np.arange(8), "bias": np.arange(8)}},
        "opt_state": [ocp.PLACEHOLDER, ocp.PLACEHOLDER],
        "step": 101,
    }
    out["placeholder"] = ckptr.restore(path / "1", args=ocp.args.PyTreeRestore(item=reference_item))
    reference_item = {"params": {"layer2": {"kernel": np.arange(8), "bias": np.arange(8)}}, "step": 101}
    out["omission_refused"] = outcome(
        lambda: ckptr.restore(path / "1", args=ocp.args.PyTreeRestore(item=reference_item)))
    out["partial_restore"] = ckptr.restore(
        path / "1", args=ocp.args.PyTreeRestore(item=reference_item, partial_restore=True))

    # Advanced: PyTreeCheckpointHandler, dtype on save, restore_args, transforms.
    path = root / "advanced"
    path.mkdir()
    ckptr = ocp.AsyncCheckpointer(ocp.PyTreeCheckpointHandler())
    ckptr.save(path / "1", args=ocp.args.PyTreeSave(state))
    ckptr.wait_until_finished()
    restored = ckptr.restore(path / "1")
    out["advanced.1"] = restored
    ckptr.save(path / "2", args=ocp.args.PyTreeSave(
        state, save_args={"a": ocp.SaveArgs(dtype=np.dtype(np.int16)), "b": ocp.SaveArgs()}))
    ckptr.wait_until_finished()
    out["advanced.2"] = ckptr.restore(path / "2")
    out["restore_args"] = ckptr.restore(path / "2", args=ocp.args.PyTreeRestore(restore_args={
        "a": ocp.RestoreArgs(restore_type=np.ndarray),
        "b": ocp.ArrayRestoreArgs(dtype=np.dtype(np.int16), sharding=sharding)}))
    out["transforms"] = ckptr.restore(path / "2", args=ocp.args.PyTreeRestore(
        item={"c": ..., "d": np.arange(8)},
        restore_args={"c": ocp.RestoreArgs(restore_type=np.ndarray)},
        transforms={"c": ocp.Transform(original_key="a")}))
    ckptr.close()
    return out


def test_v0_checkpointing_pytrees(tmp_path):
    run_both(v0_pytrees, V0, tmp_path)


# ---------------------------------------------------------------- v0: "Using the Refactored CheckpointManager API"


def v0_api_refactor(ocp, root):
    out = {}
    pytree = {"a": 0}
    abstract_pytree = {"a": 0}
    extra_metadata = {"version": 1.0}
    options = ocp.CheckpointManagerOptions()

    # Before: the legacy API.
    mngr = ocp.CheckpointManager(root / "ckpt1", ocp.Checkpointer(ocp.PyTreeCheckpointHandler()), options=options)
    restore_args = ocp.checkpoint_utils.construct_restore_args(abstract_pytree)
    mngr.save(0, pytree)
    mngr.wait_until_finished()
    out["legacy.restore"] = mngr.restore(0, items=abstract_pytree, restore_kwargs={"restore_args": restore_args})
    mngr.close()

    # After.
    with ocp.CheckpointManager(root / "ckpt2", options=options) as mngr:
        mngr.save(0, args=ocp.args.StandardSave(pytree))
        mngr.wait_until_finished()
        out["restore"] = mngr.restore(0)
        out["restore_abstract"] = mngr.restore(0, args=ocp.args.StandardRestore(abstract_pytree))
    out["step listing"] = sorted(os.listdir(root / "ckpt2"))
    out["step 0 listing"] = entries(root / "ckpt2" / "0")
    new_mngr = ocp.CheckpointManager(root / "ckpt2", options=options)
    out["unmapped.restore"] = outcome(lambda: new_mngr.restore(0))
    out["restore_abstract_new"] = new_mngr.restore(0, args=ocp.args.StandardRestore(abstract_pytree))
    new_mngr.close()
    new_mngr = ocp.CheckpointManager(root / "ckpt2", options=options)
    out["unmapped.item_metadata"] = outcome(lambda: shapes(new_mngr.item_metadata(0).tree))
    new_mngr.close()
    registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
    registry.add("default", ocp.args.StandardRestore, ocp.StandardCheckpointHandler)
    with ocp.CheckpointManager(root / "ckpt2", options=options, handler_registry=registry) as new_mngr:
        out["registry.restore"] = new_mngr.restore(0)
    with ocp.CheckpointManager(root / "ckpt2", options=options, handler_registry=registry) as new_mngr:
        out["registry.item_metadata"] = shapes(new_mngr.item_metadata(0).tree)

    # Several items.
    mngr = ocp.CheckpointManager(root / "ckpt4", options=options)
    mngr.save(0, args=ocp.args.Composite(state=ocp.args.StandardSave(pytree),
                                         extra_metadata=ocp.args.JsonSave(extra_metadata)))
    mngr.wait_until_finished()
    out["composite.restore"] = mngr.restore(0)
    out["composite.subset"] = mngr.restore(0, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_pytree)))
    mngr.close()
    new_mngr = ocp.CheckpointManager(root / "ckpt4", options=options, item_names=("state", "extra_metadata"))
    out["composite.unmapped.restore"] = outcome(lambda: new_mngr.restore(0))
    out["composite.restore_args"] = new_mngr.restore(0, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_pytree), extra_metadata=ocp.args.JsonRestore()))
    new_mngr.close()
    registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
    registry.add("state", ocp.args.StandardRestore, ocp.StandardCheckpointHandler)
    registry.add("extra_metadata", ocp.args.JsonRestore, ocp.JsonCheckpointHandler)
    with ocp.CheckpointManager(root / "ckpt4", options=options, handler_registry=registry) as new_mngr:
        out["composite.registry.restore"] = new_mngr.restore(0)
    with ocp.CheckpointManager(root / "ckpt4", options=options, item_names=("state", "extra_metadata")) as new_mngr:
        out["composite.unmapped.item_metadata"] = outcome(lambda: sorted(new_mngr.item_metadata(0).keys()))
    with ocp.CheckpointManager(root / "ckpt4", options=options, handler_registry=registry) as new_mngr:
        meta = new_mngr.item_metadata(0)
        out["composite.registry.item_metadata"] = (shapes(meta.state.tree), meta.extra_metadata)
    return out


def test_v0_api_refactor(tmp_path):
    run_both(v0_api_refactor, V0, tmp_path)


# ---------------------------------------------------------------- v0: "Asynchronous Checkpointing"


def v0_async(ocp, root):
    out = {}
    train_state = {"layer0": {"kernel": np.ones((8, 8), dtype=np.float32), "bias": np.ones((8,), dtype=np.float32)}}
    ckptr = ocp.Checkpointer(ocp.StandardCheckpointHandler())
    ckptr.save(root / "sync_checkpoint", args=ocp.args.StandardSave(train_state))
    out["sync"] = ckptr.restore(root / "sync_checkpoint")
    ckptr = ocp.AsyncCheckpointer(ocp.StandardCheckpointHandler())
    ckptr.save(root / "async_checkpoint", args=ocp.args.StandardSave(train_state))
    ckptr.wait_until_finished()
    out["async"] = ckptr.restore(root / "async_checkpoint")
    ckpt_mngr = ocp.CheckpointManager(root / "async_checkpoint_manager")
    step = 0
    while step < 5:
        ckpt_mngr.save(step, args=ocp.args.StandardSave(train_state))
        step += 1
    ckpt_mngr.wait_until_finished()
    out["all_steps"] = ckpt_mngr.all_steps()
    ckpt_mngr.close()
    out["options"] = ocp.CheckpointManagerOptions(enable_async_checkpointing=False).enable_async_checkpointing
    return out


def test_v0_async_checkpointing(tmp_path):
    run_both(v0_async, V0, tmp_path)


# ---------------------------------------------------------------- v1: "Introduction to Checkpointing with Orbax"


def v1_101(ocp, root):
    out = {}
    directory = root / "101" / "my-checkpoints"
    pytree = {"a": np.arange(64).reshape((8, 8)), "b": np.arange(16), "c": np.asarray(4.5)}
    mesh = jax.sharding.Mesh(jax.devices(), ("x",))
    shardings = {"a": NamedSharding(mesh, P("x", None)), "b": NamedSharding(mesh, P()),
                 "c": NamedSharding(mesh, P())}
    pytree = jax.tree.map(lambda arr, s: jax.make_array_from_callback(arr.shape, s, lambda idx: arr[idx]),
                          pytree, shardings)
    ocp.save(directory / "ckpt0", pytree)
    out["load"] = ocp.load(directory / "ckpt0")
    out["listing"] = entries(directory / "ckpt0")
    out["metadata"] = shapes(ocp.metadata(directory / "ckpt0").metadata)

    @jax.jit
    def train_step(state):
        return jax.tree.map(lambda x: x + 1, state)

    def train():
        with ocp.training.Checkpointer(directory / "experiment") as ckptr:
            if ckptr.latest is None:
                train_state = ocp.load(directory / "ckpt0")
                start_step = 0
            else:
                train_state = ckptr.load()
                start_step = ckptr.latest.step
            for step in range(start_step, 10):
                train_state = train_step(train_state)
                ckptr.save(step, train_state)
            return ckptr.load()

    out["train"] = train()
    out["experiment.listing"] = sorted(os.listdir(directory / "experiment"))
    return out


def test_v1_orbax_checkpoint_101(tmp_path):
    run_both(v1_101, V1, tmp_path)


# ---------------------------------------------------------------- v1: "Working with PyTree Checkpoints"


def v1_pytrees(ocp, root):
    out = {}
    sharding = NamedSharding(mesh_1d(), P("model"))
    pytree = {"a": np.arange(16, dtype=np.int32), "b": np.ones(16, dtype=np.int32)}
    pytree = jax.tree_util.tree_map(lambda x: jax.device_put(x, sharding), pytree)
    path = root / "basic"
    ocp.save(path, pytree)
    out["listing"] = entries(path)
    out["load"] = ocp.load(path)
    abstract_state = {"a": jax.ShapeDtypeStruct(shape=(16,), dtype=np.int32, sharding=sharding),
                      "b": jax.ShapeDtypeStruct(shape=(16,), dtype=np.int32, sharding=sharding)}
    loaded = ocp.load(path, abstract_state)
    out["load_abstract"] = loaded
    metadata = ocp.metadata(path).metadata
    out["metadata"] = shapes(metadata)
    out["load_metadata"] = ocp.load(path, metadata)
    out["load_concrete"] = ocp.load(path, pytree)
    cast = jax.tree_util.tree_map(lambda x: x.update(dtype=np.int16), abstract_state)
    out["load_int16"] = ocp.load(path, cast)
    sharding = NamedSharding(jax.sharding.Mesh(jax.devices(), ("x",)), P())
    change = jax.tree_util.tree_map(lambda x: x.update(sharding=sharding), abstract_state)
    out["load_resharded"] = ocp.load(path, change)
    metadata = ocp.metadata(path).metadata
    out["load_resharded_metadata"] = ocp.load(path, jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(shape=x.shape, dtype=x.dtype, sharding=sharding), metadata))

    # Change leaf type.
    path = root / "change-type"
    ocp.save(path, {"a": np.asarray(12), "b": 13.5, "c": jax.device_put(np.arange(8), NamedSharding(mesh_1d(), P("model")))})
    out["load_types"] = ocp.load(path, {"a": float, "b": int, "c": np.empty((8,))})
    out["load_change_type_raw"] = ocp.load(path)

    # Partial loading with placeholders.
    original_item = {
        "params": {"layer1": {"kernel": np.arange(8), "bias": np.arange(8)},
                   "layer2": {"kernel": np.arange(8), "bias": np.arange(8)}},
        "opt_state": [np.arange(8), np.arange(8)],
        "step": 101,
    }
    path = root / "partial"
    ocp.save(path / "1", original_item)
    reference_item = {"params": {"layer1": {"kernel": ..., "bias": ...},
                                 "layer2": {"kernel": np.arange(8), "bias": np.arange(8)}},
                      "opt_state": [..., ...], "step": 101}
    out["placeholder"] = ocp.load(path / "1", reference_item)

    # Storage dtype per leaf.
    path = root / "advanced"
    ocp.save(path / "1", pytree)
    loaded = ocp.load(path / "1")
    out["advanced.1.dtypes"] = (loaded["a"].dtype, loaded["b"].dtype)

    def scoped_storage_options_creator(keypath, value):
        del value
        last_key = keypath[-1]
        if isinstance(last_key, jax.tree_util.GetAttrKey) and last_key.name == "a":
            return ocp.options.ArrayOptions.Saving.StorageOptions(dtype=np.dtype(np.int16))
        return None

    ctx = ocp.Context()
    ctx.array.saving.scoped_storage_options_creator = scoped_storage_options_creator
    with ctx:
        ocp.save(path / "2", pytree, overwrite=True)
    out["advanced.2"] = ocp.load(path / "2")
    ctx = ocp.Context()
    ctx.array.saving.scoped_storage_options_creator = (
        lambda k, v: ocp.options.ArrayOptions.Saving.StorageOptions(dtype=np.dtype(np.int16)))
    with ctx:
        ocp.save(path / "3", pytree, overwrite=True)
    out["advanced.3"] = ocp.load(path / "3")
    ctx = ocp.Context()
    ctx.array.saving.use_ocdbt = True
    with ctx:
        ocp.save(path / "4", pytree, overwrite=True)
    out["advanced.4.listing"] = entries(path / "4")
    out["advanced.4.state listing"] = outcome(lambda: sorted(p.name for p in (path / "4" / "state").iterdir()))
    ctx = ocp.Context()
    ctx.array.saving.use_ocdbt = False
    with ctx:
        ocp.save(path / "5", pytree, overwrite=True)
    out["advanced.5.state listing"] = outcome(lambda: sorted(p.name for p in (path / "5" / "state").iterdir()))

    # Pad / truncate.
    different_shape = {
        "a": jax.ShapeDtypeStruct(shape=(8,), dtype=abstract_state["a"].dtype, sharding=abstract_state["a"].sharding),
        "b": jax.ShapeDtypeStruct(shape=(32,), dtype=abstract_state["b"].dtype,
                                  sharding=abstract_state["b"].sharding),
    }
    out["load_other_shape"] = outcome(lambda: ocp.load(path / "1", different_shape))
    ctx = ocp.Context()
    ctx.array.loading.enable_padding_and_truncation = True
    with ctx:
        out["load_padded"] = ocp.load(path / "1", different_shape)
    return out


def test_v1_checkpointing_pytrees(tmp_path):
    run_both(v1_pytrees, V1, tmp_path)


# ---------------------------------------------------------------- v1: "Working with Checkpointables"


def v1_checkpointables(ocp, root):
    out = {}
    directory = root / "checkpointables" / "my-checkpoints"
    sharding = NamedSharding(jax.sharding.Mesh(jax.devices(), ("x",)), P())
    rng = np.random.default_rng(0)

    def fake_train_step(step):
        train_state = {"params": {"layer0": {"kernel": rng.uniform(size=(2, 2)), "bias": np.ones(2)}},
                       "opt_state": {"0": rng.random(size=(2,))},
                       "step": np.asarray(step)}
        return jax.tree.map(lambda arr: jax.make_array_from_callback(arr.shape, sharding, lambda idx: arr[idx]),
                            train_state)

    train_state = fake_train_step(0)
    ocp.save(directory / "just_state", train_state)
    train_state = fake_train_step(1)
    ocp.save_checkpointables(directory / "state_and_dataset", dict(state=train_state, dataset={"index": 2}))
    out["load_checkpointables"] = ocp.load_checkpointables(directory / "state_and_dataset")
    out["listing"] = entries(directory / "state_and_dataset")
    out["load"] = ocp.load(directory / "state_and_dataset")
    out["load_checkpointables.just_state"] = ocp.load_checkpointables(directory / "just_state")
    ocp.save_checkpointables(directory / "train_state_and_dataset",
                             dict(train_state=train_state, dataset={"index": 3}))
    out["load_checkpointables.2"] = ocp.load_checkpointables(directory / "train_state_and_dataset")
    out["load.2"] = outcome(lambda: ocp.load(directory / "train_state_and_dataset"))
    out["only_dataset"] = ocp.load_checkpointables(directory / "train_state_and_dataset", dict(dataset=None))
    out["only_train_state"] = ocp.load_checkpointables(directory / "train_state_and_dataset",
                                                       dict(train_state=None))
    (directory / "train_state_and_dataset" / "dataset").rmtree()
    out["after_rmtree"] = ocp.load_checkpointables(directory / "train_state_and_dataset")
    out["after_rmtree.listing"] = entries(directory / "train_state_and_dataset")
    out["after_rmtree.dataset"] = outcome(
        lambda: ocp.load_checkpointables(directory / "train_state_and_dataset", {"dataset": None}))
    abstract_train_state = jax.tree.map(
        lambda arr: jax.ShapeDtypeStruct(arr.shape, arr.dtype, sharding=arr.sharding), train_state)
    out["abstract"] = ocp.load_checkpointables(directory / "train_state_and_dataset",
                                               dict(train_state=abstract_train_state))

    grain = pytest.importorskip("grain")
    dataset = iter(grain.MapDataset.range(30).batch(3).map(lambda x: x.tolist()))
    out["next"] = [next(dataset), next(dataset), next(dataset)]
    ocp.save_checkpointables(directory / "train_state_and_grain", dict(train_state=train_state, dataset=dataset))
    out["grain.listing"] = entries(directory / "train_state_and_grain")
    out["grain.no_instance"] = outcome(lambda: ocp.load_checkpointables(directory / "train_state_and_grain"))
    new_dataset = iter(grain.MapDataset.range(30).batch(3).map(lambda x: x.tolist()))
    loaded = ocp.load_checkpointables(directory / "train_state_and_grain", dict(dataset=new_dataset))
    out["grain.loaded_is_instance"] = loaded["dataset"] is new_dataset
    out["grain.keys"] = sorted(loaded)
    out["grain.next"] = next(loaded["dataset"])
    return out


def test_v1_checkpointables(tmp_path):
    run_both(v1_checkpointables, V1, tmp_path)


# ---------------------------------------------------------------- v1: "Checkpointing in a Training Loop"


def _training_pytree():
    pytree = {"params": {"layer0": np.arange(16).reshape((8, 2))}, "opt_state": [np.arange(16)]}
    sharding = NamedSharding(jax.sharding.Mesh(jax.devices(), ("x",)), P())
    pytree = jax.tree.map(lambda x: jax.device_put(x, sharding), pytree)
    pytree["step"] = 0
    return pytree


def v1_training(ocp, root):
    out = {}
    training = ocp.training
    pytree = _training_pytree()

    def train_step(state):
        state["step"] += 1
        return state

    root_directory = root / "my-checkpoints-1"
    with training.Checkpointer(root_directory) as ckptr:
        saved = []
        for step in range(10):
            saved.append(bool(ckptr.save(step, pytree)))
            pytree = train_step(pytree)
        out["saved"] = saved
    with training.Checkpointer(root_directory) as ckptr:
        out["load_latest"] = ckptr.load()

    root_directory = root / "my-checkpoints-2"
    with training.Checkpointer(root_directory,
                               save_decision_policy=training.save_decision_policies.FixedIntervalPolicy(3)) as ckptr:
        for step in range(10):
            ckptr.save(step, pytree)
        out["interval.steps"] = [c.step for c in ckptr.checkpoints]
    out["interval.listing"] = sorted(os.listdir(root_directory))

    root_directory = root / "my-checkpoints-3"
    with training.Checkpointer(root_directory,
                               save_decision_policy=training.save_decision_policies.FixedIntervalPolicy(3),
                               custom_metadata={"experiment_name": "my-experiment"}) as ckptr:
        for step in range(10):
            is_final = step == 9
            ckptr.save(step, pytree, metrics={"accuracy": 0.85}, custom_metadata={"is_final": is_final},
                       force=is_final)
    out["custom_metadata.listing"] = sorted(os.listdir(root_directory))
    out["custom_metadata.step 9 listing"] = entries(root_directory / "9")  # the step's items, its metrics one
    ckptr = training.Checkpointer(root_directory)
    out["latest.step"] = ckptr.latest.step
    out["checkpoints"] = [c.step for c in ckptr.checkpoints]
    out["metadata(3)"] = shapes(ckptr.metadata(3).metadata)
    out["metadata.metrics"] = ckptr.metadata().metrics
    out["metadata.custom_metadata"] = ckptr.metadata().custom_metadata
    out["metadata.metadata"] = shapes(ckptr.metadata().metadata)
    out["root_metadata.custom_metadata"] = ckptr.root_metadata().custom_metadata
    ckptr.close()

    root_directory = root / "my-checkpoints-gc"
    with training.Checkpointer(root_directory) as ckptr:
        for step in range(10):
            ckptr.save(step, pytree)
        out["gc.before"] = [c.step for c in ckptr.checkpoints]
    pp = training.preservation_policies
    with training.Checkpointer(root_directory, preservation_policy=pp.AnyPreservationPolicy(
            [pp.LatestN(2), pp.EveryNSteps(4)])) as ckptr:
        out["gc.reopened"] = [c.step for c in ckptr.checkpoints]
        ckptr.save(10, pytree)
        out["gc.after"] = [c.step for c in ckptr.checkpoints]
        out["load()"] = ckptr.load()
        out["load(first)"] = ckptr.load(ckptr.checkpoints[0])
        out["load(4)"] = ckptr.load(4)
        sharding = NamedSharding(jax.sharding.Mesh(jax.devices(), ("x",)), P("x"))
        abstract_state = {"params": {"layer0": jax.ShapeDtypeStruct((8, 2), np.float32, sharding=sharding)},
                          "opt_state": [jax.ShapeDtypeStruct((16,), np.float32, sharding=sharding)],
                          "step": 0}
        out["load(None, abstract)"] = ckptr.load(None, abstract_state)

    grain = pytest.importorskip("grain")
    dataset = iter(grain.MapDataset.range(30).batch(3).map(lambda x: x.tolist()))
    pytree = _training_pytree()
    root_directory = root / "my-checkpoints-4"
    with training.Checkpointer(root_directory) as ckptr:
        for step in range(10):
            ckptr.save_checkpointables(step, dict(pytree=pytree, dataset=dataset))
            next(dataset)
            pytree["step"] += 1
    new_dataset = iter(grain.MapDataset.range(30).batch(3).map(lambda x: x.tolist()))
    out["initial"] = next(new_dataset)
    with training.Checkpointer(root_directory) as ckptr:
        loaded = ckptr.load_checkpointables(5, dict(pytree=None, dataset=new_dataset))
    out["loaded.pytree"] = loaded["pytree"]
    out["loaded_from_checkpoint"] = next(new_dataset)
    return out


def test_v1_training(tmp_path):
    run_both(v1_training, V1, tmp_path)


# ---------------------------------------------------------------- v1: "Asynchronous Checkpointing"


def v1_async(ocp, root):
    out = {}
    train_state = {"layer0": {"kernel": np.ones((8, 8), dtype=np.float32), "bias": np.ones((8,), dtype=np.float32)}}
    path = root / "sync"
    ocp.save(path, train_state)
    out["sync.listing"] = entries(path)
    path = root / "async"
    response = ocp.save_async(path, train_state)
    out["result"] = response.result()
    out["async.listing"] = entries(path)
    out["load"] = ocp.load(path)
    return out


def test_v1_async_checkpointing(tmp_path):
    run_both(v1_async, V1, tmp_path)


# ---------------------------------------------------------------- treecask's side of the layout


def test_items_are_archives_treecask_opens(tmp_path):
    """Each checkpointable is one archive that treecask.open reads directly;
    the directory is committed whole (no temporary left)."""
    tc_v1.save_checkpointables(tmp_path / "c", dict(state={"w": np.arange(3.0)}, extra={"n": 1}))
    assert sorted(os.listdir(tmp_path / "c")) == ["extra", "index.cask", "state"]
    assert treecask.load(tmp_path / "c" / "state")["w"].tolist() == [0.0, 1.0, 2.0]
    with treecask.open(tmp_path / "c" / "extra") as a:
        assert a.metadata["treecask.orbax.kind"] == "pytree"
    with pytest.raises(treecask.InvalidArgumentError, match="one archive per item.*open or load one of its items"):
        treecask.load(tmp_path / "c")                         # never an empty tree
    assert os.listdir(tmp_path) == ["c"]
    with pytest.raises(FileExistsError):
        tc_v1.save(tmp_path / "c", {"w": np.zeros(1)})
    tc_v1.save(tmp_path / "c", {"w": np.zeros(1)}, overwrite=True)
    assert sorted(os.listdir(tmp_path / "c")) == ["index.cask", "state"]
    assert tc_v1.delete(tmp_path / "c", checkpointable_name="state")
    assert sorted(os.listdir(tmp_path / "c")) == ["index.cask"]


def test_directory_layout_through_an_object_store():
    """The same layout in an object store (the store seam): items are objects
    under the checkpoint's prefix, committed by index.cask; overwrite replaces
    the checkpoint and drops the items it no longer has."""
    obstore_store = pytest.importorskip("obstore.store")
    from treecask.stores import ObjectStore

    store = ObjectStore(obstore_store.MemoryStore())
    tc_v1.save_checkpointables("run/c", dict(state={"w": np.arange(3.0)}, extra={"n": 1}), store=store)
    assert sorted(store.list_prefix("run/")) == ["run/c/extra", "run/c/index.cask", "run/c/state"]
    assert tc_v1.load_checkpointables("run/c", store=store)["extra"] == {"n": 1}
    with pytest.raises(FileExistsError):
        tc_v1.save("run/c", {"w": np.zeros(2)}, store=store)
    tc_v1.save("run/c", {"w": np.zeros(2)}, store=store, overwrite=True)
    assert sorted(store.list_prefix("run/")) == ["run/c/index.cask", "run/c/state"]
    assert tc_v1.load("run/c", store=store)["w"].tolist() == [0.0, 0.0]
    ckptr = tc_ocp.Checkpointer(tc_ocp.CompositeCheckpointHandler())
    ckptr.save("run/e", args=tc_ocp.args.Composite(a=tc_ocp.args.StandardSave({"x": np.ones(1)}),
                                                   m=tc_ocp.args.JsonSave({"k": 1})), store=store)
    restored = ckptr.restore("run/e", store=store)
    assert restored.m == {"k": 1} and restored.a["x"].tolist() == [1.0]


def test_orbax_names_treecask_lacks_raise_unsupported_naming_the_alternative():
    for module, names in ((tc_ocp, ("AsyncCheckpointHandler", "type_handlers", "apply_transformations")),
                          (tc_ocp.handlers, ("ProtoCheckpointHandler", "JaxRandomKeyCheckpointHandler"))):
        for name in names:
            with pytest.raises(treecask.UnsupportedError, match=f"{name} is not supported"):
                getattr(module, name)
    with pytest.raises(AttributeError):
        tc_ocp.no_such_name  # noqa: B018
    assert not hasattr(tc_ocp, "no_such_name")
    registry = tc_ocp.handlers.DefaultCheckpointHandlerRegistry()
    registry.add("state", tc_ocp.args.StandardRestore, tc_ocp.StandardCheckpointHandler)
    with pytest.raises(FileExistsError):
        registry.add("state", tc_ocp.args.StandardRestore, tc_ocp.StandardCheckpointHandler)
    assert registry.get("state", tc_ocp.args.StandardRestore) is tc_ocp.StandardCheckpointHandler
    with pytest.raises(KeyError):
        registry.get("other", tc_ocp.args.StandardRestore)


def test_is_orbax_checkpoint_knows_the_directory_layout(tmp_path):
    tc_v1.save_checkpointables(tmp_path / "c", dict(state={"w": np.arange(3.0)}))
    assert tc_v1.is_orbax_checkpoint(tmp_path / "c")
    assert not tc_v1.is_orbax_checkpoint(tmp_path)          # a directory of checkpoints is not one
    assert not tc_v1.is_orbax_checkpoint(tmp_path / "none")


def test_a_jax_array_saved_on_devices_this_process_lacks(tmp_path):
    """Saved on a mesh of 8 devices, loaded without an abstract tree in a
    process of 2: Orbax 0.12.8 refuses (ValueError: "pass new shardings");
    treecask gives a jax.Array on the default device (docs/python.md, "What
    differs"). Either way nothing lands on a sharding that cannot exist."""
    import subprocess
    import sys
    import textwrap

    s = NamedSharding(jax.sharding.Mesh(jax.devices(), ("x",)), P("x"))
    tree = {"a": jax.device_put(np.arange(16, dtype=np.float32), s)}
    orbax_v1.save(tmp_path / "orbax", tree)
    tc_v1.save(tmp_path / "treecask", tree)
    code = textwrap.dedent(f"""
        import jax, numpy as np
        from orbax.checkpoint import v1 as orbax_v1
        from treecask.orbax import v1 as tc_v1
        assert len(jax.devices()) == 2
        try:
            orbax_v1.load({str(tmp_path / "orbax")!r})
            print("orbax loaded")
        except ValueError:
            print("orbax ValueError")
        a = tc_v1.load({str(tmp_path / "treecask")!r})["a"]
        assert isinstance(a, jax.Array) and a.sharding == jax.sharding.SingleDeviceSharding(jax.devices()[0])
        assert np.array_equal(np.asarray(a), np.arange(16, dtype=np.float32))
        print("treecask default device")
    """)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:2] == ["orbax ValueError", "treecask default device"]


def test_force_replaces_a_checkpoint_of_the_other_layout(tmp_path):
    """A Checkpointer's force=True replaces one item's archive file by a
    directory of items and back, as Orbax replaces its directory."""
    path = tmp_path / "ckpt"
    ckptr = tc_ocp.Checkpointer(tc_ocp.CompositeCheckpointHandler())
    tc_ocp.StandardCheckpointer().save(path, {"w": np.zeros(2)})
    composite = tc_ocp.args.Composite(state=tc_ocp.args.StandardSave({"w": np.ones(2)}),
                                      meta=tc_ocp.args.JsonSave({"v": 1}))
    with pytest.raises(FileExistsError, match="force=True"):
        ckptr.save(path, args=composite)
    ckptr.save(path, args=composite, force=True)
    assert entries(path) == ["meta", "state"] and ckptr.restore(path).meta == {"v": 1}
    std = tc_ocp.StandardCheckpointer()
    std.save(path, {"w": np.full(2, 7.0)}, force=True)
    std.wait_until_finished()
    assert os.path.isfile(path) and std.restore(path)["w"].tolist() == [7.0, 7.0]
    assert os.listdir(tmp_path) == ["ckpt"]


def test_a_managers_run_and_steps_list_as_orbaxs(tmp_path):
    """Beyond the guides' cells: a manager's run lists its <n> steps and the run's metadata entry,
    a step its items and the metrics entry where Orbax writes one (v0: with best_fn only), as
    Orbax's do (bookkeeping files aside); the same listings are read back."""
    got = {}
    for name, ocp in V0.items():
        for best in (False, True):
            d = tmp_path / name / str(best)
            opts = ocp.CheckpointManagerOptions(best_fn=(lambda m: m["l"]) if best else None)
            with ocp.CheckpointManager(d, options=opts, metadata={"v": 2}) as m:
                for step in (0, 1):
                    m.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave({"a": np.ones(2) * step}),
                                                         extra=ocp.args.JsonSave({"k": step})), metrics={"l": 1.0})
                m.wait_until_finished()
            with ocp.CheckpointManager(d, options=opts) as m:
                got[name, best] = (entries(d), entries(d / "1"), m.metadata().custom_metadata,
                                   m.restore(1).extra, m.all_steps())
    for best in (False, True):
        assert got["treecask", best] == got["orbax", best]
    assert got["treecask", True][:2] == (["0", "1", "metadata"], ["extra", "metrics", "state"])
