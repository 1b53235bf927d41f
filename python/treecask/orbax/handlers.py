"""``ocp.handlers``: Orbax's handler namespace as the guides use it: the
handlers, their argument classes under Orbax's names, and a handler
registry that tells a :class:`treecask.orbax.CheckpointManager`
(``handler_registry=``) which handler restores each item, as Orbax's
``item_handlers`` do. Handlers that write formats of their own raise
:class:`treecask.UnsupportedError` naming what to do instead.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from .args import (ArrayRestoreArgs, ArraySaveArgs, CompositeArgs, JsonRestoreArgs, JsonSaveArgs,
                   PyTreeRestoreArgs, PyTreeSaveArgs, StandardRestoreArgs, StandardSaveArgs)
from ._checkpointers import (_HANDLERS, ArrayCheckpointHandler, CheckpointHandler, CompositeCheckpointHandler,
                             JsonCheckpointHandler, PyTreeCheckpointHandler, StandardCheckpointHandler, _handler_class)
from ..errors import AlreadyExistsError, KeyNotFoundError, UnsupportedError
from ._items import _unsupported_names

CompositeResults = CompositeArgs


class CheckpointHandlerRegistry:
    """Which handler saves and restores each item, by argument class (Orbax
    ``CheckpointHandlerRegistry``). ``item`` None registers a handler for
    every item of that argument class."""

    def __init__(self, other_registry: Optional["CheckpointHandlerRegistry"] = None):
        self._entries: Dict[Tuple[Optional[str], type], Any] = {}
        if other_registry is not None:
            for (item, a), h in other_registry.get_all_entries().items():
                self.add(item, a, h)

    def add(self, item: Optional[str], args: Any, handler: Any = None) -> "CheckpointHandlerRegistry":
        """Registers ``handler`` (a handler class or instance, treecask's or
        Orbax's) for item ``item`` with the argument class ``args`` (a class or
        an instance). Without ``handler``, the handler of that argument class.
        Raises AlreadyExistsError (a ``FileExistsError``; Orbax raises
        AlreadyExistsError too) for a pair added twice, UnsupportedError for a
        handler treecask does not have."""
        a = args if isinstance(args, type) else type(args)
        if (item, a) in self._entries:
            raise AlreadyExistsError(f"entry for item={item!r} and args={a.__name__} already exists in the registry")
        if handler is None:  # the handler whose save or restore argument class `a` is
            names = {c.__name__ for c in a.__mro__}
            handler = next((h for h in _HANDLERS.values()
                            if h.save_args_cls.__name__ in names or h.restore_args_cls.__name__ in names), None)
            if handler is None:
                raise UnsupportedError(f"no treecask.orbax handler takes {a.__name__}: give the handler")
        self._entries[(item, a)] = _handler_class(handler)
        return self

    def get(self, item: Optional[str], args: Any) -> Any:
        """The handler class of (``item``, ``args``), else of (None, ``args``).
        Raises KeyNotFoundError (a ``KeyError``) when neither is registered."""
        a = args if isinstance(args, type) else type(args)
        for key in ((item, a), (None, a)):
            if key in self._entries:
                return self._entries[key]
        raise KeyNotFoundError(f"no entry for item={item!r} and args={a.__name__} in the registry")

    def has(self, item: Optional[str], args: Any) -> bool:
        """Whether :meth:`get` finds a handler."""
        a = args if isinstance(args, type) else type(args)
        return (item, a) in self._entries or (None, a) in self._entries

    def get_all_entries(self) -> Dict[Tuple[Optional[str], type], Any]:
        """{(item, argument class): handler class}."""
        return dict(self._entries)


class DefaultCheckpointHandlerRegistry(CheckpointHandlerRegistry):
    """The registry the guides build (Orbax ``DefaultCheckpointHandlerRegistry``):
    ``registry.add('state', ocp.args.StandardRestore, ocp.StandardCheckpointHandler)``."""


def create_default_handler_registry(**handlers: Any) -> DefaultCheckpointHandlerRegistry:
    """A registry with ``item=handler`` for each keyword (Orbax's helper): each
    handler registered for its save and restore argument classes."""
    r = DefaultCheckpointHandlerRegistry()
    for item, h in handlers.items():
        cls = _handler_class(h)
        r.add(item, cls.save_args_cls, cls)
        if cls.restore_args_cls is not cls.save_args_cls:
            r.add(item, cls.restore_args_cls, cls)
    return r


# Orbax handler names treecask does not provide, and what to do instead (UnsupportedError on use).
_UNSUPPORTED = {
    "AsyncCheckpointHandler": "custom handlers write files of their own; save the object's state as a pytree "
                              "(args.StandardSave) or JSON (args.JsonSave)",
    **dict.fromkeys(("ProtoCheckpointHandler", "ProtoSaveArgs", "ProtoRestoreArgs"),
                    "save the message's bytes or its JSON (args.JsonSave of MessageToDict)"),
    **dict.fromkeys(("JaxRandomKeyCheckpointHandler", "JaxRandomKeySaveArgs"),
                    "a typed PRNG key array is a pytree leaf: args.StandardSave saves it"),
    "JaxRandomKeyRestoreArgs": "a typed PRNG key array is a pytree leaf: args.StandardRestore restores it",
    "NumpyRandomKeyCheckpointHandler": "save np.random.get_state() / a Generator's bit_generator.state as JSON "
                                       "(args.JsonSave)",
    "NumpyRandomKeySaveArgs": "save the generator's state as JSON (args.JsonSave)",
    "NumpyRandomKeyRestoreArgs": "restore the generator's state as JSON (args.JsonRestore)",
    "handler_registration": "use handlers.DefaultCheckpointHandlerRegistry",
}


__getattr__ = _unsupported_names("treecask.orbax.handlers", "handlers.", _UNSUPPORTED)

__all__ = [
    "ArrayCheckpointHandler", "CheckpointHandler", "CompositeCheckpointHandler", "JsonCheckpointHandler",
    "PyTreeCheckpointHandler", "StandardCheckpointHandler", "StandardSaveArgs", "StandardRestoreArgs",
    "PyTreeSaveArgs", "PyTreeRestoreArgs", "JsonSaveArgs", "JsonRestoreArgs", "ArraySaveArgs",
    "ArrayRestoreArgs", "CompositeArgs", "CompositeResults", "CheckpointHandlerRegistry",
    "DefaultCheckpointHandlerRegistry", "create_default_handler_registry",
]
