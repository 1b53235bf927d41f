"""Multi-process save with ``jax.distributed``: ``treecask.save(path, tree)``,
called the same way in every process of a job of more than one, writes a
sharded checkpoint directory (``index.cask`` + ``process_<k>.cask``; format,
writer and atomic commit: format/SPEC.md "Sharded checkpoints"; in an object
store: docs/remote.md "Multi-process checkpoints"), read by
``_sharded.ShardedArchive``. Each process writes its share of the boxes
(replicas split among processes, ``_replicas.py``); leaves that are not
global ``jax.Array``s are written by process 0. Every file goes through the
checkpoint's store (``Store.stage_directory`` / ``write_archive`` /
``publish_directory``), coordinated only by the jax.distributed
coordination service (key-value store and barriers):

1. process 0 stages (refusing an existing ``path`` unless ``overwrite``,
   removing its own host's dead writers' temporaries, SPEC.md "Atomic
   commit") and publishes the staging path and a random save id, or its error;
2. every process writes its ``process_<k>.cask`` there and publishes "ok" or
   its error; barrier;
3. process 0 builds the index from the manifests written, binding each file
   (R8/R9), checks it opens, and the store commits; it publishes the
   outcome; barrier; every process returns or raises it.
"""

from __future__ import annotations

import json
import os
import secrets
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from . import _codec, _dtypes, _replicas, stores
from . import _jaxutil as J
from . import _tree as T
import treecask._core as _core
from . import errors as E
from ._request import SaveRequest
# The reader of these directories lived here before _sharded.py.
from ._sharded import ShardedArchive  # noqa: F401
from ._types import SaveStats
from .errors import Error

INDEX = stores.COMMIT_OBJECT  # the index archive, whose creation commits: the core's INDEX_NAME
SAVE_ID_KEY = "treecask.save_id"  # include/treecask/types.h kSaveIdKey
# Seconds a process waits at a barrier / for process 0's answer.
BARRIER_TIMEOUT_S = float(os.environ.get("TREECASK_BARRIER_TIMEOUT_S", "600"))

_save_counter = 0


def _client():
    try:
        from jax._src.distributed import global_state
    except ImportError:
        return None
    return global_state.client


def active() -> bool:
    """True in a jax.distributed job of more than one process (the
    multi-process save path). Does not import jax or start a backend when
    jax.distributed was not initialized."""
    jax = J.jax_loaded()
    return jax is not None and _client() is not None and jax.process_count() > 1


def shard_key(key_path: str, start: Sequence[int], stop: Sequence[int]) -> str:
    """The dict key of one box in a process file: "<key path>@<b0>:<e0>,...".
    (format/vectors/contents.h golden::shard_key, the same convention.)"""
    return key_path + "@" + ",".join(f"{int(b)}:{int(e)}" for b, e in zip(start, stop))


def parse_shard_key(component: str) -> Tuple[str, List[int], List[int]]:
    kp, _, box = component.rpartition("@")
    pairs = [part.split(":") for part in box.split(",")] if box else []
    return kp, [int(b) for b, _ in pairs], [int(e) for _, e in pairs]


# ---- save ------------------------------------------------------------------------------


def _flat_nodes(keys: Sequence[str]) -> list:
    return [(T.DICT, len(keys), "", tuple(keys))] + [(T.LEAF, 0, "", ())] * len(keys)


def _error_text(e: BaseException) -> str:
    cls = type(e).__name__ if isinstance(e, Error) else "IoError" if isinstance(e, OSError) else "Error"
    return f"{cls}:{e}"


