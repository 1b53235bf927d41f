"""Archives and multi-process checkpoints in object stores: ``s3://``,
``gs://``, ``az://``, ``http://`` and ``https://`` URLs read by range through
obstore (the Rust object_store client: credential chains, retries), as a
Source of the C++ core (include/treecask/source.h), which runs every check of
a local open and every chunk checksum on the bytes it is given
(format/SPEC.md "Remote reading"; docs/remote.md).

Configuration is the environment's, as boto3 and the Google clients read it
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AWS_REGION``; ``GOOGLE_APPLICATION_CREDENTIALS``,
``STORAGE_EMULATOR_HOST`` for a GCS emulator), overridden key by key by
``storage_options`` (obstore's config keys, e.g. ``endpoint``,
``access_key_id``, ``region``, ``skip_signature``)."""

from __future__ import annotations

import concurrent.futures
import datetime
import os
import threading
from typing import Any, Callable, List, Mapping, Optional, Tuple

from . import _core
from .errors import CorruptionError, Error, IoError, NotAnArchiveError, NotFoundError, UnsupportedError

# The transport rules are the core's (include/treecask/remote.h; docs/remote.md
# "URLs"): _core.parse_url takes every URL apart, _core.redact_url shows it,
# and the retry policy and per-object concurrency below are its constants.

# Ranges in flight at once per object (Source::concurrency()): the core's kObjectConcurrency.
CONCURRENCY = _core.OBJECT_CONCURRENCY


def _retry_config() -> dict:
    """obstore's ``retry_config`` from the core's RetryPolicy (remote.h): a
    connection error, 429, 500, 502, 503 (SlowDown) or 504 retried at most
    ``max_retries`` times with exponential backoff, none after
    ``timeout_s``, then the failure."""
    r = _core.RETRY_POLICY
    return {"max_retries": r["max_retries"], "retry_timeout": datetime.timedelta(seconds=r["timeout_s"]),
            "backoff": {"init_backoff": datetime.timedelta(seconds=r["initial_backoff_s"]),
                        "max_backoff": datetime.timedelta(seconds=r["max_backoff_s"]), "base": r["backoff_base"]}}


_RETRY = _retry_config()


def is_url(path: Any) -> bool:
    """True when ``path`` is a str that starts with a URL scheme
    (``<letters>://``, the core's is_url): such a string is never taken for
    a local path."""
    return isinstance(path, str) and _core.is_url(path)


def _base(u: dict, url: str) -> Tuple[str, str]:
    """(store base, object path) of a parsed URL: ``s3://bucket`` and the
    key; an http(s):// URL is its own store, with the empty path, so that
    every request goes to exactly that URL (its path never rewritten, its
    query string kept: presigned S3 URLs, GCS signed URLs, Azure SAS links)."""
    if u["scheme"] in ("http", "https"):
        return url, ""
    return f"{u['scheme']}://{u['bucket']}", u["key"]


# One obstore store (its HTTP client and connection pool) per bucket or HTTP
# directory and options, shared by every open: building one costs ~15 ms
# (TLS roots), and a kept connection saves a handshake per open.
_STORES: dict = {}
_STORES_LOCK = threading.Lock()


def _store_for(url: str, storage_options: Optional[Mapping[str, Any]]):
    """(obstore store, object path) for ``url``, the store shared with every
    other object of the same bucket (or HTTP directory), options and
    environment."""
    u = _core.parse_url(url)
    base, path = _base(u, url)
    return _shared_store(u["scheme"], base, storage_options), path


def _shared_store(scheme: str, base: str, storage_options: Optional[Mapping[str, Any]]):
    """The obstore store of ``base`` (a bucket URL or an HTTP URL), shared
    with every other user of the same base, options and environment."""
    env = tuple(sorted((k, v) for k, v in os.environ.items()
                       if k.startswith(("AWS_", "GOOGLE_", "AZURE_", "STORAGE_EMULATOR"))))
    key = (base, tuple(sorted((str(k), str(v)) for k, v in (storage_options or {}).items())), env)
    with _STORES_LOCK:
        store = _STORES.get(key)
    if store is None:
        store = _new_store(scheme, base, storage_options)
        if "?" not in base:  # a signed URL is used once: its store is not kept
            with _STORES_LOCK:
                _STORES[key] = store
    return store


def prefix_store(url: str, storage_options: Optional[Mapping[str, Any]]):
    """(obstore store, key prefix ending in "/" or empty) of the "directory"
    URL ``url`` (``s3://bucket/run``, or a bucket alone): where a multi-process
    checkpoint's or a manager's objects live. UnsupportedError for
    http(s):// (no listing, read-only)."""
    u = _core.parse_url(url, prefix=True)
    if u["scheme"] in ("http", "https"):
        raise UnsupportedError("an http(s):// URL is read-only: save to s3://, gs:// or az://", file=url)
    base, key = _base(u, url)
    key = key.rstrip("/")
    return _shared_store(u["scheme"], base, storage_options), (key + "/" if key else "")


