"""The store protocol: where archives and checkpoint directories live, as a
few byte-level calls (docs/stores.md "What a store implements"), and the
commit protocols written once on top of them.

Shaped as obstore's stores and zarr-python 3's ``zarr.abc.store.Store`` are:
a store reads ranges, puts whole objects (create-only or overwrite), lists a
prefix, deletes, and says by capability flags what it can do; the library
above it (treecask's open, save, CheckpointManager, treecask.orbax) is
written once against it and never asks which store it has.
"""

from __future__ import annotations

import abc
import contextlib
import os
import pathlib
import shutil
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

import treecask._core as _core
from ..errors import AlreadyExistsError, Error, NotAnArchiveError, NotFoundError, UnsupportedError
from . import _upload

T = TypeVar("T")

#: The object whose presence commits a checkpoint "directory" written by
#: several processes (SPEC.md "Sharded checkpoints": its index archive; the
#: core's name, sharded.h kShardedIndexName).
COMMIT_OBJECT = _core.INDEX_NAME


def join(*parts: str) -> str:
    """Store paths joined with one "/", empty parts skipped; the first part
    keeps a leading "/" (an absolute file path): ``join("run", "step_1.cask")``."""
    parts = [p for p in parts if p]
    if not parts:
        return ""
    head = parts[0].rstrip("/") or ("/" if parts[0].startswith("/") else "")
    rest = [p.strip("/") for p in parts[1:] if p.strip("/")]
    if not rest:
        return head
    return (head if head.endswith("/") or not head else head + "/") + "/".join(rest)


