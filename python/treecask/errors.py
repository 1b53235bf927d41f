"""treecask's exception classes: one per C++ ``treecask::ErrorCode``
(``include/treecask/error.h``), plus the Python-only :class:`StructureError`,
each also the closest built-in exception (docs/python.md "Errors" has the
table). Every instance carries ``code``, ``code_name``, ``file``,
``key_path`` and ``message``; ``str(error)`` is ``"<file>: <key_path>: <code
name>: <message>"``, the C++ ``Error::what()``. A URL in any of them is shown
through the core's one redaction rule (``_core.redact_url``), applied when
the error is made, so no secret reaches ``args`` or ``repr``.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import treecask._core as _core

# The core's name of each treecask::ErrorCode (error_code_name), by its stable number
# (include/treecask/error.h): each class below gives its number; the name is the core's.
_NAMES = {number: name for name, number in _core.ERROR_CODES.items()}

#: The class of each treecask::ErrorCode number (filled as the classes below are defined).
_BY_CODE: Dict[int, type] = {}


def _format(file: str, key_path: str, code_name: str, message: str) -> str:
    return ": ".join([file or "<no file>"] + ([key_path] if key_path else []) + [code_name, message])


class Error(Exception):
    """Base class of every treecask error."""

    code: Optional[int] = None
    code_name: str = "error"

    def __init__(self, message: str, *, file: str = "", key_path: str = "", what: Optional[str] = None):
        # The one redaction rule (this module's docstring), wherever a URL may be.
        self.message = _core.redact_urls_in(str(message))
        self.file = _core.redact_url(str(file)) if file else ""
        self.key_path = key_path or ""
        self._what = (_core.redact_urls_in(what) if what is not None
                      else _format(self.file, self.key_path, self.code_name, self.message))
        super().__init__(self._what)

    def __str__(self) -> str:  # KeyError would otherwise repr() its argument
        return self._what

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # A class of a C++ ErrorCode: its name is the core's, and the translator finds it by number.
        super().__init_subclass__(**kwargs)
        if "code" in cls.__dict__ and cls.code is not None:
            cls.code_name = _NAMES[cls.code]
            _BY_CODE[cls.code] = cls

    def __reduce__(self):
        return (_rebuild, (type(self), self.message, self.file, self.key_path, self._what))


def _rebuild(cls, message, file, key_path, what):
    return cls(message, file=file, key_path=key_path, what=what)


class NotFoundError(Error, FileNotFoundError):
    """The file does not exist (C++ ``kNotFound``)."""

    code = 1


class NotAnArchiveError(Error, ValueError):
    """The file exists but is not a treecask archive (``kNotAnArchive``)."""

    code = 2


class VersionError(Error):
    """The archive uses a format major version this library cannot read (``kUnsupportedVersion``)."""

    code = 3


class CorruptionError(Error, ValueError):
    """The archive's structure is damaged or violates the spec (``kCorruption``).
    A ``ValueError``, as :class:`NotAnArchiveError` and :class:`ChecksumError`:
    ``except ValueError`` catches an empty, a truncated or a bit-flipped file."""

    code = 4


class ChecksumError(CorruptionError):
    """Stored bytes do not match their XXH3 checksum (``kChecksumMismatch``);
    a CorruptionError, hence a ``ValueError`` too."""

    code = 5


class KeyNotFoundError(Error, KeyError):
    """No leaf or subtree with this key path (``kKeyNotFound``)."""

    code = 6


class InvalidArgumentError(Error, ValueError, TypeError, IndexError):
    """The caller passed something the format forbids (``kInvalidArgument``),
    including a leaf index out of range (hence also an ``IndexError``)."""

    code = 7


class ShapeError(Error, ValueError):
    """A dtype, shape or byte length disagrees with what was expected (``kShapeMismatch``)."""

    code = 8


class IoError(Error, OSError):
    """The operating system refused (open, write, fsync, rename...) (``kIo``)."""

    code = 9


class AlreadyExistsError(Error, FileExistsError):
    """``save`` without ``overwrite=True`` onto an existing path (``kAlreadyExists``)."""

    code = 10


class UnsupportedError(Error):
    """A valid request the reader cannot serve this way (``kUnsupported``)."""

    code = 11


class SignatureError(Error, ValueError):
    """A signature does not verify (``kSignature``): the envelope under the
    public key, a statement not for this archive, a key type or hash algorithm
    treecask does not check (named), or a signed range's SHA-256 (the message
    names the file and the byte range); docs/signing.md."""

    code = 12


class StructureError(Error, ValueError):
    """The checkpoint's tree does not match the template (``like``): a missing
    or extra leaf, or a node of another kind. Python-only (no C++ code)."""

    code = None
    code_name = "structure mismatch"


def _from_core(code: int, code_name: str, file: str, key_path: str, message: str, what: str) -> Error:
    """Called by the C++ exception translator: the instance for one treecask::Error."""
    cls = _BY_CODE.get(code, Error)
    return cls(message, file=file, key_path=key_path, what=what)


def _with_file(e: Error, path: str) -> Error:
    """`e`, or when it names no file a copy of it naming `path` (the file the call was about)."""
    return e if e.file else type(e)(e.message, file=path, key_path=e.key_path)


# Every error class, Error first (``from treecask.errors import *``; treecask re-exports them).
__all__ = [n for n, c in list(globals().items()) if isinstance(c, type) and issubclass(c, Error)]
