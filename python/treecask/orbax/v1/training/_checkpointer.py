"""Orbax v1's ``training.Checkpointer``, a ``_steps.Steps`` whose steps are laid out as the v1 free
functions lay out a checkpoint; its preservation policy is the manager's ``keep_fn``."""

from __future__ import annotations

import datetime
import functools
import os
import time
from typing import Any, Dict, Optional, Sequence

from ..._steps import Steps
from .._api import (AUTO_CHECKPOINTABLE_KEY, STATE_CHECKPOINTABLE_KEY, AsyncResponse, _checkpoint_metadata,
                    _encode_checkpointables, _responding, _validate_checkpointables)
from .._api import CheckpointMetadata as _BaseMetadata
from .._api import load_checkpointables as _load_checkpointables
from .._context import Context, check_supported, get_context
from ....errors import UnsupportedError
from . import preservation_policies as _pp
from . import save_decision_policies as _sd
from .errors import StepAlreadyExistsError, StepNotFoundError


class CheckpointMetadata(_BaseMetadata):
    """One step's metadata (Orbax v1 ``training.CheckpointMetadata``): the
    :class:`treecask.orbax.v1.CheckpointMetadata` fields plus ``step``,
    ``metrics`` (as saved, or None) and ``time`` (the commit time, a UTC
    datetime; ``UnsupportedError`` for a step in an object store, whose
    commit time treecask does not read). ``Checkpointer.checkpoints`` gives
    them with ``metadata`` None."""

    def __init__(self, step: int, path: Any, *, metrics: Any = None, **fields: Any):
        super().__init__(path, **fields)  # metadata, init_timestamp_nsecs, commit_timestamp_nsecs, custom_metadata
        self._step, self._metrics = step, metrics

    step = property(lambda self: self._step, doc="The step.")
    metrics = property(lambda self: self._metrics, doc="The step's metrics, or None.")

    @property
    def time(self) -> datetime.datetime:
        if self.commit_timestamp_nsecs is None:
            raise UnsupportedError("the commit time of a step in an object store is not read by treecask: use "
                                   "a policy by step, not by time", file=str(self.path))
        return self.commit_timestamp

    def _properties(self) -> Dict[str, str]:
        return {"step": str(self.step), **super()._properties(), "metrics": str(self.metrics)}


class RootMetadata:
    """The Checkpointer's own metadata (Orbax v1 ``training.RootMetadata``):
    ``directory`` and ``custom_metadata`` (the ``custom_metadata`` given to a
    Checkpointer of the directory, ``{}`` when none)."""

    def __init__(self, *, directory: Any, custom_metadata: Any = None):
        self.directory, self.custom_metadata = directory, custom_metadata

    def __repr__(self) -> str:
        return f"RootMetadata(directory={str(self.directory)!r}, custom_metadata={self.custom_metadata!r})"


def _metadata_of(info: Any) -> CheckpointMetadata:
    """A :class:`treecask.StepInfo` as v1's :class:`CheckpointMetadata` (``metadata`` None)."""
    return CheckpointMetadata(info.step, info.path, metadata=None, commit_timestamp_nsecs=info.commit_time_ns,
                              metrics=info.metrics)


def _step_of(step: Any) -> Optional[int]:
    return step.step if isinstance(step, CheckpointMetadata) else step


