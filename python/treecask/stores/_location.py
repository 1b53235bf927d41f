"""Resolve once: what a caller named (a file path, a URL, or a path inside a
store object) becomes one :class:`Location` at the first public call, and
everything below receives that value; nothing re-parses a path."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Iterator, Mapping, Optional

from ..errors import InvalidArgumentError
from ._local import LocalStore
from ._object import ObjectStore, is_url
from ._store import Store


@dataclasses.dataclass(frozen=True)
class Location:
    """Where one archive or checkpoint "directory" is: ``store`` (a
    :class:`Store`), ``path`` inside it (normalized: "/"-separated, no
    trailing "/"), ``shown`` (the text every message shows for it, secrets
    redacted: ``store.display(path)``) and ``directory`` (the caller named
    a "directory", with a trailing "/").

    Unpacks as ``store, path = location``."""

    store: Store
    path: str
    shown: str
    directory: bool = False

    def __iter__(self) -> Iterator[Any]:
        return iter((self.store, self.path))

    def __str__(self) -> str:
        return self.shown

    def is_sharded(self) -> Optional[bool]:
        """True: a sharded checkpoint "directory"; False: an archive; None:
        unknown without a request (an object store: open tries the archive
        first). :meth:`Store.is_sharded` where the store knows; else True
        when the caller named a "directory"."""
        known = self.store.is_sharded(self.path)
        return True if known is None and self.directory else known


def resolve(path: Any, store: Optional[Store] = None,
            storage_options: Optional[Mapping[str, Any]] = None) -> Location:
    """The :class:`Location` of what a caller named: ``path`` inside
    ``store`` when ``store`` is not None (``path`` "/"-separated, relative to
    the store's root); else a URL (``s3://bucket/key``, ``gs://``,
    ``az://``, ``http(s)://``: :meth:`ObjectStore.from_url`, configured by
    the environment and ``storage_options``) or a file system path (a
    :class:`LocalStore` of the working directory). A Location is returned
    as it is (resolved once, by the first public call).

    Raises InvalidArgumentError (``storage_options`` with a store object, a
    path that is not a str / PathLike, a malformed URL or credentials inside
    it), UnsupportedError (a URL scheme treecask does not serve)."""
    if isinstance(path, Location):
        if store is not None and store is not path.store:
            raise InvalidArgumentError("a resolved location already names its store", file=path.shown)
        return path
    if store is not None:
        if not isinstance(store, Store):
            raise InvalidArgumentError(f"store must be a treecask.stores.Store, got {type(store).__name__} "
                                       "(wrap an obstore store in treecask.stores.ObjectStore)")
        if storage_options:
            raise InvalidArgumentError("storage_options configure a store made from a URL; configure a store "
                                       "object with its own client options", file=store.display())
        text = "" if path is None else _text(path)
        st, p = store, store.normalize(text)
    elif is_url(text := _text(path)):
        st, key = ObjectStore.from_url(text, storage_options)
        p = key.rstrip("/")  # the key verbatim; a trailing "/" names a "directory"
    else:
        st, p = _LOCAL, _LOCAL.normalize(text)
    return Location(st, p, st.display(p), text.endswith("/"))


def _text(path: Any) -> str:
    try:
        return os.fspath(path)
    except TypeError:
        raise InvalidArgumentError(f"a path is a str or os.PathLike, got {type(path).__name__}") from None


_LOCAL = LocalStore()
