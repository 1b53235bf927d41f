"""The sharded checkpoint directory (format 3.1, format/SPEC.md "Sharded
checkpoints") as a reader: :class:`ShardedArchive`, the
:class:`~treecask._reader.Reader` over one ``_core.ShardedArchive``, whose
binding has ``_core.Archive``'s read methods over the global leaves (the
index archive's facts, treedef and key lookups; every leaf assembled from the
saved boxes, none a view of a map). Writing one is ``_distributed.py``'s job."""

from __future__ import annotations

from typing import Any

import treecask._core as _core

from . import _dtypes, stores
from . import _jaxutil as J
from ._reader import Reader


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

    files = property(lambda self: list(self._c().files()),
                     doc="Names of the shard files the index refers to (a sorted list of str).")

    @property
    def file_size(self) -> int:
        """Bytes of the index and every shard file together."""
        s = self._c()
        return int(s.index.file_size) + sum(int(s.file(f).file_size) for f in s.files())

    def place(self, key, sharding: Any) -> Any:
        """The leaf as a jax.Array on `sharding`, as :meth:`treecask.Archive.place`
        over the *global* array (each block one global hyperslab read, or a part
        of it exchanged over the job's collectives: :attr:`single_read`). A
        PRNG key array (saved as its key data: one more, trailing, dimension)
        and a 0-d leaf are read block by block into the callback, never
        ``device_put`` (a collective in a multi-process job)."""
        i = self._index(key)
        d = self._infos()[i]
        impl = d["metadata"].get(J.KEY_IMPL_META)
        dtype = _dtypes.to_numpy(d["dtype"])
        if impl is None and (d["shape"] or J.jax_cannot_hold(dtype)):
            return super().place(i, sharding)
        import jax

        data = jax.make_array_from_callback(tuple(d["shape"]), sharding, lambda index: self.read_slice(i, index),
                                            dtype=dtype)
        return J.wrap_key(data, impl) if impl is not None else data
