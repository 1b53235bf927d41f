"""The helper namespaces Orbax's guides call, with Orbax 0.12's semantics
(``ocp.tree``, ``ocp.utils``, ``ocp.checkpoint_utils``, ``ocp.test_utils``):
plain functions over jax pytrees that touch no checkpoint.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import types
from typing import Any, Callable, Dict, Optional, Tuple

from .. import _jaxutil as J
from ._items import _construct_restore_args, _to_shape_dtype_struct

PyTree = Any


def _jax():
    if (jax := J.import_jax()) is None:  # pragma: no cover - every caller passes jax trees
        raise ImportError("treecask.orbax's tree helpers need jax")
    return jax


def _key_name(k: Any) -> Any:
    """A jax key entry's name (Orbax ``get_key_name``): a dict key as str, a sequence index as int."""
    jtu = _jax().tree_util
    if isinstance(k, jtu.SequenceKey):
        return k.idx
    if isinstance(k, jtu.DictKey):
        return str(k.key)
    if isinstance(k, jtu.GetAttrKey):
        return k.name
    if isinstance(k, jtu.FlattenedIndexKey):
        return k.key
    raise ValueError(f'Unsupported KeyEntry: {type(k)}: "{k}"')


def _is_empty_or_leaf(x: Any) -> bool:
    """A leaf, or a node without children (kept by ``keep_empty_nodes``)."""
    jax = _jax()
    leaves = jax.tree_util.tree_flatten(x, is_leaf=lambda y: y is not x)[0]
    return not leaves or (len(leaves) == 1 and leaves[0] is x)


def str_keypath(keypath: Tuple[Any, ...]) -> Tuple[str, ...]:
    """A jax key path as a tuple of str names (Orbax ``tree.str_keypath``)."""
    return tuple(str(_key_name(k)) for k in keypath)


def to_flat_dict(tree: PyTree, sep: Optional[str] = None, keep_empty_nodes: bool = False,
                 is_leaf: Optional[Callable[[Any], bool]] = None) -> Dict[Any, Any]:
    """``{key tuple: leaf}`` of ``tree`` (Orbax ``tree.to_flat_dict``): keys are
    tuples of str names, or ``sep``-joined strings; empty nodes are left out
    unless ``keep_empty_nodes``; ``is_leaf`` as jax's."""
    is_leaf = is_leaf or (_is_empty_or_leaf if keep_empty_nodes else None)
    pairs, _ = _jax().tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)
    flat = {str_keypath(k): v for k, v in pairs}
    return flat if sep is None else {sep.join(k): v for k, v in flat.items()}


def from_flat_dict(flat_dict: Dict[Any, Any], target: Optional[PyTree] = None, sep: Optional[str] = None, *,
                   inplace: bool = False) -> PyTree:
    """The tree of a flat dict (Orbax ``tree.from_flat_dict``): with
    ``target``, ``target``'s structure with the values of ``flat_dict`` (keys
    as ``to_flat_dict(target, sep)`` gives them); without, nested dicts.
    ``inplace`` removes each entry from ``flat_dict`` as it is used.
    Raises KeyError for a key of ``target`` that ``flat_dict`` lacks."""
    if inplace and not isinstance(flat_dict, dict):
        raise ValueError("Inplace operations require flat_dict to be a dict.")
    take = flat_dict.pop if inplace else flat_dict.__getitem__
    if target is not None:
        jax = _jax()
        keys = list(to_flat_dict(target, sep=sep))
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(target), [take(k) for k in keys])
    if sep is None and () in flat_dict:
        if len(flat_dict) != 1:
            raise ValueError(f"Empty keypath () must be the only key; got {list(flat_dict)}.")
        return take(())
    result: Dict[Any, Any] = {}
    for k in list(flat_dict):
        parts = tuple(k) if sep is None else tuple(k.split(sep))
        node = result
        for name in parts[:-1]:
            node = node.setdefault(name, {})
        node[parts[-1]] = take(k)
    return result


def is_flat_dict(tree: PyTree) -> bool:
    """Whether ``tree`` is a dict whose values are all leaves (Orbax ``tree.is_flat_dict``)."""
    jax = _jax()
    return isinstance(tree, dict) and all(jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(v))
                                          for v in tree.values())


def get_param_names(item: PyTree, *, include_empty_nodes: bool = True) -> PyTree:
    """``item`` with each leaf replaced by its "."-joined key path (Orbax ``tree.get_param_names``)."""
    return _jax().tree_util.tree_map_with_path(lambda kp, _: ".".join(str_keypath(kp)), item,
                                            is_leaf=_is_empty_or_leaf if include_empty_nodes else None)


