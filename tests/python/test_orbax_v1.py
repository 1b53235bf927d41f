"""``from treecask.orbax import v1 as ocp``: Orbax's v1 guides' flows, run twice
-- once with ``orbax.checkpoint.v1`` (the real orbax-checkpoint 0.12.8), once
with ``treecask.orbax.v1`` -- and the results compared leaf by leaf, dtype by
dtype (test_orbax_compat.assert_same_results): save / load of a sharded
pytree, loads onto ShapeDtypeStruct targets with another NamedSharding over
the 8 CPU devices (conftest.py), metadata, async forms, checkpointables,
Orbax's structure rule (partial_load, PLACEHOLDER), and training.Checkpointer
with save-decision and preservation policies, metrics and custom metadata."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax")
orbax_checkpoint = pytest.importorskip("orbax.checkpoint")
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402
from orbax.checkpoint import v1 as orbax_v1  # noqa: E402

import treecask  # noqa: E402
from treecask.orbax import v1 as tcp_v1  # noqa: E402
from test_orbax_compat import assert_same_results  # noqa: E402

MODULES = {"orbax": orbax_v1, "treecask": tcp_v1}


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _outcome(fn):
    """fn()'s value, or the built-in class its error is an instance of (treecask's
    errors derive from the built-in class Orbax raises, where Orbax raises one)."""
    try:
        return fn()
    except FileExistsError:
        return "raises FileExistsError"
    except FileNotFoundError:
        return "raises FileNotFoundError"
    except KeyError:
        return "raises KeyError"
    except ValueError:
        return "raises ValueError"


def _shapes(tree):
    """{key path: (shape, dtype)} of a metadata tree, or the type of a scalar / string leaf."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: hasattr(x, "shape"))
    return {jax.tree_util.keystr(p): ((tuple(v.shape), np.dtype(v.dtype)) if hasattr(v, "shape") else type(v))
            for p, v in leaves}


def _sharded_pytree():
    """The 101 guide's setup: NumPy arrays put onto a mesh of every device."""
    mesh = jax.sharding.Mesh(jax.devices(), ("x",))
    shardings = {"a": NamedSharding(mesh, P("x", None)), "b": NamedSharding(mesh, P()),
                 "c": NamedSharding(mesh, P())}
    numpy_tree = {"a": np.arange(64, dtype=np.int32).reshape((8, 8)), "b": np.arange(16, dtype=np.int32),
                  "c": np.asarray(4.5, np.float32)}
    tree = jax.tree.map(lambda arr, s: jax.make_array_from_callback(arr.shape, s, lambda idx: arr[idx]),
                        numpy_tree, shardings)
    return mesh, tree


# ---- the free functions: the 101 and "Working with PyTree Checkpoints" guides ----------------


def free_functions(ocp, root):
    out = {}
    mesh, pytree = _sharded_pytree()
    path = os.path.join(root, "ckpt0")
    ocp.save(path, pytree)
    out["raw"] = (ocp.load(path), False)  # Orbax: jax.Array leaves; treecask: NumPy (documented)

    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), pytree)
    out["abstract"] = (ocp.load(path, abstract), "all")
    resharded = {"a": jax.ShapeDtypeStruct((8, 8), jnp.int32, sharding=NamedSharding(mesh, P(None, "x"))),
                 "b": jax.ShapeDtypeStruct((16,), jnp.int32, sharding=NamedSharding(mesh, P("x"))),
                 "c": jax.ShapeDtypeStruct((), jnp.float32, sharding=NamedSharding(mesh, P()))}
    out["resharded"] = (ocp.load(path, resharded), "all")
    out["cast"] = (ocp.load(path, {"a": np.zeros((8, 8), np.float32), "b": np.zeros(16, np.int32),
                                   "c": np.zeros((), np.float32)}), "all")

    md = ocp.metadata(path)
    out["metadata"] = (_shapes(md.metadata), "all")
    out["metadata_fields"] = ([type(md.init_timestamp_nsecs), type(md.commit_timestamp_nsecs), md.custom_metadata,
                               os.fspath(md.path) == path], "all")
    out["load_metadata_abstract"] = (ocp.load(path, jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=NamedSharding(mesh, P())), md.metadata)), "all")

    out["exists"] = (_outcome(lambda: ocp.save(path, pytree)), "all")
    ocp.save(path, {"a": pytree["a"]}, overwrite=True, custom_metadata={"note": "second"})
    out["overwritten"] = (ocp.load(path), False)
    out["custom"] = (ocp.metadata(path).custom_metadata, "all")

    # Deprecated names and the async forms.
    p2 = os.path.join(root, "async")
    r = ocp.save_pytree_async(p2, pytree)
    out["async_result"] = (r.result(), "all")
    out["async_loaded"] = (ocp.load_pytree(p2, abstract), "all")
    out["pytree_metadata"] = (_shapes(ocp.pytree_metadata(p2).metadata), "all")

    # Scalars, strings and NumPy leaves.
    p3 = os.path.join(root, "mixed")
    mixed = {"n": 7, "f": 0.25, "s": "text", "arr": np.arange(5, dtype=np.int16), "nested": [np.ones(2, np.float32)]}
    ocp.save(p3, mixed)
    out["mixed_raw"] = (ocp.load(p3), False)
    out["mixed_abstract"] = (ocp.load(p3, {"n": 0, "f": 0.0, "s": "", "arr": np.zeros(5, np.int16),
                                           "nested": [np.zeros(2, np.float32)]}), "all")
    out["mixed_metadata"] = (_shapes(ocp.metadata(p3).metadata), "all")
    out["missing_path"] = (_outcome(lambda: ocp.load(os.path.join(root, "nope"))), "nodes")
    return out