def from_zero(client: Any, key: str, timeout_ms: int, shown: str, work: Optional[Callable[[], str]],
              on_error: Optional[Callable[[], None]] = None) -> str:
    """Process 0's answer in every process: ``work()`` (a str; ``work`` is
    None in the other processes) run on process 0 and published under
    ``key`` of the coordination service, or its error, which every process
    raises (naming ``shown``) after ``on_error()``."""
    if work is not None:
        try:
            answer = "ok:" + work()
        except Exception as e:
            answer = "err:" + _error_text(e)
        client.key_value_set(key, answer)
    answer = client.blocking_key_value_get(key, timeout_ms)
    if answer.startswith("err:"):
        if on_error is not None:
            on_error()
        cls, _, msg = answer[4:].partition(":")
        raise getattr(E, cls, Error)(msg, file=shown)
    return answer[3:]


class _Save:
    """One multi-process save: what :func:`prepare` took from the tree, so that :func:`run` never touches it."""

    __slots__ = ("store", "path", "shown", "key", "pid", "nproc", "nodes", "key_paths", "metas", "is_global",
                 "md", "keys", "kinds", "names", "shapes", "datas", "options")


def prepare(path: str, tree: Any, *, metadata: Optional[Mapping[str, str]], compression: int,
            overwrite: bool, chunk_size: Optional[int], threads: int, durable: bool,
            max_part_bytes: Optional[int], shuffle: bool, snapshot: bool = False,
            storage_options: Optional[Mapping[str, Any]] = None,
            store: Optional[stores.Store] = None) -> _Save:
    """The caller's half of a multi-process save: flattens ``tree``, describes
    every leaf for the index, and takes this process's boxes (its parts of
    the global jax.Arrays' shards, ``_replicas.my_boxes``; on process 0 also
    the host leaves).

    With ``snapshot`` the boxes stay valid whatever the caller does next (as
    ``_async.save_async``'s snapshot: jax.Array bytes held as read-only views,
    every other leaf copied). Without it the caller must keep the tree
    unchanged until :func:`run` returns.

    ``path`` names the checkpoint: a :class:`treecask.stores.Location`
    (what the public call resolved), or as :func:`treecask.stores.resolve`
    takes it: inside ``store``, else a file system path or a URL
    (configured by ``storage_options``); every process must name the same one.

    Must be called in every process, in the same order as every other
    multi-process save (the coordination keys are numbered per call).
    Raises InvalidArgumentError for a leaf that cannot be saved (as
    treecask.save)."""
    global _save_counter
    import jax

    s = _Save()
    loc = stores.resolve(path, store, storage_options)  # a Location from the public call: as it is
    s.store, s.path, s.shown = loc.store, loc.path, loc.shown
    s.pid, s.nproc = jax.process_index(), jax.process_count()
    _save_counter += 1
    s.key = f"treecask/save/{_save_counter}"
    s.md = sorted((metadata or {}).items()) + [("treecask.processes", str(s.nproc))]
    s.options = dict(compression=compression, overwrite=bool(overwrite), chunk_size=chunk_size,
                     threads=int(threads), durable=bool(durable), max_part_bytes=max_part_bytes,
                     shuffle=bool(shuffle))
    s.nodes, s.key_paths, objs, extras = T.to_treedef(tree)
    s.is_global = [J.is_jax_array(x) and not getattr(x, "is_fully_addressable", True) for x in objs]
    # The index's description of every leaf: of a global array from its global
    # shape and sharding; of a host leaf (written whole by process 0) as a
    # single-process save encodes it, with the tree's annotations.
    s.metas, keys, arrays = [], [], []
    loads: Dict[int, int] = {}  # bytes each process writes so far: the replica-parallel balance
    for kp, x, ex, g in zip(s.key_paths, objs, extras, s.is_global):
        if g:  # described by its global shape (a PRNG key array by its key data, the impl in its metadata)
            leaf_md: Dict[str, str] = dict(ex.metadata) if ex is not None else {}
            arr = _codec.key_data(x, leaf_md)
            meta = _codec.describe(kp, _codec.ARRAY, _dtypes.to_name(np.dtype(arr.dtype), key_path=kp), arr.shape,
                                   ex, leaf_md, x)
            for (b, e), part in _replicas.my_boxes(arr, s.pid, loads):
                keys.append(shard_key(kp, b, e))
                arrays.append(part)
        else:
            meta = _codec.encode(kp, x, ex)[0] if s.pid == 0 else None
            if s.pid == 0:
                keys.append(shard_key(kp, [], []))  # box filled in below from the encoded shape
                arrays.append(x)
        s.metas.append(meta)
    kinds, names, shapes, datas, _ = _codec.encode_all(
        [k.rpartition("@")[0] for k in keys], arrays, [None] * len(arrays))
    for j, k in enumerate(keys):
        if k.endswith("@") and shapes[j] is not None and len(shapes[j]) > 0:
            keys[j] = shard_key(k[:-1], [0] * len(shapes[j]), list(shapes[j]))
        if snapshot and not J.is_jax_array(arrays[j]):
            datas[j] = np.array(datas[j], copy=True)
    order = sorted(range(len(keys)), key=lambda j: keys[j])
    s.keys, s.kinds, s.names, s.shapes, s.datas = ([c[j] for j in order] for c in (keys, kinds, names, shapes, datas))
    return s