def serialize_tree(tree: PyTree, keep_empty_nodes: bool = False) -> PyTree:
    """``tree`` as nested dicts and lists (Orbax ``tree.serialize_tree``): a
    tuple becomes a list, a namedtuple or other keyed node a dict by its field
    names; empty nodes are left out unless ``keep_empty_nodes``. Raises
    ValueError for an empty tree (no representation)."""
    jax = _jax()
    pairs, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_empty_or_leaf if keep_empty_nodes else None)
    if not pairs:
        raise ValueError("Unable to uniquely reconstruct tree from empty flattened list (pass "
                         "keep_empty_nodes=True).")
    if len(pairs) == 1 and not pairs[0][0]:
        return pairs[0][1]
    jtu = jax.tree_util
    root: Any = [] if isinstance(pairs[0][0][0], (jtu.SequenceKey, jtu.FlattenedIndexKey)) else {}
    for path, value in pairs:
        node = root
        for i, k in enumerate(path):
            name = _key_name(k)
            last = i == len(path) - 1
            nxt = None if last else ([] if isinstance(path[i + 1], (jtu.SequenceKey, jtu.FlattenedIndexKey)) else {})
            if isinstance(node, list) and name == len(node):
                node.append(value if last else nxt)
            elif last:
                node[name] = value
            if not last:
                node = node[name] if isinstance(node, list) else node.setdefault(name, nxt)
    return root


def deserialize_tree(serialized: PyTree, target: PyTree, keep_empty_nodes: bool = False) -> PyTree:
    """``target``'s structure with each leaf looked up in ``serialized`` (what
    :func:`serialize_tree` gave) at the same key path (Orbax ``tree.deserialize_tree``)."""
    jax = _jax()

    def look_up(keypath, _):
        node = serialized
        for k in keypath:
            name = _key_name(k)
            if isinstance(node, dict) and name not in node:
                name = str(name)
            node = node[name] if isinstance(node, (dict, list, tuple)) else getattr(node, str(name))
        return node

    return jax.tree_util.tree_map_with_path(look_up, target, is_leaf=_is_empty_or_leaf if keep_empty_nodes else None)


def merge_trees(*trees: PyTree, overwrite: bool = False) -> PyTree:
    """The nested dicts of several trees merged, later trees' leaves added to
    earlier ones (Orbax ``tree.merge_trees``): a key path in two trees raises
    ValueError unless ``overwrite`` (then the later tree's leaf wins)."""
    merged: Dict[Tuple[str, ...], Any] = {}
    for t in trees:
        for k, v in to_flat_dict(t).items():
            if k in merged and not overwrite:
                raise ValueError(f"Key path {'.'.join(k)} is in several trees (pass overwrite=True)")
            merged[k] = v
    return from_flat_dict(merged)


#: ``ocp.tree``: Orbax's tree helpers (``orbax.checkpoint.tree``).
tree = types.SimpleNamespace(
    PyTree=PyTree, str_keypath=str_keypath, get_param_names=get_param_names, serialize_tree=serialize_tree,
    deserialize_tree=deserialize_tree, to_flat_dict=to_flat_dict, from_flat_dict=from_flat_dict,
    is_flat_dict=is_flat_dict, to_shape_dtype_struct=_to_shape_dtype_struct, merge_trees=merge_trees)


def is_primary_host(primary_host: Optional[int] = 0) -> bool:
    """Whether this process is ``primary_host`` (None: every process is; Orbax ``utils.is_primary_host``)."""
    jax = J.jax_loaded()
    return primary_host is None or (int(jax.process_index()) if jax is not None else 0) == primary_host


def sync_global_processes(name: str, *args: Any, **kwargs: Any) -> None:
    """A barrier of every jax process (Orbax ``utils.sync_global_processes``);
    nothing to wait for in a single-process program."""
    jax = J.jax_loaded()
    if jax is not None and jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def reached_preemption(step: int) -> bool:
    """False: treecask does not watch for preemption notices (Orbax ``utils.reached_preemption``)."""
    return False


#: ``ocp.utils``: the helpers of Orbax's ``orbax.checkpoint.utils`` that guides call.
utils = types.SimpleNamespace(
    to_shape_dtype_struct=_to_shape_dtype_struct, to_flat_dict=to_flat_dict, from_flat_dict=from_flat_dict,
    serialize_tree=serialize_tree, deserialize_tree=deserialize_tree, is_primary_host=is_primary_host,
    sync_global_processes=sync_global_processes, sync_global_devices=sync_global_processes,
    reached_preemption=reached_preemption)
#: ``ocp.checkpoint_utils``: ``construct_restore_args``.
checkpoint_utils = types.SimpleNamespace(construct_restore_args=_construct_restore_args)


def erase_and_create_empty(directory: Any) -> pathlib.Path:
    """Deletes ``directory`` (a file or a directory tree) if it exists, creates
    it empty and returns it as a ``pathlib.Path`` (Orbax
    ``test_utils.erase_and_create_empty`` returns an ``epath.Path``; both are
    ``os.PathLike`` and join with ``/``). Its parent must exist
    (``FileNotFoundError`` otherwise, as Orbax's). Meant for examples and
    tests: it deletes without asking."""
    p = pathlib.Path(os.fspath(directory))
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    elif p.exists() or p.is_symlink():
        p.unlink()
    p.mkdir()
    return p


#: ``ocp.test_utils``: ``erase_and_create_empty``, the Orbax 101 guide's first line.
test_utils = types.SimpleNamespace(erase_and_create_empty=erase_and_create_empty)
