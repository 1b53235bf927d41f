"""The sharded checkpoint directory (format 3.1, format/SPEC.md "Sharded
checkpoints") as a reader: :class:`ShardedArchive`, the
:class:`~treecask._reader.Reader` over one ``_core.ShardedArchive``, whose
binding has ``_core.Archive``'s read methods over the global leaves (the
index archive's facts, treedef and key lookups; every leaf assembled from the
saved boxes, none a view of a map). Writing one is ``_distributed.py``'s job."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

import treecask._core as _core

from . import _dtypes, _replicas, stores
from . import _jaxutil as J
from ._reader import Reader, _index_bounds


class ShardedArchive(Reader):
    """A sharded checkpoint directory opened for reading: the interface of
    :class:`treecask.Archive` over the *global* arrays (``info(k).shards``
    the saved boxes); a whole leaf or any hyperslab is assembled from the
    parts of the boxes that intersect it (the C++ ShardedArchive), every file
    opened through one handle of the directory, so a checkpoint replaced
    meanwhile is read whole, old or new (docs/python.md "Multi-process save
    and restore"). ``signature`` and ``public_key``: as for
    :func:`treecask.open`, the directory signed as model_signing signs one.

    Raises what :class:`treecask.Archive` raises, and CorruptionError when a
    shard file is not the one a format 3.1 index was committed with (another
    step, save or job: the message names the file, both manifest fingerprints
    and both save ids), lacks a box the index names, or the boxes do not tile
    a leaf.
    """

    def __init__(self, path, *, verify_checksums: bool = True, validate_structure: bool = True,
                 storage_options=None, store: "stores.Store | None" = None, signature=None, public_key=None):
        # one handle of a local directory, else each object read by range
        self._open_source("open_sharded", path, store, storage_options, signature, public_key,
                          verify_checksums=verify_checksums, validate_structure=validate_structure)

    def __repr__(self) -> str:
        state = "closed" if self._core is None else f"{len(self)} leaves, {len(self._core.files())} shard files"
        return f"<treecask.ShardedArchive {_core.redact_url(self._path)!r} ({state})>"

    @property
    def files(self) -> List[str]:
        """Names of the shard files the index refers to (sorted)."""
        return list(self._c().files())

    @property
    def file_size(self) -> int:
        """Bytes of the index and every shard file together."""
        s = self._c()
        return int(s.index.file_size) + sum(int(s.file(f).file_size) for f in s.files())

    def read_slice(self, key, index: Any = (), *, verify: Optional[bool] = None) -> np.ndarray:
        """``checkpoint.read(key)[index]`` for NumPy basic indexing with step 1
        (as :meth:`treecask.Archive.read_slice`) over the *global* array,
        reading only the saved boxes it intersects and, in each, only the
        chunks that hold it (ShardedArchive::read_slice). Sub-byte leaves
        (int4, uint4, ...) come one element per byte, as ml_dtypes holds them.
        Raises KeyNotFoundError, InvalidArgumentError, ChecksumError."""
        return super().read_slice(key, index, verify=verify)

    def place(self, key, sharding: Any) -> Any:
        """The leaf as a jax.Array on `sharding`: each addressable device's
        block is read with one global hyperslab read straight into its buffer
        -- or, for a block replicated over processes, a part of it, the parts
        exchanged over the job's collectives (:attr:`single_read`). A leaf of
        a dtype JAX cannot hold exactly (64-bit while ``jax_enable_x64`` is
        off, or one its backend lacks) comes back as the whole global NumPy
        array at full width instead (docs/python.md "Dtypes on restore")."""
        import jax

        i = self._index(key)
        d = self._infos()[i]
        sharded = self._c()
        impl = d["metadata"].get(J.KEY_IMPL_META)
        shape = tuple(d["shape"])
        dtype = _dtypes.to_numpy(d["dtype"])
        if impl is None and J.jax_cannot_hold(dtype):
            return self.read(i)
        if shape and impl is None:
            placed = self._place_read_once(i, d, sharding)
            if placed is not None:
                return placed
        cache: Dict[Tuple[Tuple[int, ...], Tuple[int, ...]], np.ndarray] = {}

        def fetch(index):
            start, stop, rest = _index_bounds(index, shape)
            k = (tuple(start), tuple(stop))
            block = cache.get(k)
            if block is None:
                block = np.empty([e - b for b, e in zip(start, stop)], dtype)
                sharded.read_slice(i, start, stop, block)
                _replicas.placed_bytes += block.nbytes
                cache[k] = block
            return block if rest is None else block[rest]

        data = jax.make_array_from_callback(shape, sharding, fetch, dtype=dtype)
        # A PRNG key array is saved as its key data (one more, trailing, dimension).
        return J.wrap_key(data, impl) if impl is not None else data

