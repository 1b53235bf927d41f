"""The store interface: where archives and checkpoint directories live, as
byte ranges to read and whole objects to commit (docs/stores.md). Shaped as
zarr-python 3's ``zarr.abc.store.Store`` is: the library above it (treecask's
open, save, CheckpointManager, treecask.orbax) is written once against it and
never asks which store it has."""

from __future__ import annotations

import abc
from typing import Any, Callable, List, Optional, Sequence, TypeVar

T = TypeVar("T")

#: The object whose presence commits a checkpoint "directory" written by
#: several processes (SPEC.md "Sharded checkpoints": its index archive).
COMMIT_OBJECT = "index.cask"


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

    Reading: :meth:`local_path` (a file the core maps, for a local store) or
    :meth:`source` (the object as a ``Source`` of the C++ core: ``name``,
    ``size`` in bytes, ``concurrency``, ``read(offsets, lengths)``; the
    reader runs every check and checksum on the bytes it is given, SPEC.md
    "Remote reading"). Writing: :meth:`save_archive`, the commit written
    once: a new archive appears whole or not at all and, unless
    ``overwrite``, never replaces one (AlreadyExistsError); it is built on
    :meth:`put_file` (create-if-absent or overwrite), :meth:`list_prefix`
    and :meth:`delete`. Naming: :meth:`display`, the text every message
    shows, with secrets redacted.

    Implementations: :class:`treecask.stores.LocalStore` (a directory of the
    file system, with the core's own atomic commit) and
    :class:`treecask.stores.ObjectStore` (any obstore store: S3, GCS, Azure,
    HTTP, memory). Every method raises treecask errors (NotFoundError,
    IoError, AlreadyExistsError, UnsupportedError), never the client's, and
    no message holds a secret.
    """

    #: Whether a "directory" appears whole, by one atomic step (a rename of
    #: the file system): then every entry under a name counts as soon as the
    #: name exists (SPEC.md "Checkpoint directories"). False in an object
    #: store, where a checkpoint "directory" exists once its commit object
    #: (:data:`COMMIT_OBJECT`) does (zarr's ``supports_*`` flags, in kind).
    supports_atomic_directories: bool = False

    # ---- naming ----
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

    # ---- reading ----
    def local_path(self, path: str) -> Optional[str]:
        """The file system path of ``path`` when the core can map it (a local
        store), else None: :meth:`source` reads it."""
        return None

    @abc.abstractmethod
    def source(self, path: str) -> Any:
        """Object ``path`` as a ``Source`` of the C++ core (include/treecask/
        source.h: ``name``, ``size``, ``concurrency``, ``read(offsets,
        lengths)``). Raises NotFoundError for a missing object, IoError."""

    def stamp(self, path: str) -> Any:
        """What identifies one writing of object ``path``, for caches of what
        was read from it: None here (an object store's checkpoints are
        written once); a local file's (inode, mtime). Raises NotFoundError
        where the store can tell the object is gone."""
        return None

    # ---- writing ----
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

    # ---- written once on the above ----
    def delete_tree(self, path: str) -> None:
        """Deletes object ``path``, or every object under ``path/`` with its
        commit object (:data:`COMMIT_OBJECT`) first, so that a checkpoint
        leaves every listing at once and a crash midway leaves only objects
        no listing counts."""
        names = [n for n in self.list_prefix(path) if n == path or n.startswith(path + "/")]
        commit = join(path, COMMIT_OBJECT)
        names.sort(key=lambda n: n != commit)
        self.delete(names)

    def remove_stale(self, path: str, names: Optional[Sequence[str]] = None) -> None:
        """Deletes what dead writers left of ``path``: their temporaries
        ``<path>.tmp.<host>.<pid>.<hex16>`` (objects, or "directories" of
        objects) of this host whose process is gone, the core's rule
        (``treecask::is_stale_temporary``, SPEC.md "Atomic commit").
        ``names``: a listing of ``path`` already made (:meth:`list_prefix`)."""
        from .. import _core

        stale = []
        for n in self.list_prefix(path) if names is None else names:
            if n.startswith(path + ".tmp"):
                entry = path + n[len(path):].split("/", 1)[0]  # the temporary itself
                if _core.is_stale_temporary(path, entry):
                    stale.append(n)
        self.delete(stale)

    def check_new(self, path: str, *, overwrite: bool) -> None:
        """One listing of ``path`` before anything is written: raises
        AlreadyExistsError when the object, or a committed checkpoint
        "directory" of that name, exists and ``overwrite`` is False; deletes
        dead writers' temporaries of ``path`` (:meth:`remove_stale`)."""
        names = self.list_prefix(path)
        if not overwrite and (path in names or join(path, COMMIT_OBJECT) in names):
            from ..errors import AlreadyExistsError

            raise AlreadyExistsError("the checkpoint exists (pass overwrite=True to replace it)",
                                     file=self.display(path))
        self.remove_stale(path, names)

    def save_archive(self, path: str, write: Callable[[str, bool], T], *, overwrite: bool) -> T:
        """Commits the archive ``write`` makes as object ``path`` and returns
        what ``write`` returned. ``write(local, in_place)`` writes the
        archive at the local path ``local``; ``in_place`` is True when
        ``local`` is its final name (the core's own atomic commit, as
        :class:`LocalStore` does), False for scratch that is then uploaded.

        This generic form: :meth:`check_new` (an existing ``path`` refused
        before any byte is written or uploaded), then the archive written
        into local scratch (a directory ``treecask-upload.tmp.<host>.<pid>.<hex16>`` in
        ``$TREECASK_SCRATCH_DIR`` or the system temporary directory, removed
        whatever happens, and swept by a later save once its process is
        gone), then :meth:`put_file` commits it."""
        self.check_new(path, overwrite=overwrite)
        return self.write_archive(path, write, overwrite=overwrite)

    def write_archive(self, path: str, write: Callable[[str, bool], T], *, overwrite: bool) -> T:
        """:meth:`save_archive` without its pre-check: for an archive whose
        name no other writer uses (a shard file of one multi-process save),
        or after :meth:`check_new`. ``write`` as there. This generic form
        writes into local scratch and commits it with :meth:`put_file`."""
        from .. import _upload
        from ..errors import Error

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
        returns the store path they write them under (the staging). Raises
        AlreadyExistsError, before anything is written, when ``path`` exists
        and ``overwrite`` is False.

        This generic form (no atomic directories): :meth:`check_new` (one
        listing: an existing object or committed checkpoint refused; dead
        writers' temporaries swept), and the staging is ``path`` itself:
        the files go to their final names, which must be this save's own
        (named by its save id), and nothing counts before
        :meth:`publish_directory` creates :data:`COMMIT_OBJECT`."""
        self.check_new(path, overwrite=overwrite)
        return path

    def publish_directory(self, staging: str, path: str, write: Callable[[str, bool], T], *,
                          overwrite: bool, durable: bool, keep: Sequence[str]) -> T:
        """Commits the checkpoint "directory" ``path`` staged at ``staging``
        (:meth:`stage_directory`), whose other files are written: ``write(local,
        in_place)`` writes its commit object (:data:`COMMIT_OBJECT`, the index)
        at the local path ``local`` and checks the whole checkpoint (raising
        leaves nothing committed); returns what ``write`` returned. Without
        ``overwrite`` an existing checkpoint is never replaced
        (AlreadyExistsError). ``keep``: the names of the checkpoint's other
        files; ``durable``: everything fsynced before returning, where the
        store syncs.

        This generic form: the commit object written to local scratch and
        created by :meth:`put_file` (conditionally unless ``overwrite``):
        that creation is the commit. Then the objects directly under
        ``path`` that are neither the commit object nor in ``keep`` (an
        overwritten checkpoint's, a dead save's) are deleted, best effort."""
        from ..errors import Error

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
        (``names``: its files, relative to it), best effort. This generic
        form deletes those objects."""
        from ..errors import Error

        try:
            self.delete([join(staging, n) for n in names])
        except Error:
            pass
