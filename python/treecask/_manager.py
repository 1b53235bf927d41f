"""CheckpointManager: a directory of step archives for a training loop.

One archive per step, ``<directory>/step_<step>.cask`` (format/SPEC.md
"Checkpoint directories"); the step number and the step's metrics live inside
the step's own archive (archive metadata ``treecask.step``, ``treecask.metrics``),
so the directory listing is the only record of which steps exist: there is no
index file that could disagree with it. A step appears by the atomic rename of
``treecask.save`` (SPEC.md "Atomic commit"), so any process listing the
directory sees only complete steps.

Asynchronous save (the default): :meth:`CheckpointManager.save` flattens the
tree and makes every leaf's bytes safe from the caller -- NumPy arrays and
other host values are copied into one host buffer (the snapshot,
``treecask::save_async`` in the C++ core, GIL released, all cores); jax.Array
leaves, immutable, are held as read-only host views (donating one later makes
jax copy it rather than reuse the buffer) -- then returns; encoding, writing,
fsync, rename and retention run in the background. At most one save is in
flight. In a multi-process ``jax.distributed`` job the same holds for each
process's shards, and the background thread also runs the cross-process
commit (``_distributed.run``: the coordination service's key-value store and
barriers, which release the GIL).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import math
import numbers
import operator
import os
import pathlib
import re
import sys
import threading
import weakref
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from . import _core, _distributed
from . import _jaxutil as J
from . import stores
from .stores import _upload
from .interop import orbax as _orbax
from ._open import load
from ._open import open as open_archive
from ._request import SaveRequest, compression_code
from ._save import save
from ._types import PathLike
from .errors import AlreadyExistsError, Error, InvalidArgumentError, NotFoundError, UnsupportedError, _with_file

#: Archive metadata keys the manager writes into every step (SPEC.md "Checkpoint directories").
STEP_KEY = "treecask.step"
METRICS_KEY = "treecask.metrics"

_STEP_RE = re.compile(r"step_([0-9]+)\.cask")
# Temporaries of a step, "<name>.tmp.<host>.<pid>.<hex16>" (SPEC.md "Atomic
# commit": a save in progress, a step directory being deleted); which are stale
# is the core's rule (treecask::is_stale_temporary).
_TMP_RE = re.compile(r"(step_[0-9]+\.cask)\.tmp\..+")
_SAVE_OPTIONS = frozenset({"compression", "shuffle", "durable", "chunk_size", "metadata", "threads",
                           "max_part_bytes"})


def step_name(step: int) -> str:
    """The entry name of a step: ``step_`` + the step zero-padded to at least 8 digits + ``.cask``."""
    return f"step_{step:08d}.cask"


class _Run:
    """A manager's directory in a store (``treecask.stores``): its entries
    are the step archives ``step_<n>.cask`` (an object; a multi-process step
    the "directory" ``step_<n>.cask/``, which exists once its commit object
    ``index.cask`` does, or at once where the store publishes directories
    atomically), their temporaries, and nothing else of treecask's.
    Each question below is answered from one listing."""

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
            if m is None or not (rest in ("", stores.COMMIT_OBJECT) or self.store.supports_atomic_directories):
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
        no longer exists, and the older ``step_<n>.cask.tmp.<pid>.<hex>``):
        the core's rule of SPEC.md "Atomic commit"
        (``treecask::is_stale_temporary``), applied to every step that has a
        temporary, through the store (:meth:`treecask.stores.Store.remove_stale`).
        In a multi-process job the manager does not call it."""
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
        shown = ", ".join(found[:5]) + (", ..." if len(found) > 5 else "")
        raise UnsupportedError(
            f"this directory holds an Orbax run ({len(found)} step director{'y' if len(found) == 1 else 'ies'}: "
            f"{shown}), which treecask does not read in place: convert each step once with "
            f"treecask.import_orbax(src, dst) (or `treecask import-orbax SRC DST`) into a treecask "
            f"CheckpointManager directory of its own, e.g. dst = <new directory>/step_<N:08d>.cask",
            file=directory)


def _jax_processes() -> Tuple[int, int]:
    """(process index, process count) of a multi-process jax job, (0, 1) when
    jax is not imported: the manager never imports jax itself."""
    jax = sys.modules.get("jax")
    if jax is None:
        return 0, 1
    try:
        return int(jax.process_index()), int(jax.process_count())
    except Exception:  # jax half-imported or without a backend
        return 0, 1


