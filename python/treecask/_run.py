"""A run's listing: which steps a checkpoint directory holds, in either step
layout (:data:`ARCHIVES`, :data:`ITEM_DIRECTORIES`; format/SPEC.md
"Checkpoint directories"), from one listing of the directory's store; the
listing is the only record of which steps exist. :class:`treecask.CheckpointManager`
lists and sweeps through :class:`Run`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Dict, List, Optional, Sequence

from . import stores
from .errors import UnsupportedError
from .interop import orbax as _orbax


@dataclasses.dataclass(frozen=True)
class StepLayout:
    """How a run's directory names and holds its steps (format/SPEC.md
    "Checkpoint directories"): one of :data:`ARCHIVES` and
    :data:`ITEM_DIRECTORIES`, chosen by whoever makes the
    :class:`treecask.CheckpointManager` (``step_layout=``).

    Attributes:
      name: the layout's name, for messages.
      pattern: an entry naming a step (group 1: the step's decimal digits).
      canonical: ``str.format`` pattern of a new step's entry name.
      index: "" when the entry is the step's archive, else the name of the
        object under the entry that commits it and holds the step's own
        metadata (step, metrics): :data:`treecask.stores.COMMIT_OBJECT`.
    """

    name: str
    pattern: "re.Pattern[str]"
    canonical: str
    index: str

    def step_name(self, step: int) -> str:
        """The entry name of a new step ``step``."""
        return self.canonical.format(step)


#: One archive per step, ``step_<step:08d>.cask``: :class:`treecask.CheckpointManager`'s.
ARCHIVES = StepLayout("archives", re.compile(r"step_([0-9]+)\.cask"), "step_{:08d}.cask", "")
#: One directory per step, ``<step>/``, as Orbax's managers write their steps
#: (SPEC.md "Item-directory steps"); what ``treecask.orbax``'s managers pass.
ITEM_DIRECTORIES = StepLayout("item directories", re.compile(r"([0-9]+)"), "{}", stores.COMMIT_OBJECT)

# Temporaries of an entry, "<name>.tmp.<host>.<pid>.<hex16>" (SPEC.md "Atomic
# commit": a save in progress, a step directory being deleted); which are stale
# is the core's rule (treecask::is_stale_temporary).
_TMP_RE = re.compile(r"(.+?)\.tmp\..+")


def step_name(step: int) -> str:
    """The entry name of a step in the :data:`ARCHIVES` layout: ``step_`` +
    the step zero-padded to at least 8 digits + ``.cask``."""
    return ARCHIVES.step_name(step)


def committed(store: stores.Store, path: str, names: Sequence[str]) -> bool:
    """Whether ``names`` (a listing of ``path``, :meth:`Store.list_prefix`)
    holds a committed checkpoint at ``path``: the object itself, a
    "directory" whose commit object (:data:`treecask.stores.COMMIT_OBJECT`)
    exists, or any file under ``path/`` where the store publishes directories
    atomically (SPEC.md "Checkpoint directories")."""
    head = path + "/"
    return any(n == path or n == head + stores.COMMIT_OBJECT or store.supports_atomic_directories and n.startswith(head)
               for n in names)


class Run:
    """A run's directory in a store. In the :data:`ARCHIVES` layout (the
    default) its entries are the step archives ``step_<n>.cask`` (an object;
    a multi-process step the "directory" ``step_<n>.cask/``, which exists
    once its commit object ``index.cask`` does, or at once where the store
    publishes directories atomically); in the :data:`ITEM_DIRECTORIES`
    layout the step directories ``<n>/``, each existing once its
    ``<n>/index.cask`` does; their temporaries, and nothing else of
    treecask's."""

    def __init__(self, store: stores.Store, path: str, layout: StepLayout = ARCHIVES):
        self.store, self.path, self.layout = store, path.rstrip("/") or path, layout

    def index(self, name: str) -> str:
        """The store path of the archive holding entry ``name``'s own metadata
        (step, metrics): the entry itself, or its commit object."""
        return stores.join(self.entry(name), self.layout.index) if self.layout.index else self.entry(name)

    def entry(self, name: str) -> str:
        """The store path of entry ``name``."""
        return stores.join(self.path, name)

    def names(self) -> List[str]:
        """Every object under the directory, relative to it (one listing)."""
        prefix = self.path + "/" if self.path else ""
        return [k[len(prefix):] for k in self.store.list_prefix(prefix)]

    def steps(self, names: Optional[List[str]] = None) -> Dict[int, str]:
        """``{step: entry name}`` of the committed steps: ``step_<decimal
        digits>.cask`` (any number of digits; of two spellings of one step,
        step_5.cask and step_00000005.cask, the canonical one wins), or in
        the :data:`ITEM_DIRECTORIES` layout ``<decimal digits>/`` holding
        ``index.cask``. Temporaries are never listed."""
        out: Dict[int, str] = {}
        index = self.layout.index
        for name in self.names() if names is None else names:
            entry, _, rest = name.partition("/")
            m = self.layout.pattern.fullmatch(entry)
            if m is None:
                continue
            if index and rest != index or not index and not committed(self.store, entry, [name]):
                continue
            step = int(m.group(1))
            if step not in out or entry == self.layout.step_name(step):
                out[step] = entry
        return out

    def refuse_foreign(self, directory: str) -> None:
        """Raises UnsupportedError (:func:`refuse_orbax_run`) when the directory
        holds Orbax step directories (orbax-checkpoint's ``4/``, ``step_4/``;
        Flax's ``checkpoint_<N>/``: entries named like a step holding one of
        Orbax's marker files, ``_CHECKPOINT_METADATA``, ``_METADATA``,
        ``manifest.ocdbt``, ``checkpoint``: the importer's rule,
        ``treecask.import_orbax``), or committed steps of the other layout
        (:data:`ARCHIVES` <-> :data:`ITEM_DIRECTORIES`), which this run would
        not list and would start again beside; the message names the steps
        and which manager reads them. One listing."""
        names = self.names()
        found, ours = set(), set()
        for name in names:
            entry, _, rest = name.partition("/")
            if rest == stores.COMMIT_OBJECT:
                ours.add(entry)  # a step of treecask's (an item named like a marker is no Orbax file)
            elif rest and _orbax.is_step_name(entry) and rest.rsplit("/", 1)[-1] in _orbax.STEP_MARKERS:
                found.add(entry)
        refuse_orbax_run(directory, sorted(found - ours))
        other = Run(self.store, self.path, ITEM_DIRECTORIES if self.layout is ARCHIVES else ARCHIVES).steps(names)
        if not other:
            return
        how = ("it is a run of treecask.orbax's managers (Orbax's <step>/ directories of items): open it with "
               "treecask.orbax.CheckpointManager or treecask.orbax.v1.training.Checkpointer" if self.layout is ARCHIVES
               else "it is a run of treecask.CheckpointManager (step_<N:08d>.cask archives): open it with "
               "treecask.CheckpointManager; one step reads with treecask.orbax.Checkpointer().restore(path) "
               "or treecask.load(path)")
        raise UnsupportedError(f"this directory holds {len(other)} step{'' if len(other) == 1 else 's'} of another "
                               f"layout ({_listed([other[s] for s in sorted(other)])}): {how}", file=directory)

    def sweep(self) -> None:
        """Removes the temporaries of crashed saves of any step here
        (``<entry>.tmp.<host>.<pid>.<hex>`` of a step entry, of this host whose process
        no longer exists): the core's rule of SPEC.md "Atomic commit"
        (``treecask::is_stale_temporary``), applied by the store
        (:meth:`treecask.stores.Store.remove_stale`) to every step that has a
        temporary."""
        temps: Dict[str, List[str]] = {}
        for name in self.names():
            m = _TMP_RE.fullmatch(name.partition("/")[0])
            if m is not None and self.layout.pattern.fullmatch(m.group(1)):
                temps.setdefault(m.group(1), []).append(self.entry(name))
        for step, found in sorted(temps.items()):
            self.store.remove_stale(self.entry(step), found)


def _listed(found: List[str]) -> str:
    return ", ".join(found[:5]) + (", ..." if len(found) > 5 else "")


def refuse_orbax_run(directory: str, found: List[str]) -> None:
    """Raises UnsupportedError when ``found`` (Orbax step directories in a
    manager's directory) is not empty: a treecask manager there would list
    no step and start the run again from scratch beside them (issue #31).
    The message names the steps and the converter."""
    if found:
        raise UnsupportedError(
            f"this directory holds an Orbax run ({len(found)} step director{'y' if len(found) == 1 else 'ies'}: "
            f"{_listed(found)}), which treecask does not read in place: convert each step once with "
            f"treecask.import_orbax(src, dst) (or `treecask import-orbax SRC DST`) into a treecask "
            f"CheckpointManager directory of its own, e.g. dst = <new directory>/step_<N:08d>.cask",
            file=directory)
