"""Workflow 2: optax with a schedule, saved at step k and resumed, is
bit-identical to an uninterrupted run."""

import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import treecask  # noqa: E402

K, N = 5, 4


def _setup():
    schedule = optax.exponential_decay(init_value=0.1, transition_steps=2, decay_rate=0.5)
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(learning_rate=schedule, weight_decay=1e-3))
    key = jax.random.key(0)
    params = {"w": jax.random.normal(key, (8, 4)), "b": jnp.zeros(4, jnp.bfloat16)}
    x = jax.random.normal(jax.random.key(1), (16, 8))

    @jax.jit
    def step(params, state):
        def loss(p):
            return jnp.mean((x @ p["w"] + p["b"].astype(jnp.float32)) ** 2)

        g = jax.grad(loss)(params)
        updates, state = opt.update(g, state, params)
        return optax.apply_updates(params, updates), state

    return opt, params, step


def _run(params, state, step, n):
    for _ in range(n):
        params, state = step(params, state)
    return params, state


def _has_count(s):
    return "count" in getattr(type(s), "_fields", ())


def _counts(state):
    """The `count` of every optax state in the tree (schedules, adam...)."""
    return [int(s.count) for s in jax.tree_util.tree_leaves(state, is_leaf=_has_count) if _has_count(s)]


def test_resume_is_bit_identical(cask):
    opt, params0, step = _setup()
    full_params, _ = _run(params0, opt.init(params0), step, K + N)

    params_k, state_k = _run(params0, opt.init(params0), step, K)
    treecask.save(cask, {"params": params_k, "opt_state": state_k, "step": K}, durable=False)

    # A fresh process would rebuild the template from scratch:
    opt2, fresh_params, step2 = _setup()
    like = {"params": fresh_params, "opt_state": opt2.init(fresh_params), "step": 0}
    restored = treecask.load(cask, like=like)
    assert restored["step"] == K and type(restored["step"]) is int
    assert _counts(restored["opt_state"]) and all(c == K for c in _counts(restored["opt_state"]))
    assert jax.tree_util.tree_structure(restored["opt_state"]) == jax.tree_util.tree_structure(state_k)
    assert restored["params"]["b"].dtype == jnp.bfloat16

    resumed, _ = _run(restored["params"], restored["opt_state"], step2, N)
    for k in full_params:
        a, b = np.asarray(full_params[k]), np.asarray(resumed[k])
        assert a.dtype == b.dtype
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), k


def test_optax_state_without_template_is_plain(cask):
    opt, params, _ = _setup()
    treecask.save(cask, opt.init(params), durable=False)
    plain = treecask.load(cask)
    # chain -> tuple; namedtuple states -> dicts of their fields.
    assert isinstance(plain, tuple)
    adam = plain[1][0]
    assert set(adam) == {"count", "mu", "nu"} and isinstance(adam["mu"]["w"], np.ndarray)
    with treecask.open(cask) as a:
        names = [n.type_name for n in a.treedef if n.kind == "namedtuple"]
        assert any(n.endswith("ScaleByAdamState") for n in names)