def _new_store(scheme: str, base: str, storage_options: Optional[Mapping[str, Any]]):
    """The obstore store of ``base`` (a bucket URL or an HTTP directory), built anew."""
    import obstore.store

    options = dict(storage_options or {})
    client = {"allow_http": True} if scheme != "https" else None
    if scheme in ("http", "https"):
        return obstore.store.HTTPStore.from_url(base, client_options=client, retry_config=_RETRY)
    provider = None
    if scheme == "gs" and os.environ.get("STORAGE_EMULATOR_HOST") and "base_url" not in options:
        host = os.environ["STORAGE_EMULATOR_HOST"]
        options.setdefault("base_url", host if "://" in host else "http://" + host)
        options.setdefault("skip_signature", True)
        # An emulator takes any bearer token: without one object_store would ask the
        # cloud metadata server for a token before every write.
        provider = _emulator_token
    if scheme == "s3" and str(options.get("conditional_put", "")).lower() != "disabled":
        # The conditional commit of a multipart upload (_upload.put_file): If-None-Match
        # on CompleteMultipartUpload, as on PutObject; a store configured without
        # conditional writes gets neither.
        options.setdefault("copy_if_not_exists", "multipart")
    if provider is not None:
        return obstore.store.from_url(base, config=options, client_options=client, retry_config=_RETRY,
                                      credential_provider=provider)
    return obstore.store.from_url(base, config=options or None, client_options=client, retry_config=_RETRY)


def _emulator_token() -> dict:
    """The bearer token sent to a GCS emulator (STORAGE_EMULATOR_HOST), which checks none."""
    return {"token": "emulator", "expires_at": None}


def _error(url: str, exc: BaseException, etag: Optional[str] = None) -> Error:
    """The treecask error for an obstore failure on ``url``: the first line of
    its message, every URL in it (and ``url``) redacted by the Error
    (errors.py). Raise it outside the ``except`` that caught ``exc``, so that
    obstore's exception, whose text may quote a signed URL, is chained to
    nothing (neither ``__cause__`` nor ``__context__``)."""
    import obstore.exceptions as E

    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, E.PreconditionError):
        return CorruptionError(f"the object changed since it was opened (ETag {etag} pinned at open)", file=url)
    if isinstance(exc, E.NotSupportedError) and "Range" in first:  # as the C++ source says it
        return CorruptionError("the server ignored the Range request (HTTP 200 with the whole object "
                               "instead of 206 Partial Content): serve it from a server that honours Range",
                               file=url)
    if isinstance(exc, FileNotFoundError):
        return NotFoundError("no such object (or bucket)", file=url)
    if isinstance(exc, (E.PermissionDeniedError, E.UnauthenticatedError)):
        return IoError("access denied: check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, "
                       "GOOGLE_APPLICATION_CREDENTIALS or storage_options)", file=url)
    return IoError(f"{type(exc).__name__}: {first}", file=url)


