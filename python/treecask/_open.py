"""The entry points above every reader: :func:`open` (an archive file or a
sharded checkpoint directory, whichever `path` is), :func:`load` (open,
then restore) and :func:`verify` (open, then check everything)."""

from __future__ import annotations

import contextlib
import os
from typing import Any, Mapping, Optional

import treecask._core as _core

from . import _signing, stores
from ._archive import Archive
from ._reader import Reader
from ._sharded import ShardedArchive
from ._signing import KeySource
from ._types import PathLike
from .errors import Error, InvalidArgumentError, NotFoundError


def open(path: PathLike = "", *, verify_checksums: bool = True,  # noqa: A001
         validate_structure: bool = True, storage_options: Optional[dict] = None,
         store: Optional[stores.Store] = None, single_read: bool = True,
         signature: Optional[KeySource] = None, public_key: Optional[KeySource] = None) -> Reader:
    """Opens an archive for reading: ``with treecask.open(p) as a: a["w"]``.

    ``verify_checksums`` (default True) checks each chunk's XXH3 before its
    bytes are returned; ``validate_structure`` (default True) walks the file's
    LMDB index pages before mapping it, so a damaged or hostile file raises
    instead of crashing. Turn them off only for trusted files on hot paths.
    Returns a :class:`Reader`: an :class:`Archive` for an archive file, a
    :class:`ShardedArchive` for a sharded checkpoint directory (written
    by a multi-process save; SPEC.md "Sharded checkpoints"), with the same
    interface over the global arrays.

    ``store`` (a :class:`treecask.stores.Store`) reads ``path`` inside it
    (docs/stores.md). Without it, ``path`` is a file system path or the URL
    of an object: ``s3://``, ``gs://``, ``az://``, ``http(s)://`` (an https
    URL requested as given, presigned and SAS URLs included), read by range
    requests with every check of a local read (docs/remote.md; SPEC.md
    "Remote reading"); a prefix holding ``index.cask`` (or ending with "/")
    opens as a ShardedArchive. ``storage_options`` overrides the
    environment's configuration of a store made from a URL (obstore config
    keys). Leaves read from an object store are never views.

    ``single_read`` (default True): in a ``jax.distributed`` job of several
    processes, ``place`` (and ``load(shardings=...)``) onto a sharding whose
    blocks devices of several processes hold fetches each stored byte once
    in the job, a part of each block by each of those processes, and
    exchanges the parts over the job's collectives; every process must then
    place the same leaves in the same order. False: each process reads every
    block its devices hold (docs/python.md "Multi-process save and restore").

    ``signature`` and ``public_key`` (both or neither): a verified open of an
    archive or checkpoint signed with OpenSSF model signing (``model_signing
    sign key``, or :func:`treecask.sign`). The signature is the bundle's path,
    its URL or its bytes; the public key a PEM file's path or its bytes. The
    envelope is checked once, then every byte the reader hands out or trusts
    is covered by signed ranges whose SHA-256 it has checked (costs:
    docs/signing.md). ``verify_checksums`` stays as set.

    Raises NotFoundError, NotAnArchiveError (an empty file or object
    included), VersionError, CorruptionError, IoError, UnsupportedError (a
    URL scheme treecask does not serve), InvalidArgumentError (credentials
    inside a bucket URL; ``storage_options`` with a store object; only one
    of ``signature`` / ``public_key``), SignatureError (the signature does
    not verify or is not for this archive, here or at a later read: the
    message names the file and byte range).
    """
    if signature is not None or public_key is not None:  # read once, here (a URL included)
        check = _signing.signature_check(signature, public_key, storage_options, file=os.fspath(path))
        signature, public_key = check[0].encode(), check[1].encode()
    loc = stores.resolve(path, store, storage_options)  # resolved once: the readers receive the Location
    reader = _open_any(loc, dict(verify_checksums=verify_checksums, validate_structure=validate_structure,
                                 signature=signature, public_key=public_key))
    if isinstance(reader, ShardedArchive) and ITEMS_DIRECTORY_KEY in reader.metadata:
        reader.close()
        raise InvalidArgumentError("a treecask.orbax checkpoint directory (one archive per item), not one archive: "
                                   "open or load one of its items (each entry but index.cask is an archive, "
                                   "e.g. <path>/state), or restore it with treecask.orbax", file=reader.path)
    reader._single_read = bool(single_read)
    return reader


#: The index metadata key of a treecask.orbax checkpoint directory of items
#: (treecask/orbax/_layout.py), which is not one archive: open() refuses it.
ITEMS_DIRECTORY_KEY = "treecask.orbax.items_directory"


def _open_any(loc: stores.Location, kw: Any) -> Reader:
    """The reader of ``loc``: an archive or a sharded checkpoint, whichever it is (in an object
    store, which has no directories: as a signature's statement says, treecask::signed_model;
    unsigned, the object, else a "directory" holding index.cask when there is no such object)."""
    sharded = loc.is_sharded()
    if sharded is None and kw["signature"] is not None:
        sharded = _core.signed_model(kw["signature"].decode())[1]
    if sharded is not None:
        return (ShardedArchive if sharded else Archive)(loc, **kw)
    try:
        return Archive(loc, **kw)
    except NotFoundError:
        with contextlib.suppress(NotFoundError):
            return ShardedArchive(loc, **kw)
        raise


