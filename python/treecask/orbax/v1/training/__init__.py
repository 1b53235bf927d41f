"""``treecask.orbax.v1.training``: Orbax v1's ``training`` package --
:class:`Checkpointer` (a sequence of steps in a training loop, one treecask
archive per step), its :class:`CheckpointMetadata` and :class:`RootMetadata`,
the policies (``save_decision_policies``, ``preservation_policies``) and
``errors`` (``StepAlreadyExistsError``, ``StepNotFoundError``).
"""

from . import errors, preservation_policies, save_decision_policies
from ._checkpointer import Checkpointer, CheckpointMetadata, RootMetadata

__all__ = ["Checkpointer", "CheckpointMetadata", "RootMetadata", "save_decision_policies",
           "preservation_policies", "errors"]


def __getattr__(name: str):
    if name == "pathways":
        from ....errors import UnsupportedError

        raise UnsupportedError("Orbax v1 ocp.training.pathways is not supported by treecask.orbax.v1: "
                               "it drives Pathways' own checkpointing")
    raise AttributeError(f"module 'treecask.orbax.v1.training' has no attribute {name!r}")
