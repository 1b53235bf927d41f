"""A checkpoint directory of one archive per item and ``index.cask``, written through the store
seam, in a multi-process jax job by every process (format/SPEC.md "Item-directory steps")."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np

from .. import _distributed
from .. import _jaxutil as J
from .. import stores
from .._async import SaveJob, _start
import treecask._core as _core

from .._open import ITEMS_DIRECTORY_KEY
from .._request import SaveRequest, compression_code, metadata_items
from .._save import save as _save
from ..stores import _upload
from ..errors import Error, InvalidArgumentError, UnsupportedError, _with_file

#: The commit object of a checkpoint directory (``treecask.stores.COMMIT_OBJECT``).
INDEX = stores.COMMIT_OBJECT
#: An item archive's metadata key holding its kind ("pytree", "json", "array", "stateful").
KIND_KEY = "treecask.orbax.kind"
#: The index's metadata key that marks a checkpoint directory of items (a
#: multi-process save's sharded checkpoint also has an ``index.cask``).
MARK_KEY = ITEMS_DIRECTORY_KEY


def directory_of(store: stores.Store, key: str) -> Optional[Tuple[List[str], Dict[str, str]]]:
    """(the item entries of checkpoint directory ``key``, sorted; its index.cask's metadata), or
    None when it is not one: one listing and one open of index.cask."""
    head = key + "/" if key and not key.endswith("/") else key
    try:
        names = store.list_prefix(head)
    except UnsupportedError:  # a store that lists nothing (http(s)): one object, never a directory
        return None
    if stores.join(key, INDEX) not in names:
        return None
    from .._open import open as _open

    with _open(stores.join(key, INDEX), store=store) as a:
        md = dict(a.metadata)
    if MARK_KEY not in md:
        return None  # a sharded checkpoint: one archive
    firsts = {n[len(head):].split("/", 1)[0] for n in names}
    return sorted(f for f in firsts if f and f != INDEX and ".tmp." not in f), md


def item_names(store: stores.Store, key: str) -> Optional[List[str]]:
    """The item entries of checkpoint directory ``key`` (sorted), or None when it is not one."""
    d = directory_of(store, key)
    return None if d is None else d[0]


def _snapshot(tree: Any) -> Any:
    """``tree`` with every NumPy array copied (jax arrays are immutable)."""
    if (jax := J.import_jax()) is None:
        import copy

        return copy.deepcopy(tree)
    return jax.tree_util.tree_map(lambda x: np.array(x, copy=True) if isinstance(x, np.ndarray) else x, tree)


_items_counter = 0  # multi-process saves of a directory of items so far (the coordination keys)


def save_directory(store: stores.Store, key: str, items: Mapping[str, Tuple[Any, Mapping[str, str]]],
                   index_md: Mapping[str, str], *, overwrite: bool, asynchronous: bool,
                   meanwhile: Optional[Callable[[], None]] = None, after: Optional[Callable[[], None]] = None,
                   step: Optional[int] = None, metrics: Any = None) -> Optional[SaveJob]:
    """Writes checkpoint directory ``key``: each item ``name -> (tree, metadata)``, then ``index.cask``,
    committed whole; AlreadyExistsError unless ``overwrite``; a SaveJob when ``asynchronous``. In a
    multi-process jax job every process calls it in the same order (coordination keys are numbered per
    call): process 0 stages and commits, an error in any is raised in all, ``after`` runs in each."""
    global _items_counter
    for name in items:
        if not isinstance(name, str) or not name or "/" in name or name == INDEX or name.startswith("."):
            raise InvalidArgumentError(f"an item name is a non-empty str without '/', not '{INDEX}', got {name!r}",
                                       file=store.display(key))
    store.make_directory(key.rpartition("/")[0])  # a file system's parents; nothing in an object store
    shown, overwrite, pid, client = store.display(key), bool(overwrite), 0, None
    if _distributed.active():
        import jax

        _items_counter += 1
        coord, pid, client = f"treecask/orbax/items/{_items_counter}", jax.process_index(), _distributed._client()
        timeout_ms = int(_distributed.BARRIER_TIMEOUT_S * 1000)
        writes: List[Tuple[str, Any]] = []
        for name, (tree, md) in items.items():
            final = stores.Location(store, stores.join(key, name), store.display(stores.join(key, name)))
            try:
                writes.append((name, _distributed.prepare(
                    final, tree, metadata=dict(md), compression=compression_code("auto", shown), overwrite=False,
                    chunk_size=None, threads=0, durable=True, max_part_bytes=None, shuffle=False,
                    snapshot=asynchronous)))
            except Error as e:
                raise _with_file(e, final.shown) from None
    else:
        writes = [(n, (_snapshot(t) if asynchronous else t, md)) for n, (t, md) in items.items()]

    def stage() -> str:
        staging = store.stage_directory(key, overwrite=overwrite)
        if overwrite and not store.supports_atomic_directories:
            store.delete([stores.join(key, INDEX)])  # the old checkpoint is gone before its items are rewritten
        return staging

    def done() -> None:
        if client is not None:
            client.wait_at_barrier(coord + "/done", timeout_ms)

    staging = stage() if client is None else ""  # one process: refused here, before anything is written

    def write_all() -> None:
        nonlocal staging
        if client is not None:  # process 0 stages the checkpoint and names the staging to the others
            staging = _distributed.from_zero(client, coord + "/dir", timeout_ms, shown, stage if pid == 0 else None)
        written: List[str] = []
        try:
            while writes:
                name, w = writes.pop(0)
                path = stores.join(staging, name)
                if client is not None:  # the core's multi-process save: every process raises what failed in any
                    w.path = path
                    _distributed.run(w)
                else:
                    try:
                        _save(path, w[0], store=store, metadata=dict(w[1]), overwrite=overwrite)
                    except Error as e:  # named as the item it was to be, not its staging
                        raise _upload.named(e, store.display(path), store.display(stores.join(key, name))) from None
                written.append(name)
        except BaseException:
            writes.clear()
            if pid == 0:
                store.discard_directory(staging, written)
            raise

        def write_index(local: str, in_place: bool) -> None:
            # This process alone: the core's single-file save (treecask.save would be collective).
            md = metadata_items({**index_md, MARK_KEY: "1"}, shown)
            request, _ = SaveRequest.of_tree(local, None, overwrite=not in_place, durable=in_place, metadata=md)
            _core.save(local, request)

        def commit() -> str:  # process 0's; every process returns or raises its outcome
            try:
                store.publish_directory(staging, key, write_index, overwrite=overwrite, durable=True,
                                        keep=list(items))
            except BaseException:
                store.discard_directory(staging, written)
                raise
            return ""

        if client is None:
            commit()
        else:
            _distributed.from_zero(client, coord + "/result", timeout_ms, shown, commit if pid == 0 else None,
                                   on_error=done)
        try:  # `after` in every process, then a barrier: every process then lists the same steps
            if after is not None:
                after()
        finally:
            done()

    def run() -> None:  # `meanwhile` first, its error the save's once the checkpoint is written
        swept: Optional[BaseException] = None
        if meanwhile is not None:
            try:
                meanwhile()
            except Exception as e:
                swept = e
        write_all()
        if swept is not None:
            raise swept

    if not asynchronous:
        run()
        return None
    job = SaveJob(shown, step=step, metrics=metrics)
    _start(job, run)
    return job


__all__ = ["INDEX", "KIND_KEY", "MARK_KEY", "item_names", "save_directory"]