def test_free_functions_give_the_same_results(tmp_path):
    results = {name: free_functions(ocp, str(tmp_path / name)) for name, ocp in MODULES.items()}
    assert results["treecask"]["exists"][0] == "raises FileExistsError"
    # Orbax raises ValueError for an existing destination and its InvalidLayoutError for a missing
    # one; treecask AlreadyExistsError (a FileExistsError) and NotFoundError (a FileNotFoundError).
    assert results["orbax"]["exists"][0] == "raises ValueError"
    assert results["treecask"]["missing_path"][0] == "raises FileNotFoundError"
    for name in ("exists", "missing_path"):
        del results["orbax"][name], results["treecask"][name]
    assert results["treecask"]["resharded"][0]["a"].sharding.spec == P(None, "x")
    assert_same_results(results)
    # A v1 checkpoint is a directory as Orbax's: the pytree is the archive of the checkpointable "state".
    assert treecask.load(tmp_path / "treecask" / "mixed" / "state")["s"] == "text"


# ---- checkpointables ----------------------------------------------------------------------


def checkpointables(ocp, root):
    out = {}
    _, pytree = _sharded_pytree()
    path = os.path.join(root, "items")
    ocp.save_checkpointables(path, {"params": pytree, "extra": {"step": 3, "lr": 0.1, "name": "run"}},
                             custom_metadata={"tag": "v1"})
    loaded = ocp.load_checkpointables(path)
    out["keys"] = (sorted(loaded), "all")
    out["all"] = (loaded, False)
    out["subset"] = (ocp.load_checkpointables(path, {"extra": None}), "all")
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), pytree)
    out["abstract"] = (ocp.load_checkpointables(path, {"params": abstract})["params"], "all")
    md = ocp.checkpointables_metadata(path)
    out["metadata"] = ({k: _shapes(v) for k, v in md.metadata.items()}, "all")
    out["custom"] = (md.custom_metadata, "all")
    out["by_name"] = (ocp.load(path, checkpointable_name="extra"), "all")
    out["no_such_name"] = (_outcome(lambda: ocp.load_checkpointables(path, {"other": None})), "all")

    p2 = os.path.join(root, "async_items")
    ocp.save_checkpointables_async(p2, {"model": {"w": np.ones((2, 2), np.float32)}}).result()
    out["async"] = (ocp.load_checkpointables(p2), "all")
    return out


def test_checkpointables_give_the_same_results(tmp_path):
    results = {name: checkpointables(ocp, str(tmp_path / name)) for name, ocp in MODULES.items()}
    assert results["treecask"]["no_such_name"][0] == "raises KeyError"  # KeyNotFoundError
    assert_same_results(results)


