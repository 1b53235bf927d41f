"""LocalStore: a directory of the file system as a Store. It implements the
protocol's primitives; its commits are the file-system protocols the Store
base class writes once (the core's atomic rename, SPEC.md "Atomic commit"),
chosen because :meth:`LocalStore.local_path` answers."""

from __future__ import annotations

import contextlib
import os
import shutil
from typing import Any, Dict, List, Optional, Sequence

import treecask._core as _core
from ._source import FileSource
from ._store import Store


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
        return FileSource(self._path(path))

    def head(self, path: str) -> Optional[Dict[str, Any]]:
        """``{"size", "version": (inode, mtime in ns)}`` of the file, None when missing."""
        try:
            st = os.stat(self._path(path))
        except FileNotFoundError:
            return None
        return {"size": st.st_size, "version": (st.st_ino, st.st_mtime_ns)}

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
            if e.is_dir(follow_symlinks=False):
                for d, _, files in os.walk(e.path):
                    sub = os.path.relpath(d, self._path(parent) or ".")
                    base = f"{parent}/{sub}" if parent else sub
                    out.extend(f"{base}/{f}" for f in files)
            else:
                out.append(f"{parent}/{e.name}" if parent else e.name)
        return out

    def delete(self, paths: Sequence[str]) -> None:
        """Unlinks each file; a missing one is no error."""
        for p in paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(p))
