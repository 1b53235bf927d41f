"""Orbax v1's free functions over treecask archives and the objects they return; a checkpoint is
a directory of items (``_layout.py``) encoded as ``treecask.orbax``'s (``_items.py``)."""

from __future__ import annotations

import concurrent.futures
import contextvars
import datetime
import inspect
import pprint
import threading
import time
from typing import Any, Callable, Dict, Generic, Optional, TypeVar

import numpy as np

from ... import _jaxutil as J
from ... import _tree as T
from .. import args as _args
from ... import stores
from .. import _layout as _L
from .._items import DEFAULT_ITEM_NAME, PLACEHOLDER, Checkpoint, _encode_items, _is_stateful, _item_metadata
from .._items import _fill_later, _key_path, _read_later, Where, _restore_pytree
from .._metadata import ArrayMetadata, ScalarMetadata, StringMetadata
from ...errors import InvalidArgumentError, KeyNotFoundError, NotFoundError, UnsupportedError
from ._context import check_supported, get_context

T_ = TypeVar("T_")

#: The checkpointable name ``save`` uses (Orbax's ``"state"``).
STATE_CHECKPOINTABLE_KEY = "state"
#: ``load``'s default checkpointable name: "pytree" if present, else the first pytree by name, else the root.
AUTO_CHECKPOINTABLE_KEY = "AUTO"
_INIT_KEY = "treecask.orbax.v1.init_timestamp_nsecs"

# What permits each structure mismatch in v1 (the StructureError names it).
_ALLOW_V1 = ("with ctx = ocp.Context(); ctx.pytree.loading.partial_load = True, `with ctx:` loads only the "
             "abstract tree's fields",
             "a leaf ocp.PLACEHOLDER (...) is not loaded; with the context's pytree.loading.partial_load an "
             "array or scalar leaf there is kept as given")


# ---------------------------------------------------------------- returned objects


