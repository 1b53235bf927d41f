"""One leaf <-> its LeafMeta and bytes."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

import treecask._core as _core

from . import _dtypes
from . import _jaxutil as J
from ._boxes import Extras
from .errors import InvalidArgumentError

# ValueKind values, from the core's enum (include/treecask/types.h; SPEC.md "Scalar leaves").
ARRAY, INT, FLOAT, BOOL, STR = (_core.VALUE_KINDS[k] for k in ("array", "int", "float", "bool", "str"))
VALUE_KIND_NAMES = {value: name for name, value in _core.VALUE_KINDS.items()}  # value -> name

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def encode(key_path: str, x: Any, extras: Optional[Extras]) -> Tuple[Dict[str, Any], np.ndarray]:
    """(meta dict for _core.save, uint8 bytes) of one data leaf."""
    metadata: Dict[str, str] = dict(extras.metadata) if extras is not None else {}
    sharding_src = None
    if isinstance(x, bool):
        kind, arr = BOOL, np.array(x, np.bool_)
    elif isinstance(x, int):
        if not _INT64_MIN <= x <= _INT64_MAX:
            raise InvalidArgumentError(f"int {x} does not fit in int64", key_path=key_path)
        kind, arr = INT, np.array(x, np.int64)
    elif isinstance(x, float):
        kind, arr = FLOAT, np.array(x, np.float64)
    elif isinstance(x, complex):
        kind, arr = ARRAY, np.array(x, np.complex128)
    elif isinstance(x, str):
        try:
            raw = x.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InvalidArgumentError(f"string is not valid Unicode: {e}", key_path=key_path) from None
        kind, arr = STR, np.frombuffer(raw, np.uint8)
    elif J.is_shape_dtype_struct(x):
        raise InvalidArgumentError("a jax.ShapeDtypeStruct has no data to save", key_path=key_path)
    elif J.is_jax_array(x):
        if not getattr(x, "is_fully_addressable", True):
            raise InvalidArgumentError("the array is not fully addressable from this process (multi-host); gather "
                                       "it first (jax.experimental.multihost_utils.process_allgather)",
                                       key_path=key_path)
        kind, sharding_src, arr = ARRAY, x, np.asarray(key_data(x, metadata))  # its shards gathered
    else:
        kind, arr = ARRAY, np.asarray(x)
    if arr.dtype == object or arr.dtype.kind in "USOMm":
        raise InvalidArgumentError(f"dtype {arr.dtype} cannot be saved", key_path=key_path)
    name = _dtypes.to_name(arr.dtype, key_path=key_path)
    return describe(key_path, kind, name, arr.shape, extras, metadata, sharding_src), _dtypes.as_bytes(arr, name)


def key_data(x: Any, metadata: Dict[str, str]) -> Any:
    """A jax PRNG key array's key data, its impl recorded in ``metadata``; any other array as it is."""
    if not J.is_prng_dtype(x.dtype):
        return x
    import jax

    metadata[J.KEY_IMPL_META] = str(jax.random.key_impl(x))
    return jax.random.key_data(x)


def describe(key_path: str, kind: int, name: str, shape: Any, extras: Optional[Extras], metadata: Dict[str, str],
             sharding_src: Any) -> Dict[str, Any]:
    """The meta dict of a leaf (of dtype name ``name``) for _core.save: the
    boxes' logical axes (dropped unless one per dimension) and sharding, or
    ``sharding_src``'s (a jax.Array), and the metadata pairs."""
    logical = list(extras.logical_axes) if extras is not None and extras.logical_axes is not None else []
    return {"key_path": key_path, "value_kind": kind, "dtype": name, "shape": [int(d) for d in shape],
            "logical_axes": logical if len(logical) == len(shape) else [],
            "sharding": _sharding(extras, sharding_src, len(shape)), "metadata": sorted(metadata.items())}


def encode_all(key_paths: List[str], objs: List[Any], extras: List[Optional[Extras]]):
    """The leaf columns _core.save takes: (value kinds, dtype names, shapes,
    data buffers, {leaf position: (logical axes, sharding, metadata)} for the
    leaves that have any). Each leaf is encoded as encode() does; a plain
    NumPy array (C-contiguous, native byte order, not a packed sub-byte
    dtype, no box metadata) is passed as it is, its buffer being its bytes."""
    plain = _dtypes.PLAIN_NAMES
    ndarray = np.ndarray
    # First guess: every leaf a plain array (whole-column passes are cheaper
    # than one loop doing everything); then encode() the others.
    names: List[Any] = [plain.get(x.dtype) if type(x) is ndarray else None for x in objs]
    kinds: List[int] = [ARRAY] * len(objs)
    shapes: List[Any] = [x.shape if n is not None else None for x, n in zip(objs, names)]
    datas: List[Any] = list(objs)
    more: Dict[int, Tuple[Any, Any, Any]] = {}
    for i, (x, name, ex) in enumerate(zip(objs, names, extras)):
        if name is not None and ex is None and x.flags.c_contiguous:
            continue
        meta, datas[i] = encode(key_paths[i], x, ex)
        kinds[i], names[i], shapes[i] = meta["value_kind"], meta["dtype"], meta["shape"]
        if meta["logical_axes"] or meta["sharding"] is not None or meta["metadata"]:
            more[i] = (meta["logical_axes"], meta["sharding"], meta["metadata"])
    return kinds, names, shapes, datas, more


def _sharding(extras: Optional[Extras], arr: Any, rank: int):
    spec = extras.spec if extras is not None else None
    mesh = extras.mesh if extras is not None else None
    jax, s = J.jax_loaded(), getattr(arr, "sharding", None)
    if jax is not None and isinstance(s, jax.sharding.NamedSharding):  # a jax.Array's own NamedSharding
        actual, actual_spec = J.mesh_to_lists(s.mesh), J.spec_to_lists(tuple(s.spec))
        if actual is not None and actual_spec is not None:
            mesh, spec = mesh if mesh is not None else actual, spec if spec is not None else actual_spec
    if spec is None and mesh is None:
        return None
    spec = list(spec or [])[:rank]
    # An empty mesh means "mesh unknown" (SPEC.md "Sharding"): the spec's axis names kept (Flax Partitioned, no mesh).
    names, sizes = mesh if mesh is not None else ([], [])
    if names and any(a not in names for dim in spec for a in dim):
        return None
    return (list(names), [int(s) for s in sizes], [list(d) for d in spec])


def kind_value(kind: int, arr: np.ndarray) -> Any:
    """The Python value of a leaf of value kind `kind` from its array (as
    read): scalars and strings for the scalar value kinds, the array itself
    otherwise."""
    if kind == STR:
        return bytes(np.asarray(arr, np.uint8)).decode("utf-8")
    return _SCALAR_TYPES[kind](arr[()]) if kind in _SCALAR_TYPES else arr


_SCALAR_TYPES = {INT: int, FLOAT: float, BOOL: bool}  # the Python type of each scalar value kind
