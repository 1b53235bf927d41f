"""``treecask.stores``: where checkpoints live, and every byte that leaves
the process (docs/stores.md, with examples). A :class:`Store` reads byte
ranges and commits whole objects; ``open``, ``load``, ``save`` and
``CheckpointManager`` take ``store=`` and a path inside it, a URL or a file
path being a short way to name both (:func:`resolve`, which makes the one
:class:`Location` everything below the public call receives).
:class:`LocalStore` is a directory of the file system (mapped reads, the
core's atomic rename commit); :class:`ObjectStore` any obstore store (range
reads, conditional-write commits).
"""

from __future__ import annotations

from ._local import LocalStore
from ._location import Location, resolve
from ._object import ObjectStore, is_url
from ._store import COMMIT_OBJECT, Store, join

__all__ = ["Store", "LocalStore", "ObjectStore", "Location", "resolve", "join", "is_url", "COMMIT_OBJECT"]
