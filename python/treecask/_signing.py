"""Signed checkpoints (docs/signing.md): :func:`sign`, and the signature and key
reading behind the ``signature=`` / ``public_key=`` arguments of the readers,
:func:`treecask.open`, :func:`treecask.load` and :func:`treecask.verify`
(``_open.py``: it opens readers, which import this module), as the core's
signing API (include/treecask/signing.h) takes them. Every rule (the bundle format, the keys, which bytes are hashed
when) is the core's; this module reads the signature and key bytes and
converts."""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional, Tuple, Union

import treecask._core as _core

from . import stores
from ._types import PathLike
from .errors import InvalidArgumentError, IoError, NotFoundError, SignatureError, UnsupportedError

#: What ``signature=`` and ``public_key=`` take: a path (a URL too, for the
#: signature) or the file's bytes.
KeySource = Union[PathLike, bytes, bytearray, memoryview]

# The first read of a signature object in a store: its last 64 MiB (a bundle
# is ~250 bytes per shard: 64 MiB holds a 500 GB checkpoint's at 2 MiB shards).
_FIRST_READ = 64 << 20


def _is_bytes(x: Any) -> bool:
    return isinstance(x, (bytes, bytearray, memoryview))


def _read_local(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise NotFoundError(f"no {what} file", file=path) from None
    except IsADirectoryError:
        raise InvalidArgumentError(f"the {what} is a directory, not a file", file=path) from None
    except OSError as e:
        raise IoError(f"cannot read the {what}: {e.strerror}", file=path) from None


def _text(data: bytes, what: str, file: str) -> str:
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise (SignatureError if what == "signature" else InvalidArgumentError)(
            f"the {what} is not UTF-8 text (byte {e.start})", file=file) from None


def read_signature(signature: KeySource, storage_options: Optional[Mapping[str, Any]] = None) -> str:
    """The bundle JSON text of `signature`: bytes as given, a file path read, a URL
    (s3://, gs://, az://, http(s)://) read through the store layer with
    `storage_options`. Raises NotFoundError, IoError, SignatureError (empty or not
    UTF-8), InvalidArgumentError (another type)."""
    if _is_bytes(signature):
        return _text(signature, "signature", "")
    if not isinstance(signature, (str, os.PathLike)):
        raise InvalidArgumentError(f"signature must be a path, a URL or bytes, got {type(signature).__name__}")
    s = os.fspath(signature)
    if _core.is_url(s):  # the whole object, read through the store layer
        loc = stores.resolve(s, None, storage_options)
        data = loc.store.read_object(loc.path, _FIRST_READ)
        if not data:
            raise SignatureError("the signature object is empty", file=loc.shown)
        return _text(data, "signature", loc.shown)
    return _text(_read_local(s, "signature"), "signature", s)


def read_pem(key: KeySource, what: str) -> str:
    """The PEM text of `key` (`what`: "public_key" or "private_key"): bytes or a
    str holding "-----BEGIN" as given, else a file path read. Raises NotFoundError,
    IoError, InvalidArgumentError."""
    if _is_bytes(key):
        return _text(key, what, "")
    if isinstance(key, str) and key.lstrip().startswith("-----BEGIN"):
        return key
    if not isinstance(key, (str, os.PathLike)):
        raise InvalidArgumentError(f"{what} must be a PEM file's path or its bytes, got {type(key).__name__}")
    p = os.fspath(key)
    return _text(_read_local(p, what), what, p)


def signature_check(signature: Optional[KeySource], public_key: Optional[KeySource],
                    storage_options: Optional[Mapping[str, Any]] = None, *,
                    file: str = "") -> Optional[Tuple[str, str]]:
    """(bundle JSON, PEM public key) for the core's OpenOptions::signature, or None
    when neither is given. Raises InvalidArgumentError (naming `file`, the archive)
    when only one is, and what read_signature / read_pem raise."""
    if signature is None and public_key is None:
        return None
    if signature is None or public_key is None:
        missing = "public_key" if public_key is None else "signature"
        raise InvalidArgumentError(f"a signed open needs both signature= and public_key= ({missing} is missing)",
                                   file=_core.redact_url(file) if file else "")
    return read_signature(signature, storage_options), read_pem(public_key, "public_key")


def sign(path: PathLike, *, private_key: KeySource, signature: Optional[PathLike] = None,
         shard_size: Optional[int] = None, files: bool = False) -> str:
    """Signs an archive file or a sharded checkpoint directory with an EC private
    key, writing an OpenSSF model-signing bundle that ``model_signing verify key``
    (model-signing 1.1.1) accepts unchanged, and returns its path.

    The bundle is what ``model_signing sign key`` writes (docs/signing.md):
    with the default shard serialization each resource is a range
    ``name:start:end`` of ``shard_size`` bytes (default: the core's
    ``default_sign_shard_size``), so a verified read hashes only the shards it
    touches; ``files=True`` writes one digest per file. Every byte is hashed
    with SHA-256 on all cores (treecask::sign, include/treecask/signing.h).

    Args:
      path: the archive file (the model is that one file, resource ".") or a
        sharded checkpoint directory (its files by relative path).
      private_key: an unencrypted PEM EC private key on P-256, P-384 or P-521
        (what ``model_signing sign key`` takes): its file's path, or its bytes.
      signature: where to write the bundle (default ``path + ".sig"``, next to
        the archive or directory, never inside the signed directory); written
        to a temporary file and renamed into place.
      shard_size: bytes per shard (shard serialization only).
      files: file serialization instead of shards.

    Returns:
      The bundle's path (str).

    Raises:
      NotFoundError (no such archive or key file), IoError,
      InvalidArgumentError (not a PEM private key; shard_size with files=True or
      not positive; a signature path inside the signed directory),
      UnsupportedError (a key that is not EC on a curve model_signing takes,
      named; an object-store URL: sign the local file before uploading it).
    """
    p = os.fspath(path)
    if _core.is_url(p):
        raise UnsupportedError("sign a local archive (before uploading it): the bundle's digests are of every "
                               "byte of the file", file=_core.redact_url(p))
    if shard_size is not None:
        if files:
            raise InvalidArgumentError("shard_size is for shard serialization; files=True signs whole files",
                                       file=p)
        if int(shard_size) <= 0:
            raise InvalidArgumentError(f"shard_size must be positive, got {shard_size}", file=p)
    pem = read_pem(private_key, "private_key")
    out = os.fspath(signature) if signature is not None else p.rstrip("/") + ".sig"
    if os.path.isdir(p):
        inside = os.path.relpath(os.path.abspath(out), os.path.abspath(p))
        if not inside.startswith(os.pardir):
            raise InvalidArgumentError("the signature would be written inside the signed directory, which it "
                                       "would then not match: write it next to the directory", file=out)
    bundle = _core.sign(p, pem, shards=not files, shard_size=int(shard_size or 0))
    # the core's temporary name (<out>.tmp.<host>.<pid>.<hex16>, SPEC.md "Atomic commit"): a
    # killed signer's leftover is swept as every other writer's
    tmp = _core.temporary_path(os.path.abspath(out))
    try:
        with open(tmp, "x", encoding="utf-8") as f:
            f.write(bundle)
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return out
