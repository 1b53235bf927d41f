"""The one error map of the storage floor: every failure of obstore or
botocore becomes a treecask error here, and nowhere else (docs/stores.md
"Errors").

Each error is one line: what failed, and at most the first line of the
client's own message (obstore's texts run on with a ``Debug source:`` dump of
its internals, which never reaches a user). Every URL in it is redacted by the
Error itself (errors.py, the core's ``redact_urls_in``). Raise the result
outside the ``except`` that caught the client's exception, so that it is
chained to nothing: the client's text may quote a signed URL.
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple, TypeVar

from ..errors import AlreadyExistsError, CorruptionError, Error, InvalidArgumentError, IoError, NotFoundError

#: What an "access denied" tells the user to check.
_CREDENTIALS = ("check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, "
                "GOOGLE_APPLICATION_CREDENTIALS or storage_options)")
T = TypeVar("T")
EXISTS = "the object exists (a checkpoint is never replaced; pass overwrite=True to replace it)"


def mapped(url: str, call: Callable[[], T], etag: Optional[str] = None,
           error: Optional[Callable[[str, BaseException], Error]] = None) -> T:
    """``call()``, a client's failure raised as ``error(url, exception)``'s
    treecask error (default :func:`of_obstore`'s), chained to nothing; a
    treecask error as it is."""
    try:
        return call()
    except Error:
        raise
    except Exception as e:  # noqa: BLE001 -- every client error becomes a treecask one
        err = error(url, e) if error is not None else of_obstore(url, e, etag)
    raise err


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (its class name when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def of_obstore(url: str, exc: BaseException, etag: Optional[str] = None) -> Error:
    """The treecask error of an obstore failure on ``url`` (a read, a write
    or a listing): the object changed under a pinned ETag (``etag``) or a
    server that ignored Range -> CorruptionError; a missing object or bucket
    -> NotFoundError; an existing object (a refused conditional write) ->
    AlreadyExistsError; refused credentials -> IoError "access denied";
    anything else IoError with the client's first line."""
    import obstore.exceptions as E

    first = first_line(exc)
    text = str(exc)
    if isinstance(exc, E.PreconditionError) and etag is not None:
        return CorruptionError(f"the object changed since it was opened (ETag {etag} pinned at open)", file=url)
    if isinstance(exc, E.NotSupportedError) and "Range" in first:  # as the C++ source says it
        return CorruptionError("the server ignored the Range request (HTTP 200 with the whole object "
                               "instead of 206 Partial Content): serve it from a server that honours Range",
                               file=url)
    if isinstance(exc, E.AlreadyExistsError) or "412 Precondition Failed" in text:
        return AlreadyExistsError(EXISTS, file=url)
    if "NoSuchBucket" in text or "bucket does not exist" in text.lower():
        return NotFoundError("no such bucket", file=url)
    if isinstance(exc, FileNotFoundError):
        return NotFoundError("no such object (or bucket)", file=url)
    if isinstance(exc, (E.PermissionDeniedError, E.UnauthenticatedError)) or any(
            s in text for s in ("AccessDenied", "SignatureDoesNotMatch", "InvalidAccessKeyId", "403 Forbidden")):
        return IoError(f"access denied: {_CREDENTIALS}", file=url)
    return IoError(f"{type(exc).__name__}: {first}", file=url)


def of_config(url: str, exc: BaseException) -> Error:
    """The treecask error of a store that cannot be made for ``url`` (obstore
    refuses its configuration: a malformed URL, an unknown option): an
    InvalidArgumentError with obstore's first line; the Error redacts it.
    (A treecask error never reaches it: :func:`mapped` raises those as they are.)"""
    return InvalidArgumentError(f"cannot configure the store: {first_line(exc)}", file=url)


def botocore_code(e: BaseException) -> Tuple[str, int]:
    """(error code, HTTP status) of a botocore ClientError, else ("", 0)."""
    r = getattr(e, "response", None) or {}
    return (str(r.get("Error", {}).get("Code", "")),
            int(r.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0))


def of_botocore(url: str, what: str, e: BaseException) -> Error:
    """The treecask error of a failed botocore call (``what``: the step, e.g.
    "the multipart upload"); botocore's texts name the operation and the
    server's code, never a signature."""
    code, status = botocore_code(e)
    if code in ("NoSuchBucket",):
        return NotFoundError("no such bucket", file=url)
    if code in ("AccessDenied", "SignatureDoesNotMatch", "InvalidAccessKeyId") or status == 403:
        return IoError(f"access denied: {_CREDENTIALS}", file=url)
    detail = f"{code} (HTTP {status})" if code else f"{type(e).__name__}: {first_line(e)}"
    return IoError(f"{what} failed: {detail}", file=url)
