"""``treecask.orbax``'s checkpointers (one checkpoint at a path: an archive file, or a directory of
items) and handlers (the kind of item and the argument classes of their legacy positional calls)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from .._async import SaveJob, save_async
from .._run import committed
from . import args as args
from . import args as _args  # for methods whose parameter `args` (Orbax's name) hides the module
from ._items import Where, _encode, _encode_items, _item_metadata, _restore, _unsupported
from ._layout import save_directory
from ._metadata import StepMetadata
from .._save import save as _save
from ..errors import AlreadyExistsError

# ---------------------------------------------------------------- handlers


class CheckpointHandler:
    """Base of the handlers (Orbax ``CheckpointHandler``): a handler names the
    kind of item a checkpointer saves and the argument classes its legacy
    positional calls build. Orbax's own handler objects are accepted wherever
    these are (by class name). Constructor options of Orbax's handlers
    (``use_ocdbt``, ``use_zarr3``, ``save_concurrent_gb``...) tune Orbax's
    storage: accepted, no effect."""

    kind = "pytree"
    save_args_cls: Any = args.PyTreeSave
    restore_args_cls: Any = args.PyTreeRestore

    def __init__(self, *unused: Any, **orbax_options: Any):
        del unused, orbax_options

    def close(self) -> None:
        """Nothing to release (Orbax API)."""


class PyTreeCheckpointHandler(CheckpointHandler):
    """A pytree of arrays and scalars (Orbax ``PyTreeCheckpointHandler``):
    ``save(dir, item, save_args=...)``, ``restore(dir, item=..., restore_args=..., transforms=...)``."""


class StandardCheckpointHandler(CheckpointHandler):
    """A pytree (Orbax ``StandardCheckpointHandler``): ``args.StandardSave`` / ``args.StandardRestore``."""

    save_args_cls = args.StandardSave
    restore_args_cls = args.StandardRestore


class JsonCheckpointHandler(CheckpointHandler):
    """A JSON value (Orbax ``JsonCheckpointHandler``; ``filename`` is ignored)."""

    kind = "json"
    save_args_cls = args.JsonSave
    restore_args_cls = args.JsonRestore


class ArrayCheckpointHandler(CheckpointHandler):
    """One array (Orbax ``ArrayCheckpointHandler``)."""

    kind = "array"
    save_args_cls = args.ArraySave
    restore_args_cls = args.ArrayRestore


class CompositeCheckpointHandler(CheckpointHandler):
    """Several named items (Orbax ``CompositeCheckpointHandler``): save and
    restore with ``args=args.Composite(...)``."""

    kind = "composite"
    save_args_cls = args.Composite
    restore_args_cls = args.Composite


_HANDLERS = {c.__name__: c for c in (PyTreeCheckpointHandler, StandardCheckpointHandler, JsonCheckpointHandler,
                                     ArrayCheckpointHandler, CompositeCheckpointHandler)}


def _handler_class(h: Any) -> type:
    """This module's handler class for a handler (instance or class, this module's or Orbax's)."""
    cls = h if isinstance(h, type) else type(h)
    for c in cls.__mro__:
        if c.__name__ in _HANDLERS:
            return _HANDLERS[c.__name__]
    raise _unsupported(f"handler {cls.__name__}", f"the handlers are {sorted(_HANDLERS)}")


def _build_args(handler: type, op: str, pos: Tuple[Any, ...], kw: Dict[str, Any]) -> Any:
    """The argument object of a checkpointer call: ``args=`` as given, or the handler's legacy argument class."""
    if "args" in kw:
        a = kw.pop("args")
        if pos or kw:
            raise TypeError(f"{op}: pass args= alone, not with {sorted(kw) or 'positional arguments'}")
        return a
    if op == "restore" and not pos and not kw:
        return None
    cls = handler.save_args_cls if op == "save" else handler.restore_args_cls
    return cls(*pos, **kw)


# ---------------------------------------------------------------- checkpointers