class ObjectSource:
    """One object of an obstore store as a Source of the C++ core
    (include/treecask/source.h): ``name`` (its URL, redacted), ``size``
    (bytes; None until the first read), ``concurrency`` and ``read(offsets,
    lengths)``; ``store`` and ``path`` are the obstore store and the
    object's path in it (:func:`url_source` makes one of a URL).

    Construction sends no request. The first read is the core's open: the
    object's first and last bytes (_core.OPEN_HEAD_BYTES, OPEN_TAIL_BYTES) as
    two concurrent range requests, one round trip, whose answers give its
    size and ETag. Every later request carries ``If-Match`` with that ETag,
    so an object replaced meanwhile fails (CorruptionError), never mixes two
    versions. The core keeps what it read; this source keeps no bytes.
    ``read`` raises NotFoundError, NotAnArchiveError (an empty object),
    IoError, CorruptionError, UnsupportedError."""

    def __init__(self, store: Any, path: str, name: str):
        self.name = _core.redact_url(name)  # what every error and message shows
        self.size: Optional[int] = None
        self.concurrency = CONCURRENCY
        self._store, self._path = store, path
        self._etag: Optional[str] = None
        self._pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._lock = threading.Lock()

    def _get(self, options: dict):
        import obstore

        if self._etag is not None:
            options = dict(options, if_match=self._etag)
        try:
            return obstore.get(self._store, self._path, options=options)
        except Exception as e:  # noqa: BLE001 -- every obstore error becomes a treecask one
            err = _error(self.name, e, self._etag)
        raise err  # outside the except: obstore's exception is chained to nothing (_error)

    def _empty(self) -> bool:
        """Whether the object has 0 bytes (a HEAD request; False if it fails)."""
        import obstore

        try:
            return int(obstore.head(self._store, self._path)["size"]) == 0
        except Exception:  # noqa: BLE001 -- the caller reports its own error
            return False

    def _fetch(self, offset: int, length: int) -> Any:
        got = self._get({"range": (offset, offset + length)})
        data = got.bytes()
        if len(data) != length or int(got.range[0]) != offset:
            raise CorruptionError(f"asked for bytes [{offset}, {offset + length}), the server sent "
                                  f"[{got.range[0]}, {got.range[1]})", file=self.name)
        return data

    def _map(self, fn: Callable, *args: List[int]) -> List[Any]:
        """fn over the argument lists, concurrently when there are several."""
        if len(args[0]) == 1:
            return [fn(*(a[0] for a in args))]
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(self.concurrency)
        return list(self._pool.map(fn, *args))

    def _first_read(self, offsets: List[int], lengths: List[int]) -> List[Any]:
        """The core's first read: a negative offset asks for the last
        ``lengths[i]`` bytes; answers clipped to the object. Learns ``size``
        and the ETag, which every answer must agree on."""
        try:
            got = self._map(lambda o, n: self._get({"range": {"suffix": n} if o < 0 else (o, o + n)}),
                            offsets, lengths)
        except (IoError, CorruptionError):  # an empty object has no range to serve (HTTP 416, or 200)
            if not self._empty():
                raise
            raise NotAnArchiveError("not a treecask archive: the object is empty (0 bytes)",
                                    file=self.name) from None
        sizes = {int(g.meta["size"]) for g in got}
        etags = {g.meta.get("e_tag") for g in got}
        if len(sizes) != 1 or len(etags) != 1:
            raise CorruptionError("the object changed while it was opened", file=self.name)
        self._etag = etags.pop()
        self.size = sizes.pop()
        return [g.bytes() for g in got]

    def read(self, offsets: List[int], lengths: List[int]) -> List[Any]:
        """The bytes of each range ``[offsets[i], offsets[i] + lengths[i])``
        (the first read: see the class). Ranges that touch (the core's
        stretches of one group) go as one request, sliced without a copy;
        several requests run concurrently."""
        if self.size is None:
            return self._first_read(offsets, lengths)
        stretches: List[List[Any]] = []  # [start, end, indices of its ranges]
        for i, (o, n) in enumerate(zip(offsets, lengths)):
            if stretches and stretches[-1][1] == o:
                stretches[-1][1] = o + n
                stretches[-1][2].append(i)
            else:
                stretches.append([o, o + n, [i]])
        datas = self._map(self._fetch, [s[0] for s in stretches], [s[1] - s[0] for s in stretches])
        out: List[Any] = [None] * len(offsets)
        for (start, _, idx), data in zip(stretches, datas):
            if len(idx) == 1:
                out[idx[0]] = data
                continue
            view = memoryview(data)
            for i in idx:
                out[i] = view[offsets[i] - start:offsets[i] - start + lengths[i]]
        return out

    def __del__(self):
        if getattr(self, "_pool", None) is not None:
            self._pool.shutdown(wait=False)


def url_source(url: str, storage_options: Optional[Mapping[str, Any]] = None) -> ObjectSource:
    """The object ``url`` names as an :class:`ObjectSource` (its store shared
    with every other object of the same bucket and options)."""
    store, path = _store_for(url, storage_options)
    return ObjectSource(store, path, url)


class FileSource:
    """A local file as a Source of the C++ core (``name``, ``size``,
    ``concurrency``, ``read``): what a check of a checkpoint half in a store,
    half on this disk (an index not yet uploaded) opens."""

    concurrency = 1

    def __init__(self, path: str):
        self.name = path
        self.size = os.path.getsize(path)
        self._fd = os.open(path, os.O_RDONLY)

    def read(self, offsets: List[int], lengths: List[int]) -> List[bytes]:
        return [os.pread(self._fd, n, off) for off, n in zip(offsets, lengths)]

    def __del__(self):
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)


def opener(base_url: str, storage_options: Optional[Mapping[str, Any]] = None) -> Callable[[str], ObjectSource]:
    """The objects of the multi-process checkpoint at ``base_url`` (its
    ``index.cask`` and shard files), for ``_core.ShardedArchive.open_sources``."""
    base = base_url.rstrip("/")
    return lambda name: url_source(f"{base}/{name}", storage_options)
