"""``treecask.orbax``: Orbax's checkpointing API over treecask archives.

    import treecask.orbax as ocp          # instead of: import orbax.checkpoint as ocp

orbax-checkpoint 0.12's names and signatures, today's API and the legacy one
of the Flax guide; what it writes, what differs and what raises
``UnsupportedError``: docs/python.md "Switching from Orbax in one line".
This module holds the manager and its options; ``_checkpointers.py`` the
checkpointers and handlers; ``_items.py`` the per-leaf arguments and a
checkpoint's items; ``_layout.py`` the directory of several items;
``handlers.py``, ``_metadata.py``, ``_utils.py``, ``args.py`` Orbax's
namespaces of those names. ``treecask.orbax.v1`` is Orbax's v1 API.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Container, Dict, Mapping, Optional, Sequence

from . import args as args
from ._checkpointers import (ArrayCheckpointHandler, AsyncCheckpointer, CheckpointHandler, Checkpointer,
                             CompositeCheckpointHandler, JsonCheckpointHandler, PyTreeCheckpointer,
                             PyTreeCheckpointHandler, StandardCheckpointer, StandardCheckpointHandler, _handler_class,
                             _is_async)
from ._items import (_LAYOUT_KEY, DEFAULT_ITEM_NAME, PLACEHOLDER, ArrayRestoreArgs, RestoreArgs, SaveArgs, Checkpoint,
                     _encode_items, _item_metadata, _restore, _unsupported)
from ._steps import Steps
from ._utils import checkpoint_utils, test_utils, tree, utils
from ._items import Transform, _publish, _unsupported_names
from . import handlers
from ._metadata import ArrayMetadata, RootMetadata, ScalarMetadata, StepMetadata, StringMetadata, TreeMetadata
from ..errors import InvalidArgumentError, NotFoundError

__all__ = [
    "args", "SaveArgs", "RestoreArgs", "ArrayRestoreArgs", "AsyncOptions", "CheckpointManagerOptions",
    "CheckpointManager", "Checkpointer", "AsyncCheckpointer", "PyTreeCheckpointer", "StandardCheckpointer",
    "CheckpointHandler", "PyTreeCheckpointHandler", "StandardCheckpointHandler", "JsonCheckpointHandler",
    "ArrayCheckpointHandler", "CompositeCheckpointHandler", "ArrayMetadata", "ScalarMetadata", "StringMetadata",
    "TreeMetadata", "StepMetadata", "RootMetadata", "DEFAULT_ITEM_NAME", "utils", "checkpoint_utils", "tree",
    "test_utils", "PLACEHOLDER", "Transform", "handlers",
]


# ---------------------------------------------------------------- manager


@dataclasses.dataclass
class AsyncOptions:
    """Orbax ``AsyncOptions``: accepted, no effect (a wait lasts until the save is done)."""

    timeout_secs: int = 600
    barrier_sync_fn: Optional[Any] = None
    post_finalization_callback: Optional[Callable[[], None]] = None
    create_directories_asynchronously: bool = False


@dataclasses.dataclass
class CheckpointManagerOptions:
    """Orbax ``CheckpointManagerOptions``, field for field.

    Followed: ``save_interval_steps``, ``save_on_steps``, ``should_save_fn``,
    ``max_to_keep``, ``keep_period``, ``best_fn``, ``best_mode`` (with
    ``best_fn`` exactly the ``max_to_keep`` best steps are kept, as Orbax),
    ``enable_async_checkpointing``, ``read_only``, ``prevent_write_metrics``.
    The manager raises ``UnsupportedError`` for a field of ``_UNSUPPORTED_OPTIONS``
    (below) set otherwise than its default; every other field is accepted with
    no effect (what it asks treecask always does, or it tunes Orbax's storage).
    """

    save_interval_steps: int = 1
    max_to_keep: Optional[int] = None
    keep_time_interval: Optional[Any] = None
    keep_period: Optional[int] = None
    best_fn: Optional[Callable[[Any], float]] = None
    best_mode: str = "max"
    keep_checkpoints_without_metrics: bool = True
    step_prefix: Optional[str] = None
    step_format_fixed_length: Optional[int] = None
    step_name_format: Optional[Any] = None
    create: bool = True
    cleanup_tmp_directories: bool = False
    save_on_steps: Optional[Container[int]] = None
    single_host_load_and_broadcast: bool = False
    todelete_subdir: Optional[str] = None
    todelete_full_path: Optional[str] = None
    enable_background_delete: bool = False
    num_deletion_threads: Optional[int] = None
    read_only: bool = False
    enable_async_checkpointing: bool = True
    async_options: Optional[Any] = None
    multiprocessing_options: Optional[Any] = None
    should_save_fn: Optional[Callable[[int, Optional[int]], bool]] = None
    file_options: Optional[Any] = None
    atomicity_options: Optional[Any] = None
    save_root_metadata: bool = True
    temporary_path_class: Optional[Any] = None
    save_decision_policy: Optional[Any] = None
    preservation_policy: Optional[Any] = None
    prevent_write_metrics: bool = False
    enable_should_save_is_saving_in_progress_check: bool = True
    enable_per_process_directory_creation: bool = False
    lightweight_initialize: bool = False

    def __post_init__(self) -> None:
        if self.best_mode not in ("min", "max"):
            raise ValueError(f"CheckpointManagerOptions.best_mode must be 'min' or 'max', got {self.best_mode!r}")


# (option, value that is supported, why another is not)
_UNSUPPORTED_OPTIONS = (
    ("keep_time_interval", None, "retention is by count (max_to_keep), keep_period and best_fn"),
    ("keep_checkpoints_without_metrics", True, "treecask always keeps steps saved without metrics"),
    ("step_prefix", None, "steps are named <step>, Orbax's default"),
    ("step_format_fixed_length", None, "steps are named <step>, Orbax's default"),
    ("step_name_format", None, "steps are named <step>, Orbax's default"),
    ("single_host_load_and_broadcast", False, "every process reads what it needs"),
    ("todelete_subdir", None, "retention deletes steps"),
    ("todelete_full_path", None, "retention deletes steps"),
    ("save_decision_policy", None, "use save_interval_steps, save_on_steps or should_save_fn"),
    ("preservation_policy", None, "use max_to_keep, keep_period, best_fn"),
    ("temporary_path_class", None, "a step is committed by an atomic rename"),
)


class CheckpointManager(Steps):
    """A directory of checkpoint steps (Orbax ``CheckpointManager``) over a
    :class:`treecask.CheckpointManager`: step ``n`` is the directory
    ``<directory>/<n>/`` of one archive per item and ``index.cask``
    (format/SPEC.md "Item-directory steps"; docs/python.md "Switching from
    Orbax in one line", multi-process jobs included).

    Both of Orbax's constructors: ``CheckpointManager(directory, options=...,
    item_names=..., item_handlers=..., metadata=...)`` with ``save(step,
    args=ocp.args.StandardSave(s), metrics=m)`` / ``restore(step,
    args=ocp.args.StandardRestore(abstract))``; the legacy
    ``CheckpointManager(directory, checkpointer_or_dict, options)`` with
    ``save(step, items, save_kwargs=...)`` / ``restore(step, items=target,
    restore_kwargs=...)`` (an ``AsyncCheckpointer`` makes saves asynchronous).
    Retention and the save decision follow Orbax
    (:class:`CheckpointManagerOptions`, :meth:`should_save`); saves are
    asynchronous by default, ``wait_until_finished()`` makes them durable;
    ``all_steps()`` and ``latest_step()`` include a step still being saved.
    ``metadata`` is the run's entry ``metadata`` (Orbax's ``metadata/``).
    ``store=`` (a treecask extension): a :class:`treecask.stores.Store` that
    ``directory`` is a path inside (docs/stores.md).

    Raises (constructor): ``UnsupportedError`` for the options treecask does
    not implement (named), and for a directory of
    ``treecask.CheckpointManager`` steps; ``ValueError`` for ``checkpointers``
    combined with ``item_names`` / ``item_handlers``.
    """

    def __init__(self, directory: Any, checkpointers: Any = None, options: Any = None,
                 metadata: Optional[Mapping[str, Any]] = None, item_names: Optional[Sequence[str]] = None,
                 item_handlers: Any = None, logger: Any = None, handler_registry: Any = None,
                 store: Any = None):
        opts = options if options is not None else CheckpointManagerOptions()
        d = os.fspath(directory)
        for name, ok, why in _UNSUPPORTED_OPTIONS:
            v = getattr(opts, name, ok)
            if v != ok:
                raise _unsupported(f"CheckpointManagerOptions({name}={v!r})", why, file=d)
        if handler_registry is not None:  # Orbax's handlers.DefaultCheckpointHandlerRegistry, or treecask's
            if checkpointers is not None or item_handlers is not None:
                raise ValueError("`handler_registry` cannot be combined with `checkpointers` or `item_handlers`")
            by_item: Dict[str, Any] = {}
            for key, h in handler_registry.get_all_entries().items():
                if isinstance(key, tuple) and key and key[0] is not None:
                    by_item.setdefault(key[0], h)
            item_handlers = by_item[DEFAULT_ITEM_NAME] if set(by_item) == {DEFAULT_ITEM_NAME} else (by_item or None)
        if checkpointers is not None and (item_names is not None or item_handlers is not None):
            raise ValueError("`checkpointers` cannot be combined with `item_names` or `item_handlers`")
        self._opts = opts
        async_save = bool(getattr(opts, "enable_async_checkpointing", True))
        if checkpointers is not None:  # the legacy API: the checkpointers' handlers, async if any is
            many = isinstance(checkpointers, Mapping)
            async_save = any(_is_async(c) for c in (checkpointers.values() if many else [checkpointers]))
            item_handlers = ({n: getattr(c, "handler", c) for n, c in checkpointers.items()} if many
                             else getattr(checkpointers, "handler", checkpointers))
        many = isinstance(item_handlers, Mapping)
        self._handlers: Dict[str, type] = (
            {n: _handler_class(h) for n, h in item_handlers.items()} if many else
            {DEFAULT_ITEM_NAME: _handler_class(item_handlers)} if item_handlers is not None else {})
        for n in item_names or ():
            self._handlers.setdefault(n, PyTreeCheckpointHandler)
        # default-item mode, once known
        self._default = False if many or item_names is not None else True if item_handlers is not None else None
        super().__init__(d, store, dict(metadata) if metadata is not None else None, async_save=async_save,
                         read_only=bool(getattr(opts, "read_only", False)), best_mode=getattr(opts, "best_mode", "max"),
                         **{k: getattr(opts, k, None) for k in ("max_to_keep", "keep_period", "best_fn")})
        self._has_steps = False  # known to hold a step (then a step off the schedule lists nothing)

    # ---- listing ----
    def best_step(self) -> Optional[int]:
        """With ``best_fn``: the best step among those saved with metrics; else the latest."""
        self._wait_quietly()
        return self._mgr.best_step()

    def reload(self) -> None:
        """Forgets what :meth:`should_save` knew: every listing reads the directory (Orbax API)."""
        self._has_steps = False

    def should_save(self, step: int) -> bool:
        """Whether ``save(step)`` writes: Orbax's default save decision
        (``_get_default_save_decision_policy`` of orbax-checkpoint 0.12.8).
        Never when read-only or ``step`` is not above the latest step (one
        being saved included); else when ``should_save_fn(step, latest)``
        says so if given, otherwise when ``step % save_interval_steps == 0``,
        ``step in save_on_steps`` or the run has no step yet (Orbax's
        ``InitialSavePolicy``); and, either way, when every process reached
        the preemption sync point ``step`` (:meth:`reached_preemption`).
        A step that is not due lists nothing once the run is known to hold a
        step (a bucket: no request per training step)."""
        o = self._opts
        if getattr(o, "read_only", False):
            return False
        fn = getattr(o, "should_save_fn", None)
        if fn is None:
            interval, on_steps = getattr(o, "save_interval_steps", 1), getattr(o, "save_on_steps", None)
            due = bool(interval and step % interval == 0) or bool(on_steps and step in on_steps)
            if not due and self._has_steps and not self.reached_preemption(step):
                return False
        last = self.latest_step()
        self._has_steps = last is not None
        if last is not None and last >= step:
            return False
        return (bool(fn(step, last)) if fn is not None else due or last is None) or self.reached_preemption(step)

    # ---- save ----
    def _legacy_args(self, op: str, items: Any, kwargs: Any) -> Any:
        """The argument object of a legacy ``save(step, items, save_kwargs)`` / ``restore(step,
        items, restore_kwargs)``: each item's handler's argument class."""
        if op == "restore" and items is None and not kwargs:
            return None
        make = "save_args_cls" if op == "save" else "restore_args_cls"
        kwargs = kwargs or {}
        if self._default is not False:
            return getattr(self._handlers.get(DEFAULT_ITEM_NAME, PyTreeCheckpointHandler), make)(items, **kwargs)
        if op == "save" and not isinstance(items, Mapping):
            raise InvalidArgumentError("this manager holds items "
                                       f"{sorted(self._handlers)}: save a dict of them", file=str(self.directory))
        items = items or {}
        out = {}
        for name in (items if op == "save" else set(items) | set(kwargs)):
            h = self._handlers.get(name, None if op == "save" else PyTreeCheckpointHandler)
            if h is None:
                raise InvalidArgumentError(f"no checkpointer for item '{name}'", file=str(self.directory))
            out[name] = getattr(h, make)(items.get(name), **(kwargs.get(name) or {}))
        return args.Composite(**out)

    def save(self, step: int, items: Any = None, save_kwargs: Any = None, metrics: Any = None,
             force: Optional[bool] = False, args: Any = None,  # noqa: A002 - Orbax's name
             custom_metadata: Optional[Mapping[str, Any]] = None) -> bool:
        """Saves step ``step`` (class docstring); True when saved (or, asynchronous,
        snapshotted), False when not due.

        Raises ValueError when neither ``args`` nor ``items`` is given;
        ``AlreadyExistsError`` for an existing step; what ``treecask.save``
        raises for a leaf it cannot store; the error of the previous
        asynchronous save."""
        if items is None and args is None:
            raise ValueError("Must provide `args` for `save`.")
        if self._mgr.read_only:  # Orbax: skipped (with a warning in its log)
            return False
        a = args if args is not None else self._legacy_args("save", items, save_kwargs)
        if not force and not self.should_save(step):
            return False
        items, md = _encode_items(a, custom_metadata, str(self.directory))
        if self._default is None:
            self._default = _LAYOUT_KEY in md  # one item saved without a name
        self._save_step(step, items, metrics=None if getattr(self._opts, "prevent_write_metrics", False) else metrics,
                        metadata=md, metrics_entry=getattr(self._opts, "best_fn", None) is not None)  # Orbax's rule
        return True

    # ---- restore ----
    def restore(self, step: Optional[int], items: Any = None, restore_kwargs: Any = None,
                directory: Any = None, args: Any = None) -> Any:  # noqa: A002
        """Restores ``step`` (None: the latest) from this directory or ``directory``.

        One item: that item (raw, or into the target as the restore argument
        says); several: an ``args.Composite`` of the items asked for (all of
        them, raw, without ``args``). A save in flight is waited for first.
        Raises ``NotFoundError`` (a ``FileNotFoundError``) for a missing step
        or item; ``ShapeError`` / ``StructureError`` as :class:`Checkpointer`."""
        a = args if args is not None else self._legacy_args("restore", items, restore_kwargs)
        return _restore(self._where(step, directory, NotFoundError), a)

    def item_metadata(self, step: int) -> Any:
        """The step's item metadata, no array bytes read: a :class:`TreeMetadata`
        (one item) or an ``args.Composite`` of them (None for JSON items)."""
        if step is None:
            raise ValueError("`step` must be provided")
        return _item_metadata(self._where(step, None, NotFoundError))

    def metrics(self, step: int) -> Optional[Any]:
        """The metrics in ``step``'s entry ``metrics`` (a JSON value), or None
        when it has none (a step saved without ``best_fn``, as Orbax 0.12.8
        writes its ``metrics/`` item only then, or no such step). A save in
        flight is waited for first."""
        return self._metrics_entry(step)

    def metadata(self, step: Optional[int] = None) -> Any:
        """``step`` None: a :class:`RootMetadata`, the manager's ``metadata``
        (or the run's record of it, its entry ``metadata``) as
        ``.custom_metadata``; a step: its :class:`StepMetadata`."""
        if step is None:
            return RootMetadata(self._run_metadata())
        ck = Checkpoint(self._where(step, None, NotFoundError))
        metrics = self.metrics(step)  # Orbax's: the step's metrics item, else {}
        return StepMetadata(_item_metadata(ck), {} if metrics is None else metrics, ck.custom_metadata())

    def delete(self, step: int) -> None:
        """Deletes ``step`` (a save in flight is waited for first). Raises
        NotFoundError when it does not exist; a ``read_only`` manager
        deletes nothing (Orbax: skipped)."""
        if self._mgr.read_only:
            return
        if not self._delete_step(step):
            raise NotFoundError(f"no step {step} in the directory", file=str(self.directory))
        self._has_steps = False  # listed again by the next should_save

    wait_until_finished = Steps.wait


# Orbax names treecask.orbax does not provide, and what to do instead (a module
# __getattr__: UnsupportedError on use, never AttributeError).
_NOT_PROVIDED = {
    **{n: why for n, why in handlers._UNSUPPORTED.items() if n.endswith("CheckpointHandler")},
    "RestoreTransform": "use Transform(original_key=..., value_fn=...)",
    "apply_transformations": "restore with PyTreeRestore(item=target, transforms={key: Transform(...)})",
    "type_handlers": "every leaf type treecask.save takes is handled; no custom TypeHandlers",
    "multihost": "treecask.save coordinates jax.distributed processes itself",
    "path": "a manager's steps are named by treecask (no step name formats)",
    "serialization": "checkpoints are treecask archives (treecask.load / treecask.open)",
    "msgpack_utils": "checkpoints are treecask archives (treecask.load / treecask.open)",
    "experimental": "Orbax's experimental APIs: treecask.orbax.v1 is its v1 API",
    "pathways": "treecask places arrays with jax shardings (no Pathways)",
    "aggregate_handlers": "an archive holds the whole tree (no aggregate files)",
}


__getattr__ = _unsupported_names("treecask.orbax", "ocp.", _NOT_PROVIDED)
_publish(globals())
