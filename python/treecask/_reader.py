"""The one read interface: :class:`Reader`, what every reader of a checkpoint
store gives (leaf descriptions, the treedef and its subtrees, zero-copy views,
whole-leaf, many-leaf, row and N-d slice reads, placement onto jax shardings),
implemented once over a *source*: the core object that holds the leaves.

A source is what ``_core.Archive`` is (the methods :class:`Reader` calls on
``self._c()``): ``__len__``, ``leaf(i)`` (a leaf's description as a dict),
``leaf_columns(first, count)``, ``treedef``, ``subtree_nodes(components)``,
``find``, ``index_of``, ``metadata``, ``file_size``, ``format_version``,
``library_version``, ``created_unix_ns``, ``view(i)``, ``view_many(indices,
verify)``, ``read(i, out, verify=)``, ``read_many(indices, outs, verify)``,
``read_slice(i, start, stop, out, verify=)``, ``read_slices(i, starts, stops,
outs, verify)`` and ``verify()``. The single-file archive (``_archive.py``)
reads a ``_core.Archive``, the sharded checkpoint directory (``_sharded.py``)
a ``_core.ShardedArchive``, whose binding has the same methods. Another store
is another source.

Turning leaves back into a pytree is ``_restore.py``'s job: it calls only the
public methods below.
"""

from __future__ import annotations

import abc
import collections.abc
import itertools
import math
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, TypeVar, Union

import numpy as np

from . import _codec, _dtypes, _replicas, _signing, stores
from . import _jaxutil as J
from . import _restore
from . import _tree as T
from ._types import LeafInfo, TreeNode, leaf_info
from .errors import Error, InvalidArgumentError

#: A subtree as :meth:`Reader.subtree` gives it: (index of its first leaf,
#: number of leaves, its treedef nodes in pre-order as ``(kind, arity,
#: type_name, keys)`` tuples, the kinds as ``_tree``'s node kind numbers).
Subtree = Tuple[int, int, List[Tuple[int, int, str, Sequence[str]]]]


_R = TypeVar("_R", bound="Reader")


