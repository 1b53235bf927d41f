"""Sources of the C++ core (include/treecask/source.h: ``name``, ``size``,
``concurrency``, ``read(offsets, lengths)``) over what a store holds: one
object of an obstore store read by range (:class:`ObjectSource`), or one
local file (:class:`FileSource`). The core runs every check of a local open
and every chunk checksum on the bytes it is given (format/SPEC.md "Remote
reading"; docs/remote.md)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import threading
from typing import Any, Callable, List, Optional

import treecask._core as _core
from ..errors import CorruptionError, IoError, NotAnArchiveError
from . import _errors

# Ranges in flight at once per object (Source::concurrency()): the core's kObjectConcurrency.
CONCURRENCY = _core.OBJECT_CONCURRENCY


class ObjectSource:
    """One object of an obstore store as a Source of the C++ core
    (include/treecask/source.h): ``name`` (its URL, redacted), ``size``
    (bytes; None until the first read), ``concurrency`` and ``read(offsets,
    lengths)``; ``store`` and ``path`` are the obstore store and the
    object's path in it (:meth:`treecask.stores.ObjectStore.source` makes one).

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
        return _errors.mapped(self.name, lambda: obstore.get(self._store, self._path, options=options), self._etag)

    def _bytes(self, got: Any) -> Any:
        """The body of answer ``got``; a body cut short, or any failure while
        it streams, is the treecask error of the one map (one line)."""
        return _errors.mapped(self.name, got.bytes, self._etag)

    def _fetch(self, offset: int, length: int) -> Any:
        got = self._get({"range": (offset, offset + length)})
        data = self._bytes(got)
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
        """The core's first read (a negative offset: the last bytes), which learns ``size`` and the ETag."""
        try:
            got = self._map(lambda o, n: self._get({"range": {"suffix": n} if o < 0 else (o, o + n)}),
                            offsets, lengths)
        except (IoError, CorruptionError):  # an empty object has no range to serve (HTTP 416, or 200)
            import obstore

            empty = False
            with contextlib.suppress(Exception):  # (a failed HEAD: the read's own error is reported)
                empty = int(obstore.head(self._store, self._path)["size"]) == 0
            if not empty:
                raise
            raise NotAnArchiveError("not a treecask archive: the object is empty (0 bytes)",
                                    file=self.name) from None
        sizes = {int(g.meta["size"]) for g in got}
        etags = {g.meta.get("e_tag") for g in got}
        if len(sizes) != 1 or len(etags) != 1:
            raise CorruptionError("the object changed while it was opened", file=self.name)
        self._etag = etags.pop()
        self.size = sizes.pop()
        return [self._bytes(g) for g in got]

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