def run(s: _Save):
    """The collective half of a multi-process save (module docstring, steps
    1-3), on any thread of every process; the coordination client's waits
    release the GIL. Returns the checkpoint's SaveStats (all files); raises
    in every process what failed in any (the message names the process).
    Every file goes through the store (``treecask.stores``): its staging,
    its writes and its commit."""
    client = _client()
    st, pid, key, p, o = s.store, s.pid, s.key, s.path, s.options
    timeout_ms = int(BARRIER_TIMEOUT_S * 1000)

    # Step 1: process 0 checks the target and stages the checkpoint, under the save's identity
    # (SPEC.md "Sharded checkpoints"): in every file's metadata, so that no two saves write the
    # same manifest, whatever their trees.
    stage = lambda: secrets.token_hex(16) + ":" + st.stage_directory(p, overwrite=o["overwrite"])  # noqa: E731
    save_id, _, staging = from_zero(client, key + "/dir", timeout_ms, s.shown,
                                    stage if pid == 0 else None).partition(":")
    s.md = s.md + [(SAVE_ID_KEY, save_id)]
    # Where the files go to their final names (no atomic directories: an object store), they are this
    # save's own, process_<k>.<first 16 hex digits of the save id>.cask: a competing save never overwrites them.
    unique = not st.supports_atomic_directories
    names = [f"process_{k}.{save_id[:16]}.cask" if unique else f"process_{k}.cask" for k in range(s.nproc)]

    # Step 2: every process writes its own shards (in place, or to scratch and uploaded: the
    # name is this save's own, so no pre-check and no conditional write).
    try:
        def write(local: str, in_place: bool):
            return _core.save(local, SaveRequest(
                _flat_nodes(s.keys), [T.escape_key(k) for k in s.keys], s.kinds, s.names, s.shapes, s.datas,
                compression=o["compression"], chunk_size=o["chunk_size"], threads=o["threads"],
                durable=o["durable"] and in_place, metadata=[(SAVE_ID_KEY, save_id)],
                max_part_bytes=o["max_part_bytes"], shuffle=o["shuffle"]))

        stats = st.write_archive(stores.join(staging, names[pid]), write, overwrite=True)
        status = "ok:" + json.dumps({k: int(v) for k, v in stats.items()})
    except Exception as e:  # reported to every process; never leaves the others waiting
        status = "err:" + _error_text(e)
    s.datas = []  # the boxes are written: release the snapshot
    client.key_value_set(f"{key}/status/{pid}", status)
    client.wait_at_barrier(key + "/written", timeout_ms)

    # Step 3: process 0 builds the index from what was written and commits.
    def commit() -> str:
        try:
            return json.dumps(_commit(s, staging, names, client, timeout_ms))
        except Exception:
            st.discard_directory(staging, names)  # this save's files, whatever got written
            raise

    done = lambda: client.wait_at_barrier(key + "/done", timeout_ms)  # noqa: E731
    result = from_zero(client, key + "/result", timeout_ms, s.shown, commit if pid == 0 else None, on_error=done)
    done()
    return SaveStats(**json.loads(result))