class Checkpointer(Steps):
    """A sequence of checkpoints in a training loop (Orbax v1 ``training.Checkpointer``).

    ``Checkpointer(directory, *, context=None, save_decision_policy=None,
    preservation_policy=None, step_name_format=None, custom_metadata=None,
    cleanup_tmp_directories=False, lightweight_initialize=False, logger=None)``:
    steps are ``<directory>/<n>/`` (a directory, or an object-store URL), as
    Orbax's (format/SPEC.md "Item-directory steps"; ``custom_metadata`` is
    the run's entry ``metadata``). ``save_decision_policy`` (default: the
    first step, then whenever no save is in progress, as Orbax's) says which
    steps :meth:`save` writes; ``preservation_policy`` (default: keep all)
    which are kept, applied after each save is durable. Calls run under
    ``context`` (default: the current one). ``step_name_format`` raises
    ``UnsupportedError``; ``cleanup_tmp_directories``,
    ``lightweight_initialize`` and ``logger`` have no effect. ``store`` (a
    treecask extension): a :class:`treecask.stores.Store` that ``directory``
    is a path inside (docs/stores.md).

    Saves are asynchronous underneath: ``save_async`` returns once the
    state's bytes are safe from the caller; ``save`` waits until durable.
    ``checkpoints`` and ``latest`` include a step still being saved.
    """

    def __init__(self, directory: Any, *, context: Optional[Context] = None, save_decision_policy: Any = None,
                 preservation_policy: Any = None, step_name_format: Any = None, custom_metadata: Any = None,
                 cleanup_tmp_directories: bool = False, lightweight_initialize: bool = False, logger: Any = None,
                 store: Any = None):
        d = os.fspath(directory)
        if step_name_format is not None:
            raise UnsupportedError("Orbax v1 Checkpointer(step_name_format=...) is not supported by "
                                   "treecask.orbax.v1: steps are named <step>, as Orbax's default", file=d)
        self._context = Context(context if context is not None else get_context())
        self._save_policy = save_decision_policy if save_decision_policy is not None else _sd.AnySavePolicy([
            _sd.InitialSavePolicy(), _sd.ContinuousCheckpointingPolicy(), _sd.PreemptionCheckpointingPolicy()])
        policy = preservation_policy if preservation_policy is not None else _pp.PreserveAll()
        super().__init__(d, store, custom_metadata, async_save=True, keep_fn=lambda infos: list(
            policy.should_preserve([_metadata_of(i) for i in infos], context=_pp.PreservationContext())))

    # ---- listing ----
    @property
    def checkpoints(self) -> Sequence[CheckpointMetadata]:
        """The steps, ascending by step, as :class:`CheckpointMetadata` with
        ``metadata`` None (step, path, metrics, commit time), a step still
        being saved included (its time: when its save began)."""
        return [_metadata_of(i) for i in self._infos()]

    latest = property(lambda self: next(reversed(self.checkpoints), None),
                      doc="The newest step's :class:`CheckpointMetadata`, or None when there is none.")

    def _at(self, step: Any) -> Any:
        """(CheckpointMetadata, Where) of step ``step`` (None: the latest); StepNotFoundError when none."""
        self._wait_quietly()
        cps, step = self.checkpoints, _step_of(step)
        c = (cps[-1] if cps else None) if step is None else next((c for c in cps if c.step == step), None)
        return c, self._where(step if c is None else c.step, error=StepNotFoundError)

    def should_save(self, step: int) -> bool:
        """Whether :meth:`save` writes ``step``: above the latest step, and the
        save decision policy says so (asked with the steps saved so far, and
        whether a save is in progress and the preemption sync point is
        reached: ``treecask.CheckpointManager.reached_preemption``, as Orbax)."""
        step = int(_step_of(step))
        previous = self.checkpoints
        if previous and previous[-1].step >= step:
            return False
        now = CheckpointMetadata(step, self._mgr.path(step), metadata=None, commit_timestamp_nsecs=time.time_ns())
        ctx = _sd.DecisionContext(is_saving_in_progress=self.is_saving_in_progress(),
                                  reached_preemption=self.reached_preemption(step),
                                  multiprocessing_options=self._context.multiprocessing)
        return bool(self._save_policy.should_save(now, previous, context=ctx))

    # ---- saving ----
    def save_checkpointables_async(self, step: int, checkpointables: Dict[str, Any], *, force: bool = False,
                                   overwrite: bool = False, metrics: Any = None,
                                   custom_metadata: Any = None) -> Optional[AsyncResponse[bool]]:
        """Saves ``checkpointables`` (``{name: pytree}``) as step ``step`` if the
        save decision policy says so (or ``force``); None when not due, else a
        response whose ``.result()`` is True once the step is durable and the
        preservation policy has run. A save in flight is waited for first.
        ``metrics``: a JSON value kept with the step (what ``BestN`` reads).
        Raises :class:`StepAlreadyExistsError` for an existing step unless
        ``overwrite=True`` (then it is deleted first); ``UnsupportedError``
        as :func:`treecask.orbax.v1.save_checkpointables`."""
        d = str(self.directory)
        with self._context:
            check_supported(self._context, d)
            items = _validate_checkpointables(checkpointables, d)
            step = int(_step_of(step))
            if step in self.all_steps():  # a step in flight included
                if not overwrite:
                    raise StepAlreadyExistsError(f"step {step} already exists (overwrite=True replaces it)",
                                                 file=str(self._mgr.path(step)))
                self.delete(step)
            if not force and not self.should_save(step):  # asked before waiting, as Orbax
                return None
            self._wait_quietly()
            enc, md = _encode_checkpointables(items, custom_metadata, d)
            self._save_step(step, enc, metrics=metrics, metadata=md)
        return _responding(self.wait, self._context.asynchronous.post_finalization_callback, True)

    def save_checkpointables(self, step: int, checkpointables: Dict[str, Any], **kwargs: Any) -> bool:
        """:meth:`save_checkpointables_async`, waiting until durable; True when saved, False when not due."""
        r = self.save_checkpointables_async(step, checkpointables, **kwargs)
        return False if r is None else r.result()

    def save_async(self, step: int, state: Any, *, checkpointable_name: str = STATE_CHECKPOINTABLE_KEY,
                   **kwargs: Any) -> Optional[AsyncResponse[bool]]:
        """Saves the pytree ``state`` as checkpointable ``checkpointable_name``
        ("state") of step ``step`` (see :meth:`save_checkpointables_async`)."""
        return self.save_checkpointables_async(step, {checkpointable_name: state}, **kwargs)

    def save(self, step: int, state: Any, *, checkpointable_name: str = STATE_CHECKPOINTABLE_KEY,
             **kwargs: Any) -> bool:
        """:meth:`save_async`, waiting until durable; True when saved, False when not due."""
        return self.save_checkpointables(step, {checkpointable_name: state}, **kwargs)

    # ---- loading ----
    def load_checkpointables(self, step: Any = None, abstract_checkpointables: Any = None) -> Dict[str, Any]:
        """Step ``step``'s checkpointables (None: the latest), as
        :func:`treecask.orbax.v1.load_checkpointables`. A save in flight is
        waited for first. Raises :class:`StepNotFoundError` for no such step."""
        with self._context:
            return _load_checkpointables(self._at(step)[1], abstract_checkpointables)

    def load(self, step: Any = None, abstract_state: Any = None, *,
             checkpointable_name: str = STATE_CHECKPOINTABLE_KEY) -> Any:
        """Step ``step``'s pytree ``checkpointable_name`` (None: the latest step),
        into ``abstract_state`` when given (as :func:`treecask.orbax.v1.load`)."""
        return self.load_checkpointables(step, {checkpointable_name: abstract_state})[checkpointable_name]

    def load_async(self, step: Any = None, abstract_state: Any = None, *,
                   checkpointable_name: str = STATE_CHECKPOINTABLE_KEY) -> AsyncResponse[Any]:
        """:meth:`load` on a background thread (Orbax 0.12.8 raises NotImplementedError)."""
        return AsyncResponse(lambda: self.load(step, abstract_state, checkpointable_name=checkpointable_name))

    def load_checkpointables_async(self, step: Any = None, abstract_checkpointables: Any = None) -> AsyncResponse:
        """:meth:`load_checkpointables` on a background thread."""
        return AsyncResponse(lambda: self.load_checkpointables(step, abstract_checkpointables))

    # ---- metadata ----
    def _step_metadata(self, step: Any, one: bool) -> CheckpointMetadata:
        with self._context:
            c, where = self._at(step)
            return _checkpoint_metadata(where, None, AUTO_CHECKPOINTABLE_KEY, one,
                                        functools.partial(CheckpointMetadata, c.step, metrics=c.metrics))

    def metadata(self, step: Any = None) -> CheckpointMetadata:
        """Step ``step``'s (None: the latest) pytree metadata, as :func:`treecask.orbax.v1.metadata`, with its metrics."""
        return self._step_metadata(step, True)

    def checkpointables_metadata(self, step: Any = None) -> CheckpointMetadata:
        """Step ``step``'s checkpointables' metadata (``{name: tree}``)."""
        return self._step_metadata(step, False)

    def root_metadata(self) -> RootMetadata:
        """The ``custom_metadata`` given to this Checkpointer, or else the
        run's (its entry ``metadata``, written by the first Checkpointer given
        one), or ``{}``."""
        custom = self._run_metadata()
        return RootMetadata(directory=self.directory, custom_metadata=custom if custom is not None else {})

    # ---- deleting ----
    def delete(self, step: Any, *, checkpointable_name: Optional[str] = None, missing_ok: bool = False) -> bool:
        """Deletes step ``step`` whatever the preservation policy; True when
        deleted, False when there was none and ``missing_ok``. Raises
        :class:`StepNotFoundError` otherwise; ``UnsupportedError`` for
        ``checkpointable_name`` (a step's archive is written whole)."""
        if checkpointable_name is not None:
            raise UnsupportedError(f"Orbax v1 Checkpointer.delete(checkpointable_name={checkpointable_name!r}) is "
                                   "not supported by treecask.orbax.v1: a step's archive is written whole",
                                   file=str(self.directory))
        step = int(_step_of(step))
        deleted = self._delete_step(step)
        if deleted or missing_ok:
            return deleted
        raise StepNotFoundError(f"no checkpoint at step {step}", file=str(self.directory))

    def delete_async(self, step: Any, **kwargs: Any) -> AsyncResponse[bool]:
        """:meth:`delete` on a background thread."""
        return AsyncResponse(lambda: self.delete(step, **kwargs))

    def cancel(self, step: Any = None) -> None:
        """Orbax cancels the save in flight and deletes its files; treecask
        cannot stop a write midway, so it waits for it, then deletes ``step``
        (if it exists): the same end state."""
        try:
            self.wait()
        finally:
            if step is not None:
                self.delete(step, missing_ok=True)

    # ---- lifetime ----
    def reload(self) -> None:
        """Nothing to do: every listing reads the directory."""

    # Orbax's former names.
    save_pytree, save_pytree_async, load_pytree, load_pytree_async = save, save_async, load, load_async
    pytree_metadata = metadata
