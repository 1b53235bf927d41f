"""Optional-JAX helpers. Nothing here imports jax unless jax is already
imported by the program or the caller asks for a jax result."""

from __future__ import annotations

import math
import sys
from typing import Any, List, Optional, Sequence, Tuple

KEY_IMPL_META = "treecask.jax.key_impl"


def jax_loaded():
    """The jax module if the program has imported it, else None."""
    return sys.modules.get("jax")


def import_jax():
    try:
        import jax

        return jax
    except ImportError:
        return None


def is_jax_array(x: Any) -> bool:
    jax = jax_loaded()
    return jax is not None and isinstance(x, jax.Array)


def is_shape_dtype_struct(x: Any) -> bool:
    jax = jax_loaded()
    return jax is not None and isinstance(x, jax.ShapeDtypeStruct)


def jax_cannot_hold(dtype: Any) -> bool:
    """Whether JAX, as configured now, cannot hold an array of ``dtype``
    exactly: a 64-bit dtype (int64, uint64, float64, complex128) while
    ``jax_enable_x64`` is off, which ``jax.numpy.asarray`` and
    ``jax.device_put`` would turn into its 32-bit form without a word
    (``2**40 + 7`` becomes 7, ``1e300`` becomes inf), or a dtype the default
    backend has no arrays of (float6 on the CPU backend of jax 0.10: a
    one-element probe, cached per dtype and x64 setting). False when jax is
    not imported. The restore rule built on it: docs/python.md "Dtypes on
    restore"."""
    jax = jax_loaded()
    if jax is None:
        return False
    import numpy as np

    d = np.dtype(dtype)
    key = (d.name, bool(jax.config.jax_enable_x64))
    known = _CANNOT_HOLD.get(key)
    if known is None:
        try:
            known = np.dtype(jax.dtypes.canonicalize_dtype(d)) != d
            if not known:
                jax.device_put(np.zeros((1,), d)).block_until_ready()
        except Exception:  # jax or its backend has no such arrays
            known = True
        _CANNOT_HOLD[key] = known
    return known


_CANNOT_HOLD: dict = {}


def to_jax(arr: Any, sharding: Any = None) -> Any:
    """Host array ``arr`` as a jax.Array (on ``sharding`` when not None), or
    ``arr`` itself, unchanged, when JAX cannot hold its dtype exactly
    (:func:`jax_cannot_hold`: a 64-bit dtype while ``jax_enable_x64`` is
    off), as Orbax restores such leaves. The one place a restored host
    array becomes a jax.Array (docs/python.md "Dtypes on restore")."""
    if jax_cannot_hold(arr.dtype):
        return arr
    jax = import_jax()
    return jax.device_put(arr, sharding) if sharding is not None else jax.numpy.asarray(arr)


def is_prng_dtype(dtype: Any) -> bool:
    jax = jax_loaded()
    if jax is None:
        return False
    try:
        return bool(jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key))
    except Exception:
        return False


def wrap_key(data, impl: str):
    return import_jax().random.wrap_key_data(data, impl=impl)


# ---- sharding <-> (mesh names, mesh sizes, spec) -----------------------------


def spec_to_lists(spec: Sequence[Any]) -> Optional[List[List[str]]]:
    """PartitionSpec-like entries (None, str, tuple of str) -> lists of axis names."""
    out: List[List[str]] = []
    for e in spec:
        if e is None:
            out.append([])
        elif isinstance(e, str):
            out.append([e])
        elif isinstance(e, (tuple, list)) and all(isinstance(a, str) for a in e):
            out.append(list(e))
        else:
            return None  # UNCONSTRAINED or something we do not model
    return out


def lists_to_spec(spec: Sequence[Sequence[str]]) -> Tuple[Any, ...]:
    """Lists of axis names (:func:`spec_to_lists`) -> PartitionSpec entries."""
    return tuple(None if not e else e[0] if len(e) == 1 else tuple(e) for e in spec)


def mesh_to_lists(mesh: Any) -> Optional[Tuple[List[str], List[int]]]:
    if mesh is None:
        return None
    try:
        shape = dict(mesh.shape)
        names = [str(n) for n in mesh.axis_names]
        return names, [int(shape[n]) for n in mesh.axis_names]
    except Exception:
        return None


def abstract_mesh(names: Sequence[str], sizes: Sequence[int]):
    """A jax.sharding.AbstractMesh with these axes (no devices needed)."""
    jax = import_jax()
    AM = jax.sharding.AbstractMesh
    try:
        return AM(tuple(int(s) for s in sizes), tuple(names))
    except TypeError:  # older signature: tuple of (name, size) pairs
        return AM(tuple(zip(names, sizes)))


def concrete_sharding(s: Any) -> Any:
    """A sharding that can hold data: NamedShardings over an AbstractMesh are
    moved onto the current concrete mesh (jax.set_mesh) or, when the device
    count matches, onto jax.make_mesh of the same shape; otherwise None."""
    jax = import_jax()
    if s is None or not isinstance(s, jax.sharding.NamedSharding):
        return s
    mesh = s.mesh
    if not isinstance(mesh, jax.sharding.AbstractMesh):
        return s
    names = tuple(mesh.axis_names)
    sizes = tuple(dict(mesh.shape)[n] for n in names)
    try:
        cur = jax.sharding.get_mesh()
    except Exception:
        cur = None
    if cur is not None and not isinstance(cur, jax.sharding.AbstractMesh) and not getattr(cur, "empty", False):
        if tuple(cur.axis_names) == names and tuple(dict(cur.shape)[n] for n in names) == sizes:
            return jax.sharding.NamedSharding(cur, s.spec)
    if math.prod(sizes) == jax.device_count():
        try:
            m = jax.make_mesh(sizes, names, axis_types=tuple(mesh.axis_types))
        except TypeError:
            m = jax.make_mesh(sizes, names)
        return jax.sharding.NamedSharding(m, s.spec)
    return None