def test_async_loads(tmp_path):
    """Orbax 0.12.8 loads asynchronously only from safetensors; treecask does it for every archive."""
    tree = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "n": 2}
    tcp_v1.save(tmp_path / "c", tree)
    r = tcp_v1.load_async(tmp_path / "c", {"w": np.zeros((2, 3), np.float32), "n": 0})
    got = r.result(timeout=60)
    assert np.array_equal(got["w"], tree["w"]) and got["n"] == 2
    assert tcp_v1.load_checkpointables_async(tmp_path / "c").result()["state"]["n"] == 2
    seen = []
    r = tcp_v1.save_async(tmp_path / "d", tree)
    r.on_complete(seen.append)
    r.result()
    assert seen == [None]
    with pytest.raises(NotImplementedError):
        orbax_v1.load_async(tmp_path / "c")


# ---- Orbax's structure rule ---------------------------------------------------------------


def structure(ocp, root):
    out = {}
    path = os.path.join(root, "c")
    ocp.save(path, {"a": np.arange(3, dtype=np.int32), "b": np.ones(2, np.float32), "new": np.zeros(4, np.float32)})
    lacks = {"a": np.zeros(3, np.int32), "b": np.zeros(2, np.float32)}
    extra = dict(lacks, new=np.zeros(4, np.float32), more=np.full(2, 7, np.float32))
    out["target_lacks"] = (_outcome(lambda: ocp.load(path, lacks)), "all")
    out["target_extra"] = (_outcome(lambda: ocp.load(path, extra)), "all")
    ctx = ocp.Context()
    ctx.pytree.loading.partial_load = True
    with ctx:
        out["partial_lacks"] = (ocp.load(path, lacks), "all")
        out["partial_extra"] = (ocp.load(path, extra), "all")  # the target's value where the checkpoint has none
        # A ShapeDtypeStruct there has no value to keep: Orbax returns the ShapeDtypeStruct itself as
        # the "loaded" leaf, treecask raises StructureError naming it (compared in the test).
        out["partial_extra_abstract"] = (_outcome(lambda: ocp.load(path, dict(
            lacks, more=jax.ShapeDtypeStruct((2,), jnp.float32, sharding=NamedSharding(
                jax.sharding.Mesh(jax.devices(), ("x",)), P()))))), None)
    out["placeholder"] = ({k: (v is ...) for k, v in ocp.load(path, dict(lacks, new=ocp.PLACEHOLDER)).items()}, "all")
    return out


def test_structure_rule_is_orbaxs(tmp_path):
    results = {name: structure(ocp, str(tmp_path / name)) for name, ocp in MODULES.items()}
    assert results["treecask"]["target_lacks"][0] == "raises ValueError"
    assert isinstance(results["orbax"].pop("partial_extra_abstract")[0]["more"], jax.ShapeDtypeStruct)
    assert results["treecask"].pop("partial_extra_abstract")[0] == "raises ValueError"
    assert_same_results(results)
    path = tmp_path / "treecask" / "c"
    with pytest.raises(treecask.StructureError, match=r"'new'.*partial_load") as e:
        tcp_v1.load(path, {"a": np.zeros(3, np.int32), "b": np.zeros(2, np.float32)})
    assert e.value.key_path == "new" and e.value.file.endswith("state")
    with pytest.raises(treecask.StructureError, match=r"lacks 2 fields the target has: 'more', 'x'"):
        tcp_v1.load(path, {"a": np.zeros(3, np.int32), "b": np.zeros(2, np.float32), "new": np.zeros(4, np.float32),
                           "more": np.zeros(2), "x": 1})


# ---- training.Checkpointer ----------------------------------------------------------------


