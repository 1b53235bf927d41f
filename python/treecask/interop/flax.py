"""treecask.import_flax: a legacy Flax checkpoint (``flax.training.checkpoints``,
msgpack or Orbax backend, or ``flax.serialization.to_bytes``) -> one treecask
archive holding the state dict ``restore_checkpoint(ckpt_dir, target=None)``
returns, found and read as Flax does (docs/python.md "Migrating from legacy
Flax checkpoints"). Flax is an optional dependency, imported only here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Union

from . import orbax as _orbax
from .. import _save
from .. import _tree as T
from .._types import PathLike, SaveStats
from ..errors import InvalidArgumentError, NotFoundError, UnsupportedError

# Archive metadata keys written by import_flax (docs/python.md "Migrating from
# legacy Flax checkpoints").
META_BACKEND = "flax.backend"   # "msgpack" or "orbax"
META_STEP = "flax.step"         # the step in the checkpoint's name (checkpoint_<step>), when there is one
META_SOURCE = "flax.source"     # the file or directory read (absolute path)

# flax.training.checkpoints: the Orbax backend's marker files (_is_orbax_checkpoint)
# and the placeholder save_checkpoint_multiprocess leaves for arrays kept in <path>_gda.
_ORBAX_MARKERS = ("checkpoint", "_METADATA", "manifest.ocdbt")
_MP_ARRAY_PLACEHOLDER = "//GDAPlaceholder:"

Step = Union[int, float]


@dataclass(frozen=True)
class FlaxImport:
    """What ``import_flax`` read and wrote.

    ``checkpoint`` is the file or directory that was read (``checkpoint_<N>``
    when a checkpoint directory was given), ``step`` the number in its name
    (None when the name has none, e.g. a ``to_bytes`` file), ``backend``
    ``"msgpack"`` or ``"orbax"``. ``num_leaves`` counts the leaves written,
    ``num_sharded`` those that keep an Orbax NamedSharding's mesh and
    PartitionSpec (always 0 for msgpack). ``stats`` is what ``treecask.save``
    returned.
    """

    checkpoint: str
    step: Optional[Step]
    backend: str
    num_leaves: int
    num_sharded: int
    stats: SaveStats


def _is_orbax_checkpoint(path: str) -> bool:
    # flax.training.checkpoints._is_orbax_checkpoint
    return any(os.path.exists(os.path.join(path, m)) for m in _ORBAX_MARKERS)


def parse_step(text: str) -> Optional[Step]:
    """``text`` as a step number: an int, else a float (as Flax allows), else None."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return None


def _find(src: str, step: Optional[Step], prefix: str, checkpoints) -> str:
    """The checkpoint path ``flax.training.checkpoints.restore_checkpoint(src, ...,
    step=step, prefix=prefix)`` would read, or the error saying why there is none."""
    if step is not None:
        if not os.path.isdir(src):
            raise InvalidArgumentError(
                f"step={step} given, but this is not a checkpoint directory (Flax: 'If "
                "specified, ckpt_dir must be a directory')", file=src)
        path = os.path.join(src, f"{prefix}{step}")
        if not os.path.exists(path):
            have = sorted(n for n in os.listdir(src) if n.startswith(prefix))
            raise NotFoundError(f"no checkpoint {prefix}{step} here; checkpoints found: {have}",
                                file=src)
        return path
    if not os.path.exists(src):
        raise NotFoundError("no such Flax checkpoint file or directory", file=src)
    if not os.path.isdir(src) or _is_orbax_checkpoint(src):
        return src
    path = checkpoints.latest_checkpoint(src, prefix)
    if not path:
        raise NotFoundError(
            f"no Flax checkpoint here: no {prefix}* entry (a save_checkpoint directory), and not "
            "an Orbax checkpoint (no checkpoint, _METADATA or manifest.ocdbt)", file=src)
    return path


def _check_leaves(tree: Any, path: str) -> None:
    """Refuses what a treecask archive cannot hold, naming the key path."""
    for comps, leaf in T.iter_leaves(T.build(tree, strict=False)):
        x, kp = leaf.obj, T.join_path(comps) if comps else "(root)"
        if isinstance(x, str) and x.startswith(_MP_ARRAY_PLACEHOLDER):
            raise UnsupportedError(
                "a multi-process array written by save_checkpoint_multiprocess (its data is in "
                f"{os.path.basename(path)}_gda/ and needs Flax's GlobalAsyncCheckpointManager and "
                "a target); restore it with flax.training.checkpoints.restore_checkpoint and "
                "treecask.save the result", file=path, key_path=kp)
        if isinstance(x, (bytes, bytearray)):
            raise UnsupportedError(
                "a bytes leaf: treecask archives hold arrays, numbers, str and None; restore with "
                "flax.serialization.msgpack_restore, replace it (e.g. np.frombuffer(b, np.uint8)) "
                "and treecask.save the result", file=path, key_path=kp)


