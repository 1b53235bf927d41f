"""Workflow 3: Flax linen boxed params and TrainState; Flax NNX state into an
abstract (nnx.eval_shape) state with sharding metadata."""

import pytest

jax = pytest.importorskip("jax")
flax = pytest.importorskip("flax")
optax = pytest.importorskip("optax")
import flax.linen as nn  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from flax.training import train_state  # noqa: E402

import treecask  # noqa: E402


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        init = nn.initializers.lecun_normal()
        x = nn.Dense(16, kernel_init=nn.with_logical_partitioning(init, ("embed", "mlp")),
                     bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("mlp",)))(x)
        x = nn.relu(x)
        return nn.Dense(4, kernel_init=nn.with_partitioning(init, (None, "model")))(x)


def _variables(seed):
    return MLP().init(jax.random.key(seed), jnp.ones((1, 8)))


def test_linen_logical_partitioning_survives_without_template(cask):
    variables = _variables(0)
    treecask.save(cask, variables, durable=False)
    with treecask.open(cask) as a:
        info = a.info("params/Dense_0/kernel/value")
        assert info.logical_axes == ("embed", "mlp")
        assert a.info("params/Dense_0/bias/value").logical_axes == ("mlp",)
        assert any(n.type_name.endswith("LogicallyPartitioned") for n in a.treedef)

    plain = treecask.load(cask)
    k = plain["params"]["Dense_0"]["kernel"]
    assert isinstance(k, nn.LogicallyPartitioned) and k.names == ("embed", "mlp")
    np.testing.assert_array_equal(k.value, np.asarray(variables["params"]["Dense_0"]["kernel"].value))
    p = plain["params"]["Dense_1"]["kernel"]
    assert type(p) is flax.core.meta.Partitioned and p.names == (None, "model")
    # The rebuilt boxes work with Flax: unbox and the logical spec.
    spec = nn.get_partition_spec(plain)
    assert spec["params"]["Dense_0"]["kernel"] == jax.sharding.PartitionSpec("embed", "mlp")
    out = MLP().apply(nn.unbox(plain), jnp.ones((2, 8)))
    ref = MLP().apply(variables, jnp.ones((2, 8)))
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=0, atol=0)

    # With a boxed template: boxes (and their names) from the template.
    restored = treecask.load(cask, like=_variables(1))
    rk = restored["params"]["Dense_0"]["kernel"]
    assert isinstance(rk, nn.LogicallyPartitioned) and isinstance(rk.value, jax.Array)
    np.testing.assert_array_equal(np.asarray(rk.value), np.asarray(variables["params"]["Dense_0"]["kernel"].value))
    # Unboxed template from a boxed checkpoint (and the other way round).
    unboxed = treecask.load(cask, like=nn.unbox(_variables(1)))
    np.testing.assert_array_equal(np.asarray(unboxed["params"]["Dense_1"]["kernel"]),
                                  np.asarray(variables["params"]["Dense_1"]["kernel"].value))


def test_linen_boxed_template_from_unboxed_checkpoint(cask):
    variables = _variables(0)
    treecask.save(cask, nn.unbox(variables), durable=False)
    restored = treecask.load(cask, like=_variables(3))
    assert restored["params"]["Dense_0"]["kernel"].names == ("embed", "mlp")
    np.testing.assert_array_equal(np.asarray(restored["params"]["Dense_0"]["kernel"].value),
                                  np.asarray(variables["params"]["Dense_0"]["kernel"].value))


def test_train_state_round_trip(cask):
    tx = optax.adam(1e-3)
    params = nn.unbox(_variables(0))["params"]
    state = train_state.TrainState.create(apply_fn=MLP().apply, params=params, tx=tx)
    grads = jax.tree_util.tree_map(jnp.ones_like, params)
    state = state.apply_gradients(grads=grads).apply_gradients(grads=grads)
    treecask.save(cask, state, durable=False)
    with treecask.open(cask) as a:
        assert a.treedef[0].type_name.endswith("TrainState")
        assert a.treedef[0].keys == ("step", "params", "opt_state")

    template = train_state.TrainState.create(apply_fn=MLP().apply, params=nn.unbox(_variables(5))["params"], tx=tx)
    back = treecask.load(cask, like=template)
    assert type(back) is train_state.TrainState and int(back.step) == 2
    assert back.apply_fn is template.apply_fn and back.tx is template.tx
    for a_, b_ in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(back)):
        np.testing.assert_array_equal(np.asarray(a_), np.asarray(b_))
    # Partial: only the params of the TrainState.
    only = treecask.load(cask, like=template.params, subtree="params")
    np.testing.assert_array_equal(np.asarray(only["Dense_0"]["kernel"]), np.asarray(state.params["Dense_0"]["kernel"]))