def training(ocp, root):
    out = {}
    sd, pp = ocp.training.save_decision_policies, ocp.training.preservation_policies
    state = lambda s: {"w": np.full(3, s, np.float32), "s": s}  # noqa: E731

    with ocp.training.Checkpointer(os.path.join(root, "default")) as ckptr:
        out["empty"] = ([ckptr.latest, list(ckptr.checkpoints)], "all")
        out["should_save"] = ([ckptr.should_save(s) for s in range(3)], "all")
        out["saved"] = ([ckptr.save(s, state(s)) for s in range(4)], "all")
        out["steps"] = ([c.step for c in ckptr.checkpoints], "all")
        out["latest"] = ([ckptr.latest.step, ckptr.latest.metrics], "all")
        out["load_latest"] = (ckptr.load(), "all")
        out["load_step"] = (ckptr.load(1, {"w": np.zeros(3, np.float32), "s": 0}), "all")
        out["load_by_metadata"] = (ckptr.load(ckptr.latest), "all")
        m = ckptr.metadata(2)
        out["metadata"] = ([m.step, m.metrics, _shapes(m.metadata), m.custom_metadata], "all")
        out["exists"] = (_outcome(lambda: ckptr.save(1, state(1), force=True)), "all")
        out["no_step"] = (_outcome(lambda: ckptr.load(9)), "all")
        out["root"] = (ckptr.root_metadata().custom_metadata, "all")
        out["overwrite"] = (ckptr.save(3, state(33), force=True, overwrite=True), "all")
        out["overwritten"] = (ckptr.load(3), "all")
        out["deleted"] = ([ckptr.delete(0), [c.step for c in ckptr.checkpoints]], "all")

    policy = sd.AnySavePolicy([sd.FixedIntervalPolicy(3), sd.SpecificStepsPolicy([4]), sd.InitialSavePolicy()])
    keep = pp.AnyPreservationPolicy([pp.LatestN(2), pp.EveryNSteps(6)])
    d = os.path.join(root, "policies")
    with ocp.training.Checkpointer(d, save_decision_policy=policy, preservation_policy=keep,
                                   custom_metadata={"run": 1}) as ckptr:
        saved = [s for s in range(1, 14) if ckptr.save(s, state(s), metrics={"loss": float(s % 5)})]
        out["policy_saved"] = (saved, "all")
        out["policy_kept"] = ([c.step for c in ckptr.checkpoints], "all")
        out["policy_metrics"] = ([c.metrics for c in ckptr.checkpoints], "all")
        out["policy_root"] = (ckptr.root_metadata().custom_metadata, "all")
    with ocp.training.Checkpointer(d) as ckptr:  # a fresh Checkpointer lists what is there
        out["reopened"] = ([[c.step for c in ckptr.checkpoints], ckptr.latest.metrics, ckptr.load()["s"]], "all")

    best = pp.BestN(get_metric_fn=lambda m: m["loss"], reverse=True, n=2)
    with ocp.training.Checkpointer(os.path.join(root, "best"), preservation_policy=best,
                                   save_decision_policy=sd.FixedIntervalPolicy(1)) as ckptr:
        for s, loss in enumerate([5.0, 1.0, 3.0, 0.5, 4.0]):
            r = ckptr.save_pytree_async(s, state(s), metrics={"loss": loss})
        out["async_result"] = (r.result(), "all")
        ckptr.wait()
        out["best_kept"] = ([(c.step, c.metrics) for c in ckptr.checkpoints], "all")
        out["saving"] = (ckptr.is_saving_in_progress(), "all")
        ckptr.save_checkpointables(10, {"params": state(10), "cfg": {"a": 1}})
        out["ck_load"] = (ckptr.load_checkpointables(10), "all")
        out["ck_metadata"] = (sorted(ckptr.checkpointables_metadata(10).metadata), "all")
        out["ck_load_pytree"] = (ckptr.load_pytree(10, checkpointable_name="cfg"), "all")

    # Sharded restore onto ShapeDtypeStruct targets, in a training loop.
    mesh, pytree = _sharded_pytree()
    with ocp.training.Checkpointer(os.path.join(root, "sharded")) as ckptr:
        ckptr.save(0, pytree)
        target = {"a": jax.ShapeDtypeStruct((8, 8), jnp.int32, sharding=NamedSharding(mesh, P(None, "x"))),
                  "b": jax.ShapeDtypeStruct((16,), jnp.int32, sharding=NamedSharding(mesh, P("x"))),
                  "c": jax.ShapeDtypeStruct((), jnp.float32, sharding=NamedSharding(mesh, P()))}
        out["sharded"] = (ckptr.load(0, target), "all")
    return out


