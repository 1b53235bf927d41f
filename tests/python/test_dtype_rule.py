"""One dtype rule on restore, in every reader (docs/python.md "Dtypes on
restore"): a leaf comes back with exactly the bits that were saved, or an
error names its key path and why. A 64-bit leaf (int64, uint64, float64,
complex128) asked for as a JAX array while ``jax_enable_x64`` is off comes
back as a NumPy array at full width, as Orbax restores it, never narrowed to
32 bits; ``cast=True`` narrows only when the template asks for a narrower
dtype.

A hypothesis property over every dtype of the format x template kind (none,
NumPy, ShapeDtypeStruct with and without a sharding, jax.Array, ``shardings=``,
Flax Linen and NNX boxes, Penzai NamedArray) x x64 on/off x reader (file,
``copy=False``, S3 bucket, sharded checkpoint directory of a two-process job).
"""

from __future__ import annotations

import collections
import contextlib
import textwrap
import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import treecask  # noqa: E402
from treecask import _dtypes  # noqa: E402

from conftest import bits  # noqa: E402
from jobs import collect, launch  # noqa: E402

nn = pytest.importorskip("flax.linen")
nnx = pytest.importorskip("flax.nnx")
pz = pytest.importorskip("penzai.pz")

WIDE = ("int64", "uint64", "float64", "complex128")
DTYPES = sorted(_dtypes.PLAIN_DTYPES.keys() | _dtypes.PACKED)
SHAPE = (4, 2)


def sample(name: str) -> np.ndarray:
    """A (4, 2) array of dtype `name` whose values a 32-bit type cannot hold
    where the dtype is 64-bit (2**40 + 7, 1e300, ...), valid values otherwise."""
    dt = _dtypes.to_numpy(name)
    if name in WIDE:
        big = {"int64": [2**40 + 7, -(2**62), 3, -1], "uint64": [2**63 + 5, 2**40, 1, 0],
               "float64": [1e300, -1e-300, np.pi, -0.0],
               "complex128": [1e300 + 1e-300j, -1j, 2.5, 1e200j]}[name]
        return np.array(big * 2, dt).reshape(SHAPE)
    if name == "bool":
        return (np.arange(8) % 3 == 0).reshape(SHAPE)
    if name in _dtypes.PACKED or np.dtype(dt).kind in "iu":
        info = np.iinfo(dt) if np.dtype(dt).kind in "iu" else None
        lo, hi = (int(info.min), int(info.max)) if info is not None else (-2, 1)
        vals = [lo, hi, 0, 1 if hi >= 1 else 0] * 2
        return np.array(vals, np.int64).astype(dt).reshape(SHAPE)
    return np.array([0.5, -1.0, 2.0, 0.25, 1.5, -0.5, 0.0, 1.0], np.float32).astype(dt).reshape(SHAPE)


def tree_of(name: str) -> dict:
    """One leaf of dtype `name` bare and inside each box kind whose restore the test checks."""
    arr = sample(name)
    return {
        "plain": arr,
        "linen": nn.Partitioned(arr, names=("rows", None)),
        "nnx": nnx.Param(arr),
        "penzai": pz.nx.NamedArray(named_axes=collections.OrderedDict(rows=4, cols=2), data_array=arr),
    }


@contextlib.contextmanager
def x64(enabled: bool):
    old = bool(jax.config.jax_enable_x64)
    jax.config.update("jax_enable_x64", enabled)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", old)


def mesh_sharding():
    m = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("rows",))
    return jax.sharding.NamedSharding(m, jax.sharding.PartitionSpec("rows"))


# ---- the checkpoints, one per reader, each holding every dtype ------------------------------------

