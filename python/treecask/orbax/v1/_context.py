"""Orbax v1's ``Context``: the options a save or load runs with, current inside ``with ctx:`` (a
``contextvars`` variable); ``check_supported`` refuses those treecask cannot honour."""

from __future__ import annotations

import contextvars
import copy
from typing import Any, Optional

from . import options as O
from .._items import _unsupported

_CURRENT: contextvars.ContextVar[Optional["Context"]] = contextvars.ContextVar("treecask_orbax_v1_context",
                                                                                 default=None)

_FIELDS = (
    # (constructor keyword, attribute, option class)
    ("pytree_options", "pytree", O.PyTreeOptions),
    ("array_options", "array", O.ArrayOptions),
    ("async_options", "asynchronous", O.AsyncOptions),
    ("multiprocessing_options", "multiprocessing", O.MultiprocessingOptions),
    ("file_options", "file", O.FileOptions),
    ("checkpointables_options", "checkpointables", O.CheckpointablesOptions),
    ("pathways_options", "pathways", O.PathwaysOptions),
    ("deletion_options", "deletion", O.DeletionOptions),
    ("memory_options", "memory", O.MemoryOptions),
    ("safetensors_options", "safetensors", O.SafetensorsOptions),
    ("atomicity_options", "atomicity", O.AtomicityOptions),
)


class Context:
    """The options of v1 saves and loads (Orbax ``ocp.Context``).

    ``Context(parent=None, *, pytree_options=..., array_options=...,
    checkpoint_layout=...)``: a copy of ``parent``'s options (or the
    defaults), with the options given replacing theirs. Each option group is
    an attribute (``pytree``, ``array``, ``asynchronous``, ``multiprocessing``,
    ``file``, ``checkpointables``, ``pathways``, ``deletion``, ``memory``,
    ``safetensors``, ``atomicity``; Orbax's ``*_options`` names too) and
    ``checkpoint_layout`` a :class:`options.CheckpointLayout`. ``with ctx:``
    makes it current for the v1 calls inside (:func:`get_context`); a
    ``training.Checkpointer(context=...)`` runs every call under its own.
    Which options treecask follows: :mod:`treecask.orbax.v1.options`.
    (Orbax also forbids changing a context's options inside its ``with``
    block; treecask does not check that.)"""

    def __init__(self, context: Optional["Context"] = None, *, checkpoint_layout: Any = None, **options: Any):
        unknown = sorted(set(options) - {kw for kw, _, _ in _FIELDS})
        if unknown:
            raise TypeError(f"Context() got unexpected keyword argument(s) {unknown}")
        for kw, attr, cls in _FIELDS:  # each given option, else a copy of the parent's, else the default
            value = options.get(kw)
            value = getattr(context, attr) if value is None and context is not None else value
            object.__setattr__(self, "_" + attr, cls() if value is None else copy.deepcopy(value))
        if checkpoint_layout is None:
            checkpoint_layout = context.checkpoint_layout if context is not None else O.CheckpointLayout.ORBAX
        self._checkpoint_layout = O.CheckpointLayout(checkpoint_layout)
        self._tokens: list = []

    checkpoint_layout = property(lambda self: self._checkpoint_layout,
                                 lambda self, value: setattr(self, "_checkpoint_layout", O.CheckpointLayout(value)),
                                 doc="The checkpoint layout (an options.CheckpointLayout).")

    def __enter__(self) -> "Context":
        self._tokens.append(_CURRENT.set(self))
        return self

    def __exit__(self, *exc: Any) -> None:
        _CURRENT.reset(self._tokens.pop())

    def __repr__(self) -> str:
        return f"Context(pytree={self._pytree!r}, checkpoint_layout={self._checkpoint_layout})"


for _kw, _attr, _cls in _FIELDS:  # each group under its name and Orbax's older one (ctx.pytree_options)
    _group = property(lambda self, _a="_" + _attr: getattr(self, _a), doc=f"The {_attr} options.")
    setattr(Context, _attr, _group)
    setattr(Context, _kw, _group)
del _kw, _attr, _cls, _group


def get_context(default: Optional[Context] = None) -> Context:
    """The current context (innermost ``with ctx:``), else ``default``, else a fresh default one."""
    return _CURRENT.get() or default or Context()


def check_supported(ctx: Context, file: str = "") -> None:
    """Raises UnsupportedError naming the first option of `ctx` that treecask cannot honour."""
    def refuse(name: str, why: str) -> Exception:
        return _unsupported(f"v1 option {name}", why, file, by="treecask.orbax.v1")

    if ctx.checkpoint_layout == O.CheckpointLayout.SAFETENSORS:
        raise refuse("checkpoint_layout=SAFETENSORS", "convert the file once with treecask.import_safetensors")
    so = ctx.array.saving.storage_options
    for name in ("chunk_byte_size", "shard_axes"):
        if getattr(so, name, None) is not None:
            raise refuse(f"array.saving.storage_options.{name}",
                         "an archive's chunking is treecask.save's chunk_size")
    if getattr(ctx.array.loading, "use_load_and_broadcast", False):
        raise refuse("array.loading.use_load_and_broadcast", "every process reads the boxes it needs")
