"""The S3 calls obstore 0.12 lacks, made with botocore (optional: ``pip
install treecask[s3]``; docs/stores.md "S3 with botocore"): a multipart
upload straight to the key completed with ``If-None-Match: *``, and the
listing and aborting of a key's incomplete multipart uploads.
:func:`for_store` gives the :class:`S3` twin of an ``obstore.store.S3Store``
whose configuration botocore can reproduce (the store's ``config`` over the
``AWS_*`` environment, as obstore reads it), else None: then
:class:`treecask.stores.ObjectStore` keeps obstore's own path (``_upload``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import treecask._core as _core
from ..errors import AlreadyExistsError, Error
from . import _errors, _upload

#: The S3 options of the core's environment table (``_core.ENV_OPTIONS``,
#: remote.h kEnvOptions: which variables configure which option, in which
#: precedence) that obstore's and botocore's configurations take, under the
#: same names (obstore's S3 config keys). The table's ``ca_bundle`` is the
#: libcurl transport's; botocore and obstore read their certificates
#: themselves.
CORE_OPTIONS = ("endpoint", "region", "access_key_id", "secret_access_key", "session_token")


def options_from_env() -> Dict[str, str]:
    """``{option: value}`` of :data:`CORE_OPTIONS` that the environment sets,
    by the core's table (``_core.options_from_env("s3")``): what a store made
    from an ``s3://`` URL and its botocore twin are configured with beneath
    ``storage_options``, as the C++ tool is (AWS_ENDPOINT_URL_S3 over
    AWS_ENDPOINT_URL over AWS_ENDPOINT...)."""
    return {k: v for k, v in _core.options_from_env("s3").items() if k in CORE_OPTIONS}


# obstore's own S3 options, which the core has no counterpart of, and the variables obstore
# reads for them (object_store's AmazonS3Builder::from_env); and obstore's name of the
# fallback region.
_OBSTORE_ENV = {
    "default_region": "AWS_DEFAULT_REGION",
    "virtual_hosted_style_request": "AWS_VIRTUAL_HOSTED_STYLE_REQUEST",
    "skip_signature": "AWS_SKIP_SIGNATURE",
    "conditional_put": "AWS_CONDITIONAL_PUT",
}
# Keys that change nothing botocore does here (obstore's own commit options).
_IGNORED = {"bucket", "copy_if_not_exists"}

#: The marker ``<key>.tmp.<host>.<pid>.<hex16>/upload`` names a multipart upload straight to
#: ``<key>`` while it runs (S3 lists no owner of an upload): :meth:`S3.put_new`,
#: :meth:`S3.abort_dead_uploads`.
UPLOAD_MARKER = "upload"


def is_marker(path: str, name: str) -> bool:
    """Whether object ``name`` is an upload marker of ``path``
    (``<path>.tmp.<host>.<pid>.<hex16>/upload``)."""
    tail = "/" + UPLOAD_MARKER
    return name.startswith(path + ".tmp") and name.endswith(tail) and "/" not in name[len(path):-len(tail)]


def _true(v: Any) -> bool:
    return str(v).strip().lower() in ("1", "true", "yes", "on")


def for_store(store: Any) -> Optional["S3"]:
    """The botocore twin of obstore store ``store``, or None: botocore not
    installed (or too old for ``IfNoneMatch`` on CompleteMultipartUpload),
    not an S3Store, a Python credential provider, conditional writes
    disabled (``conditional_put="disabled"``), or an option (config, or
    client option other than ``allow_http`` and the timeouts of
    :func:`deadline`) botocore is not given here (then obstore's own path is
    used, which honours them all)."""
    import obstore.store

    if not isinstance(store, obstore.store.S3Store) or getattr(store, "credential_provider", None) is not None:
        return None
    try:
        import botocore.session  # noqa: F401
    except ImportError:
        return None
    cfg = dict(options_from_env(), **{k: os.environ[n] for k, n in _OBSTORE_ENV.items() if os.environ.get(n)})
    for k, v in (store.config or {}).items():
        if k not in CORE_OPTIONS and k not in _OBSTORE_ENV and k not in _IGNORED:
            return None
        cfg[k] = str(v)
    if set(store.client_options or {}) - {"allow_http", *_TIMEOUTS}:  # proxies, certificates: obstore's
        return None
    bucket = (store.config or {}).get("bucket")
    if not bucket or str(cfg.get("conditional_put", "")).lower() == "disabled":
        return None
    if _true(cfg.get("virtual_hosted_style_request", "")) and cfg.get("endpoint"):
        return None  # obstore's endpoint then already names the bucket
    try:
        limits = deadline(store)
    except (KeyError, ValueError):  # a duration in a unit not read here: obstore's
        return None
    client = _client(tuple(sorted(cfg.items())), tuple(sorted(limits.items())))
    return None if client is None else S3(client, str(bucket), (store.prefix or "").strip("/"))


#: obstore client options botocore is given (per attempt, seconds): ``connect_timeout`` is its
#: connect timeout, ``timeout`` its read timeout (no progress for that long fails the attempt).
_TIMEOUTS = {"connect_timeout": "connect_timeout_s", "timeout": "stall_timeout_s"}
_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "day": 86400.0,
          "days": 86400.0}


def _seconds(text: str) -> float:
    """Seconds of a duration as obstore spells its client options back ("1m 30s", "250ms")."""
    total = 0.0
    for part in str(text).split():
        number = part.rstrip("abcdefghijklmnopqrstuvwxyz")
        total += float(number) * _UNITS[part[len(number):] or "s"]
    return total


def deadline(store: Any) -> Dict[str, float]:
    """The bounds the botocore twin of obstore store ``store`` keeps, the
    store's own where it was given them, else the core's
    (``_core.RETRY_POLICY``, remote.h RetryPolicy and RemoteOptions):
    ``max_retries``; ``timeout_s``, after which no retry begins (obstore's
    ``retry_config["retry_timeout"]``); ``max_backoff_s``; per attempt
    ``connect_timeout_s`` and ``stall_timeout_s`` (obstore's client options
    ``connect_timeout`` and ``timeout``). A call then fails within
    ``timeout_s + max_backoff_s + connect_timeout_s + stall_timeout_s``
    seconds (no retry begun after ``timeout_s``, each after at most
    ``max_backoff_s``, the last at most a connect and a stall), as obstore's
    do."""
    out = {k: float(_core.RETRY_POLICY[k]) for k in
           ("max_retries", "timeout_s", "max_backoff_s", "connect_timeout_s", "stall_timeout_s")}
    retry = getattr(store, "retry_config", None) or {}
    options = getattr(store, "client_options", None) or {}
    if "max_retries" in retry:
        out["max_retries"] = float(retry["max_retries"])
    if "retry_timeout" in retry:
        out["timeout_s"] = retry["retry_timeout"].total_seconds()
    if "max_backoff" in (retry.get("backoff") or {}):
        out["max_backoff_s"] = retry["backoff"]["max_backoff"].total_seconds()
    for option, k in _TIMEOUTS.items():
        if options.get(option):
            out[k] = _seconds(options[option])
    return out


@functools.lru_cache(maxsize=None)
def _client(cfg_items: Tuple, limit_items: Tuple) -> Any:
    """The botocore client of a configuration and its bounds, one per pair (None: botocore too old)."""
    import botocore
    import botocore.config
    import botocore.session

    cfg, limits = dict(cfg_items), dict(limit_items)
    session = botocore.session.get_session()
    model = session.get_service_model("s3").operation_model("CompleteMultipartUpload")
    if "IfNoneMatch" not in model.input_shape.members:  # botocore before S3's conditional writes
        return None
    # The core's retry policy (remote.h RetryPolicy, _core.RETRY_POLICY), as obstore is given it
    # (_object._RETRY), or the store's own retry_config and timeouts (deadline()): botocore's
    # standard mode retries the same throttles, 5xx and dropped connections with capped
    # exponential backoff; total_max_attempts counts the first try (botocore's max_attempts
    # would count retries only); _keep_deadline caps the backoff and stops the retries at timeout_s.
    try:
        conf = botocore.config.Config(
            retries={"mode": "standard", "total_max_attempts": 1 + int(limits["max_retries"])},
            connect_timeout=limits["connect_timeout_s"], read_timeout=limits["stall_timeout_s"],
            max_pool_connections=2 * _upload.PARTS_IN_FLIGHT,
            # No checksum beyond SigV4's: what obstore sends (and what S3-compatible servers accept).
            request_checksum_calculation="when_required", response_checksum_validation="when_required",
            s3={"addressing_style": "virtual" if _true(cfg.get("virtual_hosted_style_request", "")) else "path"},
            signature_version=botocore.UNSIGNED if _true(cfg.get("skip_signature", "")) else None)
    except TypeError:  # botocore before 1.36 (no request_checksum_calculation): obstore's path
        return None
    client = session.create_client(
        "s3", region_name=cfg.get("region") or cfg.get("default_region") or "us-east-1",
        endpoint_url=cfg.get("endpoint") or None,
        aws_access_key_id=cfg.get("access_key_id"), aws_secret_access_key=cfg.get("secret_access_key"),
        aws_session_token=cfg.get("session_token"), config=conf)
    _keep_deadline(client, limits)
    return client


def _keep_deadline(client: Any, limits: Dict[str, float]) -> None:
    """``client``'s retries within the bounds of :func:`deadline`, as obstore's ``retry_config``."""
    import time

    from botocore.retries import standard

    events, unique_id = client.meta.events, "retry-config-s3"  # botocore's name of its handler
    events.unregister("needs-retry.s3", unique_id=unique_id)
    handler = standard.register_retry_handler(client, max_attempts=1 + int(limits["max_retries"]))
    events.unregister("needs-retry.s3", unique_id=unique_id)

    def started(context: Dict[str, Any], **_: Any) -> None:
        context["treecask_started"] = time.monotonic()

    def needs_retry(request_dict: Dict[str, Any], **kwargs: Any) -> Any:
        delay = handler.needs_retry(request_dict=request_dict, **kwargs)
        if delay is None:
            return None  # botocore's: no retry
        delay = min(delay, limits["max_backoff_s"])
        t0 = (request_dict.get("context") or {}).get("treecask_started", time.monotonic())
        # False: no retry (botocore's endpoint takes the first answer that is not None)
        return False if time.monotonic() - t0 + delay > limits["timeout_s"] else delay

    events.register("before-call.s3", started)
    events.register("needs-retry.s3", needs_retry, unique_id=unique_id)


class S3:
    """A botocore client of one bucket (``prefix``: the obstore store's key
    prefix, joined before every key)."""

    def __init__(self, client: Any, bucket: str, prefix: str):
        self.client, self.bucket, self.prefix = client, bucket, prefix

    def _key(self, path: str) -> str:
        return f"{self.prefix}/{path}" if self.prefix else path

    def put_new(self, path: str, local_file: str, url: str, *, overwrite: bool = False) -> str:
        """Uploads ``local_file`` as ``path`` by one multipart upload completed
        with ``If-None-Match: *`` (without it when ``overwrite``), named by its
        marker (:data:`UPLOAD_MARKER`) while it runs and aborted on any failure
        (docs/stores.md "S3 with botocore"); returns the completion's ETag.
        Raises AlreadyExistsError (the completion refused: 412, or 409
        ConditionalRequestConflict), NotFoundError (no bucket), IoError."""
        key = self._key(path)
        marker = self._key(f"{_core.temporary_path(path)}/{UPLOAD_MARKER}")
        err: Optional[Error] = None
        upload: Optional[str] = None
        what = "starting the multipart upload"
        try:
            try:
                self.client.put_object(Bucket=self.bucket, Key=marker, Body=b"")
                upload = self.client.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"]
                self.client.put_object(Bucket=self.bucket, Key=marker, Body=upload.encode())
                what = "the multipart upload"
                parts = self._parts(key, upload, local_file)
                return str(self.client.complete_multipart_upload(
                    Bucket=self.bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts},
                    **({} if overwrite else {"IfNoneMatch": "*"})).get("ETag", ""))
            except Exception as e:  # noqa: BLE001 -- every botocore error becomes a treecask one
                code, status = _errors.botocore_code(e)
                if not overwrite and (status == 412 or code in ("PreconditionFailed", "ConditionalRequestConflict")):
                    # A retried completion whose first try committed is refused: the object is then
                    # this save's own bytes.
                    own = self._own_etag(key, local_file)
                    if own is not None:
                        return own
                    err = AlreadyExistsError(_errors.EXISTS, file=url)
                else:  # (NoSuchUpload after another saver committed: ObjectStore.put_file checks the key)
                    err = _errors.of_botocore(url, what, e)
            raise err
        except BaseException:  # whatever failed, Ctrl-C included: the upload goes
            if upload is not None:
                self.abort(path, upload)
            raise
        finally:
            with contextlib.suppress(Exception):
                self.client.delete_object(Bucket=self.bucket, Key=marker)

    def _own_etag(self, key: str, local_file: str) -> Optional[str]:
        """The ETag of ``key`` when its size and last ``_upload.CONFIRM_BYTES`` are the file's, else None."""
        size = os.path.getsize(local_file)
        n = min(size, _upload.CONFIRM_BYTES)
        try:
            r = self.client.get_object(Bucket=self.bucket, Key=key, Range=f"bytes=-{n}")
            total = int(str(r.get("ContentRange", "")).rpartition("/")[2] or -1)
            got = r["Body"].read()
        except Exception:  # noqa: BLE001
            return None
        return str(r.get("ETag", "")) if total == size and _upload.ends_with(local_file, got, n) else None

    def _parts(self, key: str, upload: str, local_file: str) -> List[dict]:
        """The file's parts uploaded, each read by its worker; the first failure raised."""
        part = _upload.PART_BYTES
        count = max(1, -(-os.path.getsize(local_file) // part))
        fd = os.open(local_file, os.O_RDONLY)

        def send(i: int) -> dict:
            r = self.client.upload_part(Bucket=self.bucket, Key=key, UploadId=upload, PartNumber=i + 1,
                                        Body=os.pread(fd, part, i * part))
            return {"PartNumber": i + 1, "ETag": r["ETag"]}

        try:
            with concurrent.futures.ThreadPoolExecutor(_upload.PARTS_IN_FLIGHT,
                                                       thread_name_prefix="treecask-s3-part") as ex:
                futures = [ex.submit(send, i) for i in range(count)]
                try:
                    return [f.result() for f in futures]
                finally:
                    for f in futures:
                        f.cancel()
        finally:
            os.close(fd)

    def abort_dead_uploads(self, path: str, markers: Sequence[str],
                           relist: Callable[[], Sequence[str]]) -> List[str]:
        """Aborts the incomplete multipart uploads of ``path`` whose saver died,
        told by their markers (``markers``: those a listing of ``path`` found;
        ``relist()`` lists them again), by docs/stores.md "S3 with botocore"
        ("A dead saver's upload"). Returns the dead empty markers to keep (the
        next save tries again). Best effort: a failure is ignored."""
        try:
            named, empty = self._read_markers(path, markers)
            dead = [n for n, is_dead in empty.items() if is_dead]
            if not dead:
                return []
            found = self.uploads(path)
            named, empty = self._read_markers(path, relist())
            if not all(empty.values()):
                return dead
            for k, upload, _ in found:
                if k == path and upload not in named:
                    self.abort(path, upload, strict=True)
            return []
        except Exception:  # noqa: BLE001
            return list(markers)

    def _read_markers(self, path: str, markers: Sequence[str]) -> Tuple[set, Dict[str, bool]]:
        """(upload ids the markers name, {empty marker: dead?}); the dead markers' named uploads aborted."""
        named, empty = set(), {}
        for n in markers:
            try:
                upload = self.client.get_object(Bucket=self.bucket, Key=self._key(n))["Body"].read().decode()
            except Exception:  # noqa: BLE001 -- deleted meanwhile: its upload ended
                continue
            dead = _core.is_stale_temporary(path, n[:-len("/" + UPLOAD_MARKER)])
            if not upload:
                empty[n] = dead
                continue
            named.add(upload)
            if dead:
                self.abort(path, upload)
        return named, empty

    def uploads(self, prefix: str) -> List[Tuple[str, str, Any]]:
        """(path, upload id, when it was started: a datetime) of every
        incomplete multipart upload whose key starts with ``prefix``
        (ListMultipartUploads, paged). Raises botocore's errors."""
        out: List[Tuple[str, str, Any]] = []
        kw: Dict[str, str] = {"Bucket": self.bucket, "Prefix": self._key(prefix)}
        strip = len(self.prefix) + 1 if self.prefix else 0
        while True:
            r = self.client.list_multipart_uploads(**kw)
            out += [(u["Key"][strip:], u["UploadId"], u.get("Initiated")) for u in r.get("Uploads", [])]
            if not r.get("IsTruncated"):
                return out
            kw["KeyMarker"], kw["UploadIdMarker"] = r.get("NextKeyMarker", ""), r.get("NextUploadIdMarker", "")

    def abort(self, path: str, upload: str, *, strict: bool = False) -> None:
        """Aborts upload ``upload`` of ``path``. An upload already gone is
        no error; any other failure is ignored, or with ``strict`` raised
        (botocore's)."""
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=self._key(path), UploadId=upload)
        except Exception as e:  # noqa: BLE001
            if strict and _errors.botocore_code(e)[0] != "NoSuchUpload":
                raise

    def abort_dead(self, path: str) -> None:
        """After a create-only commit of ``path``: aborts every other upload of
        ``path`` and those of this host's dead temporaries of it (docs/stores.md
        "S3 with botocore"). Best effort."""
        with contextlib.suppress(Exception):
            for k, upload, _ in self.uploads(path):
                if k == path or (k.startswith(path + ".tmp") and _core.is_stale_temporary(path, k)):
                    self.abort(k, upload)