def test_training_checkpointer_gives_the_same_results(tmp_path):
    results = {name: training(ocp, str(tmp_path / name)) for name, ocp in MODULES.items()}
    t = results["treecask"]
    assert t["policy_saved"][0] == [1, 3, 4, 6, 9, 12] and t["policy_kept"][0] == [6, 9, 12]
    assert [s for s, _ in t["best_kept"][0]] == [1, 3]
    assert t["exists"][0] == "raises FileExistsError" and t["no_step"][0] == "raises FileNotFoundError"
    assert_same_results(results)
    # Orbax's layout: a directory per step, one archive per checkpointable (and the run's metadata).
    run = tmp_path / "treecask" / "policies"
    assert sorted(os.listdir(run)) == sorted(os.listdir(tmp_path / "orbax" / "policies"))
    assert sorted(os.listdir(run)) == ["12", "6", "9", "metadata"]
    assert sorted(os.listdir(run / "9")) == ["index.cask", "metrics", "state"]  # Orbax: + its own files
    assert {"metrics", "state"} <= set(os.listdir(tmp_path / "orbax" / "policies" / "9"))
    assert treecask.load(run / "9" / "state")["s"] == 9  # an item is an ordinary archive
    # treecask.CheckpointManager's steps are step_<n>.cask archives: it refuses this run, naming who reads it.
    with pytest.raises(treecask.UnsupportedError, match="treecask.orbax.v1.training.Checkpointer"):
        treecask.CheckpointManager(run)


# ---- treecask.orbax.v1 on its own ---------------------------------------------------------


def test_any_archive_loads(tmp_path):
    """A plain treecask.save archive is one pytree at the root: v1 load and metadata read it."""
    treecask.save(tmp_path / "plain.cask", {"w": np.ones(3, np.float32), "k": 2})
    assert tcp_v1.load(tmp_path / "plain.cask")["k"] == 2
    assert tcp_v1.load(tmp_path / "plain.cask", checkpointable_name=None)["k"] == 2
    assert tcp_v1.metadata(tmp_path / "plain.cask").metadata["w"].shape == (3,)
    assert tcp_v1.load_checkpointables(tmp_path / "plain.cask")["default"]["k"] == 2
    with pytest.raises(KeyError, match="state"):
        tcp_v1.load(tmp_path / "plain.cask", checkpointable_name="state")
    assert tcp_v1.is_orbax_checkpoint(tmp_path / "plain.cask")
    assert not tcp_v1.is_orbax_checkpoint(tmp_path / "nothing")
    assert tcp_v1.delete(tmp_path / "plain.cask") and not (tmp_path / "plain.cask").exists()
    assert tcp_v1.delete(tmp_path / "plain.cask", missing_ok=True) is False


def test_context_and_callbacks(tmp_path):
    calls = []
    ctx = tcp_v1.Context()
    ctx.asynchronous.post_finalization_callback = lambda: calls.append("done")
    ctx.array.saving.use_ocdbt = False  # Orbax storage tuning: accepted
    with ctx:
        assert tcp_v1.get_context() is ctx
        tcp_v1.save_async(tmp_path / "c", {"w": np.ones(2)}).result()
    assert calls == ["done"]
    child = tcp_v1.Context(ctx)
    assert child.asynchronous.post_finalization_callback is not None and child.array.saving.use_ocdbt is False
    child.pytree.loading.partial_load = True
    assert ctx.pytree.loading.partial_load is False  # a copy
    # A Checkpointer runs under its own context.
    with tcp_v1.training.Checkpointer(tmp_path / "run", context=child) as ckptr:
        ckptr.save(0, {"a": np.ones(2), "b": np.zeros(1)})
        assert list(ckptr.load(0, {"a": np.zeros(2)})) == ["a"]  # partial_load from its context
    with tcp_v1.training.Checkpointer(tmp_path / "run") as ckptr:
        with pytest.raises(treecask.StructureError, match="'b'") as e:  # in the step's item "state"
            ckptr.load(0, {"a": np.zeros(2)})
        assert e.value.file == str(tmp_path / "run" / "0" / "state")


