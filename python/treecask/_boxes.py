"""Built-in knowledge of the metadata boxes of Flax and Penzai.

A *box* is a node that wraps one array (its ``value`` / ``data_array`` field)
and carries static metadata that a leaf-only checkpointer loses: Flax
``Partitioned`` / ``LogicallyPartitioned`` names and mesh, Flax NNX variable
metadata (sharding), Penzai ``NamedArray`` / ``NamedArrayView`` axis names and
``Parameter`` labels. Boxes are saved as Dataclass nodes whose type name is
the class's qualified name, and their static metadata is stored with the
leaf below them (logical_axes, sharding and ``treecask.*`` key-values; see
docs/python.md "Tree encoding").

Reading never imports or calls anything named in a file: a box is rebuilt
only when its type name is one of the classes listed here, looked up in the
library module the program has installed.
"""

from __future__ import annotations

import collections
import functools
import sys
from dataclasses import dataclass, field
import importlib
from typing import Any, Dict, List, Optional, Tuple

from . import _jaxutil as J
from . import _static

# Leaf metadata keys (the "treecask." prefix is reserved for the package).
FLAX_NAMES = "treecask.flax.names"
FLAX_RULES = "treecask.flax.rules"
FLAX_MESH = "treecask.flax.mesh"
NNX_METADATA = "treecask.nnx.metadata"
PZ_POSITIONAL = "treecask.penzai.positional"
PZ_NAMES = "treecask.penzai.named_axes"
PZ_LOGICAL = "treecask.penzai.data_axis_for_logical_axis"
PZ_BY_NAME = "treecask.penzai.data_axis_for_name"
PZ_LABEL = "treecask.penzai.label"
PZ_METADATA = "treecask.penzai.metadata"


@dataclass
class Extras:
    """What boxes add to a leaf's LeafMeta."""

    logical_axes: Optional[List[str]] = None
    spec: Optional[List[List[str]]] = None
    mesh: Optional[Tuple[List[str], List[int]]] = None
    metadata: Dict[str, str] = field(default_factory=dict)

    def merged(self, inner: "Extras") -> "Extras":
        return Extras(
            logical_axes=inner.logical_axes if inner.logical_axes is not None else self.logical_axes,
            spec=inner.spec if inner.spec is not None else self.spec,
            mesh=inner.mesh if inner.mesh is not None else self.mesh,
            metadata={**self.metadata, **inner.metadata},
        )


def qualname(obj_or_type: Any) -> str:
    t = obj_or_type if isinstance(obj_or_type, type) else type(obj_or_type)
    return f"{t.__module__}.{t.__qualname__}"


