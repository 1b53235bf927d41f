"""``treecask.orbax.v1.training.errors``: Orbax v1's training errors as
treecask errors (each names the file and what was expected)."""

from __future__ import annotations

from ....errors import AlreadyExistsError, NotFoundError

__all__ = ["StepAlreadyExistsError", "StepNotFoundError"]


class StepAlreadyExistsError(AlreadyExistsError):
    """A save at a step that exists, without ``overwrite=True`` (Orbax's; a
    ``FileExistsError`` and a :class:`treecask.AlreadyExistsError`)."""


class StepNotFoundError(NotFoundError):
    """No checkpoint at the step asked for (Orbax's; a ``FileNotFoundError``
    and a :class:`treecask.NotFoundError`)."""
