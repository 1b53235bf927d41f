"""ObjectStore: any obstore store (S3, GCS, Azure, HTTP, memory) as a Store,
committed with the store's conditional writes (docs/stores.md), and the
stores made from URLs (``s3://``, ``gs://``, ``az://``, ``http(s)://``),
one per bucket, options and environment, shared by every open.

Configuration is the environment's, by the core's table (``_core.ENV_OPTIONS``,
remote.h kEnvOptions, which the C++ tool reads too: ``AWS_ENDPOINT_URL_S3``,
``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AWS_REGION``; ``STORAGE_EMULATOR_HOST`` for a GCS
emulator) and, for what the core has no row of, obstore's own
(``GOOGLE_APPLICATION_CREDENTIALS``, ``AWS_SKIP_SIGNATURE``...), overridden key
by key by ``storage_options`` (obstore's config keys, e.g. ``endpoint``,
``access_key_id``, ``region``, ``skip_signature``)."""

from __future__ import annotations

import contextlib
import datetime
import os
import threading
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import treecask._core as _core
from ..errors import AlreadyExistsError, Error, NotFoundError
from . import _errors, _s3, _upload
from ._source import ObjectSource
from ._store import Store


# obstore's retry_config from the core's RetryPolicy (remote.h): a connection error, 429, 500,
# 502, 503 (SlowDown) or 504 retried at most max_retries times with exponential backoff, none
# after timeout_s, then the failure.
_R = _core.RETRY_POLICY
_RETRY = {"max_retries": _R["max_retries"], "retry_timeout": datetime.timedelta(seconds=_R["timeout_s"]),
          "backoff": {"init_backoff": datetime.timedelta(seconds=_R["initial_backoff_s"]),
                      "max_backoff": datetime.timedelta(seconds=_R["max_backoff_s"]), "base": _R["backoff_base"]}}


def is_url(path: Any) -> bool:
    """True when ``path`` is a str that starts with a URL scheme
    (``<letters>://``, the core's is_url): such a string is never taken for
    a local path."""
    return isinstance(path, str) and _core.is_url(path)


# One obstore store (its HTTP client and connection pool) per bucket or HTTP
# directory and options, shared by every open: building one costs ~15 ms
# (TLS roots), and a kept connection saves a handshake per open.
_STORES: dict = {}
_STORES_LOCK = threading.Lock()


def _shared_store(scheme: str, base: str, storage_options: Optional[Mapping[str, Any]], url: str):
    """The obstore store of ``base``, shared by every user of the same base, options and environment."""
    env = tuple(sorted((k, v) for k, v in os.environ.items()
                       if k.startswith(("AWS_", "GOOGLE_", "AZURE_", "STORAGE_EMULATOR"))))
    key = (base, tuple(sorted((str(k), str(v)) for k, v in (storage_options or {}).items())), env)
    with _STORES_LOCK:
        store = _STORES.get(key)
    if store is None:
        # (obstore's ValueError may quote the URL: one treecask error, chained to nothing)
        store = _errors.mapped(url, lambda: _new_store(scheme, base, storage_options), error=_errors.of_config)
        if "?" not in base:  # a signed URL is used once: its store is not kept
            with _STORES_LOCK:
                _STORES[key] = store
    return store


