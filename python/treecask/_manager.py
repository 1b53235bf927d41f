"""CheckpointManager: a directory of step archives for a training loop
(format/SPEC.md "Checkpoint directories"), composed of three parts with one
job each: the run's listing (``_run.py``), retention (``_retention.py``) and
the asynchronous save (``_async.py``). The public calls follow
orbax-checkpoint's ``CheckpointManager`` where it has them; ``path``,
``location``, ``in_flight``, ``step_infos`` and ``steps_to_delete`` are
treecask's, for code built on the manager (``treecask.orbax`` uses only these).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import operator
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import treecask._core as _core

from . import _signing, stores
from ._async import SaveJob, processes, save_async
from ._async import reached_preemption as _reached_preemption
from ._open import load
from ._open import open as open_archive
from ._retention import Retention
from ._run import ARCHIVES, Run, StepLayout, refuse_orbax_run, step_name
from ._request import metadata_items
from ._save import save
from ._types import PathLike
from .errors import AlreadyExistsError, Error, InvalidArgumentError, NotFoundError, UnsupportedError, _with_file

__all__ = ["CheckpointManager", "StepInfo", "STEP_KEY", "METRICS_KEY", "step_name", "refuse_orbax_run"]

#: The name of a step's signature beside it (``sign_with``): ``step_<n:08d>.cask.sig``,
#: what ``treecask sign`` and :func:`treecask.sign` write by default.
_SIGNATURE_SUFFIX = ".sig"

#: Archive metadata keys the manager writes into every step (SPEC.md "Checkpoint directories").
STEP_KEY = "treecask.step"
METRICS_KEY = "treecask.metrics"

_SAVE_OPTIONS = frozenset({"compression", "shuffle", "durable", "chunk_size", "metadata", "threads",
                           "max_part_bytes"})


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """One step of a run (:meth:`CheckpointManager.step_infos`,
    :meth:`CheckpointManager.in_flight`; what ``keep_fn`` is given).

    Attributes:
      step: the step (int >= 0).
      path: where it is, as :meth:`CheckpointManager.path` shows it (a
        ``pathlib.Path`` in a local directory, else the URL, redacted).
      metrics: the metrics saved with it (JSON-decoded), or None.
      commit_time_ns: when it was committed, in ns since the Unix epoch (the
        local file's modification time), or None where the store does not say
        (an object store) or the step is still being saved.
    """

    step: int
    path: Any
    metrics: Optional[Any]
    commit_time_ns: Optional[int]


def _json_default(x: Any) -> Any:
    if hasattr(x, "tolist"):  # NumPy / jax arrays and scalars (a 0-d one: its Python scalar)
        return x.tolist()
    raise TypeError(f"{type(x).__name__} is not JSON-serialisable")


class CheckpointManager:
    """Saves, lists, retains and restores the steps of a training run in one directory.

    Args:
      directory: the directory of step archives (created if missing), or the
        URL of a prefix in an object store (``s3://bucket/run``, ``gs://``,
        ``az://``), where each step is committed as ``treecask.save`` commits
        to a store (docs/remote.md "Saving to object stores").
      max_to_keep: how many steps retention keeps (>= 1), or None (default): keep all.
        Without ``best_fn`` the newest ``max_to_keep``; with it the ``max_to_keep``
        best by ``best_fn`` plus the newest (so a preempted job can resume;
        ``keep_newest=False``: exactly the ``max_to_keep`` best, as Orbax).
        Steps saved without metrics are never deleted by the best-N rule (Orbax's
        ``keep_checkpoints_without_metrics=True``).
      keep_period: steps with ``step % keep_period == 0`` are never deleted.
      best_fn: ``metrics -> float``, the score of a step (``metrics`` as saved,
        after a JSON round trip).
      best_mode: "max" (default: a higher score is better) or "min".
      keep_newest: default True (see ``max_to_keep``); False: only the
        ``max_to_keep`` best, so a worse step just saved is deleted at once.
      save_interval_steps: :meth:`save` writes only steps that are a multiple of
        it (unless ``force``); default 1.
      async_save: default True: :meth:`save` returns once the tree's bytes are
        safe from the caller (``treecask._async.save_async``); the write,
        commit and retention run on a background thread (in a multi-process
        jax job every process calls :meth:`save` for the same steps in the
        same order, as for ``treecask.save``).
      keep_snapshot_memory: default False. True keeps the snapshot buffer
        between asynchronous saves (``treecask::SnapshotPool``): NumPy leaves
        are copied into memory already faulted in (docs/performance.md), at
        the price of about those leaves' bytes held until :meth:`close`.
      read_only: default False. True: the manager only lists and restores
        (Orbax's ``read_only``): the directory is not created, :meth:`save`
        and :meth:`delete` raise InvalidArgumentError, nothing is swept.
      keep_fn: retention by a rule of the caller's instead of ``max_to_keep``
        / ``keep_period`` (which must then be None): after each step is
        durable, ``keep_fn(infos)`` gets a :class:`StepInfo` per step
        (ascending) and returns as many bools; the steps given False are
        deleted (what Orbax's preservation policies plug into; a wrong count
        of flags is the save's InvalidArgumentError).
      storage_options: for a URL, the store's configuration (obstore config
        keys) overriding the environment's, as :func:`treecask.open`.
      step_layout: how steps are named and held (``treecask._run.StepLayout``):
        ``ARCHIVES`` (default), one archive ``step_<n:08d>.cask`` per step;
        ``ITEM_DIRECTORIES``, Orbax's layout that ``treecask.orbax``'s
        managers pass: one directory ``<n>/`` per step, one archive per item
        and ``index.cask`` (format/SPEC.md "Checkpoint directories"); then
        :meth:`save` takes ``{item name: (pytree, archive metadata)}`` and
        :meth:`restore` returns ``{item name: pytree}``.
      sign_with: an unencrypted PEM EC private key (P-256, P-384 or P-521;
        its file's path or its bytes): each step is signed right after its
        commit (``step_<n:08d>.cask.sig`` beside it, :func:`treecask.sign`),
        :meth:`restore` verifies against it and :meth:`delete` / retention
        remove it with the step (docs/signing.md). A local directory, one
        process, the ``ARCHIVES`` layout.
      **save_options: passed to :func:`treecask.save` for every step:
        ``compression``, ``shuffle``, ``durable``, ``chunk_size``, ``threads``,
        ``max_part_bytes``, ``metadata`` (the keys ``treecask.step`` and
        ``treecask.metrics`` are the manager's).

    Retention runs after a new step is durable and only then; in a
    multi-process jax job (``jax.process_count() > 1``) only process 0 deletes.

    Raises:
      InvalidArgumentError: a bad option (the message names it).
      UnsupportedError: ``directory`` holds an Orbax run (step directories
        ``<N>/`` of orbax-checkpoint's manager, or Flax's ``checkpoint_<N>``):
        never ignored, convert it with :func:`treecask.import_orbax`; steps
        of the other ``step_layout`` (the message names the manager that
        reads them); a
        read-only store (``http(s)://``) or a URL scheme treecask does not serve;
        ``sign_with`` with an object store or the ``ITEM_DIRECTORIES`` layout,
        or a key that is not EC on a curve model_signing takes.
    """

    def __init__(self, directory: PathLike = "", *, max_to_keep: Optional[int] = None,
                 keep_period: Optional[int] = None, best_fn: Optional[Callable[[Any], float]] = None,
                 best_mode: str = "max", keep_newest: bool = True, save_interval_steps: int = 1,
                 async_save: bool = True, keep_snapshot_memory: bool = False, read_only: bool = False,
                 keep_fn: Optional[Callable[[List[StepInfo]], Sequence[bool]]] = None,
                 storage_options: Optional[Mapping[str, Any]] = None,
                 store: Optional[stores.Store] = None, step_layout: StepLayout = ARCHIVES,
                 sign_with: Optional[_signing.KeySource] = None, **save_options: Any):
        # (a URL names an object store, never a local directory "s3:/bucket/run"; a read-only
        # store, http(s)://, refuses the listing below)
        st, path = stores.resolve(directory, store, storage_options)
        self._run = Run(st, path, step_layout)
        self.directory: Any = st.shown(self._run.path)
        d = str(self.directory)
        for name, v, none in (("max_to_keep", max_to_keep, "None or "), ("keep_period", keep_period, "None or "),
                              ("save_interval_steps", save_interval_steps, "")):
            if (v is not None or not none) and (not _is_int(v) or v < 1):
                raise InvalidArgumentError(f"{name} must be {none}an int >= 1, got {v!r}", file=d)
        if best_mode not in ("max", "min"):
            raise InvalidArgumentError(f"best_mode must be 'max' or 'min', got {best_mode!r}", file=d)
        if best_fn is not None and not callable(best_fn):
            raise InvalidArgumentError("best_fn must be callable", file=d)
        if keep_fn is not None and (not callable(keep_fn) or max_to_keep is not None or keep_period is not None):
            raise InvalidArgumentError("keep_fn must be callable and replaces max_to_keep and keep_period "
                                       "(leave them None)", file=d)
        unknown = sorted(set(save_options) - _SAVE_OPTIONS)
        if unknown:
            why = ("a step is never overwritten" if unknown == ["overwrite"]
                   else f"the save options are {sorted(_SAVE_OPTIONS)}")
            raise InvalidArgumentError(f"unknown save option(s) {unknown}: {why}", file=d)
        # (the private key PEM, its public key PEM) of sign_with, checked now
        self._signer: Optional[Tuple[str, str]] = None
        if sign_with is not None:
            if not st.signs_in_place() or step_layout is not ARCHIVES:
                raise UnsupportedError("sign_with signs step archives in a local directory (the bundle hashes "
                                       "the file): sign before uploading, or verify a store's steps with "
                                       "restore(signature=, public_key=)", file=d)
            pem = _signing.read_pem(sign_with, "sign_with")
            try:
                self._signer = (pem, _core.public_key_of(pem))
            except Error as e:  # a key it cannot sign with, named, for this run
                raise _with_file(e, d) from None
        self._retention = Retention(max_to_keep=max_to_keep, keep_period=keep_period, best_fn=best_fn,
                                    best_mode=best_mode, keep_newest=bool(keep_newest), keep_fn=keep_fn)
        self.save_interval_steps = int(save_interval_steps)
        self.async_save = bool(async_save)
        self.read_only = bool(read_only)
        self._pool = _core.SnapshotPool() if keep_snapshot_memory else None
        self._metadata = dict(_check_metadata(save_options.pop("metadata", None), d))
        self._save_options = save_options
        self._job: Optional[SaveJob] = None
        self._closed = False
        # entry name -> (Store.stamp, metrics): step archives are immutable,
        # a local step deleted and written again gets a new inode.
        self._metrics_cache: Dict[str, Tuple[Any, Any]] = {}
        self._run.refuse_foreign(d)
        if not self.read_only:
            st.make_directory(self._run.path)

    # the retention options, as given (read by code built on the manager)
    max_to_keep = property(lambda self: self._retention.max_to_keep, doc="``max_to_keep`` as given.")
    keep_period = property(lambda self: self._retention.keep_period, doc="``keep_period`` as given.")
    best_fn = property(lambda self: self._retention.best_fn, doc="``best_fn`` as given.")
    best_mode = property(lambda self: self._retention.best_mode, doc="``best_mode`` as given.")
    keep_newest = property(lambda self: self._retention.keep_newest, doc="``keep_newest`` as given.")

    # ---- context manager ----
    def __enter__(self) -> "CheckpointManager":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()  # a save error raised here chains the body's exception, if any

    def __repr__(self) -> str:
        return f"<treecask.CheckpointManager {_core.redact_url(str(self.directory))!r}>"

    # ---- naming ----
    store = property(lambda self: self._run.store, doc="The :class:`treecask.stores.Store` the steps are in.")

    def path(self, step: int) -> Any:
        """The path of ``step``: its existing entry if the directory has one
        (whatever its digit count), else ``<directory>/step_<step:08d>.cask``
        (a ``pathlib.Path``; for a manager on a bucket, the URL as a str,
        secrets redacted). Lists the directory once. Treat it as opaque: a
        file today, a directory for a multi-process step.
        Raises InvalidArgumentError for a bad step."""
        return self._run.store.shown(self.location(step)[1])

    def location(self, step: int) -> Tuple[stores.Store, str]:
        """``(store, path inside it)`` of ``step``, as :meth:`path` chooses
        the entry: what ``treecask.open(path, store=store)`` /
        ``treecask.load(path, store=store)`` read, with no re-parsing of a
        URL (``treecask.stores.resolve``'s pair). Does not check that the
        step exists. Raises InvalidArgumentError for a bad step."""
        step = _check_step(step, str(self.directory))  # its entry, whatever its digit count, else the canonical one
        return self._run.store, self._run.entry(self._run.steps().get(step, self._run.layout.step_name(step)))

    def should_save(self, step: int) -> bool:
        """Whether :meth:`save` writes ``step``: it is a multiple of
        ``save_interval_steps``. Never blocks, never lists the directory.
        (Orbax's ``should_save`` also refuses a step at or below the latest:
        ``treecask.orbax.CheckpointManager`` adds that rule.)"""
        return _check_step(step, str(self.directory)) % self.save_interval_steps == 0

    def reached_preemption(self, step: int) -> bool:
        """Whether every process of a ``jax.distributed`` job has reached the
        preemption sync point ``step`` (jax's ``reached_preemption_sync_point``,
        as Orbax's): False without jax, outside a distributed job, or with
        jax's preemption service off. Call it at every step in every process."""
        return _reached_preemption(_check_step(step, str(self.directory)))

    # ---- listing (the directory is the source of truth) ----
    def all_steps(self) -> List[int]:
        """Steps in the directory, ascending (one listing). A step being saved
        asynchronously appears once it is committed (:meth:`in_flight` names
        it until then; :meth:`wait_until_finished` first to include it)."""
        return sorted(self._run.steps())

    def latest_step(self) -> Optional[int]:
        """The highest step in the directory, or None (one listing)."""
        return max(self._run.steps(), default=None)

    def metrics(self, step: int) -> Optional[Any]:
        """The metrics saved with ``step`` (JSON-decoded), or None if it was
        saved without. Read from the step's archive metadata (cached per
        writing of the step). Raises NotFoundError when the step does not
        exist (names the file), InvalidArgumentError for a bad step."""
        return self._metrics_of(self._listed(step))

    def _listed(self, step: Any) -> str:
        """The entry name of the committed step ``step``; NotFoundError naming its file when there is none."""
        step = _check_step(step, str(self.directory))
        name = self._run.steps().get(step)
        if name is None:
            raise NotFoundError(f"no step {step} in the directory", file=str(self.path(step)))
        return name

    def best_step(self) -> Optional[int]:
        """With ``best_fn``: the step with the best score among those saved with
        metrics (ties: the newest), or None. Without: the latest step (Orbax)."""
        listing = self._run.steps()
        return self._retention.best(sorted(listing), lambda s: self._metrics_of(listing[s]))

    def step_infos(self) -> List[StepInfo]:
        """A :class:`StepInfo` per committed step, ascending (one listing, and
        each step's metrics: its archive metadata, cached). A step deleted
        meanwhile by another process is left out."""
        return self._infos(self._run.steps())

    def _infos(self, listing: Dict[int, str]) -> List[StepInfo]:
        out = []
        for step, name in sorted(listing.items()):
            try:
                stamp = self._stamp(name)
                metrics = self._metrics_of(name)
            except NotFoundError:  # deleted meanwhile
                continue
            out.append(StepInfo(step, self._run.store.shown(self._run.entry(name)), metrics,
                                stamp[1] if isinstance(stamp, tuple) and len(stamp) == 2 else None))
        return out

    def in_flight(self) -> Optional[StepInfo]:
        """The step whose asynchronous save is still running (its
        ``commit_time_ns`` None), or None. Never blocks."""
        job = self._job
        if job is None or job.done():
            return None
        return StepInfo(job.step, self._run.store.shown(self._run.entry(self._run.layout.step_name(job.step))),
                        job.metrics, None)

    def is_saving_in_progress(self) -> bool:
        """Whether an asynchronous save is still running (Orbax's name). Never blocks."""
        return self.in_flight() is not None

    # ---- save ----
    def save(self, step: int, tree: Any, *, metrics: Optional[Any] = None, force: bool = False,
             metadata: Optional[Mapping[str, str]] = None) -> bool:
        """Saves ``tree`` as step ``step``.

        Returns False, writing nothing, when the step is not due
        (:meth:`should_save`) and ``force`` is False; True once the step is
        saved, or snapshotted (``async_save``: the values of this moment). A
        save still in flight is waited for first: at most one snapshot exists.

        Args:
          step: a non-negative int.
          tree: any pytree ``treecask.save`` takes.
          metrics: optional JSON-serialisable value (dict of floats...; NumPy
            and jax scalars are converted) stored in the step's archive, read by
            :meth:`metrics` and ``best_fn``.
          force: save even when the step is not due.
          metadata: optional archive metadata (``str -> str``) of this step
            only, over the manager's ``metadata`` save option (the keys
            ``treecask.step`` and ``treecask.metrics`` are the manager's).

        Raises:
          the error of the previous asynchronous save (IoError for a full
            disk...), which is then cleared: this step is not saved;
          AlreadyExistsError: the step exists (the message names the file);
          InvalidArgumentError: a bad step, metrics or tree (as treecask.save),
            a closed or read-only manager;
          IoError: synchronous saves, as treecask.save.
        """
        self._check_writable()
        d = str(self.directory)
        step = _check_step(step, d)
        if not force and not self.should_save(step):
            return False
        self.wait_until_finished()
        listing = self._run.steps()
        if step in listing:
            raise AlreadyExistsError(f"step {step} already exists (a step is never overwritten)",
                                     file=str(self.path(step)))
        name = self._run.layout.step_name(step)
        entry = self._run.entry(name)
        md = {**self._metadata, **dict(_check_metadata(metadata, d)), STEP_KEY: str(step)}
        stored_metrics = None
        if metrics is not None:
            try:
                md[METRICS_KEY] = json.dumps(metrics, default=_json_default, sort_keys=True)
            except (TypeError, ValueError) as e:
                raise InvalidArgumentError(f"metrics must be JSON-serialisable: {e}",
                                           file=str(self.path(step))) from None
            stored_metrics = json.loads(md[METRICS_KEY])
        committed = functools.partial(self._committed, step, name, stored_metrics)
        single = processes()[1] == 1  # (a multi-process job sweeps nothing: another process may be saving)
        if self._signer is not None and not single:
            raise UnsupportedError("sign_with signs in one process: in a jax.distributed job sign each step's "
                                   "directory after the save with treecask.sign", file=str(self.path(step)))
        sweep = self._run.sweep if single else None
        if self._run.layout.index:  # a directory of item archives (Orbax's layout, through the store seam)
            from .orbax import _layout  # (no import cycle at load time)

            if not isinstance(tree, Mapping) or not all(isinstance(v, tuple) and len(v) == 2 for v in tree.values()):
                raise InvalidArgumentError("a step of item directories is {item name: (pytree, archive metadata)}",
                                           file=str(self.path(step)))
            job = _layout.save_directory(self._run.store, entry, tree, md, overwrite=False,
                                         asynchronous=self.async_save, meanwhile=sweep, after=committed, step=step,
                                         metrics=stored_metrics)
        elif not self.async_save:
            if sweep is not None:
                sweep()
            save(entry, tree, metadata=md, store=self._run.store, **self._save_options)
            committed()
            job = None
        else:
            job = save_async(entry, tree, store=self._run.store, metadata=md, pool=self._pool, meanwhile=sweep,
                             after=committed, step=step, metrics=stored_metrics, **self._save_options)
        if job is not None:
            self._job = job  # (one assignment: readers take self._job once, without a lock)
        return True

    def _committed(self, step: int, name: str, metrics: Any) -> None:
        """After step ``step`` (entry ``name``) is committed: signed, its metrics cached, then retention."""
        if self._signer is not None:
            entry = self._run.entry(name)
            self._run.store.sign_archive(entry, self._signer[0], entry + _SIGNATURE_SUFFIX)
        with contextlib.suppress(NotFoundError):  # deleted meanwhile
            self._metrics_cache[name] = (self._stamp(name), metrics)
        self._retain(step)

    # ---- retention ----
    def steps_to_delete(self, steps: Optional[List[int]] = None) -> List[int]:
        """The steps retention would delete now (ascending), from ``steps`` or
        the directory's: all but the kept ones, where kept = the newest
        ``max_to_keep`` (without ``best_fn``) or the ``max_to_keep`` best and
        the newest (unless ``keep_newest`` is False) and every step without
        metrics (with ``best_fn``), plus every multiple of ``keep_period``;
        with ``keep_fn``, the steps it flags False. [] when ``max_to_keep``
        and ``keep_fn`` are None."""
        listing = self._run.steps()
        if steps is not None:
            listing = {s: listing.get(s, self._run.layout.step_name(s)) for s in steps}
        return self._to_delete(listing)

    def _to_delete(self, listing: Dict[int, str]) -> List[int]:
        return self._retention.to_delete(sorted(listing), lambda s: self._metrics_of(listing[s]),
                                         lambda: self._infos(listing))

    def _retain(self, new_step: int) -> None:
        if self._retention.deletes and processes()[0] == 0:  # only process 0 deletes (Orbax's primary host)
            listing = self._run.steps()
            for s in self._to_delete(listing):
                if s != new_step or not self.keep_newest or self._retention.keep_fn is not None:
                    self._remove(listing[s])

    def _remove(self, name: str) -> None:
        """Deletes the step entry ``name`` (``Store.delete_tree``) and its cached metrics and signature."""
        self._run.store.delete_tree(self._run.entry(name))  # leaves every listing at once
        self._metrics_cache.pop(name, None)
        if self._signer is not None:  # its bundle after it: a listed step always has its own
            self._run.store.delete([self._run.entry(name) + _SIGNATURE_SUFFIX])

    def delete(self, step: int) -> None:
        """Deletes step ``step`` now, whatever the retention rule (Orbax's
        ``delete``): it leaves every listing at once (a local step file
        unlinked, a step directory renamed to a temporary then removed, a
        bucket's commit object deleted first: ``Store.delete_tree``). A save
        in flight is waited for first (its error, if any, stays for the next
        save / wait / check). In a multi-process jax job call it in every
        process: process 0 deletes.

        Raises:
          NotFoundError: no step ``step`` (names the file);
          InvalidArgumentError: a bad step, a closed or read-only manager.
        """
        self._check_writable()
        _check_step(step, str(self.directory))
        self.wait_until_finished(raise_error=False)
        name = self._listed(step)
        if processes()[0] == 0:
            self._remove(name)

    def _stamp(self, name: str) -> Any:
        """What identifies one writing of entry ``name`` (``Store.stamp``); NotFoundError once it is gone."""
        return self._run.store.stamp(self._run.index(name))

    def _metrics_of(self, name: str) -> Optional[Any]:
        key = self._stamp(name)
        hit = self._metrics_cache.get(name)
        if hit is not None and hit[0] == key:
            return hit[1]
        with open_archive(self._run.index(name), store=self._run.store) as a:
            raw = a.metadata.get(METRICS_KEY)
        m = json.loads(raw) if raw is not None else None
        self._metrics_cache[name] = (key, m)
        return m

    # ---- restore ----
    def restore(self, step: Optional[int] = None, like: Any = None, **load_options: Any) -> Any:
        """Restores a step (default: the latest) with :func:`treecask.load`.

        ``like`` and every ``load`` option (``subtree``, ``shardings``,
        ``missing``, ``extra``, ``single_read``...) pass through. A save of this manager still in
        flight is waited for first (its error, if any, stays for the next
        save / wait / close). With ``step=None``, a latest step deleted by
        another process's retention between listing and opening is skipped
        for the new latest.

        Raises:
          NotFoundError: no step at all, or no step ``step`` (names the file);
          everything :func:`treecask.load` raises.
        """
        self.wait_until_finished(raise_error=False)
        load_options.setdefault("store", self._run.store)
        if step is not None:
            return self._load(self.location(step)[1], like, load_options)
        for _ in range(8):
            steps = self._run.steps()
            if not steps:
                break
            with contextlib.suppress(NotFoundError):  # removed meanwhile by retention in another process
                return self._load(self._run.entry(steps[max(steps)]), like, load_options)
        raise NotFoundError("the directory holds no checkpoint step", file=str(self.directory))

    def _load(self, entry: str, like: Any, load_options: Dict[str, Any]) -> Any:
        """``treecask.load`` of the step at ``entry``, or ``{item name: its load}`` of a step of items."""
        if not self._run.layout.index:
            if self._signer is not None and "signature" not in load_options and "public_key" not in load_options:
                bundle = self._run.store.read_object(entry + _SIGNATURE_SUFFIX)  # sign_with's, beside the step
                if not bundle:
                    raise NotFoundError("the step's signature bundle is empty",
                                        file=self._run.store.display(entry + _SIGNATURE_SUFFIX))
                load_options = dict(load_options, public_key=self._signer[1].encode(), signature=bundle)
            return load(entry, like, **load_options)
        from .orbax import _layout

        names = _layout.item_names(self._run.store, entry)
        if names is None:
            raise NotFoundError("no longer exists", file=self._run.store.display(entry))
        likes = like if isinstance(like, Mapping) else {}
        return {n: load(stores.join(entry, n), likes.get(n), **load_options) for n in names}

    # ---- the save in flight and its errors ----
    def check_for_errors(self) -> None:
        """Raises the error of a finished asynchronous save (IoError for a
        full disk, AlreadyExistsError when another writer committed the step
        first...), once, then clears it; never blocks: a save still running
        is not waited for (Orbax's ``check_for_errors``). The same error is
        otherwise raised by the next :meth:`save`, :meth:`wait_until_finished`
        or :meth:`close`."""
        job = self._job
        if job is not None and job.done():
            job.wait()  # ended: raises its error, once

    def wait_until_finished(self, *, raise_error: bool = True) -> None:
        """Blocks until the save in flight (if any) is committed and retention
        has run. Raises that save's error (IoError for a full disk...), once
        (Orbax's ``wait_until_finished``); ``raise_error=False`` leaves it for
        :meth:`check_for_errors` or the next save / wait / close (what
        :meth:`restore` does before reading)."""
        job = self._job
        if job is not None:
            (job.wait if raise_error else job.join)()

    def _check_writable(self) -> None:
        if self._closed:
            raise InvalidArgumentError("the checkpoint manager is closed", file=str(self.directory))
        if self.read_only:
            raise InvalidArgumentError("the checkpoint manager is read-only (read_only=True)",
                                       file=str(self.directory))

    def close(self) -> None:
        """Waits for the save in flight, then closes: later saves raise
        InvalidArgumentError (listing and restore keep working) and the kept
        snapshot memory is freed. Raises the pending background error, if any.
        Idempotent."""
        self._closed = True
        try:
            self.wait_until_finished()
        finally:
            if self._pool is not None:
                self._pool.clear()


def _check_metadata(md: Optional[Mapping[str, str]], file: str) -> List[Tuple[str, str]]:
    """The (key, value) pairs of archive metadata ``md`` (str to str), none of the manager's own keys."""
    items = metadata_items(md, file)
    for k, _ in items:
        if k in (STEP_KEY, METRICS_KEY):
            raise InvalidArgumentError(f"metadata key '{k}' is reserved for the manager", file=file)
    return items


def _is_int(x: Any) -> bool:
    """A Python, NumPy or 0-d jax integer (not a bool)."""
    if isinstance(x, bool) or getattr(x, "dtype", None) == bool:
        return False
    try:
        operator.index(x)  # an int, a NumPy integer, a 0-d integer jax / NumPy array (TrainState.step)
    except TypeError:
        return False
    return True


def _check_step(step: Any, file: str) -> int:
    if not _is_int(step) or operator.index(step) < 0:
        raise InvalidArgumentError(f"a step is an int >= 0, got {step!r}", file=file)
    return operator.index(step)
