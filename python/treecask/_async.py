"""The asynchronous save: a tree's bytes made safe now, the archive written
and committed on a background thread, its error kept until someone asks.
:func:`save_async` is what :class:`treecask.CheckpointManager` and
``treecask.orbax``'s ``AsyncCheckpointer`` save with. The caller's half
copies NumPy arrays and other host values into one host buffer (the core's
snapshot, ``treecask::save_async``, GIL released, all cores) and holds
jax.Array leaves, immutable, as read-only host views; the background half
runs the store's commit (``Store.save_archive`` / ``write_archive``), or in a
multi-process job the cross-process commit (``_distributed.run``).
"""

from __future__ import annotations

import atexit
import functools
import queue
import sys
import threading
import time
import weakref
from typing import Any, Callable, List, Mapping, Optional, Tuple

import treecask._core as _core

from . import _distributed
from . import _jaxutil as J
from . import stores
from ._request import SaveRequest, compression_code
from .errors import Error, InvalidArgumentError, _with_file


def processes() -> Tuple[int, int]:
    """(process index, process count) of a multi-process jax job, (0, 1) when
    jax is not imported: treecask never imports jax itself."""
    try:
        jax = sys.modules["jax"]
        return int(jax.process_index()), int(jax.process_count())
    except Exception:  # jax not imported, half-imported or without a backend
        return 0, 1


def reached_preemption(step: int) -> bool:
    """Whether every process of a ``jax.distributed`` job has reached the
    preemption sync point ``step`` (``jax.experimental.multihost_utils.
    reached_preemption_sync_point``: a preemption notice, SIGTERM by default,
    was received by some process and ``step`` is the step all agreed to save
    at). False without jax, outside a distributed job, or when jax's
    preemption service is off -- as Orbax's ``multihost.reached_preemption``."""
    if sys.modules.get("jax") is None:
        return False
    from jax.experimental import multihost_utils

    try:
        return bool(multihost_utils.reached_preemption_sync_point(int(step)))
    except RuntimeError:  # jax_enable_preemption_service off
        return False


class SaveJob:
    """One save running in the background.

    ``step`` and ``metrics`` (as stored) are the manager's (None for a
    checkpointer's save); ``path`` what messages show; ``start_time_ns`` when
    :func:`save_async` was called (``time.time_ns()``). ``done()`` never
    blocks; ``wait()`` blocks until the archive is committed (or failed) and
    what ran after it returned, then raises the save's error, once
    (:meth:`take_error` collects it without raising)."""

    def __init__(self, path: Any, *, step: Optional[int] = None, metrics: Any = None):
        self.path, self.step, self.metrics = path, step, metrics
        self.start_time_ns = time.time_ns()
        self._done = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        self._error: Optional[BaseException] = None
        _JOBS.add(self)

    def done(self) -> bool:
        """True once the save has ended, successfully or not."""
        return self._done.is_set()

    def join(self) -> None:
        """Blocks until the save has ended (from the save's own thread: returns)."""
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join()

    def take_error(self) -> Optional[BaseException]:
        """The save's error, once (None: none, not ended, or already taken)."""
        with self._lock:
            err, self._error = self._error, None
        return err

    def wait(self) -> None:
        """:meth:`join`, then raises the save's error, once."""
        self.join()
        err = self.take_error()
        if err is not None:
            raise err

    def _run(self, body: Callable[[], Any]) -> None:
        try:
            body()
        except BaseException as e:  # kept for wait / take_error
            with self._lock:
                self._error = e
        finally:
            self._done.set()


_JOBS: "weakref.WeakSet[SaveJob]" = weakref.WeakSet()


@atexit.register
def _report_at_exit() -> None:
    """Interpreter exit: the save threads are not daemons, so Python has
    already joined them (every save in flight finished); an error nobody
    collected is printed to stderr, so that it is never lost silently."""
    for job in list(_JOBS):
        try:
            job.join()
            err = job.take_error()
        except Exception as e:  # pragma: no cover - defensive
            err = e
        if err is not None:
            print(_core.redact_urls_in(f"treecask: the checkpoint save of {job.path} failed and was never "
                                       f"reported: {err}"), file=sys.stderr)


def _start_transfers(objs) -> None:
    """Every device-to-host transfer starts before the first is waited on."""
    for x in objs:
        if J.is_jax_array(x) and any(d.platform != "cpu" for d in x.devices()):
            x.copy_to_host_async()


