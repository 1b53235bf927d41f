"""Workflow 1: an Equinox model and its optax state, restored into a freshly
initialised template (Equinox ``tree_serialise_leaves`` semantics)."""

import pytest

jax = pytest.importorskip("jax")
eqx = pytest.importorskip("equinox")
optax = pytest.importorskip("optax")
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import treecask  # noqa: E402


class Model(eqx.Module):
    mlp: eqx.nn.MLP
    norm: eqx.nn.LayerNorm
    temperature: float
    name: str = eqx.field(static=True)

    def __init__(self, key, name="model", temperature=1.0):
        self.mlp = eqx.nn.MLP(4, 3, 16, 2, activation=jax.nn.gelu, key=key)
        self.norm = eqx.nn.LayerNorm(3)
        self.temperature = temperature
        self.name = name

    def __call__(self, x):
        return self.norm(self.mlp(x)) / self.temperature


def _make(key, **kw):
    model = Model(key, **kw)
    opt = optax.adam(1e-2)
    state = opt.init(eqx.filter(model, eqx.is_inexact_array))
    return model, opt, state


def _train(model, opt, state, steps):
    x = jnp.linspace(-1, 1, 8 * 4).reshape(8, 4)

    @eqx.filter_jit
    def step(model, state):
        def loss(m):
            return jnp.mean(jax.vmap(m)(x) ** 2)

        grads = eqx.filter_grad(loss)(model)
        updates, state = opt.update(grads, state, eqx.filter(model, eqx.is_inexact_array))
        return eqx.apply_updates(model, updates), state

    for _ in range(steps):
        model, state = step(model, state)
    return model, state


def test_equinox_model_and_adam_state_into_fresh_template(cask):
    model, opt, state = _make(jax.random.key(0), temperature=2.0)
    model, state = _train(model, opt, state, 3)
    treecask.save(cask, {"model": model, "opt_state": state}, durable=False)

    with treecask.open(cask) as a:
        assert "model/mlp/layers/0/weight" in a and "opt_state/0/mu/mlp/layers/0/weight" in a
        assert a.info("model/temperature").value_kind == "float"
        assert any(n.type_name.endswith("Model") and n.kind == "dataclass" for n in a.treedef)
        assert any(n.type_name.endswith("ScaleByAdamState") and n.kind == "namedtuple" for n in a.treedef)

    fresh_model, _, fresh_state = _make(jax.random.key(42), temperature=1.0)
    out = treecask.load(cask, like={"model": fresh_model, "opt_state": fresh_state})
    m2, s2 = out["model"], out["opt_state"]

    assert type(m2) is Model and type(s2[0]) is type(state[0])
    assert jax.tree_util.tree_structure(m2) == jax.tree_util.tree_structure(model)
    saved_leaves = jax.tree_util.tree_leaves(eqx.filter((model, state), eqx.is_array))
    restored = jax.tree_util.tree_leaves(eqx.filter((m2, s2), eqx.is_array))
    assert len(saved_leaves) == len(restored)
    for a_, b_ in zip(saved_leaves, restored):
        assert isinstance(b_, jax.Array) and a_.dtype == b_.dtype and a_.shape == b_.shape
        np.testing.assert_array_equal(np.asarray(a_), np.asarray(b_))
    # Non-array fields come from the template; saved Python scalars from the file.
    assert m2.mlp.activation is jax.nn.gelu and m2.name == "model"
    assert m2.temperature == 2.0
    assert int(s2[0].count) == 3
    x = jnp.ones(4)
    np.testing.assert_array_equal(np.asarray(m2(x)), np.asarray(model(x)))
    # Training continues from the restored state exactly as from the original.
    m3, _ = _train(m2, opt, s2, 2)
    m4, _ = _train(model, opt, state, 2)
    for a_, b_ in zip(jax.tree_util.tree_leaves(eqx.filter(m3, eqx.is_array)),
                      jax.tree_util.tree_leaves(eqx.filter(m4, eqx.is_array))):
        np.testing.assert_array_equal(np.asarray(a_), np.asarray(b_))


def test_equinox_shape_mismatch_names_the_key_path(cask):
    model, _, _ = _make(jax.random.key(0))
    treecask.save(cask, model, durable=False)
    bigger = eqx.tree_at(lambda m: m.mlp.layers[1].weight, model, jnp.zeros((17, 16)))
    with pytest.raises(treecask.ShapeError) as e:
        treecask.load(cask, like=bigger)
    assert e.value.key_path == "mlp/layers/1/weight"
    assert "float32[17, 16]" in str(e.value) and "float32[16, 16]" in str(e.value)


def test_equinox_filtered_save_and_abstract_template(cask):
    model, _, _ = _make(jax.random.key(0))
    params, static = eqx.partition(model, eqx.is_inexact_array)
    treecask.save(cask, params, durable=False)
    abstract = jax.eval_shape(lambda: eqx.partition(Model(jax.random.key(1)), eqx.is_inexact_array)[0])
    restored = treecask.load(cask, like=abstract)
    m2 = eqx.combine(restored, static)
    np.testing.assert_array_equal(np.asarray(m2(jnp.ones(4))), np.asarray(model(jnp.ones(4))))