class AsyncResponse(Generic[T_]):
    """The result of an asynchronous call (Orbax ``AsyncResponse``): the work
    runs on a background thread (with the caller's context); ``result(timeout=None)``
    blocks until it is done and returns its value or raises its error
    (``TimeoutError`` when ``timeout`` seconds pass first)."""

    def __init__(self, work: Callable[[], T_]):
        self._future: "concurrent.futures.Future[T_]" = concurrent.futures.Future()
        run = contextvars.copy_context().run

        def target() -> None:  # the value or the error, then the callbacks, in this thread
            try:
                self._future.set_result(run(work))
            except BaseException as e:  # raised by result()
                self._future.set_exception(e)

        self._thread = threading.Thread(target=target, name="treecask-orbax-v1", daemon=False)
        self._thread.start()

    def result(self, timeout: Optional[float] = None) -> T_:
        """The work's value, once it is done (raises its error)."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the operation did not finish within {timeout} s")
        return self._future.result()

    def on_complete(self, callback: Callable[[T_], None]) -> None:
        """Calls ``callback(value)`` once the work succeeds (at once if it has)."""
        self._future.add_done_callback(lambda f: f.exception() is None and callback(f.result()))


class CheckpointMetadata(Generic[T_]):
    """A checkpoint's metadata (Orbax v1 ``CheckpointMetadata``): ``path``,
    ``metadata`` (the pytree's metadata tree, or ``{name: ...}`` of each
    checkpointable's), ``init_timestamp_nsecs`` (when the save began, ns
    since the epoch), ``commit_timestamp_nsecs`` (the archive's modification
    time; None in an object store), ``custom_metadata`` (the save's, ``{}``
    when none), and ``init_timestamp`` / ``commit_timestamp`` as UTC datetimes."""

    def __init__(self, path: Any, *, metadata: T_, init_timestamp_nsecs: Optional[int] = None,
                 commit_timestamp_nsecs: Optional[int] = None, custom_metadata: Any = None):
        self._path, self._metadata, self._custom = path, metadata, custom_metadata
        self._init, self._commit = init_timestamp_nsecs, commit_timestamp_nsecs

    path = property(lambda self: self._path, doc="The checkpoint's path.")
    metadata = property(lambda self: self._metadata, doc="The checkpointable's (or each one's) metadata.")
    init_timestamp_nsecs = property(lambda self: self._init, doc="When the save began (ns), or None.")
    commit_timestamp_nsecs = property(lambda self: self._commit, doc="When it was committed (ns), or None.")
    custom_metadata = property(lambda self: self._custom, doc="The save's custom_metadata.")
    init_timestamp = property(lambda self: _to_datetime(self._init), doc="When the save began (UTC), or None.")
    commit_timestamp = property(lambda self: _to_datetime(self._commit), doc="When it was committed (UTC), or None.")

    def _properties(self) -> Dict[str, str]:
        return {"metadata": str(self.metadata), "init_timestamp_nsecs": str(self._init),
                "commit_timestamp_nsecs": str(self._commit), "custom_metadata": str(self._custom)}

    def __repr__(self) -> str:
        return f"CheckpointMetadata({pprint.pformat(self._properties())})"


def _to_datetime(ns: Optional[int]) -> Optional[datetime.datetime]:
    return None if ns is None else datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.timezone.utc)


# ---------------------------------------------------------------- saving


def _validate_checkpointables(checkpointables: Any, file: str) -> Dict[str, Any]:
    if not isinstance(checkpointables, dict) or not checkpointables:
        raise InvalidArgumentError("checkpointables must be a non-empty dict {name: checkpointable}", file=file)
    for name, c in checkpointables.items():
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"a checkpointable's name is a non-empty str, got {name!r}", file=file)
        if not _is_stateful(c) and inspect.iscoroutinefunction(getattr(c, "save", None)):
            raise UnsupportedError(f"Orbax v1 checkpointable '{name}' of type {type(c).__name__} (a custom "
                                   "Checkpointable with async save/load) is not supported by treecask.orbax.v1: "
                                   "save its state as a pytree, or give it get_state() / set_state()", file=file)
    return checkpointables


def _storage_cast(tree: Any) -> Any:
    """`tree`'s array leaves cast to the context's ``storage_options`` dtype, the
    ``scoped_storage_options_creator``'s for a leaf when it gives one (Orbax's rule)."""
    saving = get_context().array.saving
    base = getattr(saving.storage_options, "dtype", None)
    creator = getattr(saving, "scoped_storage_options_creator", None)
    if base is None and creator is None:
        return tree

    def one(kp: Any, x: Any) -> Any:
        if not (hasattr(x, "astype") and hasattr(x, "dtype")):
            return x
        so = creator(kp, x) if creator is not None else None
        dt = so.dtype if getattr(so, "dtype", None) is not None else base
        return x if dt is None or x.dtype == np.dtype(dt) else x.astype(dt)

    return J.import_jax().tree_util.tree_map_with_path(one, tree)


def _encode_checkpointables(items: Dict[str, Any], custom_metadata: Any, file: str) -> Any:
    """(items, index metadata) of a save of v1 checkpointables: leaves cast as the context says, the start time."""
    enc, own = _encode_items(_args.Composite(**{n: _args.PyTreeSave(v if _is_stateful(v) else _storage_cast(v))
                                               for n, v in items.items()}), custom_metadata, file)
    own[_INIT_KEY] = str(time.time_ns())
    return enc, own


def _responding(wait: Callable[[], Any], callback: Optional[Callable[[], None]], value: Any = None) -> AsyncResponse:
    """An AsyncResponse that waits, then calls ``callback`` (when given) and returns ``value``."""
    def finish() -> Any:
        wait()
        if callback is not None:
            callback()
        return value
    return AsyncResponse(finish)


def _save_impl(path: Any, checkpointables: Dict[str, Any], *, overwrite: bool, custom_metadata: Any,
               asynchronous: bool, store: Any = None) -> AsyncResponse[None]:
    ctx = get_context()
    p = Where(path, store)
    check_supported(ctx, p)
    enc, own = _encode_checkpointables(_validate_checkpointables(checkpointables, p), custom_metadata, p)
    pending = _L.save_directory(p.store, p.key, enc, own, overwrite=bool(overwrite), asynchronous=asynchronous)
    return _responding(pending.wait if pending is not None else lambda: None,
                       ctx.asynchronous.post_finalization_callback if asynchronous else None)


def save_checkpointables(path: Any, checkpointables: Dict[str, Any], *, overwrite: bool = False,
                         custom_metadata: Any = None, store: Any = None) -> None:
    """Saves several named checkpointables as one checkpoint, the directory
    ``path`` (parents created), one archive per name; blocks until durable
    (Orbax ``save_checkpointables``). A checkpointable is a pytree, or a
    stateful object (``get_state()`` / ``set_state()``: a Grain iterator),
    saved as its state's JSON. Array leaves are cast as the context's
    ``array.saving.storage_options`` / ``scoped_storage_options_creator``
    say. ``custom_metadata``: a JSON value kept with it. Raises
    ``AlreadyExistsError`` (a ``FileExistsError``; Orbax raises ValueError)
    for an existing checkpoint unless ``overwrite=True`` (then it is replaced
    whole); ``UnsupportedError`` for a state that is not JSON, a custom
    Checkpointable and the options of :mod:`~treecask.orbax.v1.options`
    treecask does not honour; what :func:`treecask.save` raises for a leaf
    it cannot store.

    ``store`` (every function of this module takes it; a treecask extension
    beyond Orbax's signatures): a :class:`treecask.stores.Store` that
    ``path`` is a path inside (docs/stores.md); without it ``path`` is a file
    path or a URL."""
    _save_impl(path, checkpointables, overwrite=overwrite, custom_metadata=custom_metadata,
               asynchronous=False, store=store).result()


def save_checkpointables_async(path: Any, checkpointables: Dict[str, Any], *, overwrite: bool = False,
                               custom_metadata: Any = None, store: Any = None) -> AsyncResponse[None]:
    """:func:`save_checkpointables` that returns once the trees' bytes are safe
    from the caller (NumPy leaves copied, jax.Array leaves held as read-only
    views); ``.result()`` blocks until durable, then the context's
    ``asynchronous.post_finalization_callback`` has run. Errors about the
    arguments raise here, write errors from ``.result()``."""
    return _save_impl(path, checkpointables, overwrite=overwrite, custom_metadata=custom_metadata,
                      asynchronous=True, store=store)


def save(path: Any, state: Any, *, checkpointable_name: str = STATE_CHECKPOINTABLE_KEY, overwrite: bool = False,
         custom_metadata: Any = None, store: Any = None) -> None:
    """Saves the pytree ``state`` as the checkpointable ``checkpointable_name``
    ("state") of the checkpoint ``path`` (Orbax ``save``; see
    :func:`save_checkpointables`)."""
    save_checkpointables(path, {checkpointable_name: state}, overwrite=overwrite, custom_metadata=custom_metadata,
                         store=store)


def save_async(path: Any, state: Any, *, checkpointable_name: str = STATE_CHECKPOINTABLE_KEY,
               overwrite: bool = False, custom_metadata: Any = None, store: Any = None) -> AsyncResponse[None]:
    """:func:`save` asynchronously (see :func:`save_checkpointables_async`)."""
    return save_checkpointables_async(path, {checkpointable_name: state}, overwrite=overwrite,
                                      custom_metadata=custom_metadata, store=store)


save_pytree, save_pytree_async = save, save_async  # Orbax's former names


# ---------------------------------------------------------------- loading


def _pytree_name(ck: Checkpoint, name: Optional[str]) -> Optional[str]:
    """The checkpointable `load` reads: None for the archive root, else its name; "AUTO"
    is Orbax 0.12.8's rule: "state" if present, else the first pytree by name."""
    path = ck.where
    if ck.default:
        if name in (None, AUTO_CHECKPOINTABLE_KEY, DEFAULT_ITEM_NAME):
            return None
        raise KeyNotFoundError(f"no checkpointable '{name}': the archive holds one pytree at its root "
                               "(load it with checkpointable_name=None)", file=path, key_path=name)
    trees = sorted(n for n, k in ck.kinds.items() if k in ("pytree", "array"))
    if name is None:
        raise InvalidArgumentError(f"checkpointable_name=None reads the root, but the checkpoint holds "
                                   f"checkpointables {sorted(ck.kinds)}: name one", file=path)
    if name == AUTO_CHECKPOINTABLE_KEY:
        if not trees:
            raise NotFoundError(f"the checkpoint holds no pytree (it holds {sorted(ck.kinds)})", file=path)
        return STATE_CHECKPOINTABLE_KEY if STATE_CHECKPOINTABLE_KEY in trees else trees[0]
    if name not in ck.kinds:
        raise KeyNotFoundError(f"no checkpointable '{name}' in the checkpoint (it holds {sorted(ck.kinds)})",
                               file=path, key_path=name)
    return name


def _abstract(tree: Any) -> Any:
    """An abstract tree as a treecask.load template: a CheckpointMetadata's ``.metadata``, an
    ArrayMetadata as a ShapeDtypeStruct on its saved mesh (else a NumPy template), a Scalar / StringMetadata
    as its type's zero / ""."""
    if isinstance(tree, CheckpointMetadata):
        tree = tree.metadata
    if tree is None or (jax := J.import_jax()) is None:
        return tree

    def conv(x: Any) -> Any:
        if isinstance(x, (StringMetadata, ScalarMetadata)):
            return _v1_tree(x)
        if isinstance(x, ArrayMetadata):
            try:  # on its saved mesh; without one, or one this process cannot build: a NumPy array
                return jax.ShapeDtypeStruct(tuple(x.shape), x.dtype, sharding=x.sharding.to_jax())
            except Exception:
                return np.broadcast_to(np.zeros((), x.dtype), tuple(x.shape))
        return x

    return jax.tree_util.tree_map(conv, tree, is_leaf=lambda x: isinstance(x, (ArrayMetadata, StringMetadata)))


#: The Python and array types Orbax accepts as an abstract leaf ("load as saved, as this type").
_TYPE_LEAVES = (bool, int, float, complex, np.ndarray)


def _as_type(v: Any, typ: type, file: str, key: str) -> Any:
    """A saved leaf as the abstract type `typ` (Orbax: the checkpoint's value, converted)."""
    jax = J.import_jax()
    if typ is np.ndarray:
        return np.asarray(v)
    if jax is not None and isinstance(typ, type) and issubclass(typ, jax.Array):
        return v if J.is_jax_array(v) else J.to_jax(np.asarray(v))
    if typ in (bool, int, float, complex):
        if np.ndim(v) != 0:
            raise InvalidArgumentError(f"the abstract leaf is {typ.__name__}, the checkpoint's is an array of "
                                       f"shape {np.shape(v)}", file=file, key_path=key)
        return typ(np.asarray(v).item())
    raise UnsupportedError(f"an abstract leaf of type {typ.__name__} is not supported by treecask.orbax.v1: "
                           "give a jax.ShapeDtypeStruct, an array, a scalar, None or one of "
                           f"{[t.__name__ for t in _TYPE_LEAVES]} / jax.Array", file=file, key_path=key)


def _load_one(ck: Checkpoint, name: Optional[str], abstract: Any) -> Any:
    """Checkpointable `name` (None: the root pytree), into `abstract` when given."""
    item = DEFAULT_ITEM_NAME if name is None else name
    kind = ck.kinds.get(item)
    if kind in ("json", "stateful"):
        return ck.json(item) if kind == "json" else ck.set_state(item, abstract)
    at, sub, _ = ck.item(item)
    partial = bool(get_context().pytree.loading.partial_load)
    resize = bool(get_context().array.loading.enable_padding_and_truncation)
    jax = J.import_jax()  # {key path: type} of the abstract leaves that are types, loaded as saved, then converted
    flat = [] if jax is None or abstract is None else jax.tree_util.tree_flatten_with_path(
        abstract, is_leaf=lambda x: isinstance(x, type))[0]
    typed = {_key_path(kp): x for kp, x in flat if isinstance(x, type)}
    out = _restore_pytree(at, sub, _abstract(_read_later(abstract, typed)), None, None, partial_restore=partial,
                          allow=_ALLOW_V1, jax_leaves=ck.jax_leaves(item), resize=resize)

    def typed_leaf(a: Any, full: str, key: str) -> Any:
        first, _, _ = a.subtree(tuple(T.split_path(full)))
        return _as_type(a.values(first, 1)[0], typed[key], at, key)
    return _fill_later(at, sub, out, typed, typed_leaf) if typed else out


def load(path: Any, abstract_state: Any = None, *, checkpointable_name: Optional[str] = AUTO_CHECKPOINTABLE_KEY,
         store: Any = None) -> Any:
    """Loads a pytree (Orbax ``load``): the checkpointable ``checkpointable_name``
    of the checkpoint ``path`` ("AUTO": "state" if there is one, else the first
    pytree by name, Orbax 0.12.8's rule; the root of an archive holding one
    pytree, e.g. written by :func:`treecask.save`).

    Without ``abstract_state``: the tree as saved (a ``jax.Array`` for each
    leaf saved as one, as Orbax). With an abstract tree (of
    ``jax.ShapeDtypeStruct``, arrays, scalars, Python types, the
    :func:`metadata` tree, a :class:`CheckpointMetadata`): its structure and
    leaf types, dtypes cast; the structures must agree (Orbax's rule) unless
    the context's ``pytree.loading.partial_load``; a ``PLACEHOLDER`` leaf is
    not loaded. The rules in full: docs/python.md "Orbax's v1 API".

    Raises ``NotFoundError`` (a ``FileNotFoundError``) for no checkpoint,
    ``KeyNotFoundError`` for no such checkpointable, ``StructureError``,
    ``ShapeError`` (a shape differs), ``InvalidArgumentError`` for a
    checkpoint written by Orbax itself (convert it with
    ``treecask.import_orbax``), ``UnsupportedError`` for options of
    :mod:`~treecask.orbax.v1.options` treecask does not honour."""
    p = Where(path, store)
    check_supported(get_context(), p)
    ck = Checkpoint(p)
    return _load_one(ck, _pytree_name(ck, checkpointable_name), abstract_state)


def load_checkpointables(path: Any, abstract_checkpointables: Any = None, *, store: Any = None) -> Dict[str, Any]:
    """Loads checkpointables (Orbax ``load_checkpointables``): ``{name: value}``
    of every checkpointable (None), or of those ``abstract_checkpointables``
    names (a value None loads that one as saved; a tree is its abstract
    tree, as :func:`load`'s). Raises as :func:`load`; ``KeyNotFoundError``
    for a name the checkpoint lacks."""
    p = Where(path, store)
    check_supported(get_context(), p)
    if isinstance(abstract_checkpointables, CheckpointMetadata):
        abstract_checkpointables = abstract_checkpointables.metadata
    ck = Checkpoint(p)
    names = {DEFAULT_ITEM_NAME: None} if ck.default else {n: n for n in ck.kinds}
    wanted = abstract_checkpointables if abstract_checkpointables is not None else {n: None for n in names}
    if not isinstance(wanted, dict):
        raise InvalidArgumentError("abstract_checkpointables must be a dict {name: abstract checkpointable}", file=p)
    lacking = [n for n in wanted if n not in names]
    if lacking:
        raise KeyNotFoundError(f"checkpointables {lacking} are not in the checkpoint (it holds {sorted(names)})",
                               file=p, key_path=str(lacking[0]))
    return {n: _load_one(ck, names[n], abstract) for n, abstract in wanted.items()}


def load_async(path: Any, abstract_state: Any = None, *,
               checkpointable_name: Optional[str] = AUTO_CHECKPOINTABLE_KEY, store: Any = None) -> AsyncResponse[Any]:
    """:func:`load` on a background thread; ``.result()`` returns the tree
    (Orbax 0.12.8 supports this only for safetensors checkpoints)."""
    return AsyncResponse(lambda: load(path, abstract_state, checkpointable_name=checkpointable_name, store=store))


def load_checkpointables_async(path: Any, abstract_checkpointables: Any = None, *,
                               store: Any = None) -> AsyncResponse[Dict[str, Any]]:
    """:func:`load_checkpointables` on a background thread (Orbax 0.12.8 raises NotImplementedError)."""
    return AsyncResponse(lambda: load_checkpointables(path, abstract_checkpointables, store=store))


load_pytree, load_pytree_async = load, load_async  # Orbax's former names


# ---------------------------------------------------------------- metadata


def _v1_tree(tree: Any) -> Any:
    """A TreeMetadata's tree with Orbax v1's leaves: a scalar as its type's zero, a string as ""."""
    if isinstance(tree, dict):
        return {k: _v1_tree(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return (list if isinstance(tree, list) else tuple)(_v1_tree(v) for v in tree)
    if isinstance(tree, StringMetadata):
        return ""
    if isinstance(tree, ScalarMetadata):
        return {"b": False, "i": 0, "u": 0, "f": 0.0, "c": 0j}.get(np.dtype(tree.dtype).kind, 0)
    return tree


def _checkpoint_metadata(path: Any, store: Any, name: Optional[str], one: bool,
                         make: Callable[..., Any] = CheckpointMetadata) -> Any:
    """:func:`metadata` (``one``: of checkpointable ``name``) or :func:`checkpointables_metadata`, built by
    ``make`` (a training step's class); the commit time is the commit object's (a file system's)."""
    ck = Checkpoint(Where(path, store))
    im = _item_metadata(ck)
    items = {DEFAULT_ITEM_NAME: im} if ck.default else dict(im.items())
    trees: Any = {n: (None if m is None else _v1_tree(m.tree)) for n, m in items.items()}
    if one:
        name = _pytree_name(ck, name)
        trees = trees[DEFAULT_ITEM_NAME if name is None else name]
    try:
        stamp = ck.where.store.stamp(stores.join(ck.where.key, _L.INDEX) if ck.directory else ck.where.key)
    except Exception:
        stamp = None
    init, custom = ck.md.get(_INIT_KEY), ck.custom_metadata()
    return make(str(ck.where), metadata=trees, init_timestamp_nsecs=None if init is None else int(init),
                              commit_timestamp_nsecs=int(stamp[1]) if isinstance(stamp, tuple) and len(stamp) == 2
                              else None, custom_metadata={} if custom is None else custom)


def metadata(path: Any, checkpointable_name: Optional[str] = AUTO_CHECKPOINTABLE_KEY, *,
             store: Any = None) -> CheckpointMetadata:
    """The pytree's metadata without reading array bytes (Orbax ``metadata``):
    a :class:`CheckpointMetadata` whose ``.metadata`` is the tree as saved with
    a ``treecask.orbax.ArrayMetadata`` (``shape``, ``dtype``, ``sharding``) per
    array, ``0`` / ``0.0`` / ``False`` per scalar and ``""`` per string;
    ``load(path, metadata(path))`` loads it. Raises as :func:`load`."""
    return _checkpoint_metadata(path, store, checkpointable_name, True)


def checkpointables_metadata(path: Any, *, store: Any = None) -> CheckpointMetadata:
    """Every checkpointable's metadata (Orbax ``checkpointables_metadata``):
    ``.metadata`` is ``{name: tree}`` (trees as :func:`metadata`'s; None for a
    JSON item of ``treecask.orbax``)."""
    return _checkpoint_metadata(path, store, None, False)


pytree_metadata = metadata  # Orbax's former name


# ---------------------------------------------------------------- deleting, probing


def delete(path: Any, *, checkpointable_name: Optional[str] = None, missing_ok: bool = False,
           store: Any = None) -> bool:
    """Deletes the checkpoint ``path`` (Orbax ``delete``); True when deleted,
    False when there was none and ``missing_ok``. Raises ``NotFoundError``
    when there is none. ``checkpointable_name``: deletes only that
    checkpointable's entry of the directory (NotFoundError when it has none;
    UnsupportedError for a checkpoint that is one archive file, written
    whole)."""
    p = Where(path, store)
    target, names = p.key, None
    if checkpointable_name is not None:
        names = _L.item_names(p.store, p.key)
        if names is None:
            raise UnsupportedError(f"Orbax v1 delete(checkpointable_name={checkpointable_name!r}) of a checkpoint "
                                   "that is one archive file is not supported by treecask.orbax.v1: it is "
                                   "written whole; save the checkpointables to keep to a new checkpoint", file=p)
        target = stores.join(p.key, checkpointable_name)
    found = (checkpointable_name in names if names is not None else
             any(n == p.key or n.startswith(p.key + "/") for n in p.store.list_prefix(p.key)))
    if not found and not missing_ok:
        raise NotFoundError("no checkpoint here" if names is None else
                            f"no checkpointable '{checkpointable_name}' (the checkpoint holds {names})", file=p)
    if found:
        p.store.delete_tree(target)
    return found


def delete_async(path: Any, *, checkpointable_name: Optional[str] = None,
                 missing_ok: bool = False, store: Any = None) -> AsyncResponse[bool]:
    """:func:`delete` on a background thread."""
    return AsyncResponse(lambda: delete(path, checkpointable_name=checkpointable_name, missing_ok=missing_ok,
                                        store=store))


def is_orbax_checkpoint(path: Any, *, store: Any = None) -> bool:
    """Whether ``path`` is a checkpoint these functions load: a checkpoint
    directory of treecask.orbax (``index.cask`` and its items), a treecask
    archive or a sharded checkpoint."""
    try:
        Checkpoint(Where(path, store))
        return True
    except Exception:
        return False


_ = PLACEHOLDER  # re-exported by the package