def load(path: PathLike, like: Any = None, *, subtree: Optional[str] = None, shardings: Any = None,
         missing: str = "error", extra: str = "ignore", copy: bool = True, cast: bool = False,
         storage_options: Optional[dict] = None, store: Optional[stores.Store] = None,
         single_read: bool = True, signature: Optional[KeySource] = None,
         public_key: Optional[KeySource] = None) -> Any:
    """Restores a pytree from an archive.

    Args:
      path: the archive file, a sharded checkpoint directory, or the URL of
        either in an object store (s3://, gs://, az://, http(s)://; see
        :func:`open`, ``storage_options`` as there); with ``store``, the
        path of either inside that :class:`treecask.stores.Store`.
      like: optional template. Without it: nested dicts, lists and tuples of
        writable ``numpy.ndarray`` leaves and Python scalars / strings (the
        metadata boxes treecask knows rebuilt when their library is installed).
        With it: exactly ``like``'s structure and types, each array leaf read
        from the same key path (jax arrays on ``like``'s sharding), every other
        leaf taken from ``like``; leaves ``like`` lacks are not read
        (docs/python.md "``load`` with ``like``").
      subtree: key path prefix (e.g. ``"params/encoder"``): restore only that
        part, reading only its bytes; ``like`` then describes that part.
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
        False: every array leaf is a *read-only* ``numpy.ndarray``, a view of
        the memory-mapped file where the leaf has one (``info(key).zero_copy``;
        else a read-only copy), each leaf's chunks checksummed once before the call returns; only
        without ``like`` and ``shardings`` (InvalidArgumentError otherwise;
        docs/python.md "``copy=False``").
      cast: False (default): a leaf whose dtype differs from ``like``'s raises
        ShapeError ("dtype mismatch"). True: it is converted to ``like``'s dtype
        (NumPy ``astype`` rules), as Orbax restores into a target; shapes must
        still agree. Only with ``like``.
      single_read: True (default): each stored byte fetched once per
        ``jax.distributed`` job (see :func:`open`); False: every process reads
        every block its devices hold, as a single process does.
      signature, public_key: a verified restore of a signed archive or
        checkpoint (see :func:`open`; docs/signing.md): every byte restored
        is covered by signed ranges whose SHA-256 was checked first, and
        ``copy=False`` views are handed out only after.
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
        key path (a "~" not followed by 0 or 1: SPEC.md "Key paths");
      SignatureError: with ``signature``, what :func:`open` says.
    """
    with open(path, storage_options=storage_options, store=store, single_read=single_read,
              signature=signature, public_key=public_key) as a:  # a file, a sharded checkpoint, or a URL of either
        return a.load(like, subtree=subtree, shardings=shardings, missing=missing, extra=extra, copy=copy,
                      cast=cast)


def verify(path: PathLike, *, signature: Optional[KeySource] = None, public_key: Optional[KeySource] = None,
           storage_options: Optional[Mapping[str, Any]] = None) -> None:
    """Checks an archive file or a sharded checkpoint directory completely, and
    raises unless everything is intact: every chunk of every leaf against its
    XXH3 checksum (LZ4 chunks decoded, padding zero: :meth:`Reader.verify`),
    and with a signature every signed byte's SHA-256 on all cores, as
    ``model_signing verify key`` does (the envelope under the key, the
    statement naming this file or directory and its exact length, a
    directory holding exactly the signed files): for a local archive in one
    pass with the checksums (docs/signing.md "What is verified when"), for a
    directory or a URL in a pass of its own first (treecask::verify_signature).

    Args:
      path: the archive file or sharded checkpoint directory, or the URL of
        an archive in a store (with a signature: every signed byte fetched and
        hashed as it arrives, then every chunk read through the signed open),
        or, with a directory's signature, of a sharded checkpoint in one (the
        listing's files, exactly the signed ones, each checked so).
      signature: the model-signing bundle: a path, a URL, or its bytes.
      public_key: the PEM public key (SubjectPublicKeyInfo) of the EC key that
        signed it: a path or its bytes. Both or neither.
      storage_options: for a URL (see :func:`treecask.open`).

    Raises:
      SignatureError (the signature does not verify, is for another file, or
      a signed range's SHA-256 differs: the message names the file and byte
      range; an unsupported key type or hash algorithm, named);
      ChecksumError / CorruptionError for the first damaged leaf (the message
      counts the others); NotFoundError, NotAnArchiveError, VersionError,
      IoError, InvalidArgumentError (only one of signature / public_key).
    """
    p = os.fspath(path)
    check = _signing.signature_check(signature, public_key, storage_options, file=p)
    if check is not None:
        loc = stores.resolve(p, None, storage_options)
        if loc.store.is_sharded(loc.path) is not False:
            # A directory (exactly the signed files) or an object in a store: the
            # signature's own pass first. A local archive's signed open and
            # Reader.verify below hash every signed byte, in one pass with the chunks.
            loc.store.verify_signature(loc.path, check)
    with open(p, storage_options=storage_options,
                     signature=None if check is None else check[0].encode(),
                     public_key=None if check is None else check[1].encode()) as r:
        errors = r.verify()
    if errors:
        first: Error = errors[0]
        if len(errors) > 1:
            first = type(first)(f"{first.message} (and {len(errors) - 1} more damaged leaves)", file=first.file,
                                key_path=first.key_path)
        raise first
