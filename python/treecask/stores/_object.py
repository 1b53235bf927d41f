"""ObjectStore: any obstore store (S3, GCS, Azure, HTTP, memory) as a Store,
committed with the store's conditional writes (docs/stores.md)."""

from __future__ import annotations

import os
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from .. import _core, _remote, _upload
from ..errors import Error, UnsupportedError
from . import _s3
from ._store import Store


class ObjectStore(Store):
    """An obstore store (``obstore.store.S3Store``, ``GCSStore``,
    ``AzureStore``, ``HTTPStore``, ``MemoryStore``, or any made by
    ``obstore.store.from_url``), configured with the client's own types:

        store = treecask.stores.ObjectStore(obstore.store.S3Store("bucket", config=...))
        treecask.save("run/step_1.cask", tree, store=store)

    Args:
      store: the obstore store; paths are keys inside it.
      name: what messages call the store's root, e.g. ``"s3://bucket"``
        (default: the store class, ``"<S3Store>"``); shown through the core's
        redaction rule, so a signed URL's secrets never appear.

    Reading: each object opens in one round trip (its first 256 KiB and last
    4 MiB, also giving its size and ETag) and every later range carries
    ``If-Match`` with that ETag: an object replaced meanwhile is a
    CorruptionError, never a mix of two versions (SPEC.md "Remote reading").
    Writing (:meth:`put_file`): up to 64 MiB one PUT with ``If-None-Match:
    *`` (S3; GCS ``ifGenerationMatch=0``; memory: create mode); larger, on
    S3 with botocore installed, one multipart upload straight to ``path``
    completed with ``If-None-Match: *`` (``stores/_s3.py``), elsewhere a
    multipart upload to a temporary ``<path>.tmp.<host>.<pid>.<hex16>`` and a
    conditional copy onto ``path``; then the object is confirmed to be this
    save's (one ranged GET). Whether two racing creations are
    atomic is the store's guarantee, not treecask's (docs/stores.md lists
    them); a store that refuses conditional writes gets a HEAD just before an
    unconditional write. Listing needs a store that lists (not HTTP).
    """

    def __init__(self, store: Any, *, name: Optional[str] = None):
        self.store = store
        self.name = name.rstrip("/") if name else f"<{type(store).__name__}>"

    @classmethod
    def from_url(cls, url: str, storage_options: Optional[Mapping[str, Any]] = None) -> Tuple["ObjectStore", str]:
        """(store, path) of a URL: ``s3://bucket/key`` -> the bucket's store
        and ``key``; ``https://host/a/b.cask?sig=...`` -> a store of exactly
        that URL (never rewritten, its query kept) and ``""``. The store is
        configured from the environment and ``storage_options`` (obstore
        config keys), as :func:`treecask.open` documents. Raises
        UnsupportedError for a scheme treecask does not serve,
        InvalidArgumentError for a malformed URL or credentials inside it
        (``_core.parse_url``)."""
        u = _core.parse_url(url, prefix=True)  # the core's URL rule (remote.h parse_url)
        base, key = _remote._base(u, url)
        return cls(_remote._shared_store(u["scheme"], base, storage_options), name=base), key

    # ---- naming ----
    def display(self, path: str = "") -> str:
        """``<name>/<path>``, secrets redacted."""
        return _core.redact_url(f"{self.name}/{path}" if path else self.name)

    # ---- reading ----
    def source(self, path: str) -> Any:
        """Object ``path`` as the core's Source (this class's docstring)."""
        return _remote.ObjectSource(self.store, path, self.display(path))

    # ---- writing ----
    def put_file(self, path: str, local_file: str, *, overwrite: bool) -> None:
        """Uploads and commits ``local_file`` as ``path`` (this class's
        docstring); without ``overwrite``, then confirms that the object is
        this save's (``_upload.confirm``: AlreadyExistsError if another
        saver's replaced it) and, on S3 with botocore, aborts the incomplete
        multipart uploads of ``path`` no saver can complete any more
        (docs/stores.md "S3 with botocore")."""
        self._writable(path)
        url = self.display(path)
        s3 = _s3.for_store(self.store) if not overwrite else None
        if s3 is not None and os.path.getsize(local_file) > _upload.SINGLE_PUT_BYTES:
            etag = s3.put_new(path, local_file, url)
            _upload.confirm(self.store, path, local_file, url=url, etag=etag)
        else:
            _upload.put_file(self.store, path, local_file, url=url, overwrite=overwrite)
        if s3 is not None:
            s3.abort_dead(path)

    def list_prefix(self, prefix: str) -> List[str]:
        """Every key that starts with the string ``prefix``: one paged listing
        of its "directory" from just before ``prefix`` (obstore's ``offset``),
        stopped at the first key past it (object stores list in
        lexicographic order)."""
        self._writable(prefix)
        parent = prefix.rpartition("/")[0]
        if not prefix or prefix.endswith("/"):
            return _upload.list_keys(self.store, prefix or None, self.display(prefix))
        import obstore

        out: List[str] = []
        err: Optional[Error] = None
        try:
            for batch in obstore.list(self.store, parent or None, offset=prefix[:-1], chunk_size=1000):
                for m in batch:
                    k = m["path"]
                    if k.startswith(prefix):
                        out.append(k)
                    elif k > prefix:
                        return out
        except Exception as e:  # noqa: BLE001 -- every obstore error becomes a treecask one
            err = _upload._store_error(self.display(prefix), e)
        if err is not None:
            raise err  # outside the except: obstore's text may quote a signed URL
        return out

    def remove_stale(self, path: str, names: Optional[Sequence[str]] = None) -> None:
        """:meth:`Store.remove_stale`; on S3 with botocore it first aborts
        the multipart uploads of ``path`` whose saver died (their markers,
        ``stores/_s3.py``)."""
        names = self.list_prefix(path) if names is None else list(names)
        marked = [n for n in names if n.endswith("/" + _s3.UPLOAD_MARKER)]
        s3 = _s3.for_store(self.store) if marked else None
        if s3 is not None:
            s3.abort_marked(path, marked)
        super().remove_stale(path, names)

    def delete(self, paths: Sequence[str]) -> None:
        """Deletes each object (best effort: a missing one, or a failure, is skipped)."""
        _upload.delete_objects(self.store, list(paths))

    def _writable(self, path: str) -> None:
        if "HTTPStore" in type(self.store).__name__:
            raise UnsupportedError("an http(s):// store is read-only and lists nothing: save to s3://, "
                                   "gs://, az:// or another store", file=self.display(path))

