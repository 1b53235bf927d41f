"""treecask.import_orbax: an Orbax checkpoint directory -> one treecask archive,
read through Orbax's own public API (so every layout Orbax reads imports the
same way; docs/python.md "Migrating from Orbax checkpoints"). Orbax is an
optional dependency, imported only when ``import_orbax`` is called.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from .. import _jaxutil as J
from .. import _save
from .. import _tree as T
from .._boxes import Extras
from .._types import PathLike, SaveStats
from ..errors import InvalidArgumentError, NotFoundError, UnsupportedError

# Archive metadata keys written by import_orbax (docs/python.md "Migrating from
# Orbax checkpoints").
META_ITEMS = "orbax.items"                   # comma-separated item names ("" for a bare item directory)
META_STEP = "orbax.step"                     # decimal step number, when read from a step directory
META_CUSTOM = "orbax.custom_metadata"        # JSON of _CHECKPOINT_METADATA's custom_metadata, when not empty

# Orbax file names (orbax-checkpoint 0.5 .. 0.12 layouts).
_ITEM_MARKERS = ("_METADATA", "manifest.ocdbt", "checkpoint")  # a PyTree item directory holds one
_STEP_METADATA = "_CHECKPOINT_METADATA"                        # a step's (or item's) JSON metadata
_PYTREE_HANDLERS = ("StandardCheckpointHandler", "PyTreeCheckpointHandler")
_STEP_NAME = re.compile(r"^(?:.*_)?(\d+)$")                    # "12", "step_12" (Orbax step_prefix)
#: The file names whose presence makes a directory an Orbax step or item (a
#: manager on a bucket finds Orbax steps by them).
STEP_MARKERS = frozenset(_ITEM_MARKERS) | {_STEP_METADATA}


def is_step_name(name: str) -> bool:
    """Whether ``name`` is named like an Orbax or Flax step directory: ``12``,
    ``step_12`` (Orbax's ``step_prefix``), ``checkpoint_12`` (Flax)."""
    return _STEP_NAME.match(name) is not None


@dataclass(frozen=True)
class OrbaxImport:
    """What ``import_orbax`` read and wrote.

    ``checkpoint`` is the directory that was read (a step directory when a
    CheckpointManager root was given), ``step`` its step number (None for a
    bare StandardCheckpointer directory), ``items`` the (name, directory) of
    each PyTree item imported (name "" for a bare item directory), ``skipped``
    the names of the step's items that are not PyTrees (e.g. JSON items), not
    imported. ``num_leaves`` counts the leaves written, ``num_sharded`` those
    that carry a NamedSharding's mesh and PartitionSpec. ``stats`` is what
    ``treecask.save`` returned.
    """

    checkpoint: str
    step: Optional[int]
    items: Tuple[Tuple[str, str], ...]
    skipped: Tuple[str, ...]
    num_leaves: int
    num_sharded: int
    stats: SaveStats


def _is_item_dir(d: str) -> bool:
    return os.path.isdir(d) and any(os.path.exists(os.path.join(d, m)) for m in _ITEM_MARKERS)


def _read_json(path: str) -> Optional[Dict[str, Any]]:
    try:
        with open(path, "rb") as f:
            out = json.loads(f.read())
        return out if isinstance(out, dict) else None
    except (OSError, ValueError):
        return None


def _step_items(step_dir: str) -> Tuple[List[Tuple[str, str]], List[str]]:
    """([(name, dir)] of the PyTree items, [names of the other items]) of a step directory: by
    its _CHECKPOINT_METADATA's "item_handlers" when Orbax wrote one, else every PyTree item subdirectory."""
    handlers = (_read_json(os.path.join(step_dir, _STEP_METADATA)) or {}).get("item_handlers")
    if not isinstance(handlers, dict):
        dirs = [(n, os.path.join(step_dir, n)) for n in sorted(os.listdir(step_dir))]
        return [(n, d) for n, d in dirs if _is_item_dir(d)], []
    items = [(n, os.path.join(step_dir, n)) for n in sorted(handlers)
             if any(p in str(handlers[n] or "") for p in _PYTREE_HANDLERS) and _is_item_dir(os.path.join(step_dir, n))]
    return items, [n for n in sorted(handlers) if n not in dict(items)]


def is_step_dir(d: str) -> bool:
    """A step: a CheckpointManager step directory (PyTree items inside), or a
    directory that is itself one PyTree item (Flax's ``checkpoint_<N>``, written by
    ``flax.training.checkpoints.save_checkpoint`` with the Orbax backend)."""
    return os.path.isdir(d) and (_is_item_dir(d) or bool(_step_items(d)[0]))


def _holds_steps_only(src: str, items: List[Tuple[str, str]], other: List[str]) -> bool:
    """Whether the "items" of `src` are steps: no step metadata of its own and each named
    like a step (Flax's ``save_checkpoint`` writes each step as one item directory ``checkpoint_<N>``)."""
    meta = _read_json(os.path.join(src, _STEP_METADATA)) or {}
    return (bool(items) and not other and not isinstance(meta.get("item_handlers"), dict)
            and all(_STEP_NAME.match(name) for name, _ in items))


def _latest_step(root: str, step: Optional[int]) -> Optional[Tuple[int, str]]:
    """(step, directory) of `step` (None: the highest) among the step directories of a
    CheckpointManager root or a Flax checkpoint directory (not Orbax's temporaries, not Flax's
    ``checkpoint_<N>_gda``); None when there is none."""
    found: Dict[int, str] = {}
    for name in sorted(os.listdir(root)):
        m = _STEP_NAME.match(name)
        d = os.path.join(root, name)
        if m and is_step_dir(d):
            found.setdefault(int(m.group(1)), d)
    if not found:
        return None
    step = max(found) if step is None else step
    if step not in found:
        raise NotFoundError(f"no step {step} here; steps found: {sorted(found)}", file=root)
    return step, found[step]


def _resolve(src: str, item: Optional[str], step: Optional[int]):
    """(checkpoint dir, step, [(item name, item dir)], [skipped item names])."""
    if not os.path.exists(src):
        raise NotFoundError("no such Orbax checkpoint directory", file=src)
    if not os.path.isdir(src):
        raise InvalidArgumentError(
            "not a directory: an Orbax checkpoint is a directory (StandardCheckpointer "
            "directory, CheckpointManager step or root)", file=src)
    if _is_item_dir(src):
        if item is not None:
            raise InvalidArgumentError(f"item={item!r} given, but this directory is itself one PyTree item", file=src)
        return src, None, [("", src)], []
    step_dir = src
    items, other = _step_items(src)
    if _holds_steps_only(src, items, other):
        items = []  # checkpoint_5/, checkpoint_7/ are steps, not items of one step
    if not items and not other:
        latest = _latest_step(src, step)
        if latest is None:
            raise InvalidArgumentError(
                "not an Orbax checkpoint: no _METADATA / manifest.ocdbt (a StandardCheckpointer "
                "directory), no item subdirectory (a CheckpointManager step) and no step "
                "subdirectory (a CheckpointManager root, or a Flax directory of checkpoint_<N>)",
                file=src)
        step_no, step_dir = latest
        # Flax's checkpoint_<N>: the step is one bare item
        items, other = ([("", step_dir)], []) if _is_item_dir(step_dir) else _step_items(step_dir)
    else:
        if step is not None:
            raise InvalidArgumentError(f"step={step} given, but this is already a step directory", file=src)
        m = _STEP_NAME.match(os.path.basename(os.path.normpath(src)))
        step_no = int(m.group(1)) if m else None
    if item is not None:
        chosen = [(n, d) for n, d in items if n == item]
        if not chosen:
            if item in other:
                raise UnsupportedError(
                    f"item {item!r} was not written by StandardCheckpointHandler or "
                    "PyTreeCheckpointHandler; only PyTree items can be imported", file=step_dir)
            raise NotFoundError(f"no item {item!r}; PyTree items here: {[n for n, _ in items]}", file=step_dir)
        return step_dir, step_no, chosen, [n for n, _ in items if n != item] + other
    if not items:
        raise UnsupportedError(
            f"the step holds no PyTree item (items: {other}); only StandardCheckpointHandler / "
            "PyTreeCheckpointHandler items can be imported", file=step_dir)
    return step_dir, step_no, items, other


@contextlib.contextmanager
def _quiet_absl():
    # Orbax logs a warning for every item directory read without a step's
    # _CHECKPOINT_METADATA beside it; the import reports what it read itself.
    log = logging.getLogger("absl")
    old = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(old)


def _is_value_metadata(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype") and hasattr(x, "sharding")


def _sharding_extras(sharding: Any, rank: int) -> Optional[Extras]:
    """Extras(mesh, spec) of Orbax's NamedShardingMetadata; None for other shardings and
    specs treecask does not model (UNCONSTRAINED)."""
    if sharding is None or not hasattr(sharding, "axis_names") or not hasattr(sharding, "partition_spec"):
        return None
    names = [str(n) for n in sharding.axis_names]
    sizes = [int(s) for s in np.asarray(sharding.shape).reshape(-1)]
    spec = J.spec_to_lists(tuple(sharding.partition_spec))
    if spec is None or len(names) != len(sizes) or len(spec) > max(rank, 0) or any(
            a not in names for dim in spec for a in dim):
        return None
    return Extras(spec=spec, mesh=(names, sizes))


def _restore_item(ocp, d: str, prefix: Tuple[str, ...]):
    """(tree of NumPy arrays / Python scalars, {key path: Extras})."""
    import jax

    with _quiet_absl():
        md = ocp.PyTreeCheckpointer().metadata(d)
        md = getattr(md, "item_metadata", md)  # 0.11+: StepMetadata(item_metadata=TreeMetadata)
        md = getattr(md, "tree", md)
        found = ((T.join_path(prefix + tuple(T._key_component(k) for k in path)),
                  _sharding_extras(getattr(m, "sharding", None), len(tuple(m.shape))))
                 for path, m in jax.tree_util.tree_flatten_with_path(md, is_leaf=_is_value_metadata)[0]
                 if _is_value_metadata(m))
        extras = {key: ex for key, ex in found if ex is not None}

        # Python scalars come back as Python scalars (restore_type None), every array as a host
        # NumPy array: no device, no target needed.
        args = jax.tree_util.tree_map(lambda m: ocp.RestoreArgs() if type(m).__name__ == "ScalarMetadata" else
                                      ocp.RestoreArgs(restore_type=np.ndarray), md, is_leaf=_is_value_metadata)
        with ocp.PyTreeCheckpointer() as ck:
            tree = ck.restore(d, args=ocp.args.PyTreeRestore(restore_args=args))
    return tree, extras


def import_orbax(src: PathLike, dst: PathLike, *, item: Optional[str] = None,
                 step: Optional[int] = None, metadata: Optional[Mapping[str, str]] = None,
                 **save_options: Any) -> OrbaxImport:
    """Converts an Orbax checkpoint into one treecask archive.

    ``src`` is a ``StandardCheckpointer`` / ``PyTreeCheckpointer`` directory,
    a ``CheckpointManager`` step directory (its PyTree items; one at the
    archive root, several as a dict keyed by item name; other items skipped),
    a ``CheckpointManager`` root or a directory of Flax ``checkpoint_<N>``
    steps (the highest step, or ``step``). Every leaf is restored on the host
    with Orbax's own metadata (no target, no device), key paths, dtypes and
    values kept, a ``NamedSharding`` kept as the leaf's ``ShardingInfo``;
    archive metadata ``orbax.items``, ``orbax.step``, ``orbax.custom_metadata``,
    then ``metadata``. Nothing is created under ``src``. The rules in full:
    docs/python.md "Migrating from Orbax checkpoints".

    Args:
      src: the Orbax checkpoint directory (see above).
      dst: the archive to write (atomically, as ``treecask.save`` does).
      item: the one CheckpointManager item to import (default: all PyTree items).
      step: with a CheckpointManager root or a Flax checkpoint directory, the
        step to import (default: the highest).
      metadata: extra archive-level ``str -> str`` key-values.
      **save_options: passed to ``treecask.save`` (``compression``,
        ``overwrite``, ``chunk_size``, ``shuffle``, ``threads``, ``durable``...).

    Returns:
      OrbaxImport: the directory, step and items read, leaf counts and SaveStats.

    Raises:
      UnsupportedError: orbax-checkpoint is not installed, or the chosen item
        is not a PyTree item.
      NotFoundError: ``src`` does not exist, or has no such ``item`` / ``step``.
      InvalidArgumentError: ``src`` is not a directory or not an Orbax
        checkpoint (the message names the path and what was looked for).
      Orbax's own exceptions for a damaged checkpoint (Orbax has no checksums),
      and what ``treecask.save`` raises (e.g. AlreadyExistsError).
    """
    return _write(_read(src, item, step), dst, metadata, save_options)


@dataclass
class _Read:
    """An Orbax checkpoint restored on the host, not yet written."""
    checkpoint: str
    step: Optional[int]
    items: List[Tuple[str, str]]
    skipped: List[str]
    tree: Any
    extras: Dict[str, Extras]
    metadata: Dict[str, str]


def _read(src: PathLike, item: Optional[str], step: Optional[int]) -> _Read:
    """Finds and restores the checkpoint as ``import_orbax`` does (same errors)."""
    s = os.path.abspath(os.fspath(src))
    checkpoint, step_no, items, skipped = _resolve(s, item, step)
    try:
        import orbax.checkpoint as ocp
    except ImportError as e:
        raise UnsupportedError(f"treecask.import_orbax needs the orbax-checkpoint package ({e}); "
                               "install it with: pip install orbax-checkpoint (or treecask[orbax])") from None

    # one item at the archive root, several under their names
    restored = [(name, *_restore_item(ocp, idir, (name,) if len(items) > 1 else ())) for name, idir in items]
    tree = restored[0][1] if len(items) == 1 else {name: t for name, t, _ in restored}
    extras = {key: ex for _, _, item_extras in restored for key, ex in item_extras.items()}

    custom = (_read_json(os.path.join(checkpoint, _STEP_METADATA)) or {}).get("custom_metadata")
    md = {META_ITEMS: ",".join(n for n, _ in items), **({META_STEP: str(step_no)} if step_no is not None else {}),
          **({META_CUSTOM: json.dumps(custom, sort_keys=True)} if custom else {})}
    return _Read(checkpoint, step_no, items, skipped, tree, extras, md)


def _write(r: _Read, dst: PathLike, metadata: Optional[Mapping[str, str]],
           save_options: Mapping[str, Any]) -> OrbaxImport:
    stats = _save.save(os.fspath(dst), r.tree, metadata={**r.metadata, **(metadata or {})}, _leaf_extras=r.extras,
                       **save_options)
    return OrbaxImport(checkpoint=r.checkpoint, step=r.step, items=tuple(r.items),
                       skipped=tuple(r.skipped), num_leaves=stats.num_leaves,
                       num_sharded=len(r.extras), stats=stats)