def save_async(path: str, tree: Any, *, store: stores.Store, overwrite: bool = False,
               metadata: Optional[Mapping[str, str]] = None, pool: Any = None,
               meanwhile: Optional[Callable[[], None]] = None, after: Optional[Callable[[], None]] = None,
               step: Optional[int] = None, metrics: Any = None, compression: str = "auto",
               chunk_size: Optional[int] = None, threads: int = 0, durable: bool = True,
               max_part_bytes: Optional[int] = None, shuffle: bool = False) -> SaveJob:
    """``treecask.save(path, tree, store=store, ...)`` in the background:
    returns a :class:`SaveJob` once every leaf's bytes are safe from the
    caller (module docstring).

    What is copied: NumPy arrays and every other host value, into the core's
    snapshot. What is not: a ``jax.Array``'s bytes, held as the read-only
    host view ``np.asarray`` gives (module docstring): donating that array
    while the save runs makes jax copy it, and ``x.delete()`` frees it only
    when the save lets go (``tests/python/test_manager.py``).

    Args:
      path, store: where, as for ``treecask.save(path, store=store)``.
      overwrite: replace an existing checkpoint at ``path``. The commit is
        ``Store.save_archive``'s, pre-check included (dead writers' leftovers
        of ``path`` swept; where the store refuses before writing, an
        existing ``path`` refused): that pre-check runs before the snapshot
        and its error is raised here.
      metadata, pool, compression, chunk_size (bytes), threads, durable,
        max_part_bytes (bytes), shuffle: as ``treecask.save``; ``pool`` a
        ``_core.SnapshotPool`` the snapshot buffer comes from.
      meanwhile / after: called on the background thread while the archive
        is written, once the caller has its snapshot (e.g. the sweep of a
        run's dead temporaries), and after the commit (e.g. retention); an
        error of theirs is the save's (the archive is still written and
        committed when ``meanwhile`` fails).
      step, metrics: recorded on the job.

    Raises (here): InvalidArgumentError for a leaf treecask cannot store,
    the errors of the store's pre-check (AlreadyExistsError, IoError...);
    later, from ``SaveJob.wait``: IoError (a full disk...),
    AlreadyExistsError (``path`` committed meanwhile by another writer, or
    refused by a store that checks at the commit: a file system's rename).
    """
    shown = store.display(path)
    job = SaveJob(shown, step=step, metrics=metrics)
    md = dict(metadata or {})
    options = dict(chunk_size=chunk_size, threads=int(threads), max_part_bytes=max_part_bytes,
                   shuffle=bool(shuffle))
    code = compression_code(compression, shown)
    if processes()[1] > 1:  # every process's half of a sharded checkpoint directory (treecask.save's protocol)
        try:
            plan = _distributed.prepare(path, tree, store=store, metadata=md, compression=code,
                                        overwrite=bool(overwrite), durable=bool(durable), snapshot=True, **options)
        except Error as e:
            raise _with_file(e, shown) from None
        held = [functools.partial(_distributed.run, plan)]
        del plan

        def run_all() -> None:
            if meanwhile is not None:
                meanwhile()
            held.pop()()  # the snapshot goes once written, not after retention
            if after is not None:
                after()

        _start(job, run_all)
        return job

    request, objs = SaveRequest.of_tree(shown, tree, before_encode=_start_transfers, compression=code,
                                        metadata=list(md.items()), **options)
    borrowed = [J.is_jax_array(x) for x in objs]
    del objs
    # The store's commit runs on the worker; its write(local, in_place) hands the
    # local path to this thread, which takes the snapshot there and hands back the
    # pending write that the worker then waits for.
    asked: "queue.Queue[Tuple[str, Any, bool]]" = queue.Queue(1)
    given: "queue.Queue[Any]" = queue.Queue(1)
    posted = threading.Event()
    late: List[BaseException] = []  # an error of `meanwhile`

    def post(kind: str, what: Any, in_place: bool = False) -> None:
        posted.set()
        asked.put((kind, what, in_place))

    def write_here(local: str, in_place: bool) -> Any:
        post("write", local, in_place)
        pending = given.get()
        if isinstance(pending, BaseException):
            raise pending
        if meanwhile is not None:
            try:
                meanwhile()
            except BaseException as e:  # raised once the archive is committed
                late.append(e)
        return pending.wait()

    def body() -> None:
        try:
            store.save_archive(path, write_here, overwrite=bool(overwrite))
        except BaseException as e:
            if not posted.is_set():  # failed before the snapshot: the caller raises it
                post("error", e)
                raise _Told() from None
            raise
        if not posted.is_set():
            post("error", InvalidArgumentError(f"{type(store).__name__} committed nothing: its "
                                               "save_archive never called write", file=shown))
            raise _Told()
        if after is not None:
            after()
        if late:
            raise late[0]

    _start(job, body)
    try:
        kind, local, in_place = asked.get()
        if kind == "error":
            raise local
        request.overwrite = bool(overwrite) and in_place
        request.durable = bool(durable) and in_place
        pending = _core.save_async(local, request, borrowed, pool)
    except BaseException as e:  # the snapshot failed, or the caller was interrupted (Ctrl-C)
        given.put(e)  # the worker, if it waits for the snapshot, gives up: nothing is committed
        job.join()
        job.take_error()  # the caller raises it instead
        raise
    given.put(pending)
    return job


class _Told(Exception):
    """A failure already handed to the caller of save_async."""


def _start(job: SaveJob, body: Callable[[], None]) -> None:
    name = f"treecask-save-step-{job.step}" if job.step is not None else "treecask-save"
    job._thread = threading.Thread(target=job._run, args=(body,), name=name, daemon=False)
    job._thread.start()