SHARDED_CHILD = textwrap.dedent(
    '''
    import sys
    port, nproc, pid, root = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_num_cpu_devices", 2)
    jax.config.update("jax_enable_x64", True)
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=nproc, process_id=pid)
    import numpy as np
    import treecask
    sys.path.insert(0, sys.argv[5])
    from test_dtype_rule import DTYPES, sample, tree_of
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    sh = NamedSharding(Mesh(np.array(jax.devices()), ("rows",)), P("rows"))

    def global_array(x):
        try:
            return jax.make_array_from_callback(x.shape, sh, lambda idx: x[idx])
        except Exception:  # a dtype jax lacks: saved as a NumPy leaf (process 0's)
            return x

    tree = {n: jax.tree.map(global_array, tree_of(n)) for n in DTYPES}
    treecask.save(root, tree)
    print("CHILD OK", pid, flush=True)
    '''
)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, s3_server):
    """{reader name: path or URL} of one checkpoint of every dtype's tree."""
    import pathlib

    root = tmp_path_factory.mktemp("dtypes")
    tree = {n: tree_of(n) for n in DTYPES}
    local = root / "all.cask"
    treecask.save(local, tree, compression="none")
    lz4 = root / "all_lz4.cask"
    treecask.save(lz4, tree, compression="lz4")
    s3_server.create_bucket("dtyperule")
    s3_server.put("dtyperule", "all.cask", lz4)
    sharded = root / "sharded.cask"
    here = str(pathlib.Path(__file__).resolve().parent)
    procs = launch(root / "child.py", SHARDED_CHILD, 2, lambda port, i: (port, 2, i, sharded, here))
    collect(procs, "sharded dtype save")
    return {"file": (str(lz4), {}), "copy=False": (str(local), {"copy": False}),
            "bucket": (s3_server.url("dtyperule", "all.cask"), {}),  # configured by s3_env_module
            "sharded": (str(sharded), {})}


@pytest.fixture(scope="module")
def s3_env_module(s3_server):
    mp = pytest.MonkeyPatch()
    for k, v in s3_server.env().items():
        mp.setenv(k, v)
    yield s3_server
    mp.undo()


# ---- the property ------------------------------------------------------------------------------

KINDS = ("none", "numpy", "sds", "sds_sharded", "jax_array", "shardings", "linen", "nnx", "penzai")
BOX = {"linen": "linen", "nnx": "nnx", "penzai": "penzai"}


def template(kind: str, name: str):
    """(like, subtree, shardings) restoring the leaf of dtype `name` as template kind `kind`."""
    arr = sample(name)
    dt = arr.dtype
    if kind == "none":
        return None, f"{name}/plain", None
    if kind == "shardings":
        return None, f"{name}/plain", mesh_sharding()
    if kind == "numpy":
        return np.zeros(SHAPE, dt), f"{name}/plain", None
    if kind == "sds":
        return jax.ShapeDtypeStruct(SHAPE, dt), f"{name}/plain", None
    if kind == "sds_sharded":
        return jax.ShapeDtypeStruct(SHAPE, dt, sharding=mesh_sharding()), f"{name}/plain", None
    if kind == "jax_array":
        with warnings.catch_warnings():  # jax's own: "int64 ... will be truncated to int32"
            warnings.simplefilter("ignore", UserWarning)
            return jnp.zeros(SHAPE, dt), f"{name}/plain", None  # 32-bit when jax cannot hold dt
    sds = jax.ShapeDtypeStruct(SHAPE, dt)
    if kind == "linen":
        return nn.Partitioned(sds, names=("rows", None)), f"{name}/linen", None
    if kind == "nnx":
        return nnx.Param(sds), f"{name}/nnx", None
    return pz.nx.NamedArray(named_axes=collections.OrderedDict(rows=4, cols=2), data_array=sds), f"{name}/penzai", None


def unbox(x):
    if isinstance(x, nn.Partitioned):
        return x.value
    if isinstance(x, nnx.Variable):
        return x.get_value() if hasattr(x, "get_value") else x.value
    if isinstance(x, pz.nx.NamedArray):
        return x.data_array
    return x


def jax_holds(dt) -> bool:
    """Whether jax, as configured now, makes an array of dtype `dt` that keeps it."""
    try:
        return jax.device_put(np.zeros((1,), dt)).dtype == np.dtype(dt)
    except Exception:  # no such arrays on this backend (float6 on CPU)
        return False


