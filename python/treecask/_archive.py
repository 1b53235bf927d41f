"""The Archive class, save() and load()."""

from __future__ import annotations

import collections.abc
import math
import os
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _boxes, _codec, _dtypes
from . import _jaxutil as J
from . import _tree as T
from . import _core
from .errors import (
    Error,
    InvalidArgumentError,
    KeyNotFoundError,
    ShapeError,
    StructureError,
)

PathLike = Union[str, "os.PathLike[str]"]

_COMPRESSION = {"auto": 0, "none": 1, "lz4": 2}


def _compression_code(compression: str, file: str) -> int:
    """The core's code of a ``compression`` option (SPEC.md "Codecs"; the C++
    ``treecask::Compression``). Raises InvalidArgumentError naming ``file``."""
    if compression not in _COMPRESSION:
        raise InvalidArgumentError(
            f"compression must be one of {sorted(_COMPRESSION)}, got {compression!r}", file=file)
    return _COMPRESSION[compression]


# ---- public value types ---------------------------------------------------------


@dataclass(frozen=True)
class ShardingInfo:
    """How a leaf was sharded when saved: a mesh (axis names and sizes) and a
    PartitionSpec with, per dimension, the mesh axes that shard it."""

    mesh_axis_names: Tuple[str, ...]
    mesh_axis_sizes: Tuple[int, ...]
    spec: Tuple[Tuple[str, ...], ...]

    def partition_spec(self):
        """The spec as a ``jax.sharding.PartitionSpec`` (imports jax)."""
        import jax

        return jax.sharding.PartitionSpec(*J.lists_to_spec(self.spec))

    def to_jax(self, devices: Optional[Sequence[Any]] = None):
        """A ``jax.sharding.NamedSharding`` over a mesh of the saved shape built
        from ``devices`` (default: all devices; their count must equal the
        product of the mesh axis sizes, else InvalidArgumentError)."""
        import jax

        devs = list(devices) if devices is not None else jax.devices()
        n = math.prod(self.mesh_axis_sizes)
        if len(devs) != n:
            raise InvalidArgumentError(
                f"the saved mesh has {n} devices, {len(devs)} were given")
        mesh = jax.sharding.Mesh(np.array(devs).reshape(self.mesh_axis_sizes), self.mesh_axis_names)
        return jax.sharding.NamedSharding(mesh, self.partition_spec())


@dataclass(frozen=True)
class LeafInfo:
    """What the manifest says about one leaf.

    ``dtype`` is the NumPy / ml_dtypes dtype (``dtype_name`` the format's name),
    ``shape`` the array shape (for a ``str`` leaf: its UTF-8 byte count),
    ``value_kind`` what the saving program had ("array", "int", "float",
    "bool", "str"), ``codec`` "none" (zero-copy readable) or "lz4",
    ``filter`` "none" or "shuffle" (bytes shuffled before LZ4; format 2.0,
    SPEC.md "Filters"), ``byte_length`` raw bytes, ``stored_bytes`` bytes in
    the file.
    """

    key_path: str
    index: int
    dtype: np.dtype
    dtype_name: str
    shape: Tuple[int, ...]
    value_kind: str
    codec: str
    filter: str
    byte_length: int
    stored_bytes: int
    chunk_size: int
    num_chunks: int
    num_parts: int
    logical_axes: Tuple[str, ...]
    sharding: Optional[ShardingInfo]
    metadata: Mapping[str, str]

    @property
    def zero_copy(self) -> bool:
        """True when ``archive[key]`` is a view of the mapped file (raw, one part, whole bytes)."""
        return self.codec == "none" and self.num_parts <= 1 and self.dtype_name not in _dtypes.PACKED


def _leaf_info(d: Dict[str, Any]) -> LeafInfo:
    sh = d["sharding"]
    sharding = None
    if sh is not None:
        sharding = ShardingInfo(tuple(sh[0]), tuple(int(s) for s in sh[1]), tuple(tuple(a) for a in sh[2]))
    return LeafInfo(
        key_path=d["key_path"],
        index=int(d["index"]),
        dtype=_dtypes.to_numpy(d["dtype"]),
        dtype_name=d["dtype"],
        shape=tuple(int(s) for s in d["shape"]),
        value_kind=_codec.VALUE_KIND_NAMES[d["value_kind"]],
        codec=d["codec"],
        filter=d["filter"],
        byte_length=int(d["byte_length"]),
        stored_bytes=int(d["stored_bytes"]),
        chunk_size=int(d["chunk_size"]),
        num_chunks=int(d["num_chunks"]),
        num_parts=int(d["num_parts"]),
        logical_axes=tuple(d["logical_axes"]),
        sharding=sharding,
        metadata=dict(d["metadata"]),
    )


@dataclass(frozen=True)
class TreeNode:
    """One treedef node (pre-order): ``kind`` is one of "leaf", "none", "dict",
    "list", "tuple", "namedtuple", "dataclass"; ``keys`` are dict keys or field
    names (empty for lists and tuples)."""

    kind: str
    arity: int
    type_name: str
    keys: Tuple[str, ...]


@dataclass(frozen=True)
class SaveStats:
    """What save() wrote: file size, raw and stored leaf bytes, leaf and blob counts."""

    file_bytes: int
    raw_bytes: int
    stored_bytes: int
    num_leaves: int
    num_blobs: int


# ---- helpers ------------------------------------------------------------------------


def _with_file(e: Error, path: str) -> Error:
    if e.file:
        return e
    return type(e)(e.message, file=path, key_path=e.key_path)


def _join(prefix: Sequence[str], comps: Sequence[str]) -> str:
    return T.join_path(list(prefix) + list(comps))


_FLOAT_NAMES = frozenset({"float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2"})
_INT_NAMES = frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "int4", "uint4"})
_COMPLEX_NAMES = frozenset({"complex64", "complex128"})