def _read_msgpack(path: str, serialization) -> Any:
    if os.path.isdir(path):
        raise InvalidArgumentError(
            "neither a msgpack checkpoint file nor an Orbax checkpoint directory (no checkpoint, "
            "_METADATA or manifest.ocdbt)", file=path)
    with open(path, "rb") as f:
        data = f.read()
    try:
        tree = serialization.msgpack_restore(data)
    except Exception as e:  # msgpack's own errors: ExtraData, FormatError, ValueError...
        raise InvalidArgumentError(
            f"not a Flax msgpack checkpoint (flax.serialization.msgpack_restore: "
            f"{type(e).__name__}: {e})", file=path) from None
    if not (tree is None or isinstance(tree, dict) or T.is_data_leaf(tree)
            or isinstance(tree, (bytes, bytearray))):
        raise InvalidArgumentError(
            f"not a Flax msgpack checkpoint: it decodes to a {type(tree).__name__}, not a state "
            "dict", file=path)
    return tree


def import_flax(src: PathLike, dst: PathLike, *, step: Optional[Step] = None,
                prefix: str = "checkpoint_", metadata: Optional[Mapping[str, str]] = None,
                **save_options: Any) -> FlaxImport:
    """Converts a legacy Flax checkpoint into one treecask archive.

    ``src`` is what ``flax.training.checkpoints.restore_checkpoint(src,
    target, step=step, prefix=prefix)`` takes: a msgpack file, an Orbax
    ``checkpoint_<N>`` directory (imported through ``treecask.import_orbax``)
    or a ``save_checkpoint`` directory (its latest ``<prefix>*`` entry, or
    ``<prefix><step>``). The archive holds the state dict
    ``restore_checkpoint(src, target=None)`` returns (rebuild types with
    ``flax.serialization.from_state_dict(target, treecask.load(dst))``);
    archive metadata ``flax.backend``, ``flax.source``, ``flax.step``, the
    ``orbax.*`` keys for the Orbax backend, then ``metadata``. The rules in
    full: docs/python.md "Migrating from legacy Flax checkpoints".

    Args:
      src: the Flax checkpoint file or directory (see above).
      dst: the archive to write (atomically, as ``treecask.save`` does).
      step: with a checkpoint directory, the step to import (default: the
        latest), as ``restore_checkpoint(..., step=step)``; an int or float.
      prefix: the checkpoint name prefix given to ``save_checkpoint``
        (default ``"checkpoint_"``, Flax's).
      metadata: extra archive-level ``str -> str`` key-values.
      **save_options: passed to ``treecask.save`` (``compression``,
        ``overwrite``, ``chunk_size``, ``shuffle``, ``threads``, ``durable``...).

    Returns:
      FlaxImport: the path, step and backend read, leaf counts and SaveStats.

    Raises:
      UnsupportedError: flax (or, for the Orbax backend, orbax-checkpoint) is
        not installed; the checkpoint holds a multi-process array of
        ``save_checkpoint_multiprocess`` (kept in ``<path>_gda``, which needs
        Flax's GlobalAsyncCheckpointManager) or a ``bytes`` leaf, which
        treecask cannot hold (the message names the key path).
      NotFoundError: ``src`` does not exist, a directory holds no
        ``<prefix>*`` checkpoint, or there is no ``<prefix><step>``.
      InvalidArgumentError: ``step`` given with a file; the file is not Flax
        msgpack (``msgpack_restore``'s error is quoted); a ``checkpoint_<N>``
        directory that is no Orbax checkpoint.
      What ``import_orbax`` raises for an Orbax-backend checkpoint, and what
      ``treecask.save`` raises (e.g. AlreadyExistsError).
    """
    try:
        with _orbax._quiet_absl():  # flax.io logs "Tensorflow library not found" on import
            from flax import serialization
            from flax.training import checkpoints
    except ImportError as e:
        raise UnsupportedError(f"treecask.import_flax needs the flax package ({e}); install it with: "
                               "pip install flax") from None
    s = os.path.abspath(os.fspath(src))
    path = os.path.normpath(_find(s, step, prefix, checkpoints))
    name = os.path.basename(path)
    step_no = parse_step(name[len(prefix):]) if prefix and name.startswith(prefix) else None
    md: Dict[str, str] = {META_SOURCE: path, **({META_STEP: str(step_no)} if step_no is not None else {})}

    if os.path.isdir(path) and _is_orbax_checkpoint(path):
        r = _orbax._read(path, None, None)
        # restore_checkpoint(target=None) returns to_state_dict of Orbax's tree
        # (its lists become "0", "1"... dicts); the key paths are unchanged.
        r.tree = serialization.to_state_dict(r.tree)
        r.metadata.update({**md, META_BACKEND: "orbax"})
        o = _orbax._write(r, dst, metadata, save_options)
        return FlaxImport(checkpoint=path, step=step_no, backend="orbax",
                          num_leaves=o.num_leaves, num_sharded=o.num_sharded, stats=o.stats)

    tree = _read_msgpack(path, serialization)
    _check_leaves(tree, path)
    md.update({META_BACKEND: "msgpack", **(metadata or {})})
    stats = _save.save(os.fspath(dst), tree, metadata=md, **save_options)
    return FlaxImport(checkpoint=path, step=step_no, backend="msgpack",
                      num_leaves=stats.num_leaves, num_sharded=0, stats=stats)