class Reader(abc.ABC):
    """A read-only checkpoint: the interface :class:`treecask.Archive` (one
    file) and :class:`treecask.ShardedArchive` (a directory of shard
    files) share, and what ``treecask.load`` restores from.

    A leaf is named by its key path (str; KeyNotFoundError when absent) or by
    its index in pre-order (int; InvalidArgumentError, which is also an
    IndexError, when out of range) in every method below.

    A subclass opens its source in ``__init__`` (:meth:`_open_source`) and
    names itself in ``__repr__``.
    """

    _path: str
    _core: Any
    _place_by_slices = False  # (ShardedArchive: place() never device_puts, a collective there)
    _raw_infos: Optional["_LeafInfos"]
    _treedef_raw: Any

    def _open_source(self, opener: str, path: Any, store: Any, storage_options: Any, signature: Any,
                     public_key: Any, **options: Any) -> None:
        """Opens the core reader of ``path`` (resolved once) by the store's ``opener``
        (``open_archive`` / ``open_sharded``), signed when ``signature`` and ``public_key`` are given."""
        self._core = self._raw_infos = self._treedef_raw = None
        loc = stores.resolve(path, store, storage_options)
        self._path = loc.shown
        check = _signing.signature_check(signature, public_key, storage_options, file=str(loc.shown))
        self._core = getattr(loc.store, opener)(loc.path, signature=check, **options)

    # -- lifetime --
    def close(self) -> None:
        """Drops this object's reference to the mapping (views keep it alive)."""
        self._core = None

    closed = property(lambda self: self._core is None, doc="Whether :meth:`close` was called.")

    def __enter__(self: _R) -> _R:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _c(self) -> Any:
        """The source (module docstring); InvalidArgumentError once closed."""
        if self._core is None:
            raise InvalidArgumentError("the archive is closed", file=self._path)
        return self._core

    @abc.abstractmethod
    def __repr__(self) -> str: ...

    # -- checkpoint-level facts --
    path = property(lambda self: self._path,
                    doc="The path the archive was opened from, as given to open() (a str).")
    file_size = property(lambda self: int(self._c().file_size),
                         doc="Size of the archive file in bytes (int), as it was at open().")
    format_version = property(lambda self: tuple(self._c().format_version), doc='(major, minor) of the '
                              'format the file was written in (a tuple of int; SPEC.md "Versioning").')
    library_version = property(lambda self: self._c().library_version,
                               doc="Version of the library that wrote the file (a str).")
    created_unix_ns = property(lambda self: int(self._c().created_unix_ns), doc="When the writer committed "
                               "the file: nanoseconds since the Unix epoch (UTC), an int.")
    metadata = property(lambda self: dict(self._c().metadata),
                        doc="Archive-level user key-values (``save(metadata=...)``), a dict of str.")

    @property
    def treedef(self) -> Tuple[TreeNode, ...]:
        """The tree's nodes in pre-order."""
        if self._treedef_raw is None:
            self._treedef_raw = self._c().treedef
        return tuple(TreeNode(T.KIND_NAMES[k], int(a), tn, tuple(keys)) for k, a, tn, keys in self._treedef_raw)

    def subtree(self, prefix: Union[str, Sequence[str]]) -> Optional[Subtree]:
        """The subtree at key path `prefix` (a key path str, or its unescaped
        components; "" or () is the whole tree): (index of its first leaf,
        number of leaves, its treedef nodes in pre-order as ``(kind, arity,
        type_name, keys)`` tuples), or None when no node is there. The core
        walks to it; only its own nodes become Python objects.
        Raises InvalidArgumentError for a str that is not a valid key path."""
        return self._subtree(T.split_path(prefix) if isinstance(prefix, str) else list(prefix))

    def _subtree(self, comps: Sequence[str]) -> Optional[Subtree]:  # (a test counts these calls)
        return self._c().subtree_nodes(list(comps))

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
        core = self._core
        if type(key) is int and core is not None and 0 <= key < len(core):  # restore's per-leaf calls
            return key
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
        axes, sharding, metadata). Raises KeyNotFoundError (a str key),
        InvalidArgumentError (an int key out of range)."""
        return leaf_info(self._infos()[self._index(key)])

    def leaf(self, key: Union[str, int]) -> Dict[str, Any]:
        """:meth:`info` as the core gives it, a plain dict built once per leaf
        and shared (do not modify it): ``key_path``, ``dtype`` (the format's
        dtype name), ``shape``, ``value_kind`` (``_codec``'s number),
        ``metadata``, ``zero_copy`` and the other LeafInfo fields as plain
        values. Raises as :meth:`info`."""
        return self._infos()[self._index(key)]

    def __getitem__(self, key: Union[str, int]) -> np.ndarray:
        """The leaf at `key` as a read-only array of its dtype and shape: a view
        of the mapped file (no copy) when ``info(key).zero_copy``, else a fresh
        array. A ``str`` leaf is its uint8 UTF-8 bytes; scalars are 0-d arrays.
        Raises KeyNotFoundError (a str key), InvalidArgumentError (an int key
        out of range), ChecksumError (when checksums are verified)."""
        i = self._index(key)
        d = self._infos()[i]
        name, shape = d["dtype"], tuple(d["shape"])
        if d["zero_copy"]:  # the core's one rule (LeafInfo::zero_copy, include/treecask/reader.h)
            arr = (np.empty(shape, _dtypes.to_numpy(name)) if d["byte_length"] == 0
                   else _dtypes.from_bytes(self._c().view(i), name, shape))
        else:
            arr = self._read_array(i, d)
        arr.flags.writeable = False
        return arr

    def read(self, key: Union[str, int], *, verify: Optional[bool] = None) -> np.ndarray:
        """A fresh, writable copy of the leaf (decompressed), of its dtype and
        shape. ``verify`` overrides the archive's checksum setting.
        Raises KeyNotFoundError (a str key), InvalidArgumentError (an int key
        out of range), ChecksumError, CorruptionError."""
        i = self._index(key)
        return self._read_array(i, self._infos()[i], verify)

    def read_many(self, indices: Sequence[int]) -> List[np.ndarray]:
        """``[self.read(i) for i in indices]`` for leaf indices: fresh, writable
        arrays, the whole-byte dtypes read by one bulk call (all cores, pread +
        checksum in one pass). Raises as :meth:`read`."""
        todo = [self._index(i) for i in indices]
        infos = self._infos()
        ds = [infos[i] for i in todo]
        return self._read_many(todo, [d["dtype"] for d in ds], [tuple(d["shape"]) for d in ds])

    def read_rows(self, key: Union[str, int], start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` along axis 0 of an array leaf of rank >= 1,
        touching only the chunks they lie in: an array of shape
        ``(stop - start,) + shape[1:]``. Raises KeyNotFoundError (a str key),
        InvalidArgumentError (an int key out of range, a bad range, rank 0),
        ChecksumError."""
        i = self._index(key)
        d = self._infos()[i]
        start, stop, shape = int(start), int(stop), tuple(d["shape"])
        if len(shape) == 0:
            raise InvalidArgumentError("read_rows needs an array of rank >= 1", file=self._path,
                                       key_path=d["key_path"])
        out = np.empty((max(0, stop - start),) + shape[1:], _dtypes.to_numpy(d["dtype"]))
        self._c().read_slice(i, [start] + [0] * (len(shape) - 1), [stop] + list(shape[1:]), out)
        return out

    def read_slice(self, key: Union[str, int], index: Any = (), *,
                   verify: Optional[bool] = None) -> np.ndarray:
        """``archive.read(key)[index]`` for NumPy basic indexing with step 1,
        reading only the chunks that hold the slice (Archive::read_slice: each
        touched chunk checksummed whole, all cores for reads of >= 8 MiB).

        ``index``: NumPy basic indexing with step 1 (docs/python.md
        "``Archive.read_slice``"). Returns a fresh, writable array of the
        leaf's dtype. Raises KeyNotFoundError (a str key), InvalidArgumentError
        (an int key out of range, an index that is not basic indexing with step
        1, or out of range), ChecksumError, CorruptionError.
        """
        i = self._index(key)
        d = self._infos()[i]
        shape = tuple(int(s) for s in d["shape"])
        start, stop, drop = _basic_box(index, shape, self._path, d["key_path"])
        out = np.empty(tuple(b - a for a, b in zip(start, stop)), _dtypes.to_numpy(d["dtype"]))
        self._c().read_slice(i, list(start), list(stop), out, verify=verify)
        if drop:
            out = out.reshape(tuple(n for k, n in enumerate(out.shape) if k not in drop))
        return out

    def verify(self) -> List[Error]:
        """Checks every chunk of every leaf (checksum, LZ4 decoding, padding):
        one Error (ChecksumError / CorruptionError) per damaged leaf; an empty
        list means the archive is intact. The ``index.cask`` of a sharded
        checkpoint holds no leaf bytes: its verify is the checkpoint's, with
        the shard files beside it (raises NotFoundError naming a missing one,
        CorruptionError naming one of another save or the index for
        overlapping boxes; errors in the list name the shard file). Opened
        with a signature (a local archive): every signed byte too, in the same
        pass on all cores; a shard that does not match is a SignatureError of
        each leaf with a chunk in it, else one naming no leaf, last
        (docs/signing.md "What is verified when")."""
        return list(self._c().verify())

    def load(self, like: Any = None, *, subtree: Optional[str] = None, shardings: Any = None,
             missing: str = "error", extra: str = "ignore", copy: bool = True, cast: bool = False) -> Any:
        """Restores the tree (or a subtree): see :func:`treecask.load`."""
        return _restore.restore(self, like, subtree=subtree, shardings=shardings, missing=missing,
                                extra=extra, copy=copy, cast=cast)

    # -- leaves as values: what a restore assembles --
    def values(self, first: int, count: int, *, copy: bool = True) -> List[Any]:
        """``[self.value(i) for i in range(first, first + count)]``, with every
        array read by one bulk call (all cores, pread + checksum in one pass)
        and no per-leaf dict: the leaf descriptions come as columns.

        With ``copy=False`` the arrays are read-only: views of the mapped file
        for the leaves that have one (``LeafInfo.zero_copy``, the core's
        rule, as a column; their chunks checksummed once by one ``view_many``
        call on all cores), fresh read-only copies for the others (LZ4,
        several parts, sub-byte dtypes).
        Raises InvalidArgumentError when the range runs past the last leaf,
        ChecksumError, CorruptionError."""
        c = self._c()
        names, shapes, kinds, has_metadata, zero_copy = c.leaf_columns(first, count)
        if not copy:
            views = iter(c.view_many(list(itertools.compress(range(first, first + count), zero_copy)), None))
            # No view of the map: fresh copies in one bulk read, read-only like the views.
            rest = [k for k, z in enumerate(zero_copy) if not z]
            copies = iter(self._read_many([first + k for k in rest], [names[k] for k in rest],
                                          [shapes[k] for k in rest]))
            plain = _dtypes.PLAIN_DTYPES
            arrays: List[Any] = []
            for n, s, z in zip(names, shapes, zero_copy):
                arr = next(views).view(plain[n]).reshape(s) if z else next(copies)
                arr.flags.writeable = False  # (a view of the map is already)
                arrays.append(arr)
        else:
            arrays = self._read_many(list(range(first, first + count)), names, shapes)
        if kinds.count(_codec.ARRAY) != count or has_metadata.count(0) != count:
            for k, kind in enumerate(kinds):  # (kind_value gives an array leaf back as it is)
                impl = self._infos()[first + k]["metadata"].get(J.KEY_IMPL_META) if has_metadata[k] else None
                arrays[k] = (J.wrap_key(arrays[k], impl) if impl is not None and kind == _codec.ARRAY
                             else _codec.kind_value(kind, arrays[k]))
        return arrays

    def value(self, key: Union[str, int], array: Optional[np.ndarray] = None) -> Any:
        """The leaf as the value that was saved: a NumPy array, a Python int,
        float, bool or str for the scalar value kinds, a jax PRNG key array
        for a key. `array`: its array when the caller has read it already
        (:meth:`read_many`). Raises as :meth:`read`."""
        i = self._index(key)
        d = self._infos()[i]
        if array is None:
            array = self._read_array(i, d)
        impl = d["metadata"].get(J.KEY_IMPL_META)
        return (J.wrap_key(array, impl) if impl is not None and d["value_kind"] == _codec.ARRAY
                else _codec.kind_value(d["value_kind"], array))

    def place(self, key: Union[str, int], sharding: Any) -> Any:
        """The leaf as a jax.Array on `sharding` (a concrete jax Sharding): every
        distinct box the local devices hold read by one Archive::read_slices
        call into its own buffer, which the CPU backend adopts without a copy
        (:meth:`_read_boxes`), or once per job (:attr:`single_read`). A leaf of a dtype
        JAX cannot hold exactly (64-bit while ``jax_enable_x64`` is off, or
        one its backend lacks) comes back as its NumPy array at full width
        instead (docs/python.md "Dtypes on restore"). Of a sharded checkpoint
        (:class:`treecask.ShardedArchive`, over the *global* array), a PRNG key
        array (saved as its key data: one more, trailing, dimension) and a 0-d
        leaf are read block by block into the callback, never ``device_put``
        (a collective in a multi-process job).
        Raises as :meth:`read`."""
        import jax

        i = self._index(key)
        d = self._infos()[i]
        impl = d["metadata"].get(J.KEY_IMPL_META)
        shape = tuple(int(s) for s in d["shape"])
        dtype = _dtypes.to_numpy(d["dtype"])
        if self._place_by_slices and (impl is not None or not shape and not J.jax_cannot_hold(dtype)):
            data = jax.make_array_from_callback(shape, sharding, lambda index: self.read_slice(i, index), dtype=dtype)
            return J.wrap_key(data, impl) if impl is not None else data
        if impl is not None:
            return jax.device_put(self.value(i), sharding)
        if J.jax_cannot_hold(dtype):
            return self._read_array(i, d)
        if len(shape) == 0:
            return jax.device_put(self._read_array(i, d), sharding)
        # a single-read placement (single_read), unless this leaf is read without it
        inter = _replicas.read_once_sharding(sharding, shape, d["dtype"]) if self.single_read else None
        placed = None if inter is None else _replicas.place_read_once(
            lambda boxes: self._read_boxes(i, dtype, boxes), shape, dtype, sharding, inter, file=self._path,
            key_path=d["key_path"])
        if placed is not None:
            return placed
        boxes = self._read_boxes(i, dtype, {_replicas.box_of(index, shape)
                                            for index in sharding.addressable_devices_indices_map(shape).values()})
        return jax.make_array_from_callback(shape, sharding, lambda index: boxes[_replicas.box_of(index, shape)],
                                            dtype=dtype)

    @property
    def single_read(self) -> bool:
        """Whether :meth:`place` fetches each stored byte once per
        ``jax.distributed`` job (``treecask.open``'s ``single_read``, default
        True; ``_replicas.py``): then a collective, every process placing the
        same leaves in the same order."""
        return getattr(self, "_single_read", True)

    # -- internals --
    def _read_boxes(self, i: int, dtype: np.dtype, boxes) -> Dict[Tuple[Tuple[int, ...], Tuple[int, ...]], np.ndarray]:
        """Each box (start, stop) of leaf i read into its own 64-byte-aligned array by one read_slices call."""
        out = {b: _aligned_empty(tuple(e - a for a, e in zip(*b)), dtype) for b in boxes}
        keys = list(out)
        self._c().read_slices(i, [list(b[0]) for b in keys], [list(b[1]) for b in keys],
                              [out[b] for b in keys], None)
        _replicas.placed_bytes += sum(out[b].nbytes for b in keys)
        return out

    def _read_many(self, indices: List[int], names: Sequence[str], shapes: Sequence[Tuple[int, ...]]) -> List[Any]:
        """Fresh arrays of the leaves `indices`: one bulk call for the whole-byte dtypes, packed ones one by one."""
        plain = _dtypes.PLAIN_DTYPES
        arrays = [np.empty(s, plain[n]) if n in plain else None for n, s in zip(names, shapes)]
        if _dtypes.PACKED.isdisjoint(names):
            self._c().read_many(indices, arrays, None)
            return arrays
        todo = [k for k, x in enumerate(arrays) if x is not None]
        self._c().read_many([indices[k] for k in todo], [arrays[k] for k in todo], None)
        infos = self._infos()
        return [x if x is not None else self._read_array(i, infos[i]) for i, x in zip(indices, arrays)]

    def _read_array(self, i: int, d: Dict[str, Any], verify: Optional[bool] = None) -> np.ndarray:
        """A fresh, writable array of leaf i; a sub-byte dtype unpacked by a whole-leaf read_slice."""
        name, shape = d["dtype"], tuple(d["shape"])
        out = np.empty(shape, _dtypes.to_numpy(name))
        if name in _dtypes.PACKED:
            self._c().read_slice(i, [0] * len(shape), list(shape), out.view(np.uint8), verify=verify)
        else:
            self._c().read(i, out, verify=verify)
        return out


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
    """The manifest's leaf descriptions as a sequence of dicts, each built on first access."""

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
