"""Workflow 5: the restores Orbax users write -- no target, partial target,
a target with a new field, a renamed subtree, and a NamedSharding restore on
8 CPU devices where each device reads only its rows."""

import dataclasses

import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import treecask  # noqa: E402
from treecask import _archive  # noqa: E402


def _state():
    k = jax.random.split(jax.random.key(0), 4)
    return {
        "params": {
            "encoder": {"w": jax.random.normal(k[0], (16, 8)), "b": jnp.zeros(8)},
            "decoder": {"w": jax.random.normal(k[1], (8, 16)), "b": jnp.ones(16)},
        },
        "opt_state": {"mu": {"w": jax.random.normal(k[2], (16, 8))}},
        "step": 100,
    }


def _eq(a, b):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_no_target_returns_plain_dicts(cask):
    state = _state()
    treecask.save(cask, state, durable=False)
    raw = treecask.load(cask)
    assert set(raw) == {"params", "opt_state", "step"} and raw["step"] == 100
    assert isinstance(raw["params"]["encoder"]["w"], np.ndarray)
    _eq(raw["params"]["decoder"]["w"], state["params"]["decoder"]["w"])


def test_partial_target(cask):
    state = _state()
    treecask.save(cask, state, durable=False)
    like = {"params": jax.tree_util.tree_map(jnp.zeros_like, state["params"])}
    out = treecask.load(cask, like=like)
    assert set(out) == {"params"}
    assert isinstance(out["params"]["encoder"]["w"], jax.Array)
    _eq(out["params"]["encoder"]["w"], state["params"]["encoder"]["w"])
    abstract = jax.eval_shape(lambda: state["params"]["decoder"])
    dec = treecask.load(cask, like={"params": {"decoder": abstract}})
    _eq(dec["params"]["decoder"]["w"], state["params"]["decoder"]["w"])


@dataclasses.dataclass
class Params:
    w: jax.Array
    b: jax.Array
    scale: jax.Array  # new since the checkpoint was written


jax.tree_util.register_dataclass(Params, data_fields=["w", "b", "scale"], meta_fields=[])


def test_target_with_an_extra_field(cask):
    state = _state()
    treecask.save(cask, state, durable=False)
    like = Params(w=jnp.zeros((16, 8)), b=jnp.zeros(8), scale=jnp.full((8,), 3.0))
    with pytest.raises(treecask.StructureError) as e:
        treecask.load(cask, like=like, subtree="params/encoder")
    assert e.value.key_path == "params/encoder/scale"
    out = treecask.load(cask, like=like, subtree="params/encoder", missing="from_like")
    assert type(out) is Params
    _eq(out.w, state["params"]["encoder"]["w"])
    _eq(out.scale, jnp.full((8,), 3.0))


def test_renamed_subtree(cask):
    state = _state()
    treecask.save(cask, state, durable=False)
    # The new program calls the encoder "enc" and keeps it at the top level.
    like = {"enc": jax.eval_shape(lambda: state["params"]["encoder"])}
    out = {"enc": treecask.load(cask, like=like["enc"], subtree="params/encoder")}
    _eq(out["enc"]["w"], state["params"]["encoder"]["w"])
    assert isinstance(out["enc"]["b"], jax.Array)
    only = treecask.load(cask, subtree="params/encoder/w")
    _eq(only, state["params"]["encoder"]["w"])


def _mesh():
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    return jax.make_mesh((4, 2), ("data", "model"))


def test_named_sharding_restore_reads_only_each_devices_rows(cask, monkeypatch):
    mesh = _mesh()
    big = np.arange(64 * 6, dtype=np.float32).reshape(64, 6)
    treecask.save(cask, {"emb": big, "bias": np.ones(6, np.float32), "step": 3}, durable=False)

    reads = []
    orig = _archive.Archive._c

    class Spy:  # records the boxes each read_slices call asks for, then reads them
        def __init__(self, core):
            self._core = core

        def __getattr__(self, name):
            return getattr(self._core, name)

        def __len__(self):
            return len(self._core)

        def read_slices(self, i, starts, stops, outs, verify):
            key = self._core.leaf(i)["key_path"]
            reads.extend((key, tuple(a), tuple(b)) for a, b in zip(starts, stops))
            return self._core.read_slices(i, starts, stops, outs, verify)

    monkeypatch.setattr(_archive.Archive, "_c", lambda self: Spy(orig(self)))
    sharding = NamedSharding(mesh, P("data", "model"))
    out = treecask.load(cask, shardings={"emb": sharding, "bias": NamedSharding(mesh, P())})
    assert out["step"] == 3
    emb = out["emb"]
    assert isinstance(emb, jax.Array) and emb.sharding == sharding
    for shard in emb.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), big[shard.index])
    # Eight boxes of 16 rows x 3 columns (one per device), each read once, by one call.
    assert sorted(r for r in reads if r[0] == "emb") == [
        ("emb", (s, c), (s + 16, c + 3)) for s in range(0, 64, 16) for c in (0, 3)]
    _eq(out["bias"], np.ones(6))