class Store(abc.ABC):
    """Where checkpoints live. Paths are "/"-separated strings relative to the
    store's root ("" is the root).

    A store implements :meth:`display`, :meth:`source`, :meth:`put_file`,
    :meth:`list_prefix`, :meth:`delete`, :meth:`head`, the capability flags
    :attr:`read_only` and :attr:`supports_atomic_directories`, and
    :meth:`local_path` on a file system; everything else is written once here
    on top of them, in two commit protocols chosen by capability
    (docs/stores.md "What a store implements").

    Every method raises treecask errors (NotFoundError, IoError,
    AlreadyExistsError, UnsupportedError), never the client's, and no message
    holds a secret.
    """

    #: Whether a "directory" appears whole, by one atomic step (a rename of
    #: the file system): then every entry under a name counts as soon as the
    #: name exists (SPEC.md "Checkpoint directories"). False in an object
    #: store, where a checkpoint "directory" exists once its commit object
    #: (:data:`COMMIT_OBJECT`) does (zarr's ``supports_*`` flags, in kind).
    supports_atomic_directories: bool = False
    #: Whether the store only reads (an http(s):// store: no writing, no listing).
    read_only: bool = False
    #: Whether a path names one object and never a "directory" of them (a
    #: signed URL, whose store is exactly that URL).
    single_object: bool = False

    # ---- the protocol: naming ----
    def normalize(self, path: str) -> str:
        """A caller's path as this store's paths are: without leading or
        trailing "/" (object keys)."""
        return path.strip("/")

    @abc.abstractmethod
    def display(self, path: str = "") -> str:
        """``path`` as messages show it: a file path, or a URL with every
        secret redacted (the core's ``redact_url``)."""

    def __repr__(self) -> str:
        return f"<treecask.stores.{type(self).__name__} {self.display()!r}>"

    # ---- the protocol: reading ----
    def local_path(self, path: str) -> Optional[str]:
        """The file system path of ``path`` when the core can map it and
        commit by rename there (a local store), else None. The capability
        that chooses the file-system protocols below."""
        return None

    def shown(self, path: str) -> Any:
        """What users are shown of ``path`` and may pass back to
        ``treecask.open``: a ``pathlib.Path`` in a store of local files, else
        :meth:`display` (a URL with its secrets redacted). What
        ``CheckpointManager.directory`` / ``path(step)`` return."""
        local = self.local_path(path)
        return pathlib.Path(local) if local is not None else self.display(path)

    def signs_in_place(self) -> bool:
        """Whether :meth:`sign_archive` can sign this store's archives: they are
        local files (signing hashes every byte of the file where it lies)."""
        return self.local_path("") is not None

    def sign_archive(self, path: str, private_key_pem: str, signature: str) -> None:
        """Signs the archive ``path`` with the PEM EC private key (treecask::sign,
        shard serialization, docs/signing.md) and writes the bundle to the path
        ``signature`` through :meth:`put_file` (created or replaced, whole or not
        at all). Raises UnsupportedError where the archives are not local files
        (sign before uploading), and what treecask::sign raises."""
        local = self.local_path(path)
        if local is None:
            raise UnsupportedError("signing hashes a local archive file: sign it before uploading it",
                                   file=self.display(path))
        bundle = _core.sign(local, private_key_pem)
        with _upload.scratch(signature.rpartition("/")[2] or "bundle.sig") as tmp:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(bundle)
            self.put_file(signature, tmp, overwrite=True)

    def read_object(self, path: str, first_read: int = 64 << 20) -> bytes:
        """The whole of the small object ``path`` (a signature bundle), read
        through :meth:`source`: its last ``first_read`` bytes in the first
        request, the rest (if any) in a second. b"" for an empty object.
        Raises NotFoundError, IoError as the source does."""
        src = self.source(path)
        try:
            if src.size is None:  # learns its size from its first read (source.h)
                data = bytes(src.read([-first_read], [first_read])[0])
                if src.size > len(data):
                    data = bytes(src.read([0], [src.size - len(data)])[0]) + data
                return data
            return bytes(src.read([0], [src.size])[0]) if src.size else b""
        except NotAnArchiveError:  # the source's word for an empty object
            return b""

    def make_directory(self, path: str) -> None:
        """Creates the directory ``path`` and its parents in a store of local
        files (the core's commit renames into an existing directory); nothing
        in an object store, where a prefix needs no creation. Raises
        IoError-like OSError as ``os.makedirs`` does."""
        local = self.local_path(path)
        if local:
            os.makedirs(local, exist_ok=True)

    @abc.abstractmethod
    def source(self, path: str) -> Any:
        """Object ``path`` as a ``Source`` of the C++ core (include/treecask/
        source.h: ``name``, ``size``, ``concurrency``, ``read(offsets,
        lengths)``), every read pinned to the version its first read saw.
        Raises NotFoundError for a missing object, IoError."""

    @abc.abstractmethod
    def head(self, path: str) -> Optional[Dict[str, Any]]:
        """``{"size": bytes, "version": ...}`` of object ``path``, None when it
        does not exist (one HEAD request; a stat). Raises IoError."""

    # ---- the protocol: writing ----
    @abc.abstractmethod
    def put_file(self, path: str, local_file: str, *, overwrite: bool) -> None:
        """Uploads the local file ``local_file`` as object ``path``, whole or
        not at all; without ``overwrite`` only if ``path`` does not exist
        (AlreadyExistsError otherwise, also when another writer commits it
        first). Raises IoError, NotFoundError (no bucket)."""

    @abc.abstractmethod
    def list_prefix(self, prefix: str) -> List[str]:
        """The paths of every object whose path starts with the string
        ``prefix`` (zarr's ``list_prefix``: ``"run/step_1.cask"`` lists that
        object, the objects under ``run/step_1.cask/`` and its temporaries
        ``run/step_1.cask.tmp.*``; ``"run/"`` lists the whole run), in no
        particular order. One listing request where the store has them."""

    @abc.abstractmethod
    def delete(self, paths: Sequence[str]) -> None:
        """Deletes the objects ``paths``, in order; a missing one is no error."""

    def sweep_uploads(self, path: str, names: Sequence[str]) -> Sequence[str]:
        """Aborts the incomplete uploads of ``path`` whose writer died, among
        ``names`` (a listing of ``path``); returns the dead writers' names
        to keep until their uploads are aborted (the next save tries again).
        A store without resumable uploads has none (this default). Best
        effort."""
        return ()

    # ---- written once on the above ----
    def writable(self, path: str) -> None:
        """Raises UnsupportedError when the store only reads (:attr:`read_only`)."""
        if self.read_only:
            raise UnsupportedError("this store is read-only and lists nothing (an http(s):// URL): save to "
                                   "s3://, gs://, az:// or another store", file=self.display(path))

    def stamp(self, path: str) -> Any:
        """What identifies one writing of ``path``, for caches of what was
        read from it: on a file system (inode, mtime in ns) of the file or
        directory (a step deleted and written again gets a new inode; raises
        NotFoundError when gone); None in an object store, whose checkpoints
        are written once."""
        local = self.local_path(path)
        if local is None:
            return None
        try:
            st = os.stat(local)
        except FileNotFoundError:
            raise NotFoundError("no longer exists", file=local) from None
        return (st.st_ino, st.st_mtime_ns)

    def is_sharded(self, path: str) -> Optional[bool]:
        """Whether ``path`` is a sharded checkpoint "directory" (True), an
        archive (False), or unknown without a request (None: an object
        store, where an open tries the archive first)."""
        local = self.local_path(path)
        if local is not None:
            return bool(_core.is_sharded(local))
        return False if self.single_object else None

    def open_archive(self, path: str, *, verify_checksums: bool, validate_structure: bool,
                     signature: Optional[Tuple[str, str]] = None) -> Any:
        """The core's reader of the archive ``path``: the file mapped (a file
        system), else read by range through :meth:`source`. ``signature``:
        (bundle JSON, PEM public key) for a signed open (OpenOptions::signature,
        docs/signing.md), or None."""
        local = self.local_path(path)
        if local is not None:
            return _core.Archive.open(local, verify_checksums, validate_structure, signature)
        return _core.Archive.open_source(self.source(path), verify_checksums, signature)

    def verify_signature(self, path: str, signature: Tuple[str, str]) -> None:
        """Checks every signed byte of ``path`` (an archive, or a sharded
        checkpoint directory on a file system) against ``signature`` (bundle
        JSON, PEM public key) as ``model_signing verify key`` does
        (treecask::verify_signature, docs/signing.md): a file hashed on all
        cores; an object read through :meth:`source` and hashed as it arrives.
        Raises SignatureError naming the file and what failed, NotFoundError,
        IoError. A signed directory in an object store (the statement's model
        is a directory: treecask::signed_model) is its listing's files, each
        read through :meth:`source` (one HEAD each for its size)."""
        local = self.local_path(path)
        if local is not None:
            _core.verify_signature(local, signature[0], signature[1])
        elif _core.signed_model(signature[0])[1]:
            head = path.rstrip("/") + "/"
            names = [n[len(head):] for n in self.list_prefix(head)]
            files = []
            for n in names:
                if (info := self.head(join(path, n))) is None:  # gone since the listing
                    raise NotFoundError("the listing's file is gone", file=self.display(join(path, n)))
                files.append((n, int(info["size"])))
            _core.verify_signature_directory(self.display(path), files, lambda n: self.source(join(path, n)),
                                             signature[0], signature[1])
        else:
            _core.verify_signature_source(self.source(path), signature[0], signature[1])

    def open_sharded(self, path: str, *, verify_checksums: bool, validate_structure: bool,
                     signature: Optional[Tuple[str, str]] = None) -> Any:
        """The core's reader of the sharded checkpoint "directory" ``path``:
        one handle of the directory (a file system), else every file read by
        range through :meth:`source`; ``signature`` as for :meth:`open_archive`."""
        local = self.local_path(path)
        if local is not None:
            return _core.ShardedArchive.open(local, verify_checksums, validate_structure, signature)
        return _core.ShardedArchive.open_sources(lambda name: self.source(join(path, name)), self.display(path),
                                                 verify_checksums, signature)

    def delete_tree(self, path: str) -> None:
        """Deletes ``path`` so that it leaves every listing at once and a
        crash midway leaves only what no listing counts: on a file system a
        directory is renamed to a temporary first, then removed; in an object
        store the objects under ``path/`` go with the commit object
        (:data:`COMMIT_OBJECT`) first."""
        local = self.local_path(path)
        if local is not None:
            with contextlib.suppress(FileNotFoundError):
                if os.path.isdir(local) and not os.path.islink(local):
                    doomed = _core.temporary_path(local)
                    os.rename(local, doomed)
                    shutil.rmtree(doomed)
                else:
                    os.unlink(local)
            return
        commit = join(path, COMMIT_OBJECT)
        self.delete(sorted((n for n in self.list_prefix(path) if n == path or n.startswith(path + "/")),
                           key=lambda n: n != commit))

    def remove_stale(self, path: str, names: Optional[Sequence[str]] = None) -> None:
        """Deletes what dead writers left of ``path``: their temporaries
        ``<path>.tmp.<host>.<pid>.<hex16>`` (files, objects, or "directories"
        of them) of this host whose process is gone, the core's rule
        (``treecask::is_stale_temporary``, SPEC.md "Atomic commit"), and the
        incomplete uploads they name (:meth:`sweep_uploads`). ``names``: a
        listing of ``path`` already made (:meth:`list_prefix`)."""
        local = self.local_path(path)
        if local is not None:
            _core.remove_stale_temporaries(local)
            return
        names = self.list_prefix(path) if names is None else list(names)
        keep = set(self.sweep_uploads(path, names))
        # (the rule is asked of the temporary itself, <path>.tmp.*, for the objects under it too)
        self.delete([n for n in names if n.startswith(path + ".tmp") and n not in keep
                     and _core.is_stale_temporary(path, path + n[len(path):].split("/", 1)[0])])

    def check_new(self, path: str, *, overwrite: bool) -> None:
        """The pre-check of a save of ``path``: first the sweep of dead
        writers' leftovers of ``path`` (:meth:`remove_stale`; in an object
        store also this host's local scratch of dead uploads), whether the
        save then proceeds, is refused or overwrites; then AlreadyExistsError
        when the object, or a committed checkpoint "directory" of that name,
        exists and ``overwrite`` is False. One listing in an object store."""
        local, names = self.local_path(path), None
        if local is None:
            self.writable(path)
            _upload.sweep_scratch()
            names = self.list_prefix(path)
        self.remove_stale(path, names)
        exists = os.path.lexists(local) if local is not None else path in names or join(path, COMMIT_OBJECT) in names
        if exists and not overwrite:
            raise AlreadyExistsError("the checkpoint exists (pass overwrite=True to replace it)",
                                     file=self.display(path))

    def save_archive(self, path: str, write: Callable[[str, bool], T], *, overwrite: bool) -> T:
        """Commits the archive ``write`` makes as ``path`` and returns what
        ``write`` returned: it appears whole or not at all and, unless
        ``overwrite``, never replaces one (AlreadyExistsError).
        ``write(local, in_place)`` writes the archive at the local path
        ``local``; ``in_place`` is True when ``local`` is its final name.

        On a file system: ``write(path, True)``, the core's own commit (a
        temporary beside ``path``, fsynced, renamed into place; dead
        writers' temporaries swept). Elsewhere: :meth:`check_new` (an
        existing ``path`` refused before any byte is written or uploaded),
        then :meth:`write_archive`."""
        if self.local_path(path) is None:
            self.check_new(path, overwrite=overwrite)
        return self.write_archive(path, write, overwrite=overwrite)

    def write_archive(self, path: str, write: Callable[[str, bool], T], *, overwrite: bool) -> T:
        """:meth:`save_archive` without its pre-check: for an archive whose
        name no other writer uses (a shard file of one multi-process save),
        or after :meth:`check_new`. ``write`` as there. Elsewhere than on a
        file system the archive goes to local scratch (a directory
        ``treecask-upload.tmp.<host>.<pid>.<hex16>`` in
        ``$TREECASK_SCRATCH_DIR`` or the system temporary directory, removed
        whatever happens, swept by a later save once its process is gone) and
        :meth:`put_file` commits it."""
        local_final = self.local_path(path)
        if local_final is not None:
            return write(local_final, True)
        self.writable(path)
        local = ""
        try:
            with _upload.scratch(path.rpartition("/")[2] or "archive.cask") as local:
                out = write(local, False)
                self.put_file(path, local, overwrite=overwrite)
            return out
        except Error as e:  # an error of the scratch file names the object instead
            raise _upload.named(e, local, self.display(path)) from None

    # ---- a checkpoint "directory" of several files (a multi-process save) ----
    def stage_directory(self, path: str, *, overwrite: bool) -> str:
        """Prepares the commit of a checkpoint "directory" ``path`` whose
        files several processes write (SPEC.md "Sharded checkpoints") and
        returns the store path they write them under (the staging), after
        :meth:`check_new` (dead writers' leftovers swept; AlreadyExistsError,
        before anything is written, when ``path`` exists and ``overwrite`` is
        False).

        On a file system the staging is a fresh temporary directory beside
        ``path`` (the core's naming rule), as an absolute path; NotFoundError
        when the parent directory does not exist. Elsewhere it is ``path``
        itself, and nothing counts before :meth:`publish_directory`
        (docs/stores.md)."""
        self.check_new(path, overwrite=overwrite)
        local = self.local_path(path)
        if local is None:
            return path
        if not os.path.isdir(os.path.dirname(os.path.abspath(local))):
            raise NotFoundError("the parent directory does not exist", file=local)
        tmp = _core.temporary_path(local)
        os.mkdir(tmp)
        return os.path.abspath(tmp)

    def publish_directory(self, staging: str, path: str, write: Callable[[str, bool], T], *,
                          overwrite: bool, durable: bool, keep: Sequence[str]) -> T:
        """Commits the checkpoint "directory" ``path`` staged at ``staging``
        (:meth:`stage_directory`), whose other files are written: ``write(local,
        in_place)`` writes its commit object (:data:`COMMIT_OBJECT`, the index)
        at the local path ``local`` and checks the whole checkpoint (raising
        leaves nothing committed); returns what ``write`` returned. Without
        ``overwrite`` an existing checkpoint is never replaced
        (AlreadyExistsError). ``keep``: the names of the checkpoint's other
        files; ``durable``: everything fsynced before returning.

        On a file system the staging directory is renamed onto ``path`` by the
        core's one commit (include/treecask/commit.h); elsewhere the index's
        conditional creation is the commit, then the objects directly under
        ``path`` that are neither the index nor in ``keep`` are deleted, best
        effort (docs/stores.md)."""
        local = self.local_path(path)
        if local is not None:
            tmp = self.local_path(staging) or staging
            out = write(os.path.join(tmp, COMMIT_OBJECT), True)
            if durable:
                _core.sync_path(tmp, local)
            _core.publish(tmp, local, overwrite, durable, local)
            return out
        out = self.write_archive(join(path, COMMIT_OBJECT), write, overwrite=overwrite)
        kept = {join(path, n) for n in (COMMIT_OBJECT, *keep)}
        head = path + "/"
        try:
            names = self.list_prefix(head)
        except Error:  # committed; leftovers cost storage, not correctness
            names = []
        self.delete([n for n in names if n not in kept and "/" not in n[len(head):]])
        return out

    def discard_directory(self, staging: str, names: Sequence[str]) -> None:
        """Removes what a failed multi-process save wrote under ``staging``
        (``names``: its files, relative to it), best effort: the staging
        directory on a file system, those objects elsewhere."""
        local = self.local_path(staging)
        if local is not None:
            shutil.rmtree(local, ignore_errors=True)
            return
        with contextlib.suppress(Error):
            self.delete([join(staging, n) for n in names])
