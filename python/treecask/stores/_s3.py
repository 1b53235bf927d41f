"""The S3 calls obstore 0.12 lacks, made with botocore (optional: ``pip
install treecask[s3]``; docs/stores.md "S3 with botocore"):

- a conditional multipart upload straight to the key (CreateMultipartUpload,
  parts in parallel, CompleteMultipartUpload with ``If-None-Match: *``), so
  that a new large checkpoint is uploaded once, not uploaded to a temporary
  then copied;
- listing and aborting the incomplete multipart uploads of a key
  (ListMultipartUploads, AbortMultipartUpload), so that a killed saver's
  upload does not outlive the next save of that key.

:func:`for_store` gives a :class:`S3` for an ``obstore.store.S3Store`` whose
configuration botocore can reproduce (bucket, endpoint, static or
environment credentials, region, path- or virtual-hosted-style), else None:
then :class:`treecask.stores.ObjectStore` keeps obstore's own path
(python/treecask/_upload.py). Configuration is read as obstore reads it:
the store's ``config`` over the ``AWS_*`` environment variables.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import threading
from typing import Any, Dict, List, Optional, Tuple

import treecask._core as _core
from ..errors import Error
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
    "default_region": ("AWS_DEFAULT_REGION",),
    "virtual_hosted_style_request": ("AWS_VIRTUAL_HOSTED_STYLE_REQUEST",),
    "skip_signature": ("AWS_SKIP_SIGNATURE",),
    "conditional_put": ("AWS_CONDITIONAL_PUT",),
}
# Keys that change nothing botocore does here (obstore's own commit options).
_IGNORED = {"bucket", "copy_if_not_exists"}

#: A multipart upload straight to ``<key>`` is named, while it runs, by an
#: object ``<key>.tmp.<host>.<pid>.<hex16>/upload`` holding its upload id (S3
#: lists no owner of an upload): a temporary of the core's rule, so that
#: the next save of ``<key>``, or the manager's sweep of its run, aborts a
#: dead saver's upload and deletes the marker (:meth:`S3.abort_marked`).
UPLOAD_MARKER = "upload"

_CLIENTS: Dict[Tuple, Any] = {}
_CLIENTS_LOCK = threading.Lock()


def _true(v: Any) -> bool:
    return str(v).strip().lower() in ("1", "true", "yes", "on")


def for_store(store: Any) -> Optional["S3"]:
    """The botocore twin of obstore store ``store``, or None: botocore not
    installed (or too old for ``IfNoneMatch`` on CompleteMultipartUpload),
    not an S3Store, a Python credential provider, conditional writes
    disabled (``conditional_put="disabled"``), or an option (config or
    client option other than ``allow_http``) botocore is not given here (then obstore's own path is used, which honours them all)."""
    import obstore.store

    if not isinstance(store, obstore.store.S3Store) or getattr(store, "credential_provider", None) is not None:
        return None
    try:
        import botocore.session  # noqa: F401
    except ImportError:
        return None
    cfg: Dict[str, str] = options_from_env()
    for k, names in _OBSTORE_ENV.items():
        for n in names:
            if os.environ.get(n):
                cfg[k] = os.environ[n]
                break
    for k, v in (store.config or {}).items():
        if k not in CORE_OPTIONS and k not in _OBSTORE_ENV and k not in _IGNORED:
            return None
        cfg[k] = str(v)
    if set(store.client_options or {}) - {"allow_http"}:  # proxies, certificates, timeouts: obstore's
        return None
    bucket = (store.config or {}).get("bucket")
    if not bucket or str(cfg.get("conditional_put", "")).lower() == "disabled":
        return None
    if _true(cfg.get("virtual_hosted_style_request", "")) and cfg.get("endpoint"):
        return None  # obstore's endpoint then already names the bucket
    client = _client(cfg)
    if client is None:
        return None
    return S3(client, str(bucket), (store.prefix or "").strip("/"))


def _client(cfg: Dict[str, str]) -> Any:
    key = tuple(sorted(cfg.items()))
    with _CLIENTS_LOCK:
        if key in _CLIENTS:
            return _CLIENTS[key]
        import botocore.session

        session = botocore.session.get_session()
        model = session.get_service_model("s3").operation_model("CompleteMultipartUpload")
        if "IfNoneMatch" not in model.input_shape.members:  # botocore before S3's conditional writes
            _CLIENTS[key] = None
            return None
        try:
            conf = _config(cfg)
        except TypeError:  # botocore before 1.36 (no request_checksum_calculation): obstore's path
            _CLIENTS[key] = None
            return None
        client = session.create_client(
            "s3", region_name=cfg.get("region") or cfg.get("default_region") or "us-east-1",
            endpoint_url=cfg.get("endpoint") or None,
            aws_access_key_id=cfg.get("access_key_id"), aws_secret_access_key=cfg.get("secret_access_key"),
            aws_session_token=cfg.get("session_token"), config=conf)
        _CLIENTS[key] = client
        return client


def _config(cfg: Dict[str, str]) -> Any:
    import botocore
    import botocore.config

    # The core's retry policy (remote.h RetryPolicy, _core.RETRY_POLICY), as obstore is given it
    # (_object._RETRY): botocore's standard mode retries the same throttles, 5xx and dropped
    # connections with capped exponential backoff; total_max_attempts counts the first try
    # (botocore's max_attempts would count retries only). botocore has no overall deadline:
    # the core's timeout_s bounds obstore's retries, botocore's are bounded by their number.
    return botocore.config.Config(
        retries={"mode": "standard", "total_max_attempts": 1 + int(_core.RETRY_POLICY["max_retries"])},
        max_pool_connections=2 * _upload.PARTS_IN_FLIGHT,
        # No checksum beyond SigV4's: what obstore sends (and what S3-compatible servers accept).
        request_checksum_calculation="when_required", response_checksum_validation="when_required",
        s3={"addressing_style": "virtual" if _true(cfg.get("virtual_hosted_style_request", "")) else "path"},
        signature_version=botocore.UNSIGNED if _true(cfg.get("skip_signature", "")) else None)


class S3:
    """A botocore client of one bucket (``prefix``: the obstore store's key
    prefix, joined before every key)."""

    def __init__(self, client: Any, bucket: str, prefix: str):
        self.client, self.bucket, self.prefix = client, bucket, prefix

    def _key(self, path: str) -> str:
        return f"{self.prefix}/{path}" if self.prefix else path

    def put_new(self, path: str, local_file: str, url: str, *, overwrite: bool = False) -> str:
        """Uploads ``local_file`` as ``path`` by one multipart upload
        (``_upload.PART_BYTES`` parts, ``_upload.PARTS_IN_FLIGHT`` at once,
        each read from the file by its worker: memory is bounded by their
        product) completed with ``If-None-Match: *`` (without it when
        ``overwrite``); returns the ETag the completion gave. While it runs
        the upload is named by its marker (:data:`UPLOAD_MARKER`), so that
        the next save of ``path`` aborts it if this process dies, whichever
        kind of save that is. On any failure the upload is aborted. Raises
        AlreadyExistsError when the completion is refused because ``path``
        exists (412 PreconditionFailed, or 409 ConditionalRequestConflict:
        another completion of ``path`` in progress), NotFoundError (no
        bucket), IoError."""
        key = self._key(path)
        marker = self._key(f"{_core.temporary_path(path)}/{UPLOAD_MARKER}")
        err: Optional[Error] = None
        try:
            upload = self.client.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"]
        except Exception as e:  # noqa: BLE001 -- every botocore error becomes a treecask one
            err = _errors.of_botocore(url, "starting the multipart upload", e)
        if err is not None:
            raise err
        try:
            try:
                self.client.put_object(Bucket=self.bucket, Key=marker, Body=upload.encode())
            except Exception as e:  # noqa: BLE001
                err = _errors.of_botocore(url, "writing the upload's marker", e)
            if err is not None:
                with contextlib.suppress(Exception):
                    self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload)
                raise err
            return self._upload(key, upload, local_file, url, overwrite)
        finally:
            with contextlib.suppress(Exception):
                self.client.delete_object(Bucket=self.bucket, Key=marker)

    def _upload(self, key: str, upload: str, local_file: str, url: str, overwrite: bool) -> str:
        err: Optional[Error] = None
        try:
            try:
                parts = self._parts(key, upload, local_file)
                condition = {} if overwrite else {"IfNoneMatch": "*"}
                r = self.client.complete_multipart_upload(
                    Bucket=self.bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts}, **condition)
                return str(r.get("ETag", ""))
            except Exception as e:  # noqa: BLE001 -- every botocore error becomes a treecask one
                code, status = _errors.botocore_code(e)
                refused = not overwrite and (status == 412 or code in ("PreconditionFailed",
                                                                        "ConditionalRequestConflict"))
                if refused or (code == "NoSuchUpload" and not overwrite):
                    # A retried completion whose first try committed is refused (412) or finds its
                    # upload gone: the object is then this save's own bytes.
                    own = self._own_etag(key, local_file)
                    if own is not None:
                        return own
                if refused:
                    err = _errors.exists_error(url)
                elif code == "NoSuchUpload" and not overwrite and self._exists(key):
                    # aborted by the saver that committed the key first (abort_dead)
                    err = _errors.exists_error(url, "another saver committed the object first (this upload "
                                                    "was aborted)")
                else:
                    err = _errors.of_botocore(url, "the multipart upload", e)
            raise err
        except BaseException:
            with contextlib.suppress(Exception):
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload)
            raise

    def _own_etag(self, key: str, local_file: str) -> Optional[str]:
        """The ETag of object ``key`` when its size and last
        ``_upload.CONFIRM_BYTES`` are the local file's (one ranged GET), else
        None (also when it cannot be read)."""
        size = os.path.getsize(local_file)
        n = min(size, _upload.CONFIRM_BYTES)
        try:
            r = self.client.get_object(Bucket=self.bucket, Key=key, Range=f"bytes=-{n}")
            total = int(str(r.get("ContentRange", "")).rpartition("/")[2] or -1)
            got = r["Body"].read()
        except Exception:  # noqa: BLE001
            return None
        with open(local_file, "rb") as f:
            f.seek(size - n)
            mine = f.read(n)
        return str(r.get("ETag", "")) if total == size and got == mine else None

    def _exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=key)
            return True
        except Exception:  # noqa: BLE001
            return False

    def _parts(self, key: str, upload: str, local_file: str) -> List[dict]:
        """Uploads the file's parts, each read by its worker; raises the first
        failure (botocore's)."""
        part, inflight = _upload.PART_BYTES, _upload.PARTS_IN_FLIGHT
        size = os.path.getsize(local_file)
        count = max(1, -(-size // part))
        fd = os.open(local_file, os.O_RDONLY)
        try:
            def send(i: int) -> dict:
                body = os.pread(fd, part, i * part)
                r = self.client.upload_part(Bucket=self.bucket, Key=key, UploadId=upload,
                                            PartNumber=i + 1, Body=body)
                return {"PartNumber": i + 1, "ETag": r["ETag"]}

            done: List[dict] = []
            err: Optional[BaseException] = None
            with concurrent.futures.ThreadPoolExecutor(inflight, thread_name_prefix="treecask-s3-part") as ex:
                pending = set()
                for i in range(count):
                    if len(pending) >= inflight:  # at most `inflight` parts read and in flight
                        finished, pending = concurrent.futures.wait(
                            pending, return_when=concurrent.futures.FIRST_COMPLETED)
                        for f in finished:
                            if f.exception() is not None:
                                err = f.exception()
                            else:
                                done.append(f.result())
                        if err is not None:
                            break
                    pending.add(ex.submit(send, i))
                for f in concurrent.futures.as_completed(pending):
                    if f.exception() is not None:
                        err = err or f.exception()
                    else:
                        done.append(f.result())
        finally:
            os.close(fd)
        if err is not None:
            raise err
        return sorted(done, key=lambda p: p["PartNumber"])

    def abort_marked(self, path: str, names: List[str]) -> None:
        """Aborts the multipart uploads of ``path`` whose saver died: those
        named by a marker ``<path>.tmp.<host>.<pid>.<hex16>/upload`` among
        ``names`` (a listing of ``path``) that is stale by the core's rule
        (this host, a process that no longer runs). The markers themselves
        are left to :meth:`treecask.stores.Store.remove_stale`. Best effort."""
        for n in names:
            temporary, _, rest = n.partition("/" + UPLOAD_MARKER)
            if rest or not temporary.startswith(path + ".tmp") or "/" in temporary[len(path):]:
                continue
            if not _core.is_stale_temporary(path, temporary):
                continue
            with contextlib.suppress(Exception):
                upload = self.client.get_object(Bucket=self.bucket, Key=self._key(n))["Body"].read().decode()
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=self._key(path), UploadId=upload)

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

    def abort(self, path: str, upload: str) -> None:
        """Aborts upload ``upload`` of ``path``; best effort (a failure, or an
        upload already gone, is ignored)."""
        with contextlib.suppress(Exception):
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=self._key(path), UploadId=upload)

    def abort_dead(self, path: str) -> None:
        """Aborts what no saver can still complete, once ``path`` is committed
        by a save that refuses to replace it: every other incomplete
        multipart upload of ``path`` itself (its completion, conditional,
        would be refused; one made unconditionally, by an ``overwrite``
        save, fails instead of replacing this checkpoint), and the uploads
        of temporaries ``<path>.tmp.<host>.<pid>.<hex16>`` of this host
        whose process is gone (the core's rule). Best effort: a failure is
        ignored (the next save of ``path`` tries again)."""
        with contextlib.suppress(Exception):
            for k, upload, _ in self.uploads(path):
                if k == path or (k.startswith(path + ".tmp") and _core.is_stale_temporary(path, k)):
                    self.abort(k, upload)
