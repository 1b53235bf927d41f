"""``treecask.orbax.v1.training.save_decision_policies``: at which steps a
:class:`~treecask.orbax.v1.training.Checkpointer` saves (Orbax's
``save_decision_policies``, same names, fields and rules). A policy's
``should_save(step, previous_steps, *, context)`` gets the step asked about
and the steps saved so far (each with ``.step``, ``.time``, ``.metrics``) and
a :class:`DecisionContext`; any object with that method is a policy. A step
at or below the latest saved one is never due, whatever the policy.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any, Container, Optional, Protocol, Sequence, runtime_checkable

__all__ = ["DecisionContext", "SaveDecisionPolicy", "FixedIntervalPolicy", "SpecificStepsPolicy",
           "ContinuousCheckpointingPolicy", "PreemptionCheckpointingPolicy", "InitialSavePolicy", "AnySavePolicy"]


@dataclasses.dataclass(kw_only=True)
class DecisionContext:
    """What a save decision may consult: ``is_saving_in_progress`` (an
    asynchronous save still running), ``reached_preemption`` (every process
    reached the preemption sync point: ``treecask.CheckpointManager.reached_preemption``),
    ``multiprocessing_options`` (the Checkpointer context's)."""

    is_saving_in_progress: bool
    reached_preemption: bool
    multiprocessing_options: Any = None


@runtime_checkable
class SaveDecisionPolicy(Protocol):
    """A rule for when to save."""

    def should_save(self, step: Any, previous_steps: Sequence[Any], *, context: DecisionContext) -> bool:
        ...


@dataclasses.dataclass
class FixedIntervalPolicy:
    """Saves the multiples of ``interval``."""

    interval: int

    def should_save(self, step, previous_steps, *, context):
        return step.step % self.interval == 0


@dataclasses.dataclass
class SpecificStepsPolicy:
    """Saves the steps in ``steps``."""

    steps: Container[int]

    def should_save(self, step, previous_steps, *, context):
        return step.step in self.steps


@dataclasses.dataclass(kw_only=True)
class ContinuousCheckpointingPolicy:
    """Saves whenever no save is in progress and, with ``minimum_interval_secs``,
    that long has passed since the last step saved. (Orbax decides on the
    primary process and broadcasts; treecask decides in each process: in a
    multi-process job give a step-based policy instead.)"""

    minimum_interval_secs: Optional[int] = None

    def should_save(self, step, previous_steps, *, context):
        return not context.is_saving_in_progress and (
            not previous_steps or self.minimum_interval_secs is None
            or step.time - previous_steps[-1].time >= datetime.timedelta(seconds=self.minimum_interval_secs))


@dataclasses.dataclass
class PreemptionCheckpointingPolicy:
    """Saves when every process has reached the preemption sync point
    (``context.reached_preemption``)."""

    def should_save(self, step, previous_steps, *, context):
        return bool(context.reached_preemption)


@dataclasses.dataclass
class InitialSavePolicy:
    """Saves the first step of a run: when no step has been saved."""

    def should_save(self, step, previous_steps, *, context):
        return not previous_steps


@dataclasses.dataclass
class AnySavePolicy:
    """Saves when any of ``policies`` says so (asked in order, stopping at the first yes)."""

    policies: Sequence[Any]

    def should_save(self, step, previous_steps, *, context):
        return any(p.should_save(step, previous_steps, context=context) for p in self.policies)
