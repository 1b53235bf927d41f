"""Saving to object stores through obstore: an archive written to local
scratch, uploaded in parallel parts and committed so that the object appears
whole or not at all and never replaces a checkpoint (docs/stores.md "What
each store guarantees at commit"; docs/remote.md "Saving to object stores").

:func:`put_file` commits one object: at most ``SINGLE_PUT_BYTES`` by one
conditional PUT from a map of the scratch file; larger by a multipart upload
to the temporary ``<key>.tmp.<host>.<pid>.<hex16>`` and a conditional
server-side copy onto ``<key>`` (straight to ``<key>`` with ``overwrite``;
on S3 with botocore, ``_s3.S3.put_new`` instead); then :func:`confirm`.
A store without conditional writes gets :func:`_create`'s fallback. Memory:
``PART_BYTES * PARTS_IN_FLIGHT`` (128 MiB) of parts in flight plus obstore's
buffering; scratch: the archive's own bytes in :func:`scratch_dir`, removed
when the save returns or fails.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
import tempfile
from typing import Any, Callable, Iterator, Optional

import treecask._core as _core
from ..errors import AlreadyExistsError, Error
from . import _errors

# Objects up to this size are committed by one conditional PUT (bytes).
SINGLE_PUT_BYTES = 64 << 20
# Multipart upload: the size of a part and how many are in flight (bytes, count);
# their product bounds the upload's memory.
PART_BYTES = 16 << 20
PARTS_IN_FLIGHT = 8


def scratch_dir() -> str:
    """Where an upload's archive is written first: ``$TREECASK_SCRATCH_DIR``,
    else the system temporary directory."""
    return os.environ.get("TREECASK_SCRATCH_DIR") or tempfile.gettempdir()


#: The scratch directories of uploads are temporaries of this name in
#: :func:`scratch_dir`: ``treecask-upload.tmp.<host>.<pid>.<hex16>``.
SCRATCH_NAME = "treecask-upload"


def sweep_scratch() -> None:
    """Removes the scratch directories of uploads on this host whose process
    is gone (the core's rule, ``treecask::remove_stale_temporaries``): what a
    saver killed before it could remove its scratch left (up to its
    archive's bytes). Every save to an object store runs it before anything
    else (``Store.check_new``), and every new scratch directory too."""
    _core.remove_stale_temporaries(os.path.join(scratch_dir(), SCRATCH_NAME))


@contextlib.contextmanager
def scratch(name: str) -> Iterator[str]:
    """A fresh local directory for the files of one upload, named by the core's
    temporary rule (:data:`SCRATCH_NAME`, SPEC.md "Atomic commit": what a
    killed saver leaves, :func:`sweep_scratch` removes); yields the path of
    ``name`` inside it and removes the directory (whatever happened)."""
    sweep_scratch()
    d = _core.temporary_path(os.path.join(scratch_dir(), SCRATCH_NAME))
    os.mkdir(d, 0o700)
    try:
        yield os.path.join(d, name)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def put_file(store: Any, key: str, path: str, *, url: str, overwrite: bool) -> None:
    """Uploads the local file ``path`` as object ``key`` and commits it (the
    module docstring): whole or not at all; without ``overwrite`` never onto
    an existing object (AlreadyExistsError). Raises IoError naming ``url``
    after obstore's bounded retries (503 SlowDown, dropped connections)."""
    import obstore

    size = os.path.getsize(path)

    def commit() -> Optional[str]:
        if size <= SINGLE_PUT_BYTES:
            return _put_single(store, key, path, size, overwrite)
        if overwrite:
            return _put_parts(store, key, path)
        tmp = _core.temporary_path(key)
        try:
            _put_parts(store, tmp, path)
            _create(store, key, lambda: obstore.copy(store, tmp, key, overwrite=False),
                    lambda: obstore.copy(store, tmp, key, overwrite=True))
        finally:
            with contextlib.suppress(Exception):
                obstore.delete(store, tmp)
        return None

    etag = _errors.mapped(url, commit)
    if not overwrite:
        confirm(store, key, path, url=url, etag=etag)


#: How many of an object's last bytes :func:`confirm` compares (bytes).
CONFIRM_BYTES = 64 << 10


def _bare_etag(etag: Any) -> str:
    return str(etag or "").removeprefix("W/").strip('"')


def confirm(store: Any, key: str, path: str, *, url: str, etag: Optional[str] = None) -> None:
    """After a commit that refuses to replace an object: that the object now
    at ``key`` is the one this saver wrote from the local file ``path``,
    by one small ranged GET (its last ``CONFIRM_BYTES``, which also gives
    its size and ETag): the ETag the commit returned (``etag``) must be the
    object's, or, where the commit returned none (a server-side copy), the
    size and the last bytes must be the file's. Raises AlreadyExistsError
    otherwise: on a store whose conditional writes are not atomic
    (SeaweedFS, docs/stores.md) two savers can both be answered "created";
    the one whose object was replaced learns it here. A replacement that
    lands after this GET is not seen (docs/stores.md "What each store
    guarantees at commit")."""
    import obstore

    size = os.path.getsize(path)
    n = min(size, CONFIRM_BYTES)

    def tail() -> Any:
        r = obstore.get(store, key, options={"range": {"suffix": n}}) if n else obstore.get(store, key)
        return r.meta, bytes(r.bytes())

    meta, got = _errors.mapped(url, tail)
    if meta["size"] == size and (_bare_etag(etag) == _bare_etag(meta["e_tag"]) if etag and meta.get("e_tag")
                                 else ends_with(path, got, n)):
        return
    raise AlreadyExistsError("another saver committed this object at the same time and it is not this save's "
                             "(the store's conditional write is not atomic): this checkpoint was not saved",
                             file=url)


def ends_with(path: str, data: bytes, n: int) -> bool:
    """Whether ``data`` is the last ``n`` bytes of the local file ``path`` (at least ``n`` bytes
    long): a shorter answer from the server is not a match."""
    if len(data) != n:
        return False
    with open(path, "rb") as f:
        f.seek(-n, os.SEEK_END)
        return f.read() == data


def _create(store: Any, key: str, conditional: Callable[[], Any], unconditional: Callable[[], Any]) -> Any:
    """``conditional()`` (a write that fails if ``key`` exists), or where the store has no
    conditional writes the documented fallback: a HEAD of ``key``, then ``unconditional()``."""
    import obstore
    import obstore.exceptions as E

    try:
        return conditional()
    except Exception as e:  # noqa: BLE001
        if not (isinstance(e, (NotImplementedError, E.NotSupportedError)) or "not yet implemented" in str(e)):
            raise
    try:
        obstore.head(store, key)
    except FileNotFoundError:
        return unconditional()
    raise AlreadyExistsError("the object exists (a checkpoint is never replaced)")


def _put_single(store: Any, key: str, path: str, size: int, overwrite: bool) -> Optional[str]:
    """One PUT of the file (conditional unless ``overwrite``); the ETag it returned."""
    import obstore

    with open(path, "rb") as f:
        data: Any = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) if size else b""
    try:
        view = memoryview(data)
        try:
            def put(mode: str):
                return lambda: obstore.put(store, key, view, mode=mode, use_multipart=False)
            r = put("overwrite")() if overwrite else _create(store, key, put("create"), put("overwrite"))
            return (r or {}).get("e_tag")
        finally:
            # A store may keep the buffer it was given (obstore's MemoryStore holds the object's
            # bytes so): the view and the map, of a file then unlinked, live as long as it does.
            with contextlib.suppress(BufferError):
                view.release()
    finally:
        if size:
            with contextlib.suppress(BufferError):
                data.close()


def _put_parts(store: Any, key: str, path: str) -> None:
    import obstore

    with open(path, "rb") as f:
        obstore.put(store, key, f, use_multipart=True, chunk_size=PART_BYTES, max_concurrency=PARTS_IN_FLIGHT)


def named(e: Error, local: str, url: str) -> Error:
    """``e`` naming ``url`` where it named the scratch file ``local`` (or no file)."""
    return e if e.file and e.file != local else type(e)(e.message, file=url, key_path=e.key_path)
