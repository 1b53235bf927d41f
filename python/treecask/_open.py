"""The entry points above every reader: :func:`open` (an archive file or a
sharded checkpoint directory, whichever `path` is) and :func:`load` (open,
then restore)."""

from __future__ import annotations

import os
from typing import Any, Optional

from . import _core, stores
from ._archive import Archive
from ._reader import Reader
from ._sharded import ShardedArchive
from ._types import PathLike
from .errors import InvalidArgumentError, NotFoundError


def open(path: PathLike = "", *, verify_checksums: bool = True,  # noqa: A001
         validate_structure: bool = True, storage_options: Optional[dict] = None,
         store: Optional[stores.Store] = None, single_read: bool = True) -> Reader:
    """Opens an archive for reading: ``with treecask.open(p) as a: a["w"]``.

    ``verify_checksums`` (default True) checks each chunk's XXH3 before its
    bytes are returned; ``validate_structure`` (default True) walks the file's
    LMDB index pages before mapping it, so a damaged or hostile file raises
    instead of crashing. Turn them off only for trusted files on hot paths.
    Returns a :class:`Reader`: an :class:`Archive` for an archive file, a
    :class:`ShardedArchive` for a sharded checkpoint directory (written
    by a multi-process save; SPEC.md "Sharded checkpoints"), with the same
    interface over the global arrays.

    ``store`` (a :class:`treecask.stores.Store`) reads ``path`` inside it:
    ``treecask.open("step_1.cask", store=ObjectStore(obstore_store))``
    (docs/stores.md). Without it, ``path`` is a file system path or the URL
    of an object store, a short way to name a store and a path in it:
    ``s3://bucket/key``, ``gs://bucket/key``, ``az://container/key``,
    ``http(s)://host/path`` (docs/remote.md; an https URL is requested
    exactly as given, its query kept: presigned and SAS URLs). An object is
    read by range requests (obstore): the open costs one round trip on a
    file of this version, every read fetches only the chunks it needs, and
    every check and checksum of a local read applies (SPEC.md "Remote
    reading"). A path that names no object but a "directory" holding
    ``index.cask`` (or ends with "/") opens as a ShardedArchive.
    ``storage_options`` overrides the environment's configuration of a
    store made from a URL (obstore config keys: ``endpoint``,
    ``access_key_id``, ``secret_access_key``, ``region``, ...). Leaves read
    from an object store are never views (``info(k).zero_copy`` is False).

    ``single_read`` (default True): in a ``jax.distributed`` job of several
    processes, ``place`` (and ``load(shardings=...)``) onto a sharding whose
    blocks devices of several processes hold fetches each stored byte once
    in the job, a part of each block by each of those processes, and
    exchanges the parts over the job's collectives; every process must then
    place the same leaves in the same order. False: each process reads every
    block its devices hold (docs/python.md "Multi-process save and restore").

    Raises NotFoundError, NotAnArchiveError (an empty file or object
    included), VersionError, CorruptionError, IoError, UnsupportedError (a
    URL scheme treecask does not serve), InvalidArgumentError (credentials
    inside a bucket URL; ``storage_options`` with a store object).
    """
    reader = _open(path, verify_checksums=verify_checksums, validate_structure=validate_structure,
                   storage_options=storage_options, store=store)
    reader._single_read = bool(single_read)
    return reader


#: The index metadata key of a treecask.orbax checkpoint directory of items
#: (treecask/orbax/_layout.py), which is not one archive.
_ITEMS_DIRECTORY_KEY = "treecask.orbax.items_directory"


def _not_items_directory(reader: Reader) -> Reader:
    """`reader`, unless it opened the index of a treecask.orbax checkpoint
    directory of items (one archive per item): then InvalidArgumentError
    saying to open an item, instead of an empty tree."""
    if isinstance(reader, ShardedArchive) and _ITEMS_DIRECTORY_KEY in reader.metadata:
        shown = reader.path
        reader.close()
        raise InvalidArgumentError("a treecask.orbax checkpoint directory (one archive per item), not one archive: "
                                   "open or load one of its items (each entry but index.cask is an archive, "
                                   "e.g. <path>/state), or restore it with treecask.orbax", file=shown)
    return reader