def _may_delete() -> bool:
    """Whether this process deletes old steps and stale temporaries: in a
    multi-process jax job only process 0 does (as Orbax's primary host)."""
    return _jax_processes()[0] == 0


def _remove_entry(path: str) -> None:
    """Removes a local step file or directory at once (``LocalStore.delete_tree``)."""
    stores.LocalStore().delete_tree(os.fspath(path))


def _json_default(x: Any) -> Any:
    if hasattr(x, "item") and getattr(x, "shape", None) == ():
        return x.item()  # NumPy / jax scalars
    if hasattr(x, "tolist"):
        return x.tolist()
    raise TypeError(f"{type(x).__name__} is not JSON-serialisable")


def _metrics_json(metrics: Any, file: str) -> str:
    try:
        return json.dumps(metrics, default=_json_default, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"metrics must be JSON-serialisable: {e}", file=file) from None


def _save_async(path: str, tree: Any, *, metadata: Mapping[str, str], pool: Any = None,
                compression: str = "auto",
                chunk_size: Optional[int] = None, threads: int = 0, durable: bool = True,
                max_part_bytes: Optional[int] = None, shuffle: bool = False):
    """treecask.save(path, tree, ...) on the core's background thread: returns
    a ``_core.PendingSave`` once every leaf's bytes are safe from the caller.

    What is copied: NumPy arrays and every other host value (the caller may
    write them in place right after), into the core's snapshot
    (``treecask::save_async``, GIL released, all cores). What is not: the bytes
    of a ``jax.Array``, held instead as the read-only host view ``np.asarray``
    gives (on an accelerator a fresh host copy; on the CPU a view of the
    device buffer). jax arrays are immutable, and a view is an external
    reference to the buffer: donating that array to a jitted step
    (``donate_argnums``) while the save runs makes jax's CPU client copy it
    instead of reusing the buffer (the step then pays the copy, the save
    nothing), and ``x.delete()`` frees it only when the save lets go.
    ``tests/python/test_manager.py`` checks both."""
    def start_transfers(objs):  # every device-to-host transfer starts before the first is waited on
        for x in objs:
            if J.is_jax_array(x) and not J.on_host(x):
                x.copy_to_host_async()

    request, objs = SaveRequest.of_tree(
        path, tree, before_encode=start_transfers, compression=compression_code(compression, path),
        chunk_size=chunk_size, threads=int(threads), durable=bool(durable), metadata=list(metadata.items()),
        max_part_bytes=max_part_bytes, shuffle=bool(shuffle))
    return _core.save_async(path, request, [J.is_jax_array(x) for x in objs], pool)


def _prepare_distributed(store: stores.Store, path: str, tree: Any, *, metadata: Mapping[str, str],
                         snapshot: bool, compression: str = "auto", chunk_size: Optional[int] = None,
                         threads: int = 0, durable: bool = True, max_part_bytes: Optional[int] = None,
                         shuffle: bool = False):
    """The caller's half of a multi-process save of step ``path`` in
    ``store`` (``_distributed.prepare``); with ``snapshot`` safe from the
    caller as :func:`_save_async` is."""
    shown = store.display(path)
    code = compression_code(compression, shown)
    try:
        return _distributed.prepare(path, tree, store=store, metadata=metadata, compression=code,
                                    overwrite=False, chunk_size=chunk_size, threads=threads,
                                    durable=durable, max_part_bytes=max_part_bytes, shuffle=shuffle,
                                    snapshot=snapshot)
    except Error as e:
        raise _with_file(e, shown) from None


class _Job:
    """One save in flight: its step, its metrics (as stored) and its outcome."""

    def __init__(self, step: int, path: str, metrics: Optional[Any]):
        self.step = step
        self.path = path
        self.metrics = metrics
        self.done = threading.Event()
        self.thread: Optional[threading.Thread] = None


_LIVE: "weakref.WeakSet[CheckpointManager]" = weakref.WeakSet()


@atexit.register
def _finish_at_exit() -> None:
    """Interpreter exit: the worker threads are not daemons, so Python has
    already joined them (every save in flight finished); report any background
    error nobody collected, so that it is never lost silently."""
    for m in list(_LIVE):
        try:
            m._join()
            err = m._take_error()
        except Exception as e:  # pragma: no cover - defensive
            err = e
        if err is not None:
            print(_core.redact_urls_in(f"treecask: a checkpoint save in {m.directory} failed and was never "
                                       f"reported: {err}"), file=sys.stderr)


