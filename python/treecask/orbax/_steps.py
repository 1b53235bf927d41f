"""Orbax's view of a run (format/SPEC.md "Item-directory steps") over :class:`treecask.CheckpointManager`:
:class:`Steps`, the one base of ``treecask.orbax.CheckpointManager`` and ``v1.training.Checkpointer``."""

from __future__ import annotations

import json
import time
from typing import Any, Dict, List, Optional

from .. import _core, stores
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
    """A run's steps as Orbax's managers see them: a treecask manager with Orbax's retention, the run's metadata."""

    def __init__(self, directory: Any, store: Any, custom_metadata: Any, **options: Any):
        loc = stores.resolve(directory, store)  # once: the manager receives the Location
        self._mgr = _Manager(loc, keep_newest=False, save_interval_steps=1, step_layout=ITEM_DIRECTORIES, **options)
        self._store = store
        self._started: Dict[int, int] = {}  # step -> time.time_ns() when its save began
        self._root = stores.join(loc.path, ROOT_METADATA)
        self._custom = custom_metadata
        if custom_metadata is not None and not self._mgr.read_only and not self._has_root():
            _save(self._root, None, metadata={ROOT_KEY: json.dumps(custom_metadata)}, store=self._mgr.store)

    directory = property(lambda self: self._mgr.directory,
                         doc="The directory of the steps (a ``pathlib.Path``; a URL str for an object store).")

    def _run_metadata(self) -> Any:
        """The custom metadata given to this object, else the run's (its entry ``metadata``), else None."""
        if self._custom is not None or not self._has_root():
            return self._custom
        with _open(self._root, store=self._mgr.store) as a:
            raw = a.metadata.get(ROOT_KEY)
        return json.loads(raw) if raw is not None else None

    def _has_root(self) -> bool:
        """Whether the run has its entry ``metadata`` (an archive, or a multi-process job's sharded checkpoint)."""
        st = self._mgr.store
        return committed(st, self._root, st.list_prefix(self._root))

    # ---- listing ----
    def all_steps(self, read: bool = False) -> List[int]:
        """The steps, ascending: the directory's, plus a step still being saved."""
        s = self._mgr.in_flight()
        return sorted(set(self._mgr.all_steps()) | ({s.step} if s is not None else set()))

    def latest_step(self) -> Optional[int]:
        """The highest step (one being saved included), or None."""
        return max(self.all_steps(), default=None)

    def _infos(self) -> List[StepInfo]:
        """A StepInfo per step, ascending, the step being saved included (its time: when its save began)."""
        infos = self._mgr.step_infos()
        s = self._mgr.in_flight()
        if s is not None and all(i.step != s.step for i in infos):
            infos.append(StepInfo(s.step, s.path, s.metrics, self._started.get(s.step, time.time_ns())))
            infos.sort(key=lambda i: i.step)
        return infos

    def _where(self, step: Optional[int], directory: Any = None, error: Any = None) -> Optional[Where]:
        """Where committed step ``step`` (None: the latest) is, here or in ``directory``; None when none, or
        ``error`` (a NotFoundError class) raised naming the directory."""
        if directory is None:
            if step is None:  # the save in flight included: if it fails, its step is not found, never an older one
                step = self.latest_step()
            self._wait_quietly()
            m = self._mgr
        else:
            m = _Manager(directory, store=self._store, read_only=True, step_layout=ITEM_DIRECTORIES)
        steps = m.all_steps()
        step = (steps[-1] if steps else None) if step is None else step
        if step in steps:
            return Where(*reversed(m.location(step)))
        if error is not None:
            raise error("no steps found" if step is None else f"no step {step} in the directory",
                        file=str(self.directory if directory is None else Where(directory, self._store)))
        return None

    def reached_preemption(self, step: int) -> bool:
        """Whether every process has reached the preemption sync point ``step``
        (:meth:`treecask.CheckpointManager.reached_preemption`, jax's rule as
        Orbax's): False without a ``jax.distributed`` job."""
        return self._mgr.reached_preemption(step)

    # ---- saving, deleting ----
    def _save_step(self, step: int, items: Any, *, metrics: Any, metadata: Dict[str, str],
                   metrics_entry: bool = True) -> None:
        """Saves ``items`` as step ``step``, with ``metrics`` also as the entry ``metrics`` (``metrics_entry``)."""
        if metrics is not None and metrics_entry:
            if METRICS_ITEM in items:
                raise InvalidArgumentError(f"the item name '{METRICS_ITEM}' is the step's metrics' (Orbax reserves it)",
                                           file=str(self._mgr.path(step)))
            imd = {_L.KIND_KEY: METRICS_KIND}
            try:
                imd[METRICS_JSON_KEY] = json.dumps(metrics, sort_keys=True, default=_json_default)
            except (TypeError, ValueError):
                pass  # not JSON: the manager's save refuses the metrics, naming the step
            items = {**items, METRICS_ITEM: (None, imd)}
        self._started[step] = time.time_ns()
        self._mgr.save(step, items, metrics=metrics, force=True, metadata=metadata)

    def _delete_step(self, step: int) -> bool:
        """Deletes committed step ``step`` (a save in flight waited for first); False when there is none."""
        self._wait_quietly()
        if step not in self._mgr.all_steps():
            return False
        self._mgr.delete(step)
        return True

    def _metrics_entry(self, step: int) -> Any:
        """Committed step ``step``'s entry ``metrics`` (JSON-decoded), or None when it has none."""
        where = self._where(step)
        names = None if where is None else _L.item_names(where.store, where.key)
        if not names or METRICS_ITEM not in names:
            return None
        with _open(stores.join(where.key, METRICS_ITEM), store=where.store) as a:
            md = dict(a.metadata)
        raw = md.get(METRICS_JSON_KEY)
        return json.loads(raw) if md.get(_L.KIND_KEY) == METRICS_KIND and raw is not None else None

    # ---- the save in flight, lifetime ----
    def _wait_quietly(self) -> None:
        """Waits for the save in flight, leaving its error for ``wait`` / ``check_for_errors`` / the next save."""
        self._mgr.wait_until_finished(raise_error=False)

    def wait(self) -> None:
        """Blocks until the save in flight is durable and retention (the
        preservation policy) has run; raises its error, once."""
        try:
            self._mgr.wait_until_finished()
        finally:
            self._started.clear()

    def check_for_errors(self) -> None:
        """Raises the error of a finished asynchronous save, once, without blocking."""
        self._mgr.check_for_errors()

    def is_saving_in_progress(self) -> bool:
        """Whether an asynchronous save is still running."""
        return self._mgr.is_saving_in_progress()

    def close(self) -> None:
        """Waits for the save in flight, then closes (later saves raise)."""
        self._mgr.close()

    def __repr__(self) -> str:
        return f"<{type(self).__module__}.{type(self).__name__} {_core.redact_url(str(self.directory))!r}>"

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
