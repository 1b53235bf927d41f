"""Orbax's view of a run (format/SPEC.md "Item-directory steps") over
:class:`treecask.CheckpointManager`'s public calls: the one adapter that
``treecask.orbax.CheckpointManager`` and ``treecask.orbax.v1.training.Checkpointer``
share. Beyond the manager's own calls it lists a step still being saved
(Orbax's bookkeeping), reads a step through a
:class:`~treecask.orbax._items.Where` and reads other directories of the same store.
"""

from __future__ import annotations

import json
import time
from typing import Any, Dict, List, Optional

from .. import stores
from .._open import open as _open
from .._save import save as _save

from .._manager import CheckpointManager as _Manager
from .._manager import StepInfo, _json_default
from ..errors import InvalidArgumentError
from . import _layout as _L
from .._run import ITEM_DIRECTORIES, committed
from ._items import Where


#: A step's entry holding its metrics, as Orbax's managers write them (an
#: archive without leaves, of kind "metrics", the JSON under METRICS_JSON_KEY).
METRICS_ITEM = "metrics"
METRICS_KIND = "metrics"
METRICS_JSON_KEY = "treecask.orbax.metrics"

#: The entry of a run holding its custom metadata (Orbax's ``metadata/``) and
#: that archive's metadata key for it.
ROOT_METADATA = "metadata"
ROOT_KEY = "treecask.orbax.root_metadata"


