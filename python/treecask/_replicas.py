"""Replicas share the work of a multi-process checkpoint (docs/python.md
"Multi-process save and restore"; the format is unchanged: format/SPEC.md
"Sharded checkpoints" lets a leaf's boxes be any set that tiles it).

* Replica-parallel save (:func:`assign_boxes`, :func:`my_boxes`): each
  distinct box is split among the processes holding a replica of it, as runs
  of elements in C order cut on the coarsest row boundary that keeps parts
  within 1.25x of each other (:func:`split_box`), each written as the few
  boxes it covers, views of the device buffer; boxes under
  ``k x MIN_PART_BYTES`` go whole to the holder with the fewest bytes so far.
  Every process computes the same assignment from shardings and shapes alone.
* Single-read restore (:func:`read_once_sharding`, :func:`place_read_once`):
  each process reads a 1/k part of each replicated target block (the blocks
  of an intermediate sharding), then one jitted all-gather gives every
  device its whole block.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import _dtypes
from . import _jaxutil as J
from .errors import Error

Box = Tuple[Tuple[int, ...], Tuple[int, ...]]

# A replicated box is split among its k holders only when each part gets at least this many
# bytes: below, the box is written whole by one holder (fewer, larger leaves in the shard files).
MIN_PART_BYTES = 16 << 10
# A leaf smaller than this is read by every process that places it, as without single read: a
# single-read placement costs a collective per leaf (milliseconds), and such leaves (biases,
# norms, counters) are a small share of a model's bytes.
READ_ONCE_MIN_BYTES = 64 << 10
# The largest ratio of two parts' sizes split_box accepts before cutting on a finer row boundary.
BALANCE = 1.25

# Raw bytes this process has read to place leaves onto shardings (Reader.place, whichever way),
# for the tests and benchmarks: what single-read restore bounds.
placed_bytes = 0


# ---- splitting a box --------------------------------------------------------------------


def split_box(shape: Sequence[int], k: int) -> List[List[Box]]:
    """Splits the box ``[0, shape)`` into ``k`` parts of about equal element
    counts: part ``r`` is the run of elements ``[c_r, c_{r+1})`` in C order,
    where the cuts fall on multiples of the largest row size
    ``prod(shape[d+1:])`` that keeps the parts within BALANCE of each other
    (single elements at worst), given as the boxes ``(start, stop)`` that
    tile the run: at most ``2d + 1`` of them, each C-contiguous in the box.
    A part with no element is an empty list; a 0-d box is one part."""
    shape = tuple(int(n) for n in shape)
    total = math.prod(shape)
    if not shape or total == 0 or k <= 1:
        return [[((0,) * len(shape), shape)]] + [[] for _ in range(max(0, k - 1))]
    d = len(shape) - 1
    for axis in range(len(shape)):
        units = math.prod(shape[:axis + 1])
        if units % k == 0 or units // k * BALANCE >= -(-units // k):
            d = axis
            break
    units = math.prod(shape[:d + 1])
    cuts = [r * units // k for r in range(k + 1)]
    rest = shape[d + 1:]
    return [[(s + (0,) * len(rest), e + rest) for s, e in _run_boxes(cuts[r], cuts[r + 1], shape[:d + 1])]
            for r in range(k)]


def _run_boxes(a: int, b: int, dims: Tuple[int, ...]) -> List[Box]:
    """The boxes over the grid ``dims`` that tile the C-order run of cells ``[a, b)``."""
    if a >= b:
        return []
    if len(dims) == 1:
        return [((a,), (b,))]
    inner = math.prod(dims[1:])
    ra, oa = divmod(a, inner)
    rb, ob = divmod(b, inner)

    def within(row: int, lo: int, hi: int) -> List[Box]:
        return [((row,) + s, (row + 1,) + e) for s, e in _run_boxes(lo, hi, dims[1:])]

    if ra == rb:
        return within(ra, oa, ob)
    out: List[Box] = []
    if oa:
        out += within(ra, oa, inner)
        ra += 1
    if rb > ra:
        out.append(((ra,) + (0,) * (len(dims) - 1), (rb,) + dims[1:]))
    if ob:
        out += within(rb, 0, ob)
    return out


def box_of(index: Any, shape: Tuple[int, ...]) -> Box:
    """(start, stop) of a device's index over an array of ``shape`` (a tuple
    of step-1 slices, as ``Sharding.devices_indices_map`` gives it)."""
    index = tuple(index) if isinstance(index, tuple) else (index,)
    index = index + (slice(None),) * (len(shape) - len(index))
    bounds = [sl.indices(n)[:2] for sl, n in zip(index, shape)]
    return tuple(b for b, _ in bounds), tuple(max(b, e) for b, e in bounds)


# ---- replica-parallel save ---------------------------------------------------------------

@functools.lru_cache(maxsize=1024)
def holders(sharding: Any, shape: Tuple[int, ...]) -> List[Tuple[Box, Tuple[int, ...]]]:
    """Every distinct box of ``sharding`` over ``shape`` (sorted) with the
    sorted process indices of the devices that hold it; the same list in
    every process (global facts only)."""
    by_box: Dict[Box, set] = {}
    for dev, index in sharding.devices_indices_map(shape).items():
        by_box.setdefault(box_of(index, shape), set()).add(int(dev.process_index))
    return sorted((box, tuple(sorted(p))) for box, p in by_box.items())


def assign_boxes(sharding: Any, shape: Tuple[int, ...], itemsize: int,
                 loads: Dict[int, int]) -> List[Tuple[int, Box, Box]]:
    """Who writes what of one global array (module docstring):
    ``(process, box, part)`` for every part of every distinct box of
    ``sharding`` over ``shape``, ``part`` in the global array's coordinates
    and inside ``box``, the parts of each box tiling it. ``loads`` (bytes
    assigned to each process so far, updated) carries the balance from leaf
    to leaf; called in the same order in every process it gives the same
    answer everywhere."""
    out: List[Tuple[int, Box, Box]] = []
    for box, procs in holders(sharding, shape):
        start, stop = box
        extent = tuple(e - b for b, e in zip(start, stop))
        nbytes = math.prod(extent) * itemsize
        k = len(procs)
        if k > 1 and nbytes >= k * MIN_PART_BYTES:
            for p, part in zip(procs, split_box(extent, k)):
                for s, e in part:
                    loads[p] = loads.get(p, 0) + math.prod(b - a for a, b in zip(s, e)) * itemsize
                    out.append((p, box, (tuple(a + o for a, o in zip(s, start)),
                                         tuple(b + o for b, o in zip(e, start)))))
        else:
            p = min(procs, key=lambda q: (loads.get(q, 0), q))
            loads[p] = loads.get(p, 0) + nbytes
            out.append((p, box, box))
    return out


def my_boxes(arr: Any, pid: int, loads: Dict[int, int]) -> List[Tuple[Box, np.ndarray]]:
    """The parts of global jax.Array ``arr`` that process ``pid`` writes
    (:func:`assign_boxes`), each as ``((start, stop), host array)``: on CPU a
    C-contiguous read-only view of a local device's buffer (no copy), on
    other platforms that part alone copied to the host."""
    shape = tuple(int(n) for n in arr.shape)
    local: Dict[Box, Any] = {}
    for sh in arr.addressable_shards:
        local.setdefault(box_of(sh.index, shape), sh.data)
    return [(part, _host_part(local[box], box, part))
            for p, box, part in assign_boxes(arr.sharding, shape, np.dtype(arr.dtype).itemsize, loads) if p == pid]


def _host_part(data: Any, box: Box, part: Box) -> np.ndarray:
    """The elements ``part`` of the device buffer ``data`` holding ``box``, on the host."""
    sl = tuple(slice(a - o, b - o) for a, b, o in zip(part[0], part[1], box[0]))
    if part == box:
        return np.asarray(data)
    if all(d.platform == "cpu" for d in data.devices()):
        return np.asarray(data)[sl]  # a view of the buffer
    return np.asarray(data[sl])  # slice on the device, copy only the part


# ---- single-read restore -----------------------------------------------------------------


def read_once_sharding(sharding: Any, shape: Tuple[int, ...], dtype_name: str) -> Optional[Any]:
    """The intermediate sharding of a single-read placement of an array of
    ``shape`` and dtype ``dtype_name`` onto ``sharding`` (module docstring),
    or None when each process reads its own blocks (as without single read):
    one process; not a NamedSharding; a 0-d, empty or packed sub-byte array,
    one of 64-bit elements without ``jax_enable_x64``, or one of fewer than
    READ_ONCE_MIN_BYTES; no block of the target held by more than one
    process; a target that does not divide the shape; or no replicated mesh
    axis whose size divides what is left of a dimension's block. The mesh axes the target replicates over
    are added, in mesh order, to the outermost dimension whose block they
    divide (so that a process's part is a run of rows, as a replica-parallel
    save wrote it)."""
    jax = J.jax_loaded()
    if jax is None or jax.process_count() <= 1 or not isinstance(sharding, jax.sharding.NamedSharding):
        return None
    if not shape or math.prod(shape) == 0 or dtype_name in _dtypes.PACKED:
        return None
    dtype = _dtypes.to_numpy(dtype_name)
    if (_carrier(dtype) is None or math.prod(shape) * dtype.itemsize < READ_ONCE_MIN_BYTES
            or getattr(sharding, "is_fully_addressable", True)
            or max(len(p) for _, p in holders(sharding, shape)) <= 1):
        return None
    mesh = sharding.mesh
    sizes = dict(mesh.shape)
    spec = list(sharding.spec) + [None] * (len(shape) - len(sharding.spec))
    axes = [[] if s is None else [s] if isinstance(s, str) else list(s) for s in spec]
    factors = [math.prod(sizes[a] for a in ax) for ax in axes]
    if any(n % f for n, f in zip(shape, factors)):
        return None
    blocks = [n // f for n, f in zip(shape, factors)]
    used = {a for ax in axes for a in ax}
    for a in (a for a in mesh.axis_names if a not in used and sizes[a] > 1):
        d = next((d for d in range(len(shape)) if blocks[d] % sizes[a] == 0), None)
        if d is not None:
            axes[d].append(a)
            blocks[d] //= sizes[a]
    if {a for ax in axes for a in ax} == used:  # no replicated axis added
        return None
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*J.lists_to_spec(axes)))


_collectives_work: Optional[bool] = None


def _carrier(dtype: np.dtype) -> Optional[np.dtype]:
    """The dtype that carries ``dtype``'s bits unchanged through XLA (an unsigned int of its
    width: XLA may compute bfloat16 in float32 and quiet a NaN's payload; bool and the
    integers themselves), or None when jax cannot hold it (64-bit without jax_enable_x64)."""
    import jax

    dtype = np.dtype(dtype)
    if (dtype.itemsize == 8 and not jax.config.jax_enable_x64) or dtype.itemsize not in (1, 2, 4, 8):
        return None
    if dtype == np.bool_ or (dtype.kind in "iu" and dtype.type.__module__ == "numpy"):
        return dtype
    return np.dtype(f"uint{8 * dtype.itemsize}")


@functools.lru_cache(maxsize=256)
def _reshard(target: Any, flags: Any, dtype: np.dtype) -> Tuple[Any, Any]:
    """The jitted move of (parts as the carrier, flags) onto (``target``, the flags'
    maximum) and the jitted bitcast to ``dtype`` (None when not needed): two programs,
    so that XLA cannot move the bitcast before the all-gather."""
    import jax
    import jax.numpy as jnp

    replicated = jax.sharding.NamedSharding(flags.mesh, jax.sharding.PartitionSpec())
    move = jax.jit(lambda x, ok: (x, jnp.max(ok)), out_shardings=(target, replicated))
    cast = (jax.jit(lambda x: jax.lax.bitcast_convert_type(x, dtype), out_shardings=target, donate_argnums=0)
            if _carrier(dtype) != dtype else None)
    return move, cast


def place_read_once(read_boxes: Callable[[List[Box]], Dict[Box, np.ndarray]], shape: Tuple[int, ...],
                    dtype: np.dtype, sharding: Any, inter: Any, *, file: str = "",
                    key_path: str = "") -> Optional[Any]:
    """The leaf as a jax.Array on ``sharding``, each process reading only
    its blocks of the intermediate sharding ``inter``
    (:func:`read_once_sharding`) with ``read_boxes`` (boxes -> {box: fresh
    array of it}), then one jitted reshard that also agrees whether every
    process read its part. Must be called for the same leaves in the same
    order in every process (a collective). Raises, in every process, what
    the read raised in this one, or an Error naming a process whose read
    failed; returns None, once and for all, when the job's collectives do
    not run (each process then reads as without single read)."""
    global _collectives_work
    import jax

    if _collectives_work is False:
        return None
    wanted = sorted({box_of(index, shape) for index in inter.addressable_devices_indices_map(shape).values()})
    failed: Optional[BaseException] = None
    try:
        boxes = read_boxes(wanted)
    except Exception as e:  # noqa: BLE001 -- the others still take part in the collective, then all raise
        failed = e
        boxes = {b: np.zeros(tuple(hi - lo for lo, hi in zip(*b)), dtype) for b in wanted}
    mesh = inter.mesh
    P = jax.sharding.PartitionSpec
    flags = jax.sharding.NamedSharding(mesh, P(tuple(mesh.axis_names)))
    mine = np.full((1,), jax.process_index() + 1 if failed is not None else 0, np.int32)
    carrier = _carrier(dtype)
    parts = jax.make_array_from_callback(shape, inter, lambda index: boxes[box_of(index, shape)].view(carrier),
                                         dtype=carrier)
    ok = jax.make_array_from_callback((mesh.size,), flags, lambda index: mine)
    try:
        move, cast = _reshard(sharding, flags, np.dtype(dtype))
        out, bad = move(parts, ok)
        bad = int(np.asarray(bad.addressable_data(0)))
    except Exception:
        if _collectives_work is None and failed is None:  # the first collective: the job has none
            _collectives_work = False
            return None
        raise
    _collectives_work = True
    parts = boxes = None  # this leaf's parts go now, before the next leaf's are read
    if failed is not None:
        raise failed
    if bad:
        raise Error(f"process {bad - 1} failed to read its part of this leaf (its own error says why)",
                    file=file, key_path=key_path)
    return out if cast is None else cast(out)