# ---- Archive ---------------------------------------------------------------------------


class Archive:
    """A read-only, memory-mapped treecask archive.

    ``Archive(path)`` (or :func:`treecask.open`) maps the file and checks its
    header and manifest; the cost is proportional to the manifest, not to the
    tensor bytes. Leaves are read lazily:

    * ``archive["a/b"]`` -- a read-only ``numpy.ndarray`` of the leaf's dtype and
      shape that *views the mapped file* (no copy) for raw leaves, or a fresh
      read-only array for LZ4, multi-part and int4/uint4 leaves;
    * ``archive.read("a/b")`` -- a fresh, writable copy;
    * ``archive.load(...)`` -- a whole tree or subtree (see :func:`treecask.load`).

    The mapping stays alive while the Archive or any view from it lives, even
    after :meth:`close`. Use it as a context manager to close it promptly.

    A leaf is named by its key path (str; KeyNotFoundError when absent) or by
    its index in pre-order (int; InvalidArgumentError, which is also an
    IndexError, when out of range) in every method below.

    Raises NotFoundError, NotAnArchiveError, VersionError, CorruptionError, IoError.
    """

    def __init__(self, path: PathLike, *, verify_checksums: bool = True, validate_structure: bool = True):
        self._path = os.fspath(path)
        self._core: Optional[_core.Archive] = None
        self._raw_infos: Optional[List[Dict[str, Any]]] = None
        self._treedef_raw = None
        self._core = _core.Archive.open(self._path, verify_checksums, validate_structure)

    # -- lifetime --
    def close(self) -> None:
        """Drops this object's reference to the mapping (views keep it alive)."""
        self._core = None

    @property
    def closed(self) -> bool:
        return self._core is None

    def __enter__(self) -> "Archive":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _c(self) -> _core.Archive:
        if self._core is None:
            raise InvalidArgumentError("the archive is closed", file=self._path)
        return self._core

    def __repr__(self) -> str:
        state = "closed" if self._core is None else f"{len(self)} leaves"
        return f"<treecask.Archive {self._path!r} ({state})>"

    # -- archive-level facts --
    @property
    def path(self) -> str:
        return self._path

    @property
    def file_size(self) -> int:
        return int(self._c().file_size)

    @property
    def format_version(self) -> Tuple[int, int]:
        return tuple(self._c().format_version)

    @property
    def library_version(self) -> str:
        """Version of the library that wrote the file."""
        return self._c().library_version

    @property
    def created_unix_ns(self) -> int:
        return int(self._c().created_unix_ns)

    @property
    def metadata(self) -> Dict[str, str]:
        """Archive-level user key-values (``save(metadata=...)``)."""
        return dict(self._c().metadata)

    def _raw_treedef(self):
        if self._treedef_raw is None:
            self._treedef_raw = self._c().treedef
        return self._treedef_raw

    @property
    def treedef(self) -> Tuple[TreeNode, ...]:
        """The tree's nodes in pre-order."""
        return tuple(
            TreeNode(T.KIND_NAMES[k], int(a), tn, tuple(keys)) for k, a, tn, keys in self._raw_treedef()
        )

    def _subtree(self, comps: Sequence[str]) -> Optional[Tuple[int, int, list]]:
        """(first leaf index, number of leaves, raw treedef nodes) of the
        subtree at key path components `comps`, or None. The C++ side walks to
        it; only its own nodes become Python objects."""
        return self._c().subtree_nodes(list(comps))

    def _start(self, comps: Tuple[str, ...]) -> Optional[T.TNode]:
        """The TNode tree of the subtree at `comps` (paths and leaf indices as
        in the whole tree), or None."""
        sub = self._subtree(comps)
        if sub is None:
            return None
        first, _, nodes = sub
        return T.index_treedef(nodes, path=comps, first_leaf=first)

    def _infos(self) -> "_LeafInfos":
        if self._raw_infos is None:
            self._raw_infos = _LeafInfos(self._c())
        return self._raw_infos

    # -- leaves --
    def __len__(self) -> int:
        return len(self._c())

    def keys(self) -> List[str]:
        """Key paths of all leaves, in pre-order (e.g. ``["params/w", "step"]``)."""
        return [d["key_path"] for d in self._infos()]

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._c().find(key) is not None

    def _index(self, key: Union[str, int]) -> int:
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            if not 0 <= int(key) < len(self):
                raise InvalidArgumentError(f"leaf index {key} out of range (archive has {len(self)} leaves)",
                                           file=self._path)
            return int(key)
        if not isinstance(key, str):
            raise InvalidArgumentError(f"a key path is a str, got {type(key).__name__}", file=self._path)
        return int(self._c().index_of(key))

    def info(self, key: Union[str, int]) -> LeafInfo:
        """The manifest's description of one leaf (dtype, shape, codec, logical
        axes, sharding, metadata). Raises KeyNotFoundError."""
        return _leaf_info(self._infos()[self._index(key)])

    def __getitem__(self, key: Union[str, int]) -> np.ndarray:
        """The leaf at `key` as a read-only array of its dtype and shape: a view
        of the mapped file (no copy) when ``info(key).zero_copy``, else a fresh
        array. A ``str`` leaf is its uint8 UTF-8 bytes; scalars are 0-d arrays.
        Raises KeyNotFoundError, ChecksumError (when checksums are verified)."""
        i = self._index(key)
        d = self._infos()[i]
        name, shape = d["dtype"], tuple(d["shape"])
        if d["codec"] == "none" and d["num_parts"] <= 1 and name not in _dtypes.PACKED:
            if d["byte_length"] == 0:
                arr = np.empty(shape, _dtypes.to_numpy(name))
            else:
                arr = _dtypes.from_bytes(self._c().view(i), name, shape)
        else:
            arr = self._read_array(i, d)
        arr.flags.writeable = False
        return arr

    def read(self, key: Union[str, int], *, verify: Optional[bool] = None) -> np.ndarray:
        """A fresh, writable copy of the leaf (decompressed), of its dtype and
        shape. ``verify`` overrides the archive's checksum setting.
        Raises KeyNotFoundError, ChecksumError, CorruptionError."""
        i = self._index(key)
        return self._read_array(i, self._infos()[i], verify)

    def read_rows(self, key: Union[str, int], start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` along axis 0 of an array leaf of rank >= 1,
        touching only the chunks they lie in: an array of shape
        ``(stop - start,) + shape[1:]``. Raises KeyNotFoundError,
        InvalidArgumentError (bad range, rank 0), ChecksumError."""
        i = self._index(key)
        return self._read_rows(i, self._infos()[i], int(start), int(stop))

    def read_slice(self, key: Union[str, int], index: Any = (), *,
                   verify: Optional[bool] = None) -> np.ndarray:
        """``archive.read(key)[index]`` for NumPy basic indexing with step 1,
        reading only the chunks that hold the slice (Archive::read_slice: each
        touched chunk checksummed whole, all cores for reads of >= 8 MiB).

        ``index`` is an int, a ``slice`` (step None or 1), ``...``, or a tuple
        of them, at most one per dimension; missing trailing dimensions are
        taken whole; an int drops its dimension; negative values count from
        the end as in NumPy; an out-of-range int raises. Returns a fresh,
        writable array of the leaf's dtype (int4/uint4 one element per byte,
        as ml_dtypes holds them). Raises KeyNotFoundError,
        InvalidArgumentError (a step other than 1, ``None``/newaxis, fancy
        indexing, too many indices, an int out of range), ChecksumError,
        CorruptionError.
        """
        i = self._index(key)
        d = self._infos()[i]
        shape = tuple(int(s) for s in d["shape"])
        start, stop, drop = _basic_box(index, shape, self._path, d["key_path"])
        out = np.empty(tuple(b - a for a, b in zip(start, stop)), _dtypes.to_numpy(d["dtype"]))
        self._c().read_slice(i, start, stop, out, verify)
        if drop:
            out = out.reshape(tuple(n for k, n in enumerate(out.shape) if k not in drop))
        return out

    def verify(self) -> List[Error]:
        """Checks every chunk of every leaf (checksum, LZ4 decoding, padding):
        one Error (ChecksumError / CorruptionError) per damaged leaf; an empty
        list means the archive is intact."""
        return list(self._c().verify())

    def load(self, like: Any = None, *, subtree: Optional[str] = None, shardings: Any = None,
             missing: str = "error", extra: str = "ignore", copy: bool = True) -> Any:
        """Restores the tree (or a subtree): see :func:`treecask.load`."""
        return _load(self, like, subtree=subtree, shardings=shardings, missing=missing, extra=extra,
                     copy=copy)

    # -- internals --
    def _values(self, first: int, count: int, copy: bool = True) -> List[Any]:
        """``[self._value(i) for i in range(first, first + count)]``, with every
        array read by one bulk call (all cores, pread + checksum in one pass)
        and no per-leaf dict: the leaf descriptions come as columns.

        With ``copy=False`` the arrays are read-only: views of the mapped file
        for the leaves that have one (raw, one part, not a packed sub-byte dtype; their
        chunks checksummed once by one ``view_many`` call on all cores), fresh
        read-only copies for the others (LZ4, several parts, sub-byte dtypes)."""
        c = self._c()
        names, shapes, kinds, has_metadata = c.leaf_columns(first, count)
        plain = _dtypes.PLAIN_DTYPES
        if not copy:
            views = c.view_many(list(range(first, first + count)), None)
            arrays = []
            for k, (n, s, v) in enumerate(zip(names, shapes, views)):
                if v is not None and n in plain:
                    arr = v.view(plain[n]).reshape(s)
                else:  # no view of the map: a fresh copy, read-only like the views
                    arr = self._read_array(first + k, self._infos()[first + k])
                    arr.flags.writeable = False
                arrays.append(arr)
        else:
            empty = np.empty
            arrays = [empty(s, plain[n]) if n in plain else None for n, s in zip(names, shapes)]
            if not _dtypes.PACKED.isdisjoint(names):  # sub-byte leaves: unpacked one by one below
                todo = [(first + k, x) for k, x in enumerate(arrays) if x is not None]
                c.read_many([i for i, _ in todo], [x for _, x in todo], None)
                for k, x in enumerate(arrays):
                    if x is None:
                        arrays[k] = self._read_array(first + k, self._infos()[first + k])
            else:
                c.read_many(list(range(first, first + count)), arrays, None)
        if kinds.count(_codec.ARRAY) != count or has_metadata.count(0) != count:
            for k in range(count):
                kind = kinds[k]
                if has_metadata[k]:
                    impl = self._infos()[first + k]["metadata"].get(J.KEY_IMPL_META)
                    if impl is not None and kind == _codec.ARRAY:
                        arrays[k] = J.wrap_key(arrays[k], impl)
                        continue
                if kind != _codec.ARRAY:
                    arrays[k] = _codec.kind_value(kind, arrays[k])
        return arrays

    def _prefetch(self, indices) -> None:
        """Reads the plain arrays among `indices` in one bulk call (all cores,
        pread + checksum in one pass) for the _read_array calls that follow in
        this thread; see _load_like."""
        infos = self._infos()
        todo, outs, arrays = [], [], {}
        for i in indices:
            d = infos[i]
            if d["dtype"] in _dtypes.PACKED:
                continue
            arr = np.empty(tuple(d["shape"]), _dtypes.to_numpy(d["dtype"]))
            todo.append(int(i))
            outs.append(arr)
            arrays[int(i)] = arr
        if todo:
            self._c().read_many(todo, outs, None)
        _prefetched.arrays = arrays

    def _read_array(self, i: int, d: Dict[str, Any], verify: Optional[bool] = None) -> np.ndarray:
        pre = getattr(_prefetched, "arrays", None)
        if pre and verify is None and i in pre:
            return pre.pop(i)
        name, shape = d["dtype"], tuple(d["shape"])
        if name in _dtypes.PACKED:
            buf = np.empty(int(d["byte_length"]), np.uint8)
            self._c().read(i, buf, verify)
            return _dtypes.unpack_bits(buf, name, shape)
        out = np.empty(shape, _dtypes.to_numpy(name))
        self._c().read(i, out, verify)
        return out

    def _read_rows(self, i: int, d: Dict[str, Any], start: int, stop: int) -> np.ndarray:
        name, shape = d["dtype"], tuple(d["shape"])
        if len(shape) == 0:
            raise InvalidArgumentError("read_rows needs an array of rank >= 1", file=self._path,
                                       key_path=d["key_path"])
        out = np.empty((max(0, stop - start),) + shape[1:], _dtypes.to_numpy(name))
        self._c().read_slice(i, [start] + [0] * (len(shape) - 1), [stop] + list(shape[1:]), out)
        return out

    def _value(self, i: int) -> Any:
        """Leaf i as numpy / Python value (PRNG keys as jax key arrays)."""
        d = self._infos()[i]
        arr = self._read_array(i, d)
        impl = d["metadata"].get(J.KEY_IMPL_META)
        if impl is not None and d["value_kind"] == _codec.ARRAY:
            return J.wrap_key(arr, impl)
        return _codec.to_value(d, arr)

    def _place(self, i: int, sharding: Any) -> Any:
        """Leaf i as a jax.Array on `sharding`. Every distinct box the local
        devices hold is read by one Archive::read_slices call (each chunk
        decoded and checksummed once, all cores, GIL released) straight into
        its own 64-byte-aligned buffer, which the CPU backend then adopts
        without a copy; replicas of a box share its buffer."""
        import jax

        d = self._infos()[i]
        impl = d["metadata"].get(J.KEY_IMPL_META)
        if impl is not None:
            return jax.device_put(self._value(i), sharding)
        shape = tuple(int(s) for s in d["shape"])
        dtype = _dtypes.to_numpy(d["dtype"])
        if len(shape) == 0:
            return jax.device_put(self._read_array(i, d), sharding)
        boxes: Dict[Tuple[Tuple[int, ...], Tuple[int, ...]], np.ndarray] = {}
        for index in sharding.addressable_devices_indices_map(shape).values():
            box = _index_box(index, shape)
            if box not in boxes:
                boxes[box] = _aligned_empty(tuple(b - a for a, b in zip(*box)), dtype)
        keys = list(boxes)
        self._c().read_slices(i, [list(b[0]) for b in keys], [list(b[1]) for b in keys],
                              [boxes[b] for b in keys], None)

        def fetch(index):
            return boxes[_index_box(index, shape)]

        return jax.make_array_from_callback(shape, sharding, fetch, dtype=dtype)


def _index_box(index: Any, shape: Tuple[int, ...]) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """(start, stop) of a shard index (a tuple of step-1 slices, as
    Sharding.devices_indices_map gives) over an array of `shape`."""
    index = tuple(index) if isinstance(index, tuple) else (index,)
    start, stop = [], []
    for k, n in enumerate(shape):
        sl = index[k] if k < len(index) else slice(None)
        a, b, step = sl.indices(n)
        if step != 1:
            raise InvalidArgumentError(f"a shard index with step {step} along dimension {k}")
        start.append(a)
        stop.append(max(a, b))
    return tuple(start), tuple(stop)


def _basic_box(index: Any, shape: Tuple[int, ...], file: str, key_path: str):
    """(start, stop, dimensions to drop) of NumPy basic index `index` (ints,
    step-1 slices, one Ellipsis) over `shape`; InvalidArgumentError otherwise."""
    items = list(index) if isinstance(index, tuple) else [index]

    def bad(why: str):
        return InvalidArgumentError(f"read_slice: {why}", file=file, key_path=key_path)

    ell = [k for k, x in enumerate(items) if x is Ellipsis]
    if len(ell) > 1:
        raise bad("at most one ... in an index")
    if ell:
        items[ell[0]:ell[0] + 1] = [slice(None)] * max(0, len(shape) - (len(items) - 1))
    if len(items) > len(shape):
        raise bad(f"{len(items)} indices for a leaf of rank {len(shape)}")
    start, stop, drop = [], [], set()
    for k, n in enumerate(shape):
        x = items[k] if k < len(items) else slice(None)
        if isinstance(x, slice):
            a, b, step = x.indices(n)
            if step != 1:
                raise bad(f"dimension {k}: step {step}; only step 1 is read in place")
            start.append(a)
            stop.append(max(a, b))
        elif isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)):
            v = int(x) + (n if int(x) < 0 else 0)
            if not 0 <= v < n:
                raise bad(f"dimension {k}: index {int(x)} is out of range for size {n}")
            start.append(v)
            stop.append(v + 1)
            drop.add(k)
        else:
            raise bad(f"dimension {k}: {type(x).__name__} is not an int or a slice")
    return start, stop, drop


def _aligned_empty(shape: Tuple[int, ...], dtype: np.dtype, align: int = 64) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on an `align`-byte
    boundary: the JAX CPU backend adopts such host buffers without copying."""
    n = math.prod(shape) * dtype.itemsize
    raw = np.empty(n + align, np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off:off + n].view(dtype).reshape(shape)


class _LeafInfos(collections.abc.Sequence):
    """The manifest's leaf descriptions as a sequence of dicts, each built on
    first access: opening an archive and reading one leaf costs one dict, not
    one per leaf (10,000-leaf archives open in about a millisecond)."""

    def __init__(self, core):
        self._core = core
        self._n = len(core)
        self._items: Dict[int, Dict[str, Any]] = {}  # built on first access: no list of n Nones

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self._n))]
        if not -self._n <= i < self._n:
            raise IndexError("leaf index out of range")
        i = i if i >= 0 else self._n + i
        d = self._items.get(i)
        if d is None:
            d = self._items[i] = self._core.leaf(i)
        return d


# Arrays bulk-read by Archive._prefetch for the load running in this thread.
_prefetched = threading.local()


# ---- save ---------------------------------------------------------------------------------


def save(path: PathLike, tree: Any, *, metadata: Optional[Mapping[str, str]] = None,
         compression: str = "auto", overwrite: bool = False, chunk_size: Optional[int] = None,
         threads: int = 0, durable: bool = True, max_part_bytes: Optional[int] = None,
         shuffle: bool = False, _leaf_extras: Optional[Mapping[str, Any]] = None) -> SaveStats:
    """Saves a pytree as one archive file, atomically.

    In a ``jax.distributed`` job of more than one process, call it the same
    way in every process: ``path`` becomes a sharded checkpoint directory
    (``index.cask`` + ``process_<k>.cask``; format 3.0), each process writing
    only its replica-0 shards, committed atomically across processes (see
    docs/python.md "Multi-process save and restore"). An error in any process
    is raised in every process.

    Args:
      path: the archive file to create (written to a temporary file in the same
        directory and renamed into place when complete).
      tree: any pytree of arrays (``numpy.ndarray``, ``jax.Array`` -- sharded
        ones are gathered --, NumPy scalars), Python ``int`` / ``float`` /
        ``bool`` / ``complex`` / ``str`` and ``None``, in dicts, lists, tuples,
        namedtuples and (with jax) any registered pytree node (dataclasses,
        ``eqx.Module``, ``flax.struct``, ``TrainState``, optax states, Flax /
        Penzai boxes). Callables (e.g. activation functions) are not saved:
        they are recorded as None and restored from ``like``. Dtypes: bool,
        (u)int8..64, float16/32/64, bfloat16, float8_e4m3fn, float8_e5m2,
        int4, uint4, complex64/128.
      metadata: archive-level ``str -> str`` key-values.
      compression: "auto" (LZ4 where it saves >= 10%; such leaves are not
        zero-copy readable), "none" (always raw, zero-copy) or "lz4".
      overwrite: replace an existing file at ``path``.
      chunk_size: raw bytes per checksum/compression chunk (a multiple of 64 in
        [4096, 64 MiB]; default 1 MiB).
      threads: compression/hashing threads (0: all cores).
      durable: fsync the file and its directory before returning.
      max_part_bytes: advanced: the largest zero-copy piece of a raw leaf (a
        multiple of chunk_size, at most 1 GiB, the default); larger leaves are
        stored in several parts and read by copy.
      shuffle: byte-shuffle each chunk of the LZ4-coded leaves whose dtype has
        2, 4, 8 or 16 bytes per element before compressing it (Blosc's
        shuffle; SPEC.md "Filters"): bf16/fp32 weights, which plain LZ4 barely
        shrinks, then compress. Use with ``compression="lz4"`` (or "auto",
        whose probe then tries shuffled samples). The file is format 2.0, which
        treecask 0.1 refuses (VersionError); without it, format 1.0.

    Returns:
      SaveStats (file size, raw and stored bytes, leaf and blob counts).

    Raises:
      InvalidArgumentError: an unsupported leaf type or dtype, a non-str key
        path component that is empty, duplicate key paths, bad metadata or
        options (the message names the key path).
      AlreadyExistsError: ``path`` exists and ``overwrite`` is False.
      IoError: the OS refused (e.g. ENOSPC); any previous file is untouched.
    """
    p = os.fspath(path)
    code = _compression_code(compression, p)
    md: List[Tuple[str, str]] = []
    for k, v in (metadata or {}).items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise InvalidArgumentError("archive metadata must map str to str", file=p)
        md.append((k, v))
    # ---- multi-process (jax.distributed, > 1 process): a sharded checkpoint directory ----
    from . import _distributed

    if _distributed.active():
        try:
            return _distributed.save(p, tree, metadata=dict(md), compression=code,
                                     overwrite=bool(overwrite), chunk_size=chunk_size, threads=int(threads),
                                     durable=bool(durable), max_part_bytes=max_part_bytes, shuffle=bool(shuffle))
        except Error as e:
            raise _with_file(e, p) from None
    try:
        nodes, key_paths, objs, extras = T.to_treedef(tree)
        if _leaf_extras:  # private (treecask.import_orbax): {key path: _boxes.Extras}
            extras = [_leaf_extras.get(kp, ex) for kp, ex in zip(key_paths, extras)]
        kinds, dtypes, shapes, datas, more = _codec.encode_all(key_paths, objs, extras)
    except Error as e:
        raise _with_file(e, p) from None
    st = _core.save(p, nodes, key_paths, kinds, dtypes, shapes, datas, more, code,
                    chunk_size, int(threads), bool(overwrite), bool(durable), md, max_part_bytes,
                    bool(shuffle))
    return SaveStats(**{k: int(v) for k, v in st.items()})


# ---- load ---------------------------------------------------------------------------------


def open(path: PathLike, *, verify_checksums: bool = True,  # noqa: A001
         validate_structure: bool = True) -> Archive:
    """Opens an archive for reading: ``with treecask.open(p) as a: a["w"]``.

    ``verify_checksums`` (default True) checks each chunk's XXH3 before its
    bytes are returned; ``validate_structure`` (default True) walks the file's
    LMDB index pages before mapping it, so a damaged or hostile file raises
    instead of crashing. Turn them off only for trusted files on hot paths.
    A sharded checkpoint directory (written by a multi-process save; SPEC.md
    "Sharded checkpoints") opens as a ShardedCheckpoint, which has the same
    interface over the global arrays.
    Raises NotFoundError, NotAnArchiveError, VersionError, CorruptionError, IoError.
    """
    if _core.is_sharded(os.fspath(path)):
        from ._distributed import ShardedCheckpoint

        return ShardedCheckpoint(path, verify_checksums=verify_checksums, validate_structure=validate_structure)
    return Archive(path, verify_checksums=verify_checksums, validate_structure=validate_structure)


def load(path: PathLike, like: Any = None, *, subtree: Optional[str] = None, shardings: Any = None,
         missing: str = "error", extra: str = "ignore", copy: bool = True) -> Any:
    """Restores a pytree from an archive.

    Args:
      path: the archive file.
      like: optional template. Without it the tree comes back as nested dicts,
        lists and tuples (namedtuples and dataclasses as dicts of their fields)
        of writable ``numpy.ndarray`` leaves and Python scalars / strings, with
        Flax ``Partitioned`` / ``LogicallyPartitioned``, NNX variables and Penzai
        ``NamedArray`` / ``NamedArrayView`` / ``Parameter`` boxes rebuilt when
        those libraries are installed. With it, the result has exactly
        ``like``'s structure and types: each array leaf of ``like``
        (``numpy.ndarray``, ``jax.Array``, ``jax.ShapeDtypeStruct``, NumPy or
        Python scalar, ``str``) is read from the leaf at the same key path and
        returned as the same type (jax arrays on ``like``'s sharding); every
        other leaf (functions, static fields) is taken from ``like``. Leaves
        ``like`` lacks are not read (Orbax partial restore).
      subtree: key path prefix (e.g. ``"params/encoder"``): restore only that
        part, reading only its bytes; ``like`` then describes that part. The
        cost is opening the file plus that part: the C++ core walks the
        treedef to it, and only its nodes and leaves reach Python.
      shardings: place arrays onto jax shardings, each device's N-d box read
        straight into its own buffer, each chunk once (Archive._place): one ``jax.sharding.Sharding`` for every array, a pytree
        of shardings (or None) with the result's structure (a subtree may stand
        for everything under it), or a callable ``(key_path, LeafInfo) ->
        Sharding | None``. Overrides ``like``'s own shardings.
      missing: "error" (default) or "from_like": keep ``like``'s value for a
        leaf the checkpoint lacks (a model that gained a field since the save).
      extra: "ignore" (default) or "error": fail when the checkpoint (subtree)
        has leaves ``like`` does not ask for.
      copy: True (default): every array leaf is a fresh, writable array.
        False: no copy -- every array leaf is a *read-only* ``numpy.ndarray``
        that views the memory-mapped file, for the servers that only read
        weights: each leaf's chunks are checksummed (XXH3) once, by all cores,
        before the call returns, and the tree costs no memory beyond the file's
        pages in the page cache, which other processes mapping the same file
        share. The map stays alive as long as any of the arrays does. Leaves
        that have no view of the map (``Archive.info(key).zero_copy`` False:
        LZ4-compressed, stored in several parts, a packed sub-byte dtype, or any leaf of a
        sharded checkpoint directory) come back as fresh arrays, also
        read-only; scalars, strings and PRNG keys as with ``copy=True``. Only
        without ``like`` and ``shardings`` (InvalidArgumentError otherwise).
        Writing to a leaf raises ``ValueError`` (NumPy's read-only flag);
        ``np.array(leaf)`` makes a writable copy of one leaf.

    Returns:
      The restored tree.

    Raises:
      NotFoundError, NotAnArchiveError, VersionError, CorruptionError, ChecksumError;
      KeyNotFoundError: ``subtree`` names nothing in the archive;
      StructureError: ``like`` asks for a leaf the checkpoint lacks (missing="error")
        or the checkpoint has leaves ``like`` lacks (extra="error");
      ShapeError: a leaf's dtype or shape differs from ``like``'s (the message
        names the key path and both dtypes/shapes).
    """
    with open(path) as a:  # a file, or a sharded checkpoint directory
        return _load(a, like, subtree=subtree, shardings=shardings, missing=missing, extra=extra,
                     copy=copy)


def _load(a: Archive, like: Any, *, subtree: Optional[str], shardings: Any, missing: str,
          extra: str, copy: bool = True) -> Any:
    file = a.path
    if not copy and (like is not None or shardings is not None):
        raise InvalidArgumentError("copy=False returns read-only NumPy views of the file; it does not "
                                   "combine with like or shardings", file=file)
    if missing not in ("error", "from_like"):
        raise InvalidArgumentError(f"missing must be 'error' or 'from_like', got {missing!r}", file=file)
    if extra not in ("ignore", "error"):
        raise InvalidArgumentError(f"extra must be 'ignore' or 'error', got {extra!r}", file=file)
    prefix = tuple(T.split_path(subtree)) if subtree else ()

    def not_found():
        return KeyNotFoundError(f"no subtree '{subtree}' in the archive", file=file, key_path=subtree or "")

    if like is None and shardings is None:  # the common case: only the subtree's nodes and leaves
        sub = a._subtree(prefix)
        if sub is None:
            raise not_found()
        first, count, nodes = sub
        try:
            return _assemble(a, nodes, first, a._values(first, count, copy), prefix)
        except Error as e:
            raise _with_file(e, file) from None
    start = a._start(prefix)
    if start is None:
        raise not_found()
    resolver = _sharding_resolver(shardings, a)
    try:
        if like is None:
            return _load_plain(a, start, resolver)
        return _load_like(a, start, prefix, like, resolver, missing, extra, bulk=shardings is None)
    except Error as e:
        raise _with_file(e, file) from None
    finally:
        _prefetched.arrays = None


def _sharding_resolver(shardings: Any, a: Archive) -> Callable[[Tuple[str, ...], int], Any]:
    """(components relative to the restored root, leaf index) -> Sharding or None."""
    if shardings is None:
        return lambda comps, i: None
    jax = J.import_jax()
    if jax is None:
        raise InvalidArgumentError("shardings needs jax")
    if isinstance(shardings, jax.sharding.Sharding):
        s = J.concrete_sharding(shardings)
        return lambda comps, i: s
    if callable(shardings):
        return lambda comps, i: J.concrete_sharding(shardings(T.join_path(comps), a.info(i)))
    node = T.build(shardings, strict=False)
    table: Dict[Tuple[str, ...], Any] = {}

    def collect(n: T.PNode, comps: Tuple[str, ...]):
        if n.kind == T.LEAF:
            table[comps] = n.obj
            return
        if n.kind == T.NONE:
            table[comps] = None
            return
        names = n.keys if n.kind in (T.DICT, T.NAMEDTUPLE, T.DATACLASS) else [str(k) for k in range(len(n.children))]
        for name, c in zip(names, n.children):
            collect(c, comps + (name,))

    collect(node, ())

    def resolve(comps, i):
        for k in range(len(comps), -1, -1):
            if comps[:k] in table:
                return J.concrete_sharding(table[comps[:k]])
        return None

    return resolve


def _assemble(a: Archive, nodes: Sequence[Tuple[int, int, str, Sequence[str]]], first: int,
              values: List[Any], base: Tuple[str, ...]) -> Any:
    """The tree of the pre-order treedef `nodes` (the subtree at components
    `base` whose first leaf is leaf `first`) with leaf k taken from
    values[k]: what _load_plain builds, without a TNode per node."""
    pos = 0
    li = 0

    def rec(path: Tuple[str, ...]) -> Any:
        nonlocal pos, li
        kind, arity, type_name, keys = nodes[pos]
        pos += 1
        if kind == T.LEAF:
            li += 1
            return values[li - 1]
        if kind == T.NONE:
            return None
        named = kind in (T.DICT, T.NAMEDTUPLE, T.DATACLASS)
        leaf0 = li
        children = []
        for j in range(arity):
            child_kind = nodes[pos][0]
            if child_kind == T.LEAF:
                children.append(values[li])
                li += 1
                pos += 1
            elif child_kind == T.NONE:
                children.append(None)
                pos += 1
            else:
                children.append(rec(path + (keys[j] if named else str(j),)))
        if kind == T.LIST:
            return children
        if kind == T.TUPLE:
            return tuple(children)
        fields = dict(zip(keys, children))
        if kind == T.DATACLASS and li > leaf0:
            return _rebuild_box(a, type_name, fields, first + leaf0, path)
        return fields

    try:
        return rec(base)
    finally:
        # rec refers to itself through its closure: a reference cycle that would keep
        # `values` (every leaf: the whole tree's memory, or its map) alive after the
        # caller drops the tree, until the cyclic GC happens to run.
        del rec


def _rebuild_box(a: Archive, type_name: str, fields: Dict[str, Any], first_leaf: int,
                 path: Tuple[str, ...]) -> Any:
    """A known box of `type_name` rebuilt from its fields and its first leaf's
    description; the fields as a dict when the type is not known (or, with a
    warning, when rebuilding fails)."""
    k = _boxes.known(type_name)
    if k is not None:
        box, cls = k
        try:
            return box.rebuild(cls, fields, a._infos()[first_leaf])
        except Exception as e:  # e.g. an incompatible library version
            warnings.warn(f"treecask: could not rebuild {type_name} at "
                          f"'{T.join_path(path)}' ({e}); returning its fields as a dict")
    return fields


def _load_plain(a: Archive, start: T.TNode, resolver) -> Any:
    base = len(start.path)

    def rec(n: T.TNode) -> Any:
        if n.kind == T.LEAF:
            rel = n.path[base:]
            s = resolver(rel, n.first_leaf)
            info = a._infos()[n.first_leaf]
            if s is not None and info["value_kind"] == _codec.ARRAY:
                return a._place(n.first_leaf, s)
            return a._value(n.first_leaf)
        if n.kind == T.NONE:
            return None
        children = [rec(c) for c in n.children]
        if n.kind == T.LIST:
            return children
        if n.kind == T.TUPLE:
            return tuple(children)
        fields = dict(zip(n.keys, children))
        if n.kind == T.DATACLASS and n.num_leaves >= 1:
            return _rebuild_box(a, n.type_name, fields, n.first_leaf, n.path)
        return fields

    try:
        return rec(start)
    finally:
        del rec  # break the closure's self-reference (see _assemble)


def _is_box_node(n: T.TNode) -> bool:
    return n.kind == T.DATACLASS and n.num_leaves == 1 and _boxes.known(n.type_name) is not None


def _load_like(a: Archive, start: T.TNode, prefix: Tuple[str, ...], like: Any, resolver,
               missing: str, extra: str, bulk: bool = False) -> Any:
    file = a.path
    pt = T.build(like, strict=False)
    flags = dict(T.box_components(pt))

    # Plan: which archive leaf each data leaf of `like` comes from.
    plan: Dict[Tuple[str, ...], Optional[int]] = {}
    for comps, leaf in T.iter_leaves(pt):
        if leaf.leaf_kind != T.DATA:
            continue
        idx = _resolve(start, comps, flags.get(comps, ()))
        if idx is None:
            if missing == "error" or J.is_shape_dtype_struct(leaf.obj):
                why = ("the checkpoint has no leaf here"
                       + ("" if missing == "error" else " and like holds no value to keep (a ShapeDtypeStruct)"))
                raise StructureError(
                    why + ("; pass missing='from_like' to keep like's value" if missing == "error" else ""),
                    file=file, key_path=_join(prefix, comps))
        else:
            _check(a._infos()[idx], leaf.obj, _join(prefix, comps), file)
        plan[comps] = idx

    if extra == "error":
        used = {i for i in plan.values() if i is not None}
        unused = [a._infos()[i]["key_path"] for i in range(start.first_leaf, start.first_leaf + start.num_leaves)
                  if i not in used]
        if unused:
            more = f" (and {len(unused) - 5} more)" if len(unused) > 5 else ""
            raise StructureError(
                f"the checkpoint has {len(unused)} leaves the template lacks: {', '.join(unused[:5])}{more}",
                file=file, key_path=unused[0])

    if bulk:
        a._prefetch(sorted({i for i in plan.values() if i is not None}))

    def leaf_value(comps, leaf: T.PNode):
        if leaf.leaf_kind != T.DATA:
            return leaf.obj
        idx = plan.get(comps)
        if idx is None:
            return leaf.obj
        return _convert(a, idx, leaf.obj, resolver(comps, idx))

    return T.rebuild(pt, leaf_value)


def _resolve(start: T.TNode, comps: Tuple[str, ...], flags: Tuple[bool, ...]) -> Optional[int]:
    n = T.find_node(start, comps)
    if n is not None:
        if n.kind == T.LEAF:
            return n.first_leaf
        if _is_box_node(n):  # saved boxed, template unboxed
            return n.first_leaf
        return None
    if any(flags):  # template boxed, saved unboxed
        bare = tuple(c for c, f in zip(comps, flags) if not f)
        n = T.find_node(start, bare)
        if n is not None and n.kind == T.LEAF:
            return n.first_leaf
    return None


def _shape_str(name: str, shape: Sequence[int]) -> str:
    return f"{name}[{', '.join(str(int(s)) for s in shape)}]"


def _check(info: Dict[str, Any], x: Any, key_path: str, file: str) -> None:
    """Raises ShapeError when leaf `info` cannot restore template leaf `x`."""
    name, shape, kind = info["dtype"], tuple(info["shape"]), info["value_kind"]
    got = _shape_str(name, shape) + ("" if kind == _codec.ARRAY else f" ({_codec.VALUE_KIND_NAMES[kind]})")

    def bad(expected: str):
        raise ShapeError(f"the template expects {expected}, the checkpoint has {got}", file=file,
                         key_path=key_path)

    if isinstance(x, bool):
        if name != "bool" or shape != ():
            bad("a bool")
        return
    if isinstance(x, int):
        if name not in _INT_NAMES or shape != ():
            bad("an int")
        return
    if isinstance(x, float):
        if name not in _FLOAT_NAMES or shape != ():
            bad("a float")
        return
    if isinstance(x, complex):
        if name not in _COMPLEX_NAMES or shape != ():
            bad("a complex")
        return
    if isinstance(x, str):
        if kind != _codec.STR:
            bad("a str")
        return
    xshape = tuple(int(s) for s in x.shape)
    if kind in (_codec.INT, _codec.FLOAT, _codec.BOOL) and xshape == ():
        # A Python scalar in the file restores into any 0-d array of its kind.
        try:
            xname = _dtypes.to_name(x.dtype)
        except Error:
            xname = ""
        ok = {_codec.INT: _INT_NAMES, _codec.FLOAT: _FLOAT_NAMES, _codec.BOOL: {"bool"}}[kind]
        if xname not in ok:
            bad(f"a 0-d {xname or x.dtype} array")
        return
    if J.is_prng_dtype(x.dtype):
        if J.KEY_IMPL_META not in info["metadata"] or shape[: len(xshape)] != xshape:
            bad(f"a PRNG key array {x.dtype}[{', '.join(map(str, xshape))}]")
        return
    try:
        xname = _dtypes.to_name(x.dtype)
    except Error:
        xname = str(np.dtype(x.dtype))
    if xname != name or xshape != shape:
        bad(_shape_str(xname, xshape))


def _convert(a: Archive, i: int, x: Any, sharding: Any) -> Any:
    """Leaf i as the type of template leaf `x`."""
    if isinstance(x, (bool, int, float, complex, str)):
        v = a._value(i)
        if isinstance(v, np.ndarray):
            v = v[()].item() if v.shape == () else v
        return type(x)(v)
    d = a._infos()[i]
    scalar = d["value_kind"] in (_codec.INT, _codec.FLOAT, _codec.BOOL)
    if isinstance(x, np.generic):
        arr = a._read_array(i, d)
        return arr.astype(x.dtype)[()] if scalar else arr[()]
    if J.is_jax_array(x) or J.is_shape_dtype_struct(x):
        import jax

        if sharding is None:
            sharding = J.concrete_sharding(getattr(x, "sharding", None))
        if scalar:  # a Python scalar in the file, cast to the template's 0-d dtype
            arr = a._read_array(i, d).astype(x.dtype)
            return jax.device_put(arr, sharding) if sharding is not None else jax.numpy.asarray(arr)
        if sharding is not None:
            return a._place(i, sharding)
        v = a._value(i)
        return v if J.is_jax_array(v) else jax.numpy.asarray(v)
    if sharding is not None and not scalar:
        return a._place(i, sharding)
    if scalar and isinstance(x, np.ndarray):
        return a._read_array(i, d).astype(x.dtype)
    return a._value(i)
