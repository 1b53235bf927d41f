"""``treecask.stores``: where checkpoints live, and every byte that leaves
the process (docs/stores.md).

A :class:`Store` reads byte ranges and commits whole objects; treecask's
``open``, ``load``, ``save`` and ``CheckpointManager`` take ``store=`` and a
path inside it, and a URL or a file path is a short way to name both
(:func:`resolve`, which makes the one :class:`Location` everything below
the public call receives):

    import obstore.store, treecask
    from treecask.stores import ObjectStore

    store = ObjectStore(obstore.store.MemoryStore())
    treecask.save("step_1.cask", tree, store=store)
    tree = treecask.load("step_1.cask", store=store)

* :class:`LocalStore` -- a directory of the file system: mapped reads, the
  core's atomic rename commit.
* :class:`ObjectStore` -- any obstore store (S3, GCS, Azure, HTTP, memory):
  range reads, conditional-write commits.
"""

from __future__ import annotations

from ._local import LocalStore
from ._location import Location, resolve
from ._object import ObjectStore, is_url
from ._store import COMMIT_OBJECT, Store, join

__all__ = ["Store", "LocalStore", "ObjectStore", "Location", "resolve", "join", "is_url", "COMMIT_OBJECT"]