def _commit(s: _Save, staging: str, names: List[str], client, timeout_ms: int) -> Dict[str, int]:
    """Step 3 (process 0): the index built from the shard files' manifests, opened
    with them as one checkpoint, then published by the store (``Store.publish_directory``)."""
    st, key, nproc = s.store, s.key, s.nproc
    totals = {"file_bytes": 0, "raw_bytes": 0, "stored_bytes": 0, "num_leaves": len(s.key_paths), "num_blobs": 0}
    for k in range(nproc):
        status = client.blocking_key_value_get(f"{key}/status/{k}", timeout_ms)
        if status.startswith("err:"):
            cls, _, msg = status[4:].partition(":")
            raise getattr(E, cls, Error)(f"process {k} failed: {msg}", file=s.shown)
        got = json.loads(status[3:])
        for f in ("file_bytes", "stored_bytes", "num_blobs"):
            totals[f] += int(got[f])
    # Where each box lives, from the manifests the processes wrote.
    position = {kp: i for i, kp in enumerate(s.key_paths)}
    refs: List[List[Tuple[str, str, List[int], List[int]]]] = [[] for _ in s.key_paths]
    # The fingerprint of each shard file that holds a box (every leaf of a file is one), for the
    # index to bind (SPEC.md R8: it lists exactly the files its ShardRefs name, or more).
    bound: List[Tuple[str, int, int]] = []
    # Each shard file's source is made once and serves this reading and the check of the whole
    # checkpoint (in an object store each open is one round trip, the object's head and tail).
    sources = {name: st.source(stores.join(staging, name)) for name in names}
    for name, source in sources.items():
        a = _core.Archive.open_source(source, True)
        if len(a):
            bound.append(a.manifest_fingerprint)
        for j in range(len(a)):
            d = a.leaf(j)
            comp = T.split_path(d["key_path"])
            kp, b, e = parse_shard_key(comp[0] if len(comp) == 1 else "")
            i = position.get(kp)
            if i is None or len(comp) != 1:
                raise E.CorruptionError(f"{name} holds '{d['key_path']}', which names no leaf of the tree",
                                        file=st.display(stores.join(s.path, name)))
            refs[i].append((name, d["key_path"], b, e))
    for kp, r in zip(s.key_paths, refs):
        if not r:
            raise E.CorruptionError("no process wrote any shard of this leaf", file=s.shown, key_path=kp)
    kinds, dtypes, shapes = ([meta[f] for meta in s.metas] for f in ("value_kind", "dtype", "shape"))
    datas = [np.empty(0, np.uint8)] * len(s.metas)
    more = {i: (meta["logical_axes"], meta["sharding"], meta["metadata"], refs[i]) for i, meta in enumerate(s.metas)}
    totals["raw_bytes"] = sum(int(_core.byte_length_for(meta["dtype"], meta["shape"])) for meta in s.metas)

    def write_index(local: str, in_place: bool) -> Dict[str, int]:
        request = SaveRequest(s.nodes, s.key_paths, kinds, dtypes, shapes, datas, more, threads=1,
                              durable=s.options["durable"] and in_place, metadata=s.md, shard_files=bound)
        totals["file_bytes"] += int(_core.save(local, request)["file_bytes"])
        # The checkpoint must open as a whole before it is committed.
        index = stores.LocalStore().source(local)  # the index, still on this disk
        _core.ShardedArchive.open_sources(lambda n: index if n == INDEX else sources[n], s.shown, True)
        return totals

    return st.publish_directory(staging, s.path, write_index, overwrite=s.options["overwrite"],
                                durable=s.options["durable"], keep=names)