def test_unsupported_v1_features_are_named(tmp_path):
    tree = {"w": np.ones(2)}
    cases = []
    ctx = tcp_v1.Context()
    ctx.array.saving.storage_options.chunk_byte_size = 1 << 20
    cases.append((ctx, lambda: tcp_v1.save(tmp_path / "a", tree), "storage_options.chunk_byte_size"))
    ctx = tcp_v1.Context(checkpoint_layout="safetensors")
    cases.append((ctx, lambda: tcp_v1.load(tmp_path / "a"), "SAFETENSORS"))
    ctx = tcp_v1.Context()
    ctx.array.loading.use_load_and_broadcast = True
    cases.append((ctx, lambda: tcp_v1.load(tmp_path / "a"), "use_load_and_broadcast"))
    for ctx, call, name in cases:
        with ctx, pytest.raises(treecask.UnsupportedError, match=name):
            call()
    with pytest.raises(treecask.UnsupportedError, match="step_name_format"):
        tcp_v1.training.Checkpointer(tmp_path / "r", step_name_format=object())

    class Opaque:  # get_state() that is not JSON
        def get_state(self):
            return object()

        def set_state(self, s):
            pass

    with pytest.raises(treecask.UnsupportedError, match="not JSON"):
        tcp_v1.save_checkpointables(tmp_path / "b", {"data": Opaque()})
    assert not os.path.exists(tmp_path / "b")
    for name in ("partial", "handlers", "Checkpointable", "multihost"):
        assert hasattr(orbax_v1, name)
        with pytest.raises(treecask.UnsupportedError, match=f"ocp.{name} is not supported"):
            getattr(tcp_v1, name)
    with pytest.raises(treecask.UnsupportedError, match="pathways"):
        tcp_v1.training.pathways  # noqa: B018
    with pytest.raises(AttributeError):
        tcp_v1.no_such_name  # noqa: B018


def test_an_orbax_v1_checkpoint_says_how_to_convert_it(tmp_path):
    orbax_v1.save(tmp_path / "orbax", {"w": np.ones(2)})
    for p in (tmp_path / "orbax", tmp_path / "orbax" / "state"):
        with pytest.raises(treecask.InvalidArgumentError, match="orbax.checkpoint.v1 and save the tree with "
                                                                "treecask.orbax.v1"):
            tcp_v1.load(p)
    tree = orbax_v1.load(tmp_path / "orbax")  # the way in
    tcp_v1.save(tmp_path / "c", tree)
    assert tcp_v1.load(tmp_path / "c")["w"].tolist() == [1.0, 1.0]


def test_importing_treecask_orbax_v1_needs_no_orbax(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        sys.modules["orbax"] = None          # any import of orbax fails
        import numpy as np
        from treecask.orbax import v1 as ocp
        ocp.save({str(tmp_path / 'c')!r}, {{"w": np.ones(2)}})
        assert ocp.load({str(tmp_path / 'c')!r})["w"].tolist() == [1.0, 1.0]
        with ocp.training.Checkpointer({str(tmp_path / 'run')!r}) as c:
            c.save(0, {{"w": np.ones(2)}})
            assert c.latest.step == 0
        print("ok")
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr


def test_on_a_bucket(s3_server, monkeypatch):
    """treecask.orbax.v1 over an object store: a checkpoint object, its metadata, and a
    Checkpointer's steps with a step-based preservation policy."""
    import uuid

    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    s3_server.create_bucket("ocpv1")
    url = f"s3://ocpv1/{uuid.uuid4().hex}"
    tree = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "s": 1}
    tcp_v1.save(url + "/one.cask", tree, custom_metadata={"k": 1})
    with pytest.raises(FileExistsError):
        tcp_v1.save(url + "/one.cask", tree)
    got = tcp_v1.load(url + "/one.cask", {"w": np.zeros((3, 4), np.float32), "s": 0})
    assert np.array_equal(got["w"], tree["w"]) and got["s"] == 1
    md = tcp_v1.metadata(url + "/one.cask")
    assert md.metadata["w"].shape == (3, 4) and md.custom_metadata == {"k": 1} and md.commit_timestamp_nsecs is None
    keep = tcp_v1.training.preservation_policies.LatestN(2)
    with tcp_v1.training.Checkpointer(url + "/run", preservation_policy=keep) as ckptr:
        for s in range(4):
            ckptr.save(s, {"w": np.full(2, s, np.float32)}, force=True)
        assert [c.step for c in ckptr.checkpoints] == [2, 3] and ckptr.load()["w"][0] == 3
        with pytest.raises(treecask.UnsupportedError, match="commit time"):
            _ = ckptr.latest.time
