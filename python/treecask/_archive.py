"""The archive: :func:`open` and the :class:`Archive` class, a read-only
memory-mapped archive and its reads (leaf descriptions, zero-copy views,
whole-leaf, row, N-d slice and bulk reads, placement onto jax shardings).
Turning leaves back into a pytree is ``_restore.py``'s job."""

from __future__ import annotations

import collections.abc
import itertools
import math
import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _codec, _dtypes
from . import _jaxutil as J
from . import _tree as T
from . import _core
# The public types lived here before _types.py; pickles written then name
# treecask._archive.LeafInfo (and ShardingInfo, TreeNode, SaveStats): keep them importable.
from ._types import LeafInfo, PathLike, SaveStats, ShardingInfo, TreeNode, leaf_info  # noqa: F401
from .errors import Error, InvalidArgumentError


class Archive:
    """A read-only, memory-mapped treecask archive.

    ``Archive(path)`` (or :func:`treecask.open`) maps the file and checks its
    header and manifest; the cost is proportional to the manifest, not to the
    tensor bytes. Leaves are read lazily:

    * ``archive["a/b"]`` -- a read-only ``numpy.ndarray`` of the leaf's dtype and
      shape that *views the mapped file* (no copy) when ``info(key).zero_copy``
      (raw, one part, not a packed sub-byte dtype), else a fresh read-only array;
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

    def _reader(self) -> Any:
        """The core object whose ``read(i, out, verify=)`` and
        ``read_slice(i, start, stop, out, verify=)`` read leaf i: the archive
        itself here, the directory of shard files in ShardedCheckpoint."""
        return self._c()

    def __repr__(self) -> str:
        state = "closed" if self._core is None else f"{len(self)} leaves"
        return f"<treecask.Archive {self._path!r} ({state})>"

    # -- archive-level facts --
    @property
    def path(self) -> str:
        """The path the archive was opened from, as given to open() (a str)."""
        return self._path

    @property
    def file_size(self) -> int:
        """Size of the archive file in bytes, as it was at open()."""
        return int(self._c().file_size)

    @property
    def format_version(self) -> Tuple[int, int]:
        """(major, minor) of the format the file was written in (SPEC.md "Versioning")."""
        return tuple(self._c().format_version)

    @property
    def library_version(self) -> str:
        """Version of the library that wrote the file."""
        return self._c().library_version

    @property
    def created_unix_ns(self) -> int:
        """When the writer committed the file: nanoseconds since the Unix epoch (UTC)."""
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
        axes, sharding, metadata). Raises KeyNotFoundError (a str key),
        InvalidArgumentError (an int key out of range)."""
        return leaf_info(self._infos()[self._index(key)])

    def __getitem__(self, key: Union[str, int]) -> np.ndarray:
        """The leaf at `key` as a read-only array of its dtype and shape: a view
        of the mapped file (no copy) when ``info(key).zero_copy``, else a fresh
        array. A ``str`` leaf is its uint8 UTF-8 bytes; scalars are 0-d arrays.
        Raises KeyNotFoundError (a str key), InvalidArgumentError (an int key
        out of range), ChecksumError (when checksums are verified)."""
        i = self._index(key)
        d = self._infos()[i]
        name, shape = d["dtype"], tuple(d["shape"])
        if d["zero_copy"]:  # the binding's one rule (_core.zero_copy)
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
        Raises KeyNotFoundError (a str key), InvalidArgumentError (an int key
        out of range), ChecksumError, CorruptionError."""
        i = self._index(key)
        return self._read_array(i, self._infos()[i], verify)

    def read_rows(self, key: Union[str, int], start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` along axis 0 of an array leaf of rank >= 1,
        touching only the chunks they lie in: an array of shape
        ``(stop - start,) + shape[1:]``. Raises KeyNotFoundError (a str key),
        InvalidArgumentError (an int key out of range, a bad range, rank 0),
        ChecksumError."""
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
        writable array of the leaf's dtype (sub-byte dtypes one element per
        byte, as ml_dtypes holds them). Raises KeyNotFoundError (a str key),
        InvalidArgumentError (an int key out of range, a step other than 1,
        ``None``/newaxis, fancy indexing, too many indices, an int index out
        of range), ChecksumError, CorruptionError.
        """
        i = self._index(key)
        d = self._infos()[i]
        shape = tuple(int(s) for s in d["shape"])
        start, stop, drop = _basic_box(index, shape, self._path, d["key_path"])
        out = np.empty(tuple(b - a for a, b in zip(start, stop)), _dtypes.to_numpy(d["dtype"]))
        self._reader().read_slice(i, list(start), list(stop), out, verify=verify)
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
        from ._restore import restore  # _restore imports this module

        return restore(self, like, subtree=subtree, shardings=shardings, missing=missing, extra=extra,
                       copy=copy)

    # -- internals --
    def _values(self, first: int, count: int, copy: bool = True) -> List[Any]:
        """``[self._value(i) for i in range(first, first + count)]``, with every
        array read by one bulk call (all cores, pread + checksum in one pass)
        and no per-leaf dict: the leaf descriptions come as columns.

        With ``copy=False`` the arrays are read-only: views of the mapped file
        for the leaves that have one (``LeafInfo.zero_copy``, the binding's
        rule, as a column; their chunks checksummed once by one ``view_many``
        call on all cores), fresh read-only copies for the others (LZ4,
        several parts, sub-byte dtypes)."""
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
                if z:
                    arrays.append(next(views).view(plain[n]).reshape(s))
                else:
                    arr = next(copies)
                    arr.flags.writeable = False
                    arrays.append(arr)
        else:
            arrays = self._read_many(list(range(first, first + count)), names, shapes)
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

    def _read_many(self, indices: List[int], names: Sequence[str], shapes: Sequence[Tuple[int, ...]]) -> List[Any]:
        """Fresh, writable arrays of the leaves `indices` (of dtype names
        `names` and shapes `shapes`): one bulk call (all cores, pread +
        checksum in one pass) for the whole-byte dtypes; the packed sub-byte
        leaves one by one (_read_array unpacks them)."""
        plain = _dtypes.PLAIN_DTYPES
        empty = np.empty
        arrays = [empty(s, plain[n]) if n in plain else None for n, s in zip(names, shapes)]
        if _dtypes.PACKED.isdisjoint(names):
            self._c().read_many(indices, arrays, None)
            return arrays
        todo = [k for k, x in enumerate(arrays) if x is not None]
        self._c().read_many([indices[k] for k in todo], [arrays[k] for k in todo], None)
        infos = self._infos()
        return [x if x is not None else self._read_array(i, infos[i]) for i, x in zip(indices, arrays)]

    def _prefetch(self, indices: Sequence[int]) -> Dict[int, np.ndarray]:
        """{leaf index: fresh array} of the leaves `indices`, read by
        _read_many: the arrays a restore into a template takes its leaves
        from (_restore._like)."""
        infos = self._infos()
        todo = [int(i) for i in indices]
        ds = [infos[i] for i in todo]
        return dict(zip(todo, self._read_many(todo, [d["dtype"] for d in ds], [tuple(d["shape"]) for d in ds])))

    def _read_array(self, i: int, d: Dict[str, Any], verify: Optional[bool] = None) -> np.ndarray:
        """A fresh, writable array of leaf i (description `d`): sub-byte dtypes
        unpacked one element per byte by a whole-leaf slice read
        (Archive::read_slice), as ml_dtypes holds them."""
        name, shape = d["dtype"], tuple(d["shape"])
        out = np.empty(shape, _dtypes.to_numpy(name))
        if name in _dtypes.PACKED:
            self._reader().read_slice(i, [0] * len(shape), list(shape), out.view(np.uint8), verify=verify)
        else:
            self._reader().read(i, out, verify=verify)
        return out

    def _read_rows(self, i: int, d: Dict[str, Any], start: int, stop: int) -> np.ndarray:
        name, shape = d["dtype"], tuple(d["shape"])
        if len(shape) == 0:
            raise InvalidArgumentError("read_rows needs an array of rank >= 1", file=self._path,
                                       key_path=d["key_path"])
        out = np.empty((max(0, stop - start),) + shape[1:], _dtypes.to_numpy(name))
        self._reader().read_slice(i, [start] + [0] * (len(shape) - 1), [stop] + list(shape[1:]), out)
        return out

    def _value(self, i: int, arr: Optional[np.ndarray] = None) -> Any:
        """Leaf i as numpy / Python value (PRNG keys as jax key arrays); `arr`:
        its array when the caller has read it already (a prefetched one)."""
        d = self._infos()[i]
        if arr is None:
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


def _index_bounds(index: Any, shape: Tuple[int, ...]) -> Tuple[List[int], List[int], Optional[Tuple[Any, ...]]]:
    """(start, stop, leftover) of a device's index over an array of `shape`
    (a slice or a tuple of slices, as Sharding.devices_indices_map and
    jax.make_array_from_callback give it): the box [start, stop) holding it,
    and the indexing still to apply to that box, None when it is the box
    itself (every slice of step 1); a dimension sliced with another step is
    taken whole and sliced by the leftover."""
    index = tuple(index) if isinstance(index, tuple) else (index,)
    start, stop, rest, plain = [], [], [], True
    for d, n in enumerate(shape):
        sl = index[d] if d < len(index) else slice(None)
        b, e, step = sl.indices(n)
        if step == 1:
            start.append(b)
            stop.append(max(b, e))
            rest.append(slice(None))
        else:
            start.append(0)
            stop.append(n)
            rest.append(sl)
            plain = False
    return start, stop, None if plain else tuple(rest)


def _index_box(index: Any, shape: Tuple[int, ...]) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """(start, stop) of a shard index of step-1 slices (_index_bounds);
    InvalidArgumentError for a slice of another step."""
    start, stop, rest = _index_bounds(index, shape)
    if rest is not None:
        k, sl = next((k, sl) for k, sl in enumerate(rest) if sl != slice(None))
        raise InvalidArgumentError(f"a shard index with step {sl.indices(shape[k])[2]} along dimension {k}")
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