def _array_like(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _rank(x: Any) -> int:
    return len(getattr(x, "shape", ()))


class Box:
    """One family of boxes: ``matches(obj)``; ``fields(obj)``, its ``[(name,
    child)]``; ``extras(obj)``, the :class:`Extras` it adds to the leaf below;
    ``known_types()``, ``{type_name: class}`` for rebuilding without a
    template; ``rebuild(cls, children, meta)``, an instance of ``cls`` from
    the rebuilt children (by name) and the first leaf's info dict; and
    ``rebuild_like(like, children)``, ``like`` with its children replaced
    (None: the generic jax unflatten)."""

    family = ""  # top-level package the classes come from

    def rebuild_like(self, like: Any, children: List[Any]) -> Any:
        return None


# ---- Flax linen: Partitioned / LogicallyPartitioned ---------------------------


class FlaxPartitionedBox(Box):
    family = "flax"

    def _types(self):
        meta = sys.modules.get("flax.core.meta")
        if meta is None:
            return None, None
        spmd = sys.modules.get("flax.linen.spmd")
        return meta.Partitioned, getattr(spmd, "LogicallyPartitioned", None)

    def matches(self, obj):
        part, _ = self._types()
        return part is not None and isinstance(obj, part) and _array_like(obj.value)

    def fields(self, obj):
        return [("value", obj.value)]

    def extras(self, obj):
        _, logical = self._types()
        ex = Extras()
        names = tuple(obj.names) if obj.names is not None else None
        if names is not None and _static.encodable(names):
            ex.metadata[FLAX_NAMES] = _static.encode(names)
        mesh = J.mesh_to_lists(getattr(obj, "mesh", None))
        if mesh is not None:
            ex.mesh = mesh
            ex.metadata[FLAX_MESH] = _static.encode([mesh[0], mesh[1]])
        rank = _rank(obj.value)
        is_logical = logical is not None and isinstance(obj, logical)
        if names is not None and len(names) == rank:
            if is_logical:
                if all(n is None or isinstance(n, str) for n in names):
                    ex.logical_axes = ["" if n is None else n for n in names]
                rules = getattr(obj, "rules", None)
                if rules is not None and _static.encodable(tuple(rules)):
                    ex.metadata[FLAX_RULES] = _static.encode(tuple(rules))
            else:
                ex.spec = J.spec_to_lists(names)
        return ex

    def known_types(self):
        part, logical = self._types()
        if part is None:
            try:
                importlib.import_module("flax.core.meta")
                importlib.import_module("flax.linen.spmd")
            except ImportError:
                return {}
            part, logical = self._types()
        out = {qualname(part): part}
        if logical is not None:
            out[qualname(logical)] = logical
        return out

    def rebuild(self, cls, children, meta):
        md = meta.get("metadata", {})
        names = _static.decode(md[FLAX_NAMES]) if FLAX_NAMES in md else None
        mesh = J.abstract_mesh(*_static.decode(md[FLAX_MESH])) if FLAX_MESH in md else None
        kwargs = dict(value=children["value"], names=names, mesh=mesh)
        if FLAX_RULES in md:
            kwargs["rules"] = _static.decode(md[FLAX_RULES])
        return cls(**kwargs)


# ---- Flax NNX: Variable (Param, BatchStat, ...) -------------------------------


class NnxVariableBox(Box):
    family = "flax"

    _SHARDING_KEYS = ("out_sharding", "sharding_names", "sharding")

    def matches(self, obj):
        base = getattr(sys.modules.get("flax.nnx.variablelib"), "Variable", None)
        return base is not None and isinstance(obj, base)

    def fields(self, obj):
        return [("value", obj.get_raw_value())]

    def extras(self, obj):
        ex = Extras()
        md = dict(obj.get_metadata())
        keep = {k: v for k, v in md.items() if k != "mesh" and _static.encodable(v)}
        ex.metadata[NNX_METADATA] = _static.encode(keep)
        value = obj.get_raw_value()
        for key in self._SHARDING_KEYS:
            names = md.get(key)
            if names is not None and isinstance(names, (tuple, list)) and len(names) == _rank(value):
                ex.spec = J.spec_to_lists(tuple(names))
                break
        mesh = J.mesh_to_lists(md.get("mesh"))
        if mesh is not None:
            ex.mesh = mesh
        return ex

    def known_types(self):
        try:
            from flax import nnx
            from flax.nnx import variablelib
        except ImportError:
            return {}
        return {qualname(v): v for mod in (nnx, variablelib) for v in vars(mod).values()
                if isinstance(v, type) and issubclass(v, variablelib.Variable)}

    def rebuild(self, cls, children, meta):
        md = meta.get("metadata", {})
        attrs = {"mesh": None, "hijax": False, "ref": False, "eager_sharding": False,
                 **(_static.decode(md[NNX_METADATA]) if NNX_METADATA in md else {})}
        return cls.from_metadata(children["value"], attrs)


# ---- Penzai: NamedArray / NamedArrayView / Parameter ---------------------------


class _PenzaiNamedBox(Box):
    """A Penzai named-axes array class (``_name``) and the mapping of its axis
    names (``_axes``), which must all be str to be boxed."""

    family = "penzai"
    _name = _axes = ""

    def matches(self, obj):
        na = sys.modules.get("penzai.core.named_axes")
        return (na is not None and isinstance(obj, getattr(na, self._name)) and _array_like(obj.data_array)
                and all(isinstance(n, str) for n in getattr(obj, self._axes)))

    def fields(self, obj):
        return [("data_array", obj.data_array)]

    def known_types(self):
        try:
            from penzai.core import named_axes as na
        except ImportError:
            return {}
        cls = getattr(na, self._name)
        return {qualname(cls): cls}


class PenzaiNamedArrayBox(_PenzaiNamedBox):
    _name, _axes = "NamedArray", "named_axes"

    def extras(self, obj):
        names = list(obj.named_axes.keys())
        npos = _rank(obj.data_array) - len(names)
        ex = Extras(logical_axes=[""] * npos + names)
        ex.metadata[PZ_POSITIONAL] = str(npos)
        ex.metadata[PZ_NAMES] = _static.encode(names)
        return ex

    def rebuild(self, cls, children, meta):
        md = meta.get("metadata", {})
        data = children["data_array"]
        shape = tuple(meta["shape"])
        names = list(_static.decode(md[PZ_NAMES])) if PZ_NAMES in md else [n for n in meta.get("logical_axes", ()) if n]
        npos = int(md.get(PZ_POSITIONAL, len(shape) - len(names)))
        named = collections.OrderedDict(zip(names, shape[npos:]))
        return cls(named_axes=named, data_array=data)


class PenzaiNamedArrayViewBox(_PenzaiNamedBox):
    _name, _axes = "NamedArrayView", "data_axis_for_name"

    def extras(self, obj):
        rank = len(obj.data_shape)
        axes = [""] * rank
        for name, ax in obj.data_axis_for_name.items():
            axes[ax] = name
        ex = Extras(logical_axes=axes)
        ex.metadata[PZ_LOGICAL] = _static.encode([int(a) for a in obj.data_axis_for_logical_axis])
        ex.metadata[PZ_BY_NAME] = _static.encode([[n, int(a)] for n, a in obj.data_axis_for_name.items()])
        return ex

    def rebuild(self, cls, children, meta):
        md = meta.get("metadata", {})
        logical = tuple(_static.decode(md[PZ_LOGICAL])) if PZ_LOGICAL in md else ()
        by_name = {n: a for n, a in _static.decode(md[PZ_BY_NAME])} if PZ_BY_NAME in md else {}
        return cls(data_shape=tuple(meta["shape"]), data_axis_for_logical_axis=logical, data_axis_for_name=by_name,
                   data_array=children["data_array"])


class PenzaiVariableBox(Box):
    """pz.Parameter / pz.StateVariable (mutable, not pytrees) and their frozen
    ParameterValue / StateVariableValue counterparts."""

    family = "penzai"

    _NAMES = ("Parameter", "ParameterValue", "StateVariable", "StateVariableValue")

    def _classes(self):
        v = sys.modules.get("penzai.core.variables")
        return () if v is None else tuple(getattr(v, n) for n in self._NAMES if hasattr(v, n))

    def matches(self, obj):
        classes = self._classes()
        return bool(classes) and isinstance(obj, classes)

    def fields(self, obj):
        return [("value", obj.value)]

    def extras(self, obj):
        ex = Extras()
        label = getattr(obj, "label", None)
        if isinstance(label, str):
            ex.metadata[PZ_LABEL] = label
        md = getattr(obj, "metadata", None)
        if md and _static.encodable(dict(md)):
            ex.metadata[PZ_METADATA] = _static.encode(dict(md))
        return ex

    def known_types(self):
        try:
            importlib.import_module("penzai.core.variables")
        except ImportError:
            return {}
        return {qualname(c): c for c in self._classes()}

    def rebuild(self, cls, children, meta):
        md = meta.get("metadata", {})
        label = md.get(PZ_LABEL)
        metadata = _static.decode(md[PZ_METADATA]) if PZ_METADATA in md else {}
        if cls.__name__ == "StateVariable":
            return cls(children["value"], label=label, metadata=metadata)
        return cls(label=label, value=children["value"], metadata=metadata)

    def rebuild_like(self, like, children):
        value = children[0]
        name = type(like).__name__
        if name == "Parameter":
            return type(like)(label=like.label, value=value, metadata=dict(like.metadata))
        if name == "StateVariable":
            return type(like)(value, label=like.label, metadata=dict(like.metadata))
        return None  # frozen values are pytrees: generic unflatten


BOXES: Tuple[Box, ...] = (
    FlaxPartitionedBox(),
    NnxVariableBox(),
    PenzaiNamedArrayBox(),
    PenzaiNamedArrayViewBox(),
    PenzaiVariableBox(),
)


def match(obj: Any) -> Optional[Box]:
    """The box family of `obj`, or None (cheap unless flax/penzai are imported)."""
    if "flax" not in sys.modules and "penzai" not in sys.modules:
        return None
    return next((b for b in BOXES if b.matches(obj)), None)


@functools.lru_cache(maxsize=None)  # one table per box family: the installed classes are walked once
def _known_types(i: int) -> Dict[str, type]:
    return BOXES[i].known_types()


def known(type_name: str) -> Optional[Tuple[Box, type]]:
    """(box, class) for a type name written in a file, from built-in knowledge
    only: the classes of the installed Flax / Penzai, never an import of a name
    taken from the file."""
    if not (type_name.startswith("flax.") or type_name.startswith("penzai.")):
        return None
    for i, b in enumerate(BOXES):
        cls = _known_types(i).get(type_name) if type_name.startswith(b.family + ".") else None
        if cls is not None:
            return b, cls
    return None
