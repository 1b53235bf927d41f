"""``treecask.orbax.v1.training.preservation_policies``: which steps a
:class:`~treecask.orbax.v1.training.Checkpointer` keeps (Orbax's
``preservation_policies``, same names, fields and rules). A policy's
``should_preserve(checkpoints, *, context)`` gets the steps in ascending
order (each with ``.step``, ``.time``, ``.metrics``) and returns one bool per
step; the Checkpointer deletes the steps no policy keeps, after each save is
durable. Any object with that method is a policy.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any, Callable, List, Optional, Protocol, Sequence, runtime_checkable

__all__ = ["PreservationContext", "PreservationPolicy", "PreserveAll", "LatestN", "EveryNSeconds", "EveryNSteps",
           "EveryNStepsClosest", "CustomSteps", "BestN", "LatestDuration", "AnyPreservationPolicy"]


@dataclasses.dataclass(kw_only=True)
class PreservationContext:
    """What a preservation decision may consult besides the steps (nothing yet, as in Orbax)."""


@runtime_checkable
class PreservationPolicy(Protocol):
    """A rule for which checkpoints to keep."""

    def should_preserve(self, checkpoints: Sequence[Any], *, context: PreservationContext) -> Sequence[bool]:
        ...


@dataclasses.dataclass
class PreserveAll:
    """Keeps every step (the Checkpointer's default)."""

    def should_preserve(self, checkpoints, *, context):
        return [True] * len(checkpoints)


@dataclasses.dataclass
class LatestN:
    """Keeps the newest ``n`` steps (all when ``n`` is None)."""

    n: Optional[int] = None

    def should_preserve(self, checkpoints, *, context):
        k = len(checkpoints)
        return [self.n is None or i >= k - self.n for i in range(k)]


@dataclasses.dataclass
class EveryNSeconds:
    """Keeps the first step, then each step at least ``interval_secs`` after the last one kept."""

    interval_secs: int

    def should_preserve(self, checkpoints, *, context):
        interval = datetime.timedelta(seconds=self.interval_secs)
        return _spaced(checkpoints, lambda c, last: c.time - last.time >= interval)


def _spaced(checkpoints: Sequence[Any], far_enough: Callable[[Any, Any], bool]) -> List[bool]:
    """The first step kept, then each step ``far_enough`` from the last one kept."""
    flags: List[bool] = []
    last = None
    for c in checkpoints:
        flags.append(last is None or far_enough(c, last))
        last = c if flags[-1] else last
    return flags


def _cap(flags: List[bool], max_to_keep: Optional[int]) -> List[bool]:
    """Only the newest `max_to_keep` of the kept steps stay kept."""
    kept = [i for i, f in enumerate(flags) if f]
    drop = set() if max_to_keep is None else set(kept[:max(len(kept) - max_to_keep, 0)])
    return [f and i not in drop for i, f in enumerate(flags)]


@dataclasses.dataclass
class EveryNSteps:
    """Keeps the multiples of ``interval_steps`` (``exact_interval``), or else the
    first step and each step at least ``interval_steps`` after the last one
    kept; at most the newest ``max_to_keep`` of them. ValueError for an interval of 0."""

    interval_steps: int
    exact_interval: bool = True
    max_to_keep: Optional[int] = None

    def should_preserve(self, checkpoints, *, context):
        if self.interval_steps == 0:
            raise ValueError("interval_steps must not be 0.")
        if self.exact_interval:
            return _cap([c.step % self.interval_steps == 0 for c in checkpoints], self.max_to_keep)
        return _cap(_spaced(checkpoints, lambda c, last: c.step - last.step >= self.interval_steps), self.max_to_keep)


@dataclasses.dataclass
class EveryNStepsClosest:
    """For each multiple k * ``interval_steps``, keeps the step nearest to it
    (the later one on a tie), and always the newest step; at most the newest
    ``max_to_keep`` of them. ValueError for an interval of 0."""

    interval_steps: int
    max_to_keep: Optional[int] = None

    def should_preserve(self, checkpoints, *, context):
        if self.interval_steps == 0:
            raise ValueError("interval_steps must not be 0.")
        nearest = {}  # k -> (distance, index)
        for i, c in enumerate(checkpoints):
            k = round(c.step / self.interval_steps)
            d = abs(c.step - k * self.interval_steps)
            if k not in nearest or d <= nearest[k][0]:
                nearest[k] = (d, i)
        keep = {i for _, i in nearest.values()} | {len(checkpoints) - 1}
        return _cap([i in keep for i in range(len(checkpoints))], self.max_to_keep)


class CustomSteps:
    """Keeps the steps in ``steps``."""

    def __init__(self, steps: Sequence[int]):
        self._steps = set(steps)

    def should_preserve(self, checkpoints, *, context):
        return [c.step in self._steps for c in checkpoints]

    def __repr__(self) -> str:
        return f"CustomSteps(steps={sorted(self._steps)})"


@dataclasses.dataclass(kw_only=True)
class BestN:
    """Keeps the ``n`` best steps by ``get_metric_fn(metrics)``: the steps
    sorted by it (descending when ``reverse``), the last ``n`` kept; steps
    saved without metrics are kept unless ``keep_checkpoints_without_metrics``
    is False. ``n`` None keeps all, 0 none."""

    get_metric_fn: Callable[[Any], float]
    reverse: bool = False
    n: Optional[int] = None
    keep_checkpoints_without_metrics: bool = True

    def should_preserve(self, checkpoints, *, context):
        k = len(checkpoints)
        if self.n is None or k <= self.n:
            return [True] * k
        if self.n == 0:
            return [False] * k
        scored = sorted((i for i, c in enumerate(checkpoints) if c.metrics is not None),
                        key=lambda i: self.get_metric_fn(checkpoints[i].metrics), reverse=self.reverse)
        keep = set(scored[-self.n:])
        if self.keep_checkpoints_without_metrics:
            keep.update(i for i, c in enumerate(checkpoints) if c.metrics is None)
        return [i in keep for i in range(k)]


@dataclasses.dataclass
class LatestDuration:
    """Keeps the steps committed within ``duration`` (a ``datetime.timedelta``) of now."""

    duration: datetime.timedelta

    def should_preserve(self, checkpoints, *, context):
        now = datetime.datetime.now(tz=datetime.timezone.utc)
        first = next((i for i, c in enumerate(checkpoints) if now - c.time <= self.duration), len(checkpoints))
        return [i >= first for i in range(len(checkpoints))]


@dataclasses.dataclass
class AnyPreservationPolicy:
    """Keeps a step when any of ``policies`` keeps it."""

    policies: Sequence[Any]

    def should_preserve(self, checkpoints, *, context):
        votes = [list(p.should_preserve(checkpoints, context=context)) for p in self.policies]
        return [any(v[i] for v in votes) for i in range(len(checkpoints))]
