"""``treecask.stores``: where checkpoints live (docs/stores.md).

A :class:`Store` reads byte ranges and commits whole objects; treecask's
``open``, ``load``, ``save`` and ``CheckpointManager`` take ``store=`` and a
path inside it, and a URL or a file path is a short way to name both
(:func:`resolve`):

    import obstore.store, treecask
    from treecask.stores import ObjectStore

    store = ObjectStore(obstore.store.MemoryStore())
    treecask.save("step_1.cask", tree, store=store)
    tree = treecask.load("step_1.cask", store=store)

* :class:`LocalStore` -- a directory of the file system: mapped reads, the
  core's atomic rename commit.
* :class:`ObjectStore` -- any obstore store (S3, GCS, Azure, HTTP, memory):
  range reads, conditional-write commits.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional, Tuple

from ._local import LocalStore
from ._object import ObjectStore
from ._store import COMMIT_OBJECT, Store, join

__all__ = ["Store", "LocalStore", "ObjectStore", "resolve", "join", "COMMIT_OBJECT"]


def resolve(path: Any, store: Optional[Store] = None,
            storage_options: Optional[Mapping[str, Any]] = None) -> Tuple[Store, str]:
    """(store, path inside it) of what a caller named: ``store`` and ``path``
    as given when ``store`` is not None (``path`` "/"-separated, relative to
    the store's root); else a URL (``s3://bucket/key``, ``gs://``, ``az://``,
    ``http(s)://``: :meth:`ObjectStore.from_url`, configured by the
    environment and ``storage_options``) or a file system path (a
    :class:`LocalStore` of the working directory).

    Raises InvalidArgumentError (``storage_options`` with a store object, or
    a path that is not a str / PathLike), UnsupportedError (a URL scheme
    treecask does not serve)."""
    from .. import _remote
    from ..errors import InvalidArgumentError

    if store is not None:
        if not isinstance(store, Store):
            raise InvalidArgumentError(f"store must be a treecask.stores.Store, got {type(store).__name__} "
                                       "(wrap an obstore store in treecask.stores.ObjectStore)")
        if storage_options:
            raise InvalidArgumentError("storage_options configure a store made from a URL; configure a store "
                                       "object with its own client options", file=store.display())
        return store, "" if path is None else store.normalize(os.fspath(path))
    p = os.fspath(path)
    if _remote.is_url(p):
        return ObjectStore.from_url(p, storage_options)
    return _LOCAL, p


_LOCAL = LocalStore()
