"""Mapping between treecask dtype names and NumPy / ml_dtypes dtypes, and the
int4/uint4 nibble packing (file: two elements per byte, element 2k in the low
nibble of byte k; ml_dtypes: one element per byte)."""

from __future__ import annotations

from typing import Dict

import ml_dtypes
import numpy as np

from .errors import InvalidArgumentError

_NAME_TO_DTYPE: Dict[str, np.dtype] = {
    "bool": np.dtype(np.bool_),
    "int8": np.dtype(np.int8),
    "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "uint8": np.dtype(np.uint8),
    "uint16": np.dtype(np.uint16),
    "uint32": np.dtype(np.uint32),
    "uint64": np.dtype(np.uint64),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "complex64": np.dtype(np.complex64),
    "complex128": np.dtype(np.complex128),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
    "int4": np.dtype(ml_dtypes.int4),
    "uint4": np.dtype(ml_dtypes.uint4),
}
_DTYPE_TO_NAME: Dict[np.dtype, str] = {v: k for k, v in _NAME_TO_DTYPE.items()}

PACKED = frozenset({"int4", "uint4"})
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
    name = _DTYPE_TO_NAME.get(dt)
    if name is None:
        # Non-native byte order of a supported type: the caller converts.
        native = dt.newbyteorder("=")
        name = _DTYPE_TO_NAME.get(native)
        if name is None:
            raise InvalidArgumentError(
                f"dtype {dt} is not supported (supported: {', '.join(_NAME_TO_DTYPE)})",
                key_path=key_path,
            )
    return name


def byte_length(name: str, shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    if name in PACKED:
        return (n + 1) // 2
    return n * _NAME_TO_DTYPE[name].itemsize


def pack_nibbles(arr: np.ndarray) -> np.ndarray:
    """int4/uint4 array (one element per byte) -> packed uint8 bytes."""
    nibbles = np.ascontiguousarray(arr).reshape(-1).view(np.uint8) & np.uint8(0x0F)
    if nibbles.size % 2:
        nibbles = np.concatenate([nibbles, np.zeros(1, np.uint8)])
    return (nibbles[0::2] | (nibbles[1::2] << np.uint8(4))).astype(np.uint8, copy=False)


def unpack_nibbles(packed: np.ndarray, name: str, shape) -> np.ndarray:
    """Packed uint8 bytes -> a fresh int4/uint4 array of `shape`."""
    n = 1
    for d in shape:
        n *= int(d)
    packed = np.asarray(packed, dtype=np.uint8).reshape(-1)
    out = np.empty(packed.size * 2, np.uint8)
    out[0::2] = packed & np.uint8(0x0F)
    out[1::2] = packed >> np.uint8(4)
    out = out[:n]
    if name == "int4":
        signed = (out.astype(np.int8) ^ np.int8(8)) - np.int8(8)
        return signed.astype(ml_dtypes.int4).reshape(shape)
    return out.astype(ml_dtypes.uint4).reshape(shape)


def as_bytes(arr: np.ndarray, name: str) -> np.ndarray:
    """The file bytes of `arr` (C order, little-endian) as a 1-d uint8 array,
    without a copy where `arr` is already contiguous and native."""
    if name in PACKED:
        return pack_nibbles(arr)
    a = np.asarray(arr)
    if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and np.little_endian is False):
        a = a.astype(a.dtype.newbyteorder("<"))
    a = np.ascontiguousarray(a)
    return a.reshape(-1).view(np.uint8)


def from_bytes(buf: np.ndarray, name: str, shape) -> np.ndarray:
    """An array of dtype `name` and `shape` over `buf` (a view where possible)."""
    if name in PACKED:
        return unpack_nibbles(buf, name, shape)
    return buf.view(_NAME_TO_DTYPE[name]).reshape(shape)
