"""``treecask.orbax.v1``: Orbax's v1 checkpointing API over treecask archives.

    from treecask.orbax import v1 as ocp     # instead of: from orbax.checkpoint import v1 as ocp

orbax-checkpoint 0.12.8's ``orbax.checkpoint.v1`` names and signatures; what a
checkpoint is on disk, the rules followed and what differs: docs/python.md
"Orbax's v1 API" (format/SPEC.md "Item-directory steps" for a
``training.Checkpointer``'s steps). ``_api.py`` holds the free functions,
``_context.py`` the Context, ``options.py`` the option classes, ``training/``
the Checkpointer and policies.
"""

import types

from . import options, training
from ._api import (AUTO_CHECKPOINTABLE_KEY, PLACEHOLDER, STATE_CHECKPOINTABLE_KEY, AsyncResponse, CheckpointMetadata,
                   checkpointables_metadata, delete, delete_async, is_orbax_checkpoint, load, load_async,
                   load_checkpointables, load_checkpointables_async, load_pytree, load_pytree_async, metadata,
                   pytree_metadata, save, save_async, save_checkpointables, save_checkpointables_async, save_pytree,
                   save_pytree_async)
from ._context import Context, get_context
from .._items import _publish, _to_shape_dtype_struct, _unsupported_names
from .._utils import merge_trees as _merge_trees

#: A pytree's metadata is the tree itself (Orbax's ``PyTreeMetadata``).
PyTreeMetadata = object


from typing import Any, Protocol, runtime_checkable  # noqa: E402


@runtime_checkable
class StatefulCheckpointable(Protocol):
    """An object saved through its state (Orbax ``StatefulCheckpointable``,
    e.g. a Grain dataset iterator): ``get_state()`` returns a JSON value,
    ``set_state(state)`` restores it. ``save_checkpointables`` stores the
    state; ``load_checkpointables(path, {name: obj})`` calls
    ``obj.set_state`` and returns ``obj``."""

    def get_state(self) -> Any: ...

    def set_state(self, state: Any) -> None: ...


#: ``ocp.arrays`` (``to_shape_dtype_struct``) and ``ocp.tree`` (``merge``, Orbax's ``merge_trees``).
arrays = types.SimpleNamespace(to_shape_dtype_struct=_to_shape_dtype_struct)
tree = types.SimpleNamespace(merge=_merge_trees)


# Orbax v1 names treecask does not provide, and why (a module __getattr__: UnsupportedError on use).
_UNSUPPORTED = {
    "partial": "partial saving adds to a checkpoint directory; an archive is written whole",
    "handlers": "custom CheckpointableHandlers write their own files; every checkpointable is a pytree",
    "Checkpointable": "custom checkpointables write their own files; every checkpointable is a pytree",
    "AbstractCheckpointable": "custom checkpointables write their own files; every checkpointable is a pytree",
    "CheckpointableHandler": "custom CheckpointableHandlers write their own files; every checkpointable is a pytree",
    "path": "steps are named <step>, Orbax's default (no step name formats)",
    "multihost": "treecask.save coordinates jax.distributed processes itself",
    "errors": "the errors are treecask's (treecask.errors; training.errors for steps)",
}


__getattr__ = _unsupported_names("treecask.orbax.v1", "v1 ocp.", _UNSUPPORTED, by="treecask.orbax.v1")

__all__ = [
    "save", "save_async", "save_pytree", "save_pytree_async", "save_checkpointables", "save_checkpointables_async",
    "load", "load_async", "load_pytree", "load_pytree_async", "load_checkpointables", "load_checkpointables_async",
    "metadata", "pytree_metadata", "checkpointables_metadata", "delete", "delete_async", "is_orbax_checkpoint",
    "AsyncResponse", "CheckpointMetadata", "StatefulCheckpointable", "PyTreeMetadata", "Context", "get_context", "PLACEHOLDER",
    "STATE_CHECKPOINTABLE_KEY", "AUTO_CHECKPOINTABLE_KEY", "options", "training", "arrays", "tree",
]
_publish(globals())