class NnxModel(nnx.Module):
    def __init__(self, rngs):
        init = nnx.initializers.lecun_normal()
        self.up = nnx.Linear(8, 16, rngs=rngs, kernel_init=nnx.with_partitioning(init, (None, "model")))
        self.blocks = nnx.List([nnx.Linear(16, 16, rngs=rngs,
                                           kernel_init=nnx.with_partitioning(init, ("model", None)))])
        self.norm = nnx.BatchNorm(16, rngs=rngs)
        self.drop = nnx.Dropout(0.1, rngs=rngs)

    def __call__(self, x):
        x = self.up(x)
        for b in self.blocks:
            x = b(x)
        return self.norm(x, use_running_average=True)


def _mesh():
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    return jax.make_mesh((2, 4), ("data", "model"))


def test_nnx_state_into_abstract_state(cask):
    mesh = _mesh()
    with jax.set_mesh(mesh):
        model = NnxModel(nnx.Rngs(0))
        state = nnx.state(model)
        treecask.save(cask, state, durable=False)
        abstract = nnx.state(nnx.eval_shape(lambda: NnxModel(nnx.Rngs(1))))
        restored = treecask.load(cask, like=abstract)

    with treecask.open(cask) as a:
        info = a.info("up/kernel/value")
        assert info.sharding is not None and info.sharding.spec == ((), ("model",))
        assert info.sharding.mesh_axis_names == ("data", "model") and info.sharding.mesh_axis_sizes == (2, 4)
        assert a.info("blocks/0/kernel/value").sharding.spec == (("model",), ())
        assert a.info("drop/rngs/key/value").metadata["treecask.jax.key_impl"]

    kernel = restored["up"]["kernel"]
    assert type(kernel) is nnx.Param
    assert kernel.get_metadata()["out_sharding"] == (None, "model")
    value = kernel.get_value()
    assert isinstance(value, jax.Array)
    assert value.sharding.spec == jax.sharding.PartitionSpec(None, "model")
    assert value.sharding.mesh.shape == {"data": 2, "model": 4}
    np.testing.assert_array_equal(np.asarray(value), np.asarray(state["up"]["kernel"].get_value()))
    assert type(restored["norm"]["mean"]) is nnx.BatchStat
    key = restored["drop"]["rngs"]["key"].get_value()
    assert jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(jax.random.key_data(key),
                                  jax.random.key_data(state["drop"]["rngs"]["key"].get_value()))

    # The restored state updates a fresh model into the saved one.
    with jax.set_mesh(mesh):
        fresh = NnxModel(nnx.Rngs(7))
        nnx.update(fresh, restored)
    for (pa, a_), (pb, b_) in zip(jax.tree_util.tree_leaves_with_path(nnx.state(fresh)),
                                  jax.tree_util.tree_leaves_with_path(state)):
        assert pa == pb
        if jax.dtypes.issubdtype(a_.dtype, jax.dtypes.prng_key):
            a_, b_ = jax.random.key_data(a_), jax.random.key_data(b_)
        np.testing.assert_array_equal(np.asarray(a_), np.asarray(b_))


def test_nnx_state_without_template_keeps_variable_types_and_metadata(cask):
    mesh = _mesh()
    with jax.set_mesh(mesh):
        state = nnx.state(NnxModel(nnx.Rngs(0)))
    treecask.save(cask, state, durable=False)
    plain = treecask.load(cask)
    k = plain["up"]["kernel"]
    assert type(k) is nnx.Param and k.get_metadata()["out_sharding"] == (None, "model")
    np.testing.assert_array_equal(np.asarray(k.get_value()), np.asarray(state["up"]["kernel"].get_value()))
    assert type(plain["drop"]["rngs"]["count"]) is nnx.RngCount
    assert plain["drop"]["rngs"]["count"].get_metadata()["tag"] == "default"
    # Restoring onto the saved sharding: LeafInfo.sharding -> NamedSharding.
    with treecask.open(cask) as a:
        s = a.info("up/kernel/value").sharding.to_jax()
    placed = treecask.load(cask, subtree="up/kernel/value", shardings=s)
    assert placed.sharding.spec == jax.sharding.PartitionSpec(None, "model")


def test_linen_partitioned_with_mesh_keeps_names_and_mesh(cask):
    mesh = _mesh()
    init = nn.with_partitioning(nn.initializers.ones, ("data", "model"), mesh=mesh)
    box = init(jax.random.key(0), (4, 8))
    assert isinstance(box, nn.Partitioned) and box.mesh is mesh
    treecask.save(cask, {"w": box}, durable=False)
    with treecask.open(cask) as a:
        s = a.info("w/value").sharding
        assert s.mesh_axis_names == ("data", "model") and s.mesh_axis_sizes == (2, 4)
        assert s.spec == (("data",), ("model",))
    plain = treecask.load(cask)["w"]
    assert type(plain) is nn.Partitioned and plain.names == ("data", "model")
    assert dict(plain.mesh.shape) == {"data": 2, "model": 4}  # an AbstractMesh of the saved shape
    back = treecask.load(cask, like={"w": box})["w"]
    assert back.mesh is mesh and np.array_equal(np.asarray(back.value), np.ones((4, 8)))
