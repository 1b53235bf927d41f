"""``treecask gc URL``: what dead savers left under a prefix of an object
store that nobody saves to any more (docs/stores.md "Cleaning up after a
killed saver"). The saves' own sweeps only remove this host's leftovers of
dead processes, at the next save of the same key or run; this removes the
rest, by age instead of by owner."""

from __future__ import annotations

import dataclasses
import datetime
import re
from typing import Any, Dict, List, Optional

import treecask._core as _core

from ..errors import UnsupportedError
from . import _errors, _s3
from ._object import ObjectStore
from ._store import COMMIT_OBJECT

#: A multi-process checkpoint's shard object in a store (``_distributed.run`` names it).
_SHARD = re.compile(r"process_[0-9]+\.[0-9a-f]+\.cask")


@dataclasses.dataclass
class Leftover:
    """One thing :func:`collect` removes: ``kind`` is ``"temporary"`` (an
    object of a temporary ``<name>.tmp.<host>.<pid>.<hex16>``, or under one),
    ``"uncommitted shard"`` (a multi-process checkpoint's shard object whose
    checkpoint has no ``index.cask``) or ``"multipart upload"`` (incomplete;
    S3 with botocore); ``path`` its path in the store, ``age_s`` seconds since
    it was written (an upload: started), ``size`` bytes (0 for an upload),
    ``upload_id`` the upload's id."""

    kind: str
    path: str
    age_s: float
    size: int = 0
    upload_id: Optional[str] = None


def _age(now: datetime.datetime, when: Any) -> float:
    if when is None:
        return float("inf")
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return (now - when).total_seconds()


def find(store: ObjectStore, prefix: str, *, older_than: float) -> List[Leftover]:
    """The leftovers under the "directory" ``prefix`` of ``store`` (its
    whole root for ``""``) that are at least ``older_than`` seconds old (by
    the store's clock as it reports times and this machine's): temporaries
    of any host and process; the shard objects of a checkpoint
    ``<ckpt>/process_<k>.<id>.cask`` without ``<ckpt>/index.cask``, when
    every shard of it is that old; incomplete multipart uploads (S3 with
    botocore). One listing (and one ListMultipartUploads). Raises
    UnsupportedError for a store that is not an object store, NotFoundError,
    IoError."""
    import obstore

    if not isinstance(store, ObjectStore):
        raise UnsupportedError("treecask gc cleans object stores (s3://, gs://, az://); a local "
                               "directory's temporaries are swept by its next save", file=store.display(prefix))
    store.writable(prefix)
    base = prefix.strip("/")
    base = base + "/" if base else ""
    now = datetime.datetime.now(datetime.timezone.utc)
    metas: Dict[str, Any] = _errors.mapped(store.display(prefix), lambda: {
        m["path"]: m for batch in obstore.list(store.store, base or None, chunk_size=1000) for m in batch})
    out: List[Leftover] = []
    shards: Dict[str, List[Any]] = {}
    for path, m in sorted(metas.items()):
        parts = path.split("/")
        if any(_core.is_temporary_name(p) for p in parts):  # the core's grammar, every form
            age = _age(now, m.get("last_modified"))
            if age >= older_than:
                out.append(Leftover("temporary", path, age, int(m.get("size", 0))))
        elif _SHARD.fullmatch(parts[-1]) and len(parts) > 1:
            shards.setdefault("/".join(parts[:-1]), []).append(m)
    for ckpt, ms in sorted(shards.items()):
        if f"{ckpt}/{COMMIT_OBJECT}" in metas:
            continue
        ages = [_age(now, m.get("last_modified")) for m in ms]
        if min(ages) >= older_than:
            out += [Leftover("uncommitted shard", m["path"], a, int(m.get("size", 0))) for m, a in zip(ms, ages)]
    s3 = _s3.for_store(store.store)
    if s3 is not None:
        listed = _errors.mapped(store.display(prefix), lambda: s3.uploads(base),
                                error=lambda url, e: _errors.of_botocore(url, "listing multipart uploads", e))
        for path, upload, started in listed:
            age = _age(now, started)
            if age >= older_than:
                out.append(Leftover("multipart upload", path, age, 0, upload))
    return out


def collect(store: ObjectStore, prefix: str, *, older_than: float, dry_run: bool = False) -> List[Leftover]:
    """Removes (unless ``dry_run``) and returns what :func:`find` finds:
    objects deleted, uploads aborted. Only for a prefix nobody saves to any
    more: a save still running there, started at least ``older_than``
    seconds ago, loses its temporaries or its upload and fails (IoError),
    never commits half an object. Raises as :func:`find` does."""
    found = find(store, prefix, older_than=older_than)
    if dry_run:
        return found
    s3 = _s3.for_store(store.store)
    for f in found:
        if f.upload_id is not None and s3 is not None:
            s3.abort(f.path, f.upload_id)
    store.delete([f.path for f in found if f.upload_id is None])
    return found
