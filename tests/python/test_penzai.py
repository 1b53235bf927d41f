"""Workflow 4: Penzai parameters (pz.unbind_params) saved and bound back;
NamedArray axis names survive with and without a template."""

import pytest

jax = pytest.importorskip("jax")
penzai = pytest.importorskip("penzai")
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from penzai import pz  # noqa: E402
from penzai.models import simple_mlp  # noqa: E402

import treecask  # noqa: E402


def _model(seed):
    return simple_mlp.MLP.from_config(name="mlp", init_base_rng=jax.random.key(seed), feature_sizes=[4, 16, 3])


def _x():
    return pz.nx.wrap(jnp.linspace(-1, 1, 5 * 4).reshape(5, 4)).tag("batch", "features")


def test_unbound_params_round_trip_without_template(cask):
    model = _model(0)
    unbound, params = pz.unbind_params(model)
    treecask.save(cask, params, durable=False)
    with treecask.open(cask) as a:
        info = a.info("0/value/data_array")
        assert info.logical_axes == ("features", "features_out")
        assert info.metadata["treecask.penzai.label"] == params[0].label

    restored = treecask.load(cask)
    assert [type(p) for p in restored] == [pz.Parameter] * len(params)
    for p, q in zip(params, restored):
        assert q.label == p.label
        assert isinstance(q.value, pz.nx.NamedArray) and q.value.named_shape == p.value.named_shape
        np.testing.assert_array_equal(np.asarray(q.value.data_array), np.asarray(p.value.data_array))
    rebound = pz.bind_variables(unbound, restored)
    y, ref = rebound(_x()), model(_x())
    assert y.named_shape == ref.named_shape
    np.testing.assert_array_equal(np.asarray(y.unwrap("batch", "features")),
                                  np.asarray(ref.unwrap("batch", "features")))


def test_unbound_params_into_fresh_model_template(cask):
    model = _model(0)
    _, params = pz.unbind_params(model)
    treecask.save(cask, params, durable=False)
    fresh_unbound, fresh_params = pz.unbind_params(_model(1))
    restored = treecask.load(cask, like=fresh_params)
    assert [p.label for p in restored] == [p.label for p in fresh_params]
    assert all(q.value.named_shape == p.value.named_shape for p, q in zip(params, restored))
    rebound = pz.bind_variables(fresh_unbound, restored)
    np.testing.assert_array_equal(np.asarray(rebound(_x()).unwrap("batch", "features")),
                                  np.asarray(model(_x()).unwrap("batch", "features")))


def test_frozen_params_as_label_dict(cask):
    model = _model(0)
    unbound, frozen = pz.unbind_params(model, freeze=True)
    treecask.save(cask, {p.label: p.value for p in frozen}, durable=False)
    plain = treecask.load(cask)
    assert all(isinstance(v, pz.nx.NamedArray) for v in plain.values())
    values = [pz.ParameterValue(label=p.label, value=plain[p.label]) for p in frozen]
    out = pz.bind_variables(unbound, values)(_x())
    np.testing.assert_array_equal(np.asarray(out.unwrap("batch", "features")),
                                  np.asarray(model(_x()).unwrap("batch", "features")))
    # The frozen tuple itself also round-trips (ParameterValue is a pytree).
    treecask.save(cask, frozen, overwrite=True, durable=False)
    back = treecask.load(cask)
    assert type(back[0]) is pz.ParameterValue and back[0].label == frozen[0].label


def test_named_array_views_and_positional_axes(cask):
    data = jnp.arange(3 * 4 * 5, dtype=jnp.float32).reshape(3, 4, 5)
    view = pz.nx.wrap(data).tag_prefix("b", "c")  # positional axis last: a NamedArrayView
    named = view.with_positional_prefix()           # NamedArray with a positional prefix
    treecask.save(cask, {"view": view, "named": named}, durable=False)
    with treecask.open(cask) as a:
        assert a.info("view/data_array").logical_axes == ("b", "c", "")
        assert a.info("named/data_array").logical_axes == ("", "b", "c")
    plain = treecask.load(cask)
    for k, orig in (("view", view), ("named", named)):
        got = plain[k]
        assert type(got) is type(orig)
        assert got.named_shape == orig.named_shape and got.positional_shape == orig.positional_shape
        np.testing.assert_array_equal(np.asarray(got.untag_prefix("b", "c").unwrap()),
                                      np.asarray(orig.untag_prefix("b", "c").unwrap()))
    like = {"view": pz.nx.wrap(jnp.zeros((3, 4, 5))).tag_prefix("b", "c"),
            "named": pz.nx.wrap(jnp.zeros((3, 4, 5))).tag_prefix("b", "c").with_positional_prefix()}
    back = treecask.load(cask, like=like)
    assert back["named"].named_shape == {"b": 3, "c": 4}
    np.testing.assert_array_equal(np.asarray(back["named"].data_array), np.asarray(named.data_array))
