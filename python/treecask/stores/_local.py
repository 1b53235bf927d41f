"""LocalStore: a directory of the file system as a Store, committed by the
core's own atomic rename (SPEC.md "Atomic commit")."""

from __future__ import annotations

import os
import shutil
from typing import Any, Callable, List, Optional, Sequence, TypeVar

from .. import _core
from ._store import COMMIT_OBJECT, Store

T = TypeVar("T")


class LocalStore(Store):
    """The files under ``root`` (default "": paths are file system paths as
    given, relative to the working directory).

    Reading maps the file (zero-copy views, shared page cache); writing is
    the core's commit: the archive is written to ``<path>.tmp.<host>.<pid>.<hex16>``
    beside its final name, fsynced (``durable``), then renamed into place
    (``treecask::publish``: never onto an existing file unless
    ``overwrite``); temporaries of dead writers of this host are removed by
    the next save of that path (``treecask::remove_stale_temporaries``).
    """

    supports_atomic_directories = True  # a directory is published by one rename

    def __init__(self, root: Any = ""):
        self.root = os.fspath(root)

    def _path(self, path: str) -> str:
        return os.path.join(self.root, path) if self.root else path

    def normalize(self, path: str) -> str:
        """The file system path as given (an absolute one keeps its "/")."""
        return path.rstrip("/") or path

    def display(self, path: str = "") -> str:
        """The file system path of ``path``."""
        return self._path(path) if path else self.root

    def local_path(self, path: str) -> str:
        """The file system path of ``path`` (the core maps it)."""
        return self._path(path)

    def source(self, path: str) -> Any:
        """A ``Source`` over the file (pread); the readers map local files
        instead (:meth:`local_path`)."""
        from .._remote import FileSource

        return FileSource(self._path(path))

    def stamp(self, path: str) -> Any:
        """(inode, mtime in ns) of the file or directory ``path``: a step
        deleted and written again gets a new inode. NotFoundError when gone."""
        p = self._path(path)
        try:
            st = os.stat(p)
        except FileNotFoundError:
            from ..errors import NotFoundError

            raise NotFoundError("no longer exists", file=p) from None
        return (st.st_ino, st.st_mtime_ns)

    def put_file(self, path: str, local_file: str, *, overwrite: bool) -> None:
        """Moves ``local_file`` to ``path`` by the core's atomic publish
        (rename; across file systems a copy to a temporary beside ``path``
        first)."""
        dst = self._path(path)
        if os.stat(local_file).st_dev != os.stat(os.path.dirname(os.path.abspath(dst))).st_dev:
            tmp = _core.temporary_path(dst)
            shutil.copyfile(local_file, tmp)
            local_file = tmp
        _core.publish(local_file, dst, overwrite, True, dst)

    def list_prefix(self, prefix: str) -> List[str]:
        """Every file whose path (relative to the root) starts with ``prefix``,
        under directories too. A missing directory lists nothing."""
        parent, _, start = prefix.rpartition("/")
        out: List[str] = []
        try:
            entries = list(os.scandir(self._path(parent) or "."))
        except (FileNotFoundError, NotADirectoryError):
            return out
        for e in entries:
            if not e.name.startswith(start):
                continue
            rel = f"{parent}/{e.name}" if parent else e.name
            if e.is_dir(follow_symlinks=False):
                for d, _, files in os.walk(e.path):
                    sub = os.path.relpath(d, self._path(parent) or ".")
                    base = f"{parent}/{sub}" if parent else sub
                    out.extend(f"{base}/{f}" for f in files)
            else:
                out.append(rel)
        return out

    def delete(self, paths: Sequence[str]) -> None:
        """Unlinks each file; a missing one is no error."""
        for p in paths:
            try:
                os.unlink(self._path(p))
            except FileNotFoundError:
                pass

    def delete_tree(self, path: str) -> None:
        """Removes the file ``path``, or the directory: renamed to a
        temporary name first, so that it leaves every listing at once and a
        crash midway leaves only a temporary that the next sweep removes."""
        p = self._path(path)
        try:
            if os.path.isdir(p) and not os.path.islink(p):
                doomed = _core.temporary_path(p)
                os.rename(p, doomed)
                shutil.rmtree(doomed)
            else:
                os.unlink(p)
        except FileNotFoundError:
            pass

    def remove_stale(self, path: str, names: Optional[Sequence[str]] = None) -> None:
        """The core's sweep of ``path``'s temporaries (files and directories)."""
        _core.remove_stale_temporaries(self._path(path))

    def check_new(self, path: str, *, overwrite: bool) -> None:
        """Sweeps dead writers' temporaries of ``path``; the commit itself
        refuses an existing file (the core's publish)."""
        self.remove_stale(path)

    def save_archive(self, path: str, write: Callable[[str, bool], T], *, overwrite: bool) -> T:
        """``write(path, True)``: the core writes the archive beside its name
        and renames it into place (this class's docstring)."""
        return write(self._path(path), True)

    def write_archive(self, path: str, write: Callable[[str, bool], T], *, overwrite: bool) -> T:
        """``write(path, True)``: written in place (the core's commit)."""
        return write(self._path(path), True)

    def stage_directory(self, path: str, *, overwrite: bool) -> str:
        """A fresh temporary directory ``<path>.tmp.<host>.<pid>.<hex16>``
        beside ``path`` (the core's naming rule), after sweeping dead
        writers' temporaries of ``path``; its absolute path (the root does not
        apply to it). Raises
        AlreadyExistsError when ``path`` exists and ``overwrite`` is False,
        NotFoundError when its parent directory does not."""
        from ..errors import AlreadyExistsError, NotFoundError

        full = self._path(path)
        if os.path.lexists(full) and not overwrite:
            raise AlreadyExistsError("the path exists; pass overwrite=True to replace it", file=full)
        if not os.path.isdir(os.path.dirname(os.path.abspath(full))):
            raise NotFoundError("the parent directory does not exist", file=full)
        _core.remove_stale_temporaries(full)
        tmp = _core.temporary_path(full)
        os.mkdir(tmp)
        return os.path.abspath(tmp)  # absolute: every process writes there, whatever its working directory

    def publish_directory(self, staging: str, path: str, write: Callable[[str, bool], T], *,
                          overwrite: bool, durable: bool, keep: Sequence[str]) -> T:
        """The commit object written in place in the staging directory, then
        the directory (fsynced if ``durable``) renamed onto ``path`` by the
        core's one commit (include/treecask/commit.h: ``RENAME_NOREPLACE``,
        or with ``overwrite`` ``RENAME_EXCHANGE`` and removal of the old
        directory; then the parent's fsync)."""
        tmp, full = self._path(staging), self._path(path)
        out = write(os.path.join(tmp, COMMIT_OBJECT), True)
        if durable:
            _core.sync_path(tmp, full)
        _core.publish(tmp, full, overwrite, durable, full)
        return out

    def discard_directory(self, staging: str, names: Sequence[str]) -> None:
        """Removes the staging directory."""
        shutil.rmtree(self._path(staging), ignore_errors=True)