def test_sharded_save_records_sharding_and_restores_by_template(cask):
    mesh = _mesh()
    s = NamedSharding(mesh, P("data", None))
    x = jax.device_put(jnp.arange(32 * 4, dtype=jnp.bfloat16).reshape(32, 4), s)
    treecask.save(cask, {"x": x}, durable=False)
    with treecask.open(cask) as a:
        info = a.info("x")
        assert info.sharding.mesh_axis_names == ("data", "model") and info.sharding.spec == (("data",), ())
        assert info.sharding.partition_spec() == P("data", None)
    # The template's sharding places the result.
    other = NamedSharding(mesh, P("model", None))
    like = {"x": jax.ShapeDtypeStruct((32, 4), jnp.bfloat16, sharding=other)}
    out = treecask.load(cask, like=like)
    assert out["x"].sharding == other
    _eq(out["x"], x)
    for shard in out["x"].addressable_shards:
        _eq(shard.data, np.asarray(x)[shard.index])
    # One sharding for every leaf, and a callable.
    one = treecask.load(cask, shardings=NamedSharding(mesh, P(None, "model")))
    assert one["x"].sharding.spec == P(None, "model")
    by_fn = treecask.load(cask, shardings=lambda path, info: info.sharding.to_jax())
    assert by_fn["x"].sharding.spec == P("data", None)
    _eq(by_fn["x"], x)


def test_sharded_restore_of_lz4_and_int4_leaves(cask):
    import ml_dtypes

    mesh = _mesh()
    z = np.zeros((64, 256), np.float32)
    z[:, ::3] = 1
    q = (np.arange(64 * 6) % 16 - 8).astype(ml_dtypes.int4).reshape(64, 6)
    treecask.save(cask, {"z": z, "q": q}, compression="lz4", chunk_size=4096, durable=False)
    sh = NamedSharding(mesh, P("data"))
    out = treecask.load(cask, shardings=sh)
    for k, ref in (("z", z), ("q", q)):
        for shard in out[k].addressable_shards:
            assert np.array_equal(np.asarray(shard.data).astype(np.float32), ref[shard.index].astype(np.float32))


def test_python_scalars_restore_into_jax_scalars(cask):
    treecask.save(cask, {"step": 12, "lr": 0.25}, durable=False)
    back = treecask.load(cask, like={"step": jnp.array(0, jnp.int32), "lr": jnp.array(0.0, jnp.float32)})
    assert isinstance(back["step"], jax.Array) and back["step"].dtype == jnp.int32 and int(back["step"]) == 12
    assert back["lr"].dtype == jnp.float32 and float(back["lr"]) == 0.25


def test_cast_restores_into_a_target_of_another_dtype(cask):
    import ml_dtypes

    w = np.arange(12, dtype=np.float64).reshape(3, 4)
    treecask.save(cask, {"w": w, "i": np.arange(4, dtype=np.int32), "n": 3}, durable=False)
    like = {"w": np.zeros((3, 4), np.float32), "i": np.zeros(4, np.int32)}
    with pytest.raises(treecask.ShapeError) as e:
        treecask.load(cask, like=like)
    assert "dtype mismatch" in str(e.value) and "shape mismatch" not in str(e.value)
    assert e.value.key_path == "w" and "cast=True" in str(e.value)
    with pytest.raises(treecask.ShapeError) as e:  # a shape mismatch still says so, cast or not
        treecask.load(cask, like={"w": np.zeros((4, 3), np.float32)}, cast=True)
    assert "shape mismatch" in str(e.value)
    out = treecask.load(cask, like=like, cast=True)
    assert out["w"].dtype == np.float32 and out["i"].dtype == np.int32
    np.testing.assert_array_equal(out["w"], w.astype(np.float32))
    # Into a bf16 serving template on a sharding, and a Python int into an int8 0-d array.
    mesh = jax.make_mesh((4, 2), ("x", "y"))
    sharding = NamedSharding(mesh, P(None, "y"))
    out = treecask.load(cask, like={"w": jax.ShapeDtypeStruct((3, 4), jnp.bfloat16, sharding=sharding),
                                    "n": np.int8(0)}, cast=True)
    assert out["w"].dtype == jnp.bfloat16 and out["n"].dtype == np.int8 and out["n"] == 3
    assert out["w"].sharding == sharding
    np.testing.assert_array_equal(np.asarray(out["w"]), w.astype(ml_dtypes.bfloat16))
    with pytest.raises(treecask.InvalidArgumentError, match="needs like"):
        treecask.load(cask, cast=True)
