"""The single-file archive: :class:`Archive`, a read-only memory-mapped
archive file, the :class:`~treecask._reader.Reader` over one ``_core.Archive``
(zero-copy views of the map, bulk reads of many leaves in one call)."""

from __future__ import annotations


import treecask._core as _core

from . import stores
from ._reader import Reader
# The public types lived here before _types.py; pickles written then name
# treecask._archive.LeafInfo (and ShardingInfo, TreeNode, SaveStats): keep them importable.
from ._types import LeafInfo, PathLike, SaveStats, ShardingInfo, TreeNode  # noqa: F401
# Read helpers that lived here before _reader.py.
from ._reader import _LeafInfos, _aligned_empty, _basic_box  # noqa: F401


class Archive(Reader):
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

    Leaves are named as :class:`~treecask.Reader` says. ``path`` may be the
    URL of an object in a store (read by range requests, no leaf a view), and
    ``storage_options``, ``signature`` and ``public_key`` are as for
    :func:`treecask.open`.

    Raises NotFoundError, NotAnArchiveError, VersionError, CorruptionError, IoError,
    UnsupportedError (a URL scheme treecask does not serve), SignatureError.
    """

    def __init__(self, path: PathLike, *, verify_checksums: bool = True, validate_structure: bool = True,
                 storage_options=None, store: "stores.Store | None" = None, signature=None, public_key=None):
        self._open_source("open_archive", path, store, storage_options, signature, public_key,
                          verify_checksums=verify_checksums, validate_structure=validate_structure)

    def __repr__(self) -> str:
        state = "closed" if self._core is None else f"{len(self)} leaves"
        return f"<treecask.Archive {_core.redact_url(self._path)!r} ({state})>"