def _open(path: PathLike, *, verify_checksums: bool, validate_structure: bool,
          storage_options: Optional[dict], store: Optional[stores.Store]) -> Reader:
    """open() without its reader options: the reader `path` names."""
    return _not_items_directory(_open_any(path, verify_checksums=verify_checksums,
                                          validate_structure=validate_structure,
                                          storage_options=storage_options, store=store))


def _open_any(path: PathLike, *, verify_checksums: bool, validate_structure: bool,
              storage_options: Optional[dict], store: Optional[stores.Store]) -> Reader:
    st, p = stores.resolve(path, store, storage_options)
    local = st.local_path(p)
    if local is not None:  # the readers are given the store resolved here, not the path again
        reader = ShardedArchive if _core.is_sharded(local) else Archive
        return reader(p, verify_checksums=verify_checksums, validate_structure=validate_structure, store=st)
    kw = dict(verify_checksums=verify_checksums, store=st)
    if os.fspath(path).endswith("/"):  # names a "directory": a sharded checkpoint
        return ShardedArchive(p, **kw)
    try:
        return Archive(p, **kw)
    except NotFoundError:
        if "?" in st.display(p):  # a signed URL names one object, never a directory
            raise
        try:
            return ShardedArchive(p, **kw)
        except NotFoundError:
            pass
        raise


def load(path: PathLike, like: Any = None, *, subtree: Optional[str] = None, shardings: Any = None,
         missing: str = "error", extra: str = "ignore", copy: bool = True, cast: bool = False,
         storage_options: Optional[dict] = None, store: Optional[stores.Store] = None,
         single_read: bool = True) -> Any:
    """Restores a pytree from an archive.

    Args:
      path: the archive file, a sharded checkpoint directory, or the URL of
        either in an object store (s3://, gs://, az://, http(s)://; see
        :func:`open`, ``storage_options`` as there); with ``store``, the
        path of either inside that :class:`treecask.stores.Store`.
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
        straight into its own buffer, each chunk once (Reader.place): one
        ``jax.sharding.Sharding`` for every array, a pytree of shardings (or None) with the result's structure (a subtree may stand
        for everything under it), or a callable ``(key_path, LeafInfo) ->
        Sharding | None``. Overrides ``like``'s own shardings. In a
        ``jax.distributed`` job, call it the same way in every process: a
        block that devices of several processes hold is fetched once in the
        job and spread over its collectives (``single_read``).
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
      cast: False (default): a leaf whose dtype differs from ``like``'s raises
        ShapeError ("dtype mismatch"). True: it is converted to ``like``'s dtype
        (NumPy ``astype`` rules: a float64 checkpoint into a float32 or
        bfloat16 template, an int4 leaf into int8...), as Orbax restores into
        a target; shapes must still agree. Only with ``like``.

      single_read: True (default): each stored byte fetched once per
        ``jax.distributed`` job (see :func:`open`); False: every process reads
        every block its devices hold, as a single process does.
    Returns:
      The restored tree.

    Raises:
      NotFoundError, NotAnArchiveError, VersionError, CorruptionError, ChecksumError;
      KeyNotFoundError: ``subtree`` names nothing in the archive;
      StructureError: ``like`` asks for a leaf the checkpoint lacks (missing="error")
        or the checkpoint has leaves ``like`` lacks (extra="error");
      ShapeError: a leaf's shape differs from ``like``'s ("shape mismatch"), or
        its dtype does without ``cast`` ("dtype mismatch"; the message names the
        key path and both dtypes/shapes);
      InvalidArgumentError: a bad option, or a ``subtree`` that is not a valid
        key path (a "~" not followed by 0 or 1: SPEC.md "Key paths").
    """
    with open(path, storage_options=storage_options, store=store, single_read=single_read) as a:  # a file, a sharded checkpoint, or a URL of either
        return a.load(like, subtree=subtree, shardings=shardings, missing=missing, extra=extra, copy=copy,
                      cast=cast)