def check_restore(checkpoints, reader: str, kind: str, name: str) -> None:
    path, options = checkpoints[reader]
    arr = sample(name)
    try:
        like, subtree, shardings = template(kind, name)
    except Exception:  # jax cannot make a template of a dtype it lacks (float6...): nothing to restore
        assert kind == "jax_array" and not jax_holds(arr.dtype), (kind, name)
        return
    if reader == "copy=False" and kind != "none":
        with pytest.raises(treecask.InvalidArgumentError, match="copy=False"):  # views only: no template
            treecask.load(path, like, subtree=subtree, shardings=shardings, **options)
        return
    try:
        got = treecask.load(path, like, subtree=subtree, shardings=shardings, **options)
    except treecask.Error as e:
        # The one allowed failure: a jax.Array template that jax made 32-bit (x64 off) for a
        # 64-bit leaf is a dtype mismatch, named with the key path and cast=True.
        assert kind == "jax_array" and not jax_holds(arr.dtype), f"{reader}/{kind}/{name}: {e!r}"
        assert e.key_path == f"{name}/plain" and "cast=True" in str(e), str(e)
        return
    value = unbox(got)
    host = np.asarray(value)
    assert host.dtype == arr.dtype, f"{reader}/{kind}/{name}: came back as {host.dtype}"
    assert host.shape == arr.shape
    assert np.array_equal(bits(host), bits(arr)), f"{reader}/{kind}/{name}: values changed"
    wants_jax = kind in ("sds", "sds_sharded", "jax_array", "shardings", "linen", "nnx", "penzai")
    if wants_jax and not jax_holds(arr.dtype):
        assert isinstance(value, np.ndarray), f"{reader}/{kind}/{name}: {type(value)}"
    elif kind in ("sds", "sds_sharded", "jax_array", "shardings"):
        assert isinstance(value, jax.Array), f"{reader}/{kind}/{name}: {type(value)}"
    elif kind in ("none", "numpy"):
        assert isinstance(value, np.ndarray)


READERS = ("file", "copy=False", "bucket", "sharded")


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(name=st.sampled_from(DTYPES), kind=st.sampled_from(KINDS), enable_x64=st.booleans(),
       reader=st.sampled_from(READERS))
def test_a_restored_leaf_has_the_saved_bits_or_an_error_names_it(checkpoints, s3_env_module, name, kind,
                                                                enable_x64, reader):
    with x64(enable_x64):
        check_restore(checkpoints, reader, kind, name)


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", WIDE)
def test_a_64_bit_leaf_is_never_narrowed_with_x64_off(checkpoints, s3_env_module, reader, kind, name):
    """The issue's cases, every one: 2**40 + 7 and 1e300 come back exactly."""
    with x64(False):
        check_restore(checkpoints, reader, kind, name)


def test_the_orbax_101_idiom_restores_int64_and_float64_exactly(tmp_path):
    """``jax.tree.map(ocp.utils.to_shape_dtype_struct, numpy_tree)`` as the
    restore target, x64 off: Orbax gives the int64 and float64 values back as
    NumPy arrays, and so does treecask."""
    import treecask.orbax as ocp

    tree = {"i": np.array([2**40 + 7, 5], np.int64), "f": np.array([1e300, 2.0], np.float64),
            "g": np.arange(3, dtype=np.float32)}
    with x64(False):
        ckpt = ocp.StandardCheckpointer()
        ckpt.save(tmp_path / "state", tree)
        ckpt.wait_until_finished()
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
        got = ckpt.restore(tmp_path / "state", abstract)
    assert isinstance(got["i"], np.ndarray) and got["i"].dtype == np.int64 and got["i"][0] == 2**40 + 7
    assert isinstance(got["f"], np.ndarray) and got["f"][0] == 1e300
    assert isinstance(got["g"], jax.Array) and got["g"].dtype == jnp.float32


def test_cast_narrows_only_when_asked(tmp_path):
    path = tmp_path / "w.cask"
    treecask.save(path, {"i": np.array([2**40 + 7, -3], np.int64)})
    with x64(False):
        with pytest.raises(treecask.ShapeError, match="cast=True") as e:
            treecask.load(path, {"i": np.zeros(2, np.int32)})
        assert e.value.key_path == "i"
        narrowed = treecask.load(path, {"i": np.zeros(2, np.int32)}, cast=True)["i"]
        assert narrowed.dtype == np.int32 and list(narrowed) == [7, -3]  # asked: int64 -> int32 wraps
        # cast=True to a 64-bit template jax cannot hold: still full width, as NumPy.
        full = treecask.load(path, {"i": jax.ShapeDtypeStruct((2,), np.int64)}, cast=True)["i"]
        assert isinstance(full, np.ndarray) and full.dtype == np.int64 and full[0] == 2**40 + 7


def test_reader_place_keeps_full_width(tmp_path):
    path = tmp_path / "w.cask"
    treecask.save(path, {"f": np.array([1e300, 1.0], np.float64), "h": np.array([1.0, 2.0], np.float32)})
    with x64(False), treecask.open(path) as a:
        f = a.place("f", mesh_sharding())
        assert isinstance(f, np.ndarray) and f[0] == 1e300
        assert isinstance(a.place("h", mesh_sharding()), jax.Array)
    with x64(True), treecask.open(path) as a:
        f = a.place("f", mesh_sharding())
        assert isinstance(f, jax.Array) and f.dtype == jnp.float64 and float(f[0]) == 1e300