class CheckpointManager:
    """Saves, lists, retains and restores the steps of a training run in one directory.

    Args:
      directory: the directory of step archives (created if missing), or the
        URL of a prefix in an object store (``s3://bucket/run``, ``gs://``,
        ``az://``): each step is then the object ``step_<n>.cask`` (a
        multi-process step the prefix ``step_<n>.cask/``, which exists once
        its ``index.cask`` does), committed as ``treecask.save`` commits to a
        store, never replacing a step; the asynchronous save's upload runs in
        the background; retention deletes a step's commit object first
        (docs/remote.md "Saving to object stores").
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
      keep_newest: default True: with ``best_fn`` and ``max_to_keep``, the
        newest step is kept as well as the best ones. False: only the
        ``max_to_keep`` best (Orbax's ``CheckpointManagerOptions`` semantics;
        ``treecask.orbax.CheckpointManager`` passes it), so a step just saved
        with a worse score than those is deleted at once.
      save_interval_steps: :meth:`save` writes only steps that are a multiple of
        it (unless ``force``); default 1.
      async_save: default True: :meth:`save` returns once the tree's bytes are
        safe from the caller (NumPy leaves copied into a host snapshot,
        jax.Array leaves held as read-only views); the write, fsync, rename
        and retention run on a background thread -- in a multi-process jax
        job the cross-process commit too (every process must call
        :meth:`save` for the same steps in the same order, as for
        ``treecask.save``).
      keep_snapshot_memory: default False. True keeps the snapshot buffer
        between asynchronous saves (``treecask::SnapshotPool``) instead of
        returning it to the OS: the copy of NumPy leaves then goes into memory
        that is already faulted in (2-3x faster than into fresh memory here),
        at the price of holding about those leaves' bytes of host memory from
        the first save until :meth:`close`. (jax.Array leaves are not copied.)
      storage_options: for a URL, the store's configuration (obstore config
        keys) overriding the environment's, as :func:`treecask.open`.
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
        never ignored, convert it with :func:`treecask.import_orbax`; a
        read-only store (``http(s)://``) or a URL scheme treecask does not serve.
    """

    def __init__(self, directory: PathLike = "", *, max_to_keep: Optional[int] = None,
                 keep_period: Optional[int] = None, best_fn: Optional[Callable[[Any], float]] = None,
                 best_mode: str = "max", keep_newest: bool = True, save_interval_steps: int = 1,
                 async_save: bool = True,
                 keep_snapshot_memory: bool = False, storage_options: Optional[Mapping[str, Any]] = None,
                 store: Optional[stores.Store] = None, **save_options: Any):
        # (a URL names an object store, never a local directory "s3:/bucket/run"; a read-only
        # store, http(s)://, refuses the listing below)
        st, path = stores.resolve(directory, store, storage_options)
        self._run = _Run(st, path)
        local = st.local_path(path)
        self.directory: Any = pathlib.Path(local) if local is not None else st.display(path)
        d = str(self.directory)
        for name, v in (("max_to_keep", max_to_keep), ("keep_period", keep_period)):
            if v is not None and (not _is_int(v) or v < 1):
                raise InvalidArgumentError(f"{name} must be None or an int >= 1, got {v!r}", file=d)
        if not _is_int(save_interval_steps) or save_interval_steps < 1:
            raise InvalidArgumentError(f"save_interval_steps must be an int >= 1, got {save_interval_steps!r}",
                                       file=d)
        if best_mode not in ("max", "min"):
            raise InvalidArgumentError(f"best_mode must be 'max' or 'min', got {best_mode!r}", file=d)
        if best_fn is not None and not callable(best_fn):
            raise InvalidArgumentError("best_fn must be callable", file=d)
        unknown = sorted(set(save_options) - _SAVE_OPTIONS)
        if unknown:
            why = ("a step is never overwritten" if unknown == ["overwrite"]
                   else f"the save options are {sorted(_SAVE_OPTIONS)}")
            raise InvalidArgumentError(f"unknown save option(s) {unknown}: {why}", file=d)
        md = dict(save_options.pop("metadata", None) or {})
        for k, v in md.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise InvalidArgumentError("archive metadata must map str to str", file=d)
            if k in (STEP_KEY, METRICS_KEY):
                raise InvalidArgumentError(f"metadata key '{k}' is reserved for the manager", file=d)
        self.max_to_keep = max_to_keep
        self.keep_period = keep_period
        self.best_fn = best_fn
        self.best_mode = best_mode
        self.keep_newest = bool(keep_newest)
        self.save_interval_steps = int(save_interval_steps)
        self.async_save = bool(async_save)
        self._pool = _core.SnapshotPool() if keep_snapshot_memory else None
        self._metadata = md
        self._save_options = save_options
        self._lock = threading.Lock()
        self._job: Optional[_Job] = None
        self._error: Optional[BaseException] = None
        self._closed = False
        # entry name -> ((inode, mtime_ns), metrics): step archives are immutable,
        # a step deleted and written again gets a new inode.
        self._metrics_cache: Dict[str, Tuple[Tuple[int, int], Any]] = {}
        refuse_orbax_run(d, self._run.orbax_steps())
        if local is not None:
            os.makedirs(local, exist_ok=True)
        _LIVE.add(self)

    # ---- context manager ----
    def __enter__(self) -> "CheckpointManager":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()  # a save error raised here chains the body's exception, if any

    def __repr__(self) -> str:
        return f"<treecask.CheckpointManager {_core.redact_url(str(self.directory))!r}>"

    # ---- naming ----
    def _steps(self) -> Dict[int, str]:
        """``{step: entry name}``: the directory's listing (one request)."""
        return self._run.steps()

    def _entry(self, name: str) -> Any:
        """What :meth:`path` shows of entry ``name``: a ``pathlib.Path`` in a
        local directory, else the store's display name (a URL, redacted)."""
        local = self._run.store.local_path(self._run.entry(name))
        return pathlib.Path(local) if local is not None else self._run.store.display(self._run.entry(name))

    def path(self, step: int) -> Any:
        """The path of ``step``: its existing entry if the directory has one
        (whatever its digit count), else ``<directory>/step_<step:08d>.cask``
        (a ``pathlib.Path``; for a manager on a bucket, the URL as a str).
        Treat it as opaque: a file today, a directory for a multi-process step."""
        step = _check_step(step, str(self.directory))
        name = self._steps().get(step, step_name(step))
        return self._entry(name)

    def should_save(self, step: int) -> bool:
        """Whether :meth:`save` writes ``step``: it is a multiple of
        ``save_interval_steps``. Never blocks, never lists the directory."""
        return _check_step(step, str(self.directory)) % self.save_interval_steps == 0

    # ---- listing (the directory is the source of truth) ----
    def all_steps(self) -> List[int]:
        """Steps in the directory, ascending. A step being saved asynchronously
        appears once it is durable (call :meth:`wait_until_finished` first to
        include it)."""
        return sorted(self._steps())

    def latest_step(self) -> Optional[int]:
        """The highest step in the directory, or None."""
        steps = self._steps()
        return max(steps) if steps else None

    def metrics(self, step: int) -> Optional[Any]:
        """The metrics saved with ``step`` (JSON-decoded), or None if it was
        saved without. Raises NotFoundError when the step does not exist."""
        step = _check_step(step, str(self.directory))
        name = self._steps().get(step)
        if name is None:
            raise NotFoundError(f"no step {step} in the directory", file=str(self._entry(step_name(step))))
        return self._metrics_of(name)

    def best_step(self) -> Optional[int]:
        """With ``best_fn``: the step with the best score among those saved with
        metrics (ties: the newest), or None. Without: the latest step (Orbax)."""
        steps = self._steps()
        if self.best_fn is None:
            return max(steps) if steps else None
        scored = []
        for s, name in steps.items():
            try:
                m = self._metrics_of(name)
            except NotFoundError:  # deleted meanwhile by another process
                continue
            if m is not None:
                scored.append((self._score(m), s))
        ranked = self._rank(scored)
        return ranked[-1] if ranked else None

    # ---- save ----
    def save(self, step: int, tree: Any, *, metrics: Optional[Any] = None, force: bool = False,
             metadata: Optional[Mapping[str, str]] = None) -> bool:
        """Saves ``tree`` as step ``step``.

        Returns False, writing nothing, when the step is not due
        (:meth:`should_save`) and ``force`` is False; True once the step is
        saved (synchronous) or snapshotted (asynchronous: the checkpoint holds
        the values of this moment whatever the caller then does to its NumPy
        arrays or jax buffers, donation included). A save still in flight is
        waited for first, so at most one snapshot exists at a time.

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
          InvalidArgumentError: a bad step, metrics or tree (as treecask.save);
          IoError: synchronous saves, as treecask.save.
        """
        self._check_open()
        d = str(self.directory)
        step = _check_step(step, d)
        if not force and not self.should_save(step):
            return False
        self._join()
        err = self._take_error()
        if err is not None:
            raise err
        existing = self._steps().get(step)
        if existing is not None:
            raise AlreadyExistsError(f"step {step} already exists (a step is never overwritten)",
                                     file=str(self._entry(existing)))
        path = str(self._entry(step_name(step)))
        entry = self._run.entry(step_name(step))
        md = dict(self._metadata)
        for k, v in (metadata or {}).items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise InvalidArgumentError("archive metadata must map str to str", file=d)
            if k in (STEP_KEY, METRICS_KEY):
                raise InvalidArgumentError(f"metadata key '{k}' is reserved for the manager", file=d)
            md[k] = v
        md[STEP_KEY] = str(step)
        stored_metrics = None
        if metrics is not None:
            md[METRICS_KEY] = _metrics_json(metrics, path)
            stored_metrics = json.loads(md[METRICS_KEY])
        job = _Job(step, path, stored_metrics)
        _, nproc = _jax_processes()
        local = self._run.store.local_path(entry)
        if nproc > 1:  # every process's half of a sharded step directory (treecask.save's protocol)
            plan = _prepare_distributed(self._run.store, entry, tree, metadata=md,
                                        snapshot=self.async_save, **self._save_options)
            write = functools.partial(_distributed.run, plan)
        elif self.async_save and local is None:  # into scratch now, then the upload in the background
            write = self._upload_later(entry, tree, md)
        elif self.async_save:
            write = _save_async(local, tree, metadata=md, pool=self._pool, **self._save_options).wait
        else:
            self._run.sweep()
            save(entry, tree, metadata=md, store=self._run.store, **self._save_options)
            write = None
        if write is None or not self.async_save:
            if write is not None:
                write()
            self._remember(job)
            self._retain(step)
            return True
        job.thread = threading.Thread(target=self._finish, args=(job, write),
                                      name=f"treecask-save-step-{step}", daemon=False)
        with self._lock:
            self._job = job
        job.thread.start()
        return True

    def _upload_later(self, entry: str, tree: Any, md: Mapping[str, str]) -> Callable[[], None]:
        """An asynchronous save of one archive to a store the core cannot
        write in place (an object store): the snapshot is taken now (as for a
        local step) into local scratch that the returned call finishes
        writing, commits through the store (never onto an existing step:
        ``Store.put_file``) and removes."""
        store = self._run.store
        with contextlib.ExitStack() as stack:  # the scratch goes if the snapshot fails
            local = stack.enter_context(_upload.scratch(step_name(0)))
            pending = _save_async(local, tree, metadata=md, pool=self._pool,
                                  **dict(self._save_options, durable=False))
            scratch = stack.pop_all()  # else it goes when the write is done
        shown = store.display(entry)

        def write() -> None:
            with scratch:
                try:
                    pending.wait()
                    store.put_file(entry, local, overwrite=False)
                except Error as e:
                    raise _upload.named(e, local, shown) from None
        return write

    def _finish(self, job: _Job, write: Callable[[], Any]) -> None:
        """The background half of an asynchronous save (worker thread): the
        core's write (single process) or the collective protocol (a
        multi-process job), then retention."""
        try:
            if _may_delete() and _jax_processes()[1] == 1:
                self._run.sweep()
            write()
            del write  # the snapshot / borrowed buffers go now, not at the next save
            self._remember(job)
            self._retain(job.step)
        except BaseException as e:  # kept for the next save / wait / close
            with self._lock:
                self._error = e
        finally:
            job.done.set()

    def _remember(self, job: _Job) -> None:
        """Caches the metrics of the step just written (no need to reopen it)."""
        name = os.path.basename(job.path)
        try:
            stamp = self._stamp(name)
        except NotFoundError:
            return
        self._metrics_cache[name] = (stamp, job.metrics)

    # ---- retention ----
    def _score(self, metrics: Any) -> float:
        v = float(self.best_fn(metrics))
        if math.isnan(v):  # NaN is the worst score
            return -math.inf if self.best_mode == "max" else math.inf
        return v

    def _rank(self, scored: List[Tuple[float, int]]) -> List[int]:
        """Steps from worst to best; among equal scores the newer is better."""
        if self.best_mode == "max":
            return [s for _, s in sorted(scored)]
        return [s for _, s in sorted(scored, key=lambda t: (-t[0], t[1]))]

    def steps_to_delete(self, steps: Optional[List[int]] = None) -> List[int]:
        """The steps retention would delete now (ascending), from ``steps`` or
        the directory's: all but the kept ones, where kept = the newest
        ``max_to_keep`` (without ``best_fn``) or the ``max_to_keep`` best and
        the newest (unless ``keep_newest`` is False) and every step without
        metrics (with ``best_fn``), plus every
        multiple of ``keep_period``. None when ``max_to_keep`` is None."""
        if steps is None:
            listing = self._steps()
            steps = sorted(listing)
        else:
            listing = None
            steps = sorted(steps)
        if self.max_to_keep is None or not steps:
            return []
        keep = {steps[-1]} if self.keep_newest or self.best_fn is None else set()
        if self.best_fn is None:
            keep.update(steps[-self.max_to_keep:])
        else:
            scored = []
            for s in steps:
                name = (listing or {}).get(s, step_name(s))
                try:
                    m = self._metrics_of(name)
                except NotFoundError:
                    continue
                if m is None:
                    keep.add(s)
                else:
                    scored.append((self._score(m), s))
            keep.update(self._rank(scored)[-self.max_to_keep:])
        if self.keep_period is not None:
            keep.update(s for s in steps if s % self.keep_period == 0)
        return [s for s in steps if s not in keep]

    def _retain(self, new_step: int) -> None:
        if self.max_to_keep is None or not _may_delete():
            return
        listing = self._steps()
        for s in self.steps_to_delete(sorted(listing)):
            if s == new_step and self.keep_newest:
                continue
            self._remove(listing[s])

    def _remove(self, name: str) -> None:
        """Deletes the step entry ``name`` (a file, a directory, or a bucket's
        objects: its commit object first) and forgets its cached metrics."""
        self._run.remove(name)
        self._metrics_cache.pop(name, None)

    def _stamp(self, name: str) -> Any:
        """What identifies one writing of entry ``name`` (``Store.stamp``: a
        local step's inode and mtime, since a step deleted and written again
        gets a new inode; None in an object store, where a manager never
        rewrites a step). Raises NotFoundError when a local step no longer
        exists."""
        return self._run.store.stamp(self._run.entry(name))

    def _metrics_of(self, name: str) -> Optional[Any]:
        key = self._stamp(name)
        hit = self._metrics_cache.get(name)
        if hit is not None and hit[0] == key:
            return hit[1]
        with open_archive(self._run.entry(name), store=self._run.store) as a:
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
        self._join()
        load_options.setdefault("store", self._run.store)
        if step is not None:
            name = self._steps().get(_check_step(step, str(self.directory)), step_name(step))
            return load(self._run.entry(name), like, **load_options)
        for _ in range(8):
            steps = self._steps()
            if not steps:
                break
            try:
                return load(self._run.entry(steps[max(steps)]), like, **load_options)
            except NotFoundError:
                continue  # removed meanwhile by retention in another process
        raise NotFoundError("the directory holds no checkpoint step", file=str(self.directory))

    # ---- lifetime ----
    def _join(self) -> None:
        job = self._job
        if job is not None and job.thread is not None and job.thread is not threading.current_thread():
            job.thread.join()

    def _take_error(self) -> Optional[BaseException]:
        with self._lock:
            err, self._error = self._error, None
        return err

    def wait_until_finished(self) -> None:
        """Blocks until the save in flight (if any) is durable and retention has
        run. Raises that save's error (IoError for a full disk...), once."""
        self._join()
        err = self._take_error()
        if err is not None:
            raise err

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgumentError("the checkpoint manager is closed", file=str(self.directory))

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


def _is_int(x: Any) -> bool:
    """A Python, NumPy or 0-d jax integer (not a bool)."""
    if isinstance(x, bool) or getattr(x, "dtype", None) == bool:
        return False
    if isinstance(x, numbers.Integral):
        return True
    try:
        operator.index(x)  # a 0-d integer jax / NumPy array, e.g. TrainState.step
    except TypeError:
        return False
    return True


def _check_step(step: Any, file: str) -> int:
    if not _is_int(step) or operator.index(step) < 0:
        raise InvalidArgumentError(f"a step is an int >= 0, got {step!r}", file=file)
    return operator.index(step)
