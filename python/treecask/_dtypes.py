"""Mapping between treecask dtype names and NumPy / ml_dtypes dtypes, and the
file bytes of an array. The sub-byte dtypes are packed in the file (SPEC.md
"Dtypes": element k occupies bits [k * bits, (k + 1) * bits) of the leaf's
bytes read as one little-endian bit stream, so int4 element 2k is the low
nibble of byte k) and held one element per byte in memory (ml_dtypes, the
value in the low bits); the core packs them (treecask::pack_elements) and
unpacks them (Archive::read_slice)."""

from __future__ import annotations

from typing import Dict

import ml_dtypes
import numpy as np

import treecask._core as _core
from .errors import InvalidArgumentError

# The NumPy / ml_dtypes dtype of each of the core's dtype names (in the core's order): the
# format names each dtype as ml_dtypes, else NumPy, does (tests/python/test_basic.py and
# test_dtype_rule.py check every one).
_NAME_TO_DTYPE: Dict[str, np.dtype] = {n: np.dtype(getattr(ml_dtypes, n, n)) for n in _core.dtype_names()}
_DTYPE_TO_NAME: Dict[np.dtype, str] = {v: k for k, v in _NAME_TO_DTYPE.items()}

# Bits per element of the packed sub-byte dtypes, from the core (treecask::dtype_bits,
# dtype_packed: include/treecask/types.h).
BITS: Dict[str, int] = {n: _core.dtype_bits(n) for n in _core.dtype_names() if _core.dtype_packed(n)}
PACKED = frozenset(BITS)
# Native-byte-order dtypes whose array memory is their file bytes (all but the packed ones).
PLAIN_NAMES: Dict[np.dtype, str] = {k: v for k, v in _DTYPE_TO_NAME.items() if v not in PACKED}
PLAIN_DTYPES: Dict[str, np.dtype] = {v: k for k, v in PLAIN_NAMES.items()}


def to_numpy(name: str) -> np.dtype:
    """The NumPy dtype for a treecask dtype name."""
    try:
        return _NAME_TO_DTYPE[name]
    except KeyError:
        raise InvalidArgumentError(f"unknown dtype '{name}'") from None


def to_name(dtype, *, key_path: str = "") -> str:
    """The treecask dtype name of a NumPy dtype; InvalidArgumentError if unsupported."""
    dt = np.dtype(dtype)
    # (a non-native byte order of a supported type: the caller converts)
    name = _DTYPE_TO_NAME.get(dt) or _DTYPE_TO_NAME.get(dt.newbyteorder("="))
    if name is None:
        raise InvalidArgumentError(f"dtype {dt} is not supported (supported: {', '.join(_NAME_TO_DTYPE)})",
                                   key_path=key_path)
    return name


def as_bytes(arr: np.ndarray, name: str) -> np.ndarray:
    """The file bytes of `arr` (C order, little-endian) as a 1-d uint8 array,
    without a copy where `arr` is already contiguous and native; a sub-byte
    dtype (ml_dtypes: one element per byte) packed by the core
    (treecask::pack_elements: byte_length_for(name, shape) bytes, padding bits zero)."""
    if name in PACKED:
        elems = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        out = np.empty(_core.byte_length_for(name, [elems.size]), np.uint8)
        _core.pack_elements(name, elems, out)
        return out
    a = np.asarray(arr)
    if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and np.little_endian is False):
        a = a.astype(a.dtype.newbyteorder("<"))
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def from_bytes(buf: np.ndarray, name: str, shape) -> np.ndarray:
    """A view of `buf` (the file bytes of a leaf of a whole-byte dtype `name`)
    as an array of that dtype and `shape`. Packed sub-byte leaves have no view:
    Archive.read_slice unpacks them."""
    return buf.view(_NAME_TO_DTYPE[name]).reshape(shape)
