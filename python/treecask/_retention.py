"""Retention: which steps of a run a :class:`treecask.CheckpointManager` keeps.

The rules are Orbax's ``CheckpointManagerOptions`` (``max_to_keep``,
``keep_period``, ``best_fn`` / ``best_mode``, steps without metrics kept as
``keep_checkpoints_without_metrics=True``), with treecask's default of also
keeping the newest step beside the best ones (``keep_newest``); or a rule of
the caller's (``keep_fn``, what Orbax v1's preservation policies plug into).
Nothing here lists or deletes: the manager hands in the steps and a way to
read their metrics, and deletes what :meth:`Retention.to_delete` names.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterable, List, Optional, Sequence, Tuple

from .errors import InvalidArgumentError, NotFoundError

#: ``metrics_of(step)``: the metrics saved with a step (None: saved without);
#: raises NotFoundError when the step is gone meanwhile.
MetricsOf = Callable[[int], Optional[Any]]


@dataclasses.dataclass(frozen=True)
class Retention:
    """One run's retention rule (the arguments of :class:`treecask.CheckpointManager`
    of the same names; checked there)."""

    max_to_keep: Optional[int]
    keep_period: Optional[int]
    best_fn: Optional[Callable[[Any], float]]
    best_mode: str
    keep_newest: bool
    keep_fn: Optional[Callable[[List[Any]], Sequence[bool]]] = None

    @property
    def deletes(self) -> bool:
        """Whether this rule can delete a step at all."""
        return self.max_to_keep is not None or self.keep_fn is not None

    def score(self, metrics: Any) -> float:
        """``best_fn(metrics)`` as a float; NaN is the worst score."""
        v = float(self.best_fn(metrics))
        if math.isnan(v):
            return -math.inf if self.best_mode == "max" else math.inf
        return v

    def rank(self, scored: Iterable[Tuple[float, int]]) -> List[int]:
        """Steps from worst to best; among equal scores the newer is better."""
        return [s for _, s in sorted(scored, key=lambda t: (t[0] if self.best_mode == "max" else -t[0], t[1]))]

    def _scored(self, steps: Sequence[int], metrics_of: MetricsOf) -> Tuple[List[Tuple[float, int]], List[int]]:
        """(score, step) of the steps saved with metrics, and the steps saved without (none gone meanwhile)."""
        scored, unscored = [], []
        for s in steps:
            try:
                m = metrics_of(s)
            except NotFoundError:  # deleted meanwhile by another process
                continue
            if m is None:
                unscored.append(s)
            else:
                scored.append((self.score(m), s))
        return scored, unscored

    def best(self, steps: Sequence[int], metrics_of: MetricsOf) -> Optional[int]:
        """With ``best_fn``: the best-scored step among those saved with
        metrics (ties: the newest), or None; without: the newest step (Orbax's
        ``best_step``)."""
        if self.best_fn is None:
            return max(steps) if steps else None
        ranked = self.rank(self._scored(steps, metrics_of)[0])
        return ranked[-1] if ranked else None

    def to_delete(self, steps: Sequence[int], metrics_of: MetricsOf,
                  infos: Optional[Callable[[], List[Any]]] = None) -> List[int]:
        """The steps of ``steps`` this rule deletes (ascending).

        ``keep_fn``: the steps whose flag is False in ``keep_fn(infos())``
        (``infos()``: a :class:`treecask.StepInfo` per step, ascending; the
        flags must be as many as the steps, else InvalidArgumentError).
        Else, with ``max_to_keep`` None: none. Else all but the kept ones:
        the newest ``max_to_keep`` (without ``best_fn``), or the
        ``max_to_keep`` best and every step saved without metrics, plus the
        newest unless ``keep_newest`` is False (with ``best_fn``); and every
        multiple of ``keep_period``."""
        steps = sorted(steps)
        if self.keep_fn is not None:
            listed = infos() if infos is not None else []
            flags = list(self.keep_fn(listed))
            if len(flags) != len(listed):
                raise InvalidArgumentError(f"keep_fn returned {len(flags)} flags for {len(listed)} steps")
            return sorted(i.step for i, keep in zip(listed, flags) if not keep)
        if self.max_to_keep is None or not steps:
            return []
        keep = {steps[-1]} if self.keep_newest or self.best_fn is None else set()
        if self.best_fn is None:
            keep.update(steps[-self.max_to_keep:])
        else:
            scored, unscored = self._scored(steps, metrics_of)
            keep.update(unscored, self.rank(scored)[-self.max_to_keep:])
        if self.keep_period is not None:
            keep.update(s for s in steps if s % self.keep_period == 0)
        return [s for s in steps if s not in keep]
