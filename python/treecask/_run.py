"""A run's listing: which steps a checkpoint directory holds.

One archive per step, ``<directory>/step_<step>.cask`` (format/SPEC.md
"Checkpoint directories"): the listing is the only record of which steps
exist (no index file that could disagree with it). A step appears by the
atomic commit of ``treecask.save`` (SPEC.md "Atomic commit"), so any process
listing the directory sees only complete steps. Everything here goes through
the directory's store (``treecask.stores``); every question is answered from
one listing. :class:`treecask.CheckpointManager` lists, sweeps and deletes
through :class:`Run`.
"""

from __future__ import annotations

import os
import pathlib
import re
from typing import Any, Dict, List, Optional, Sequence

from . import stores
from .errors import UnsupportedError
from .interop import orbax as _orbax

_STEP_RE = re.compile(r"step_([0-9]+)\.cask")
# Temporaries of a step, "<name>.tmp.<host>.<pid>.<hex16>" (SPEC.md "Atomic
# commit": a save in progress, a step directory being deleted); which are stale
# is the core's rule (treecask::is_stale_temporary).
_TMP_RE = re.compile(r"(step_[0-9]+\.cask)\.tmp\..+")


def step_name(step: int) -> str:
    """The entry name of a step: ``step_`` + the step zero-padded to at least 8 digits + ``.cask``."""
    return f"step_{step:08d}.cask"


def committed(store: stores.Store, path: str, names: Sequence[str]) -> bool:
    """Whether ``names`` (a listing of ``path``, :meth:`Store.list_prefix`)
    holds a committed checkpoint at ``path``: the object itself, a
    "directory" whose commit object (:data:`treecask.stores.COMMIT_OBJECT`)
    exists, or any file under ``path/`` where the store publishes directories
    atomically (SPEC.md "Checkpoint directories")."""
    head = path + "/"
    for n in names:
        if n == path or n == head + stores.COMMIT_OBJECT:
            return True
        if store.supports_atomic_directories and n.startswith(head):
            return True
    return False


def shown(store: stores.Store, path: str) -> Any:
    """What users are shown of ``path`` and may pass back to ``treecask.open``:
    a ``pathlib.Path`` in a store of local files, else the store's display
    name (a URL with its secrets redacted)."""
    local = store.local_path(path)  # the one question of the manager that is not the store seam's yet
    return pathlib.Path(local) if local is not None else store.display(path)


def make_directory(store: stores.Store, path: str) -> None:
    """Creates the directory ``path`` and its parents in a store of local
    files (the core's commit renames into an existing directory); nothing in
    an object store, where a prefix needs no creation."""
    local = store.local_path(path)
    if local is not None and local:
        os.makedirs(local, exist_ok=True)


class Run:
    """A run's directory in a store: its entries are the step archives
    ``step_<n>.cask`` (an object; a multi-process step the "directory"
    ``step_<n>.cask/``, which exists once its commit object ``index.cask``
    does, or at once where the store publishes directories atomically),
    their temporaries, and nothing else of treecask's."""

    def __init__(self, store: stores.Store, path: str):
        self.store = store
        self.path = path.rstrip("/") or path

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
        step_5.cask and step_00000005.cask, the canonical one wins).
        Temporaries are never listed."""
        out: Dict[int, str] = {}
        for name in self.names() if names is None else names:
            entry, _, rest = name.partition("/")
            m = _STEP_RE.fullmatch(entry)
            if m is None or not committed(self.store, entry, [name]):
                continue
            step = int(m.group(1))
            if step not in out or entry == step_name(step):
                out[step] = entry
        return out

    def orbax_steps(self, names: Optional[List[str]] = None) -> List[str]:
        """The Orbax step directories here (a run of orbax-checkpoint's
        manager: ``4/``, ``step_4/``; Flax's ``checkpoint_<N>/``): entries
        named like a step that hold one of Orbax's marker files
        (``_CHECKPOINT_METADATA``, ``_METADATA``, ``manifest.ocdbt``,
        ``checkpoint``; the importer's rule, ``treecask.import_orbax``)."""
        found = set()
        for name in self.names() if names is None else names:
            entry, _, rest = name.partition("/")
            if rest and _orbax.is_step_name(entry) and rest.rsplit("/", 1)[-1] in _orbax.STEP_MARKERS:
                found.add(entry)
        return sorted(found)

    def sweep(self, names: Optional[List[str]] = None) -> None:
        """Removes the temporaries of crashed saves of any step here
        (``step_<n>.cask.tmp.<host>.<pid>.<hex>`` of this host whose process
        no longer exists): the core's rule of SPEC.md "Atomic commit"
        (``treecask::is_stale_temporary``), applied by the store
        (:meth:`treecask.stores.Store.remove_stale`) to every step that has a
        temporary."""
        names = self.names() if names is None else names
        temps: Dict[str, List[str]] = {}
        for name in names:
            m = _TMP_RE.fullmatch(name.partition("/")[0])
            if m is not None:
                temps.setdefault(m.group(1), []).append(self.entry(name))
        for step, found in sorted(temps.items()):
            self.store.remove_stale(self.entry(step), found)

    def remove(self, name: str) -> None:
        """Deletes entry ``name`` so that it leaves every listing at once
        (:meth:`treecask.stores.Store.delete_tree`)."""
        self.store.delete_tree(self.entry(name))


def refuse_orbax_run(directory: str, found: List[str]) -> None:
    """Raises UnsupportedError when ``found`` (Orbax step directories in a
    manager's directory) is not empty: a treecask manager there would list
    no step and start the run again from scratch beside them (issue #31).
    The message names the steps and the converter."""
    if found:
        listed = ", ".join(found[:5]) + (", ..." if len(found) > 5 else "")
        raise UnsupportedError(
            f"this directory holds an Orbax run ({len(found)} step director{'y' if len(found) == 1 else 'ies'}: "
            f"{listed}), which treecask does not read in place: convert each step once with "
            f"treecask.import_orbax(src, dst) (or `treecask import-orbax SRC DST`) into a treecask "
            f"CheckpointManager directory of its own, e.g. dst = <new directory>/step_<N:08d>.cask",
            file=directory)