class Steps:
    """A run's steps as Orbax's managers see them.

    ``Steps(directory, store=None, **options)``: a
    :class:`treecask.CheckpointManager` of ``directory`` with ``options``
    (``async_save``, ``read_only``, ``max_to_keep``, ``keep_period``,
    ``best_fn``, ``best_mode``, ``keep_fn``), Orbax's retention
    (``keep_newest=False``: exactly the ``max_to_keep`` best with
    ``best_fn``) and no save interval (the Orbax layers decide which steps
    are due). Raises what that constructor raises."""

    def __init__(self, directory: Any, store: Any = None, **options: Any):
        loc = stores.resolve(directory, store)  # once: the manager receives the Location
        self.manager = _Manager(loc, keep_newest=False, save_interval_steps=1, step_layout=ITEM_DIRECTORIES,
                                **options)
        self._store = store
        self._started: Dict[int, int] = {}  # step -> time.time_ns() when its save began
        self._root = stores.join(loc.path, ROOT_METADATA)

    # ---- the run's own metadata ----
    def root_metadata(self) -> Any:
        """The run's custom metadata (JSON-decoded) from its entry
        ``metadata`` (:meth:`save_root_metadata`), or None when it has none."""
        st = self.manager.store
        if not self._has_root(st):
            return None
        with _open(self._root, store=st) as a:
            raw = a.metadata.get(ROOT_KEY)
        return json.loads(raw) if raw is not None else None

    def save_root_metadata(self, custom: Any) -> None:
        """Writes the run's custom metadata (a JSON value) once, as Orbax's
        managers do: the entry ``metadata`` beside the steps (Orbax's
        ``metadata/`` directory), a leafless treecask archive whose archive
        metadata holds it (in a multi-process jax job, where every process
        calls this, the core's sharded checkpoint of it). A run that has it
        keeps it; nothing when read-only."""
        st = self.manager.store
        if self.manager.read_only or self._has_root(st):
            return
        _save(self._root, None, metadata={ROOT_KEY: json.dumps(custom)}, store=st)

    def _has_root(self, st: stores.Store) -> bool:
        """Whether the run has its entry ``metadata``: an archive, or (written
        by a multi-process job, every process calling) a sharded checkpoint
        directory."""
        return committed(st, self._root, st.list_prefix(self._root))

    # ---- listing ----
    def all_steps(self) -> List[int]:
        """The committed steps and the step being saved, ascending."""
        steps = set(self.manager.all_steps())
        s = self.manager.in_flight()
        if s is not None:
            steps.add(s.step)
        return sorted(steps)

    def latest_step(self) -> Optional[int]:
        """The highest step (one being saved included), or None."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    def infos(self) -> List[StepInfo]:
        """A :class:`treecask.StepInfo` per step, ascending, the step being
        saved included (its ``commit_time_ns``: when its save began)."""
        infos = self.manager.step_infos()
        s = self.manager.in_flight()
        if s is not None and all(i.step != s.step for i in infos):
            infos.append(StepInfo(s.step, s.path, s.metrics, self._started.get(s.step, time.time_ns())))
            infos.sort(key=lambda i: i.step)
        return infos

    def where(self, step: Optional[int], directory: Any = None) -> Optional[Where]:
        """Where committed step ``step`` (None: the latest) is (its store and
        path), in this run or in ``directory`` (a path or URL, or a path in
        the store this run was given); None when there is no such step. A
        save in flight here is waited for first."""
        if directory is None:
            self.wait_quietly()
            m = self.manager
        else:
            m = _Manager(directory, store=self._store, read_only=True, step_layout=ITEM_DIRECTORIES)
        steps = m.all_steps()
        step = (steps[-1] if steps else None) if step is None else step
        if step not in steps:
            return None
        store, path = m.location(step)
        return Where(path, store)

    # ---- saving, deleting ----
    def save(self, step: int, items: Any, *, metrics: Any, metadata: Dict[str, str],
             metrics_entry: bool = True) -> None:
        """Saves ``items`` (``{item name: (pytree, archive metadata)}``,
        ``_items._encode_items``) as step ``step``, with ``metadata`` in its
        ``index.cask`` (due or not: the Orbax layers decide). ``metrics``
        (a JSON value, or None) are also the step's entry ``metrics`` when
        ``metrics_entry``, where Orbax's managers write one (v1's always,
        v0's with ``best_fn``); an item of that name is then refused
        (InvalidArgumentError), as Orbax reserves it."""
        if metrics is not None and metrics_entry:
            if METRICS_ITEM in items:
                raise InvalidArgumentError(f"the item name '{METRICS_ITEM}' is the step's metrics' (Orbax reserves it)",
                                           file=str(self.manager.path(step)))
            imd = {_L.KIND_KEY: METRICS_KIND}
            try:
                imd[METRICS_JSON_KEY] = json.dumps(metrics, sort_keys=True, default=_json_default)
            except (TypeError, ValueError):
                pass  # not JSON: the manager's save refuses the metrics, naming the step
            items = {**items, METRICS_ITEM: (None, imd)}
        self._started[step] = time.time_ns()
        self.manager.save(step, items, metrics=metrics, force=True, metadata=metadata)

    def delete(self, step: int) -> bool:
        """Deletes committed step ``step`` (a save in flight is waited for
        first); False when there is none."""
        self.wait_quietly()
        if step not in self.manager.all_steps():
            return False
        self.manager.delete(step)
        return True

    # ---- the save in flight ----
    def wait_quietly(self) -> None:
        """Waits for the save in flight without taking its error (it stays
        for ``wait`` / ``check_for_errors`` / the next save)."""
        self.manager.wait_until_finished(raise_error=False)

    def wait(self) -> None:
        """Blocks until the save in flight is committed and retention has run; raises its error, once."""
        try:
            self.manager.wait_until_finished()
        finally:
            self._started.clear()

    def metrics_entry(self, step: int) -> Any:
        """The metrics in committed step ``step``'s entry ``metrics`` (JSON-decoded),
        or None when the step has no such entry (saved by a v0 manager
        without ``best_fn``, or without metrics) or does not exist: what
        Orbax's ``CheckpointManager.metrics`` reads (its ``metrics/`` item,
        written only with ``best_fn``). A save in flight is waited for first."""
        where = self.where(step)
        if where is None:
            return None
        names = _L.item_names(where.store, where.key)
        if not names or METRICS_ITEM not in names:
            return None
        with _open(stores.join(where.key, METRICS_ITEM), store=where.store) as a:
            md = dict(a.metadata)
        raw = md.get(METRICS_JSON_KEY)
        return json.loads(raw) if md.get(_L.KIND_KEY) == METRICS_KIND and raw is not None else None


class Run:
    """What ``treecask.orbax.CheckpointManager`` and
    ``treecask.orbax.v1.training.Checkpointer`` share over their ``_steps``
    (a :class:`Steps`): the directory and the lifetime calls."""

    _steps: Steps

    @property
    def directory(self) -> Any:
        """The directory of the steps (a ``pathlib.Path``; a URL str for an object store)."""
        return self._steps.manager.directory

    def is_saving_in_progress(self) -> bool:
        """Whether an asynchronous save is still running."""
        return self._steps.manager.is_saving_in_progress()

    def close(self) -> None:
        """Waits for the save in flight, then closes (later saves raise)."""
        self._steps.manager.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
