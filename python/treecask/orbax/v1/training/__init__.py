"""``treecask.orbax.v1.training``: Orbax v1's ``training`` package --
:class:`Checkpointer` (a sequence of steps in a training loop, one treecask
archive per step), its :class:`CheckpointMetadata` and :class:`RootMetadata`,
the policies (``save_decision_policies``, ``preservation_policies``) and
``errors`` (``StepAlreadyExistsError``, ``StepNotFoundError``).
"""

from . import errors, preservation_policies, save_decision_policies
from ._checkpointer import Checkpointer, CheckpointMetadata, RootMetadata
from ..._items import _publish, _unsupported_names

__all__ = ["Checkpointer", "CheckpointMetadata", "RootMetadata", "save_decision_policies",
           "preservation_policies", "errors"]


__getattr__ = _unsupported_names("treecask.orbax.v1.training", "v1 ocp.training.",
                                 {"pathways": "it drives Pathways' own checkpointing"}, by="treecask.orbax.v1")
_publish(globals())