def _new_store(scheme: str, base: str, storage_options: Optional[Mapping[str, Any]]):
    """The obstore store of ``base`` (a bucket URL or an HTTP directory), built anew."""
    import obstore.store

    client = {"allow_http": True} if scheme != "https" else None
    # The environment by the core's table (remote.h kEnvOptions), beneath storage_options, as
    # the C++ tool reads it (obstore's own reading of the environment fills in the rest).
    options = dict(_s3.options_from_env() if scheme == "s3" else {}, **(storage_options or {}))
    if scheme in ("http", "https"):
        return obstore.store.HTTPStore.from_url(base, client_options=client, retry_config=_RETRY)
    provider = None
    emulator = _core.options_from_env("gs").get("endpoint") if scheme == "gs" else None  # STORAGE_EMULATOR_HOST
    if emulator and "base_url" not in options:
        options.setdefault("base_url", emulator if "://" in emulator else "http://" + emulator)
        options.setdefault("skip_signature", True)
        # An emulator takes any bearer token: without one object_store would ask the
        # cloud metadata server for a token before every write.
        provider = lambda: {"token": "emulator", "expires_at": None}  # noqa: E731 -- the emulator checks none
    if scheme == "s3" and str(options.get("conditional_put", "")).lower() != "disabled":
        # The conditional commit of a multipart upload (_upload.put_file): If-None-Match
        # on CompleteMultipartUpload, as on PutObject; a store configured without
        # conditional writes gets neither.
        options.setdefault("copy_if_not_exists", "multipart")
    return obstore.store.from_url(base, config=options or None, client_options=client, retry_config=_RETRY,
                                  **({"credential_provider": provider} if provider is not None else {}))


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
      read_only: the store only reads and lists nothing (default: True for
        an ``obstore.store.HTTPStore``).

    Reads are pinned to one ETag (``_source.ObjectSource``), commits
    conditional and confirmed (docs/stores.md "What each store guarantees at
    commit"). Listing needs a store that lists (not HTTP).
    """

    def __init__(self, store: Any, *, name: Optional[str] = None, read_only: Optional[bool] = None,
                 single_object: bool = False):
        import obstore.store

        self.store = store
        self.name = name.rstrip("/") if name else f"<{type(store).__name__}>"
        self.read_only = isinstance(store, obstore.store.HTTPStore) if read_only is None else bool(read_only)
        self.single_object = bool(single_object)

    @classmethod
    def from_url(cls, url: str, storage_options: Optional[Mapping[str, Any]] = None) -> Tuple["ObjectStore", str]:
        """(store, path) of a URL: ``s3://bucket/key`` -> the bucket's store
        and ``key``; ``https://host/a/b.cask?sig=...`` -> a store of exactly
        that URL (never rewritten, its query kept; it names one object) and
        ``""``. The store is configured from the environment and
        ``storage_options`` (obstore config keys), as :func:`treecask.open`
        documents. Raises UnsupportedError for a scheme treecask does not
        serve, InvalidArgumentError for a malformed URL, credentials inside
        it (``_core.parse_url``) or a configuration obstore refuses."""
        err: Optional[Error] = None
        try:
            u = _core.parse_url(url, prefix=True)  # the core's URL rule (remote.h parse_url)
        except Error as e:  # named by the whole URL (redacted), not the part the parser reached
            err = type(e)(e.message, file=url, key_path=e.key_path)
        if err is not None:
            raise err
        # An http(s):// URL is its own store with the empty path: every request goes to exactly that URL
        # (its path never rewritten, its query kept: presigned S3, GCS signed and Azure SAS URLs).
        http = u["scheme"] in ("http", "https")
        base, key = (url, "") if http else (f"{u['scheme']}://{u['bucket']}", u["key"])
        return cls(_shared_store(u["scheme"], base, storage_options, url), name=base,
                   single_object=http and "?" in url), key

    # ---- naming ----
    def display(self, path: str = "") -> str:
        """``<name>/<path>``, secrets redacted."""
        return _core.redact_url(f"{self.name}/{path}" if path else self.name)

    # ---- reading ----
    def source(self, path: str) -> Any:
        """Object ``path`` as the core's Source (this class's docstring)."""
        return ObjectSource(self.store, path, self.display(path))

    def head(self, path: str) -> Optional[Dict[str, Any]]:
        """``{"size", "version": ETag}`` of object ``path`` (one HEAD), None when missing."""
        import obstore

        try:
            m = _errors.mapped(self.display(path), lambda: obstore.head(self.store, path))
        except NotFoundError:
            return None
        return {"size": int(m["size"]), "version": m.get("e_tag")}

    # ---- writing ----
    def put_file(self, path: str, local_file: str, *, overwrite: bool) -> None:
        """Uploads and commits ``local_file`` as ``path`` (this class's
        docstring). Without ``overwrite``: the object is then confirmed to be
        this save's (``_upload.confirm``: AlreadyExistsError if another
        saver's replaced it); a failure on the way, whatever the server
        answered (a 500 for a part of an upload the winner aborted), is
        AlreadyExistsError when another saver committed ``path`` meanwhile
        (the key is checked); on S3 with botocore, the incomplete multipart
        uploads of ``path`` no saver can complete any more are aborted
        (docs/stores.md "S3 with botocore")."""
        self.writable(path)
        url = self.display(path)
        s3 = _s3.for_store(self.store)
        try:
            if s3 is not None and os.path.getsize(local_file) > _upload.SINGLE_PUT_BYTES:
                etag = s3.put_new(path, local_file, url, overwrite=overwrite)
                if not overwrite:
                    _upload.confirm(self.store, path, local_file, url=url, etag=etag)
            else:
                _upload.put_file(self.store, path, local_file, url=url, overwrite=overwrite)
        except AlreadyExistsError:
            raise
        except Error:
            committed = False
            with contextlib.suppress(Error):
                committed = not overwrite and self.head(path) is not None
            if not committed:
                raise
            # Another saver committed the key: this save's object if the bytes say so, else refused.
            _upload.confirm(self.store, path, local_file, url=url)
        if s3 is not None and not overwrite:
            s3.abort_dead(path)

    def list_prefix(self, prefix: str) -> List[str]:
        """Every key that starts with the string ``prefix``: one paged listing
        of its "directory" from just before ``prefix`` (obstore's ``offset``),
        stopped at the first key past it (object stores list in
        lexicographic order)."""
        import obstore

        self.writable(prefix)
        if not prefix or prefix.endswith("/"):
            return _errors.mapped(self.display(prefix), lambda: [
                m["path"] for batch in obstore.list(self.store, prefix or None, chunk_size=1000) for m in batch])

        def listing() -> List[str]:
            out: List[str] = []
            for batch in obstore.list(self.store, prefix.rpartition("/")[0] or None, offset=prefix[:-1],
                                      chunk_size=1000):
                for m in batch:
                    if m["path"].startswith(prefix):
                        out.append(m["path"])
                    elif m["path"] > prefix:
                        return out
            return out

        return _errors.mapped(self.display(prefix), listing)

    def sweep_uploads(self, path: str, names: Sequence[str]) -> Sequence[str]:
        """On S3 with botocore: aborts the multipart uploads of ``path``
        whose saver died, by their markers among ``names``; returns the dead
        markers kept for the next save (``_s3.S3.abort_dead_uploads``)."""
        marked = [n for n in names if _s3.is_marker(path, n)]
        s3 = _s3.for_store(self.store) if marked else None
        if s3 is None:
            return ()
        return s3.abort_dead_uploads(path, marked, lambda: [n for n in self.list_prefix(path)
                                                            if _s3.is_marker(path, n)])

    def delete(self, paths: Sequence[str]) -> None:
        """Deletes each object (best effort: a missing one, or a failure, is skipped)."""
        import obstore

        for k in paths:
            with contextlib.suppress(Exception):
                obstore.delete(self.store, k)