class Checkpointer:
    """Saves and restores one checkpoint at a path (Orbax ``Checkpointer``).

    ``Checkpointer(handler)``; the checkpoint at ``directory`` is one treecask
    archive *file*, or for several items (``args=ocp.args.Composite(...)``) a
    directory as Orbax's (docs/python.md "Switching from Orbax in one line").
    Options of Orbax's constructor are accepted and have no effect.

    ``save(directory, *args, force=False, custom_metadata=None, **kwargs)``:
    ``args=ocp.args.StandardSave(tree)`` or the handler's legacy arguments
    (``save(path, tree, save_args=...)``). An existing checkpoint raises
    ``AlreadyExistsError`` (a ``FileExistsError``; Orbax raises ValueError)
    unless ``force=True``, which replaces it. ``restore(directory, *args,
    **kwargs)``: ``args=...`` or the legacy ``item=target, restore_args=...,
    transforms=...``; nothing: the tree as saved (leaves saved as jax arrays
    restored as jax arrays, as Orbax). Raises ``NotFoundError`` when there is
    no checkpoint, ``ShapeError`` when a target's shape differs,
    ``StructureError`` (a ``ValueError``) naming the key paths where the
    target's structure differs (Orbax's rule; ``args.PyTreeRestore``).
    ``store=`` (a treecask extension, on ``save``, ``restore`` and
    ``metadata``): a :class:`treecask.stores.Store` that ``directory`` is a
    path inside (docs/stores.md).
    """

    _async = False

    def __init__(self, handler: Any = None, *, multiprocessing_options: Any = None, file_options: Any = None,
                 atomicity_options: Any = None, checkpoint_metadata_store: Any = None,
                 temporary_path_class: Any = None, **orbax_options: Any):
        self._handler = _handler_class(handler if handler is not None else PyTreeCheckpointHandler)
        self._job: Optional[SaveJob] = None  # the asynchronous save in flight or last finished

    handler = property(lambda self: self._handler, doc="The handler class this checkpointer saves with.")

    def save(self, directory: Any, *args_: Any, force: bool = False, custom_metadata: Any = None,
             store: Any = None, **kwargs: Any) -> None:
        """Saves a checkpoint at ``directory`` (class docstring): several items
        as Orbax's directory (``_layout.save_directory``), one as an archive
        through its store's commit; with ``force`` a checkpoint directory of a
        multi-process save is deleted first, as Orbax deletes the directory it
        replaces (a file's commit would not replace it)."""
        path = Where(directory, store)
        a = _build_args(self._handler, "save", args_, kwargs)
        composite = args.kind(a)[1] == "composite"
        tree, md = (_encode_items if composite else _encode)(a, custom_metadata, path)  # composite: {name: item}
        self.wait_until_finished()
        try:
            if composite:
                self._job = save_directory(path.store, path.key, tree, md, overwrite=bool(force),
                                           asynchronous=self._async)
                return
            path.store.make_directory(path.key.rpartition("/")[0])
            names = path.store.list_prefix(path.key)
            if not force and committed(path.store, path.key, names):  # refused now, whichever store (Orbax's)
                raise AlreadyExistsError("a checkpoint exists here", file=path)
            if force and any(n.startswith(path.key + "/") for n in names):
                path.store.delete_tree(path.key)
            if self._async:
                self._job = save_async(path.key, tree, store=path.store, overwrite=bool(force), metadata=md)
            else:
                _save(path.key, tree, store=path.store, metadata=md, overwrite=bool(force))
                self._job = None
        except AlreadyExistsError:
            raise AlreadyExistsError("a checkpoint exists here (force=True replaces it)", file=path) from None

    def restore(self, directory: Any, *args_: Any, store: Any = None, **kwargs: Any) -> Any:
        """Restores the checkpoint at ``directory`` (class docstring)."""
        self.wait_until_finished()
        return _restore(Where(directory, store), _build_args(self._handler, "restore", args_, kwargs))

    def metadata(self, directory: Any, *, store: Any = None) -> "StepMetadata":
        """The checkpoint's :class:`StepMetadata` (``.item_metadata`` a
        :class:`TreeMetadata`; no array bytes read)."""
        self.wait_until_finished()
        im = _item_metadata(Where(directory, store))
        return StepMetadata(im, None, getattr(im, "custom_metadata", None))

    def wait_until_finished(self) -> None:
        """Blocks until the save in flight (asynchronous checkpointers) is
        durable; raises its error, once."""
        if self._job is not None:
            self._job.wait()

    def check_for_errors(self) -> None:
        """Raises the error of a finished asynchronous save, once (never blocks)."""
        if self._job is not None and self._job.done():
            self._job.wait()  # ended: raises its error, once

    close = wait_until_finished  # waits for the save in flight (Orbax API)

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncCheckpointer(Checkpointer):
    """A :class:`Checkpointer` whose ``save`` returns once the tree's bytes
    are safe from the caller (Orbax ``AsyncCheckpointer``; treecask's
    asynchronous save: the write and its commit run in the background).
    ``wait_until_finished()`` blocks until durable and raises a background
    error; the next ``save``, ``restore`` or ``close`` waits first.
    ``timeout_secs`` and ``async_options`` are accepted, no effect."""

    _async = True

    def __init__(self, handler: Any = None, timeout_secs: Optional[int] = None, *, async_options: Any = None,
                 **orbax_options: Any):
        super().__init__(handler, **orbax_options)


class PyTreeCheckpointer(Checkpointer):
    """``Checkpointer(PyTreeCheckpointHandler())`` (Orbax ``PyTreeCheckpointer``,
    synchronous): ``save(path, tree, save_args=...)``, ``restore(path, item=...,
    restore_args=..., transforms=...)``. ``use_ocdbt``, ``use_zarr3``,
    ``use_compression``, ``primary_host`` are accepted, no effect."""

    def __init__(self, primary_host: Optional[int] = 0, use_ocdbt: bool = True, use_zarr3: bool = False,
                 use_compression: bool = True):
        super().__init__(PyTreeCheckpointHandler)


class StandardCheckpointer(AsyncCheckpointer):
    """An asynchronous checkpointer of a pytree (Orbax ``StandardCheckpointer``):
    ``save(path, state, *, save_args=None, force=False, custom_metadata=None)``,
    ``restore(path, target=None, *, strict=True)`` (a target of arrays or
    ``ShapeDtypeStruct``: their types, shardings and dtypes, leaves cast)."""

    def __init__(self, **orbax_options: Any):
        super().__init__(StandardCheckpointHandler)

    def save(self, directory: Any, state: Any = None, *, save_args: Any = None, force: bool = False,
             custom_metadata: Any = None, args: Any = None,  # noqa: A002 - Orbax's name
             store: Any = None) -> None:
        """Saves ``state`` at ``directory`` (see :class:`Checkpointer`)."""
        a = args if args is not None else _args.StandardSave(state, save_args=save_args)
        super().save(directory, args=a, force=force, custom_metadata=custom_metadata, store=store)

    def restore(self, directory: Any, target: Any = None, *, strict: bool = True,
                args: Any = None, store: Any = None) -> Any:  # noqa: A002
        """Restores the checkpoint at ``directory``, into ``target`` when given."""
        a = args if args is not None else _args.StandardRestore(target, strict=strict)
        return super().restore(directory, args=a, store=store)


def _is_async(checkpointer: Any) -> bool:
    return any(c.__name__ == "AsyncCheckpointer" for c in type(checkpointer).__mro__)
