"""save(): one pytree -> one archive file (or, in a multi-process jax job, a
sharded checkpoint directory; ``_distributed.py``)."""

from __future__ import annotations

from typing import Any, Mapping, Optional

import treecask._core as _core

from . import stores
from ._request import SaveRequest, compression_code, metadata_items
from ._types import PathLike, SaveStats
from .errors import Error, _with_file

def save(path: PathLike, tree: Any, *, metadata: Optional[Mapping[str, str]] = None,
         compression: str = "auto", overwrite: bool = False, chunk_size: Optional[int] = None,
         threads: int = 0, durable: bool = True, max_part_bytes: Optional[int] = None,
         shuffle: bool = False, storage_options: Optional[Mapping[str, Any]] = None,
         store: Optional[stores.Store] = None, _leaf_extras: Optional[Mapping[str, Any]] = None) -> SaveStats:
    """Saves a pytree as one archive file, atomically.

    In a ``jax.distributed`` job of more than one process, call it the same
    way in every process: ``path`` becomes a sharded checkpoint directory
    (``index.cask`` + ``process_<k>.cask``; format 3.1), each process writing
    its share of the boxes, committed atomically across processes
    (docs/python.md "Multi-process save and restore"). An error in any
    process is raised in every process.

    ``path`` may be the URL of an object in a store (``s3://``, ``gs://``,
    ``az://``): written to local scratch, uploaded in parallel parts and
    committed whole, never replacing an existing object without
    ``overwrite`` (docs/remote.md "Saving to object stores"). ``store`` (a
    :class:`treecask.stores.Store`) saves to ``path`` inside it, committed by
    the store (docs/stores.md).

    Args:
      path: the archive file to create (written to a temporary file in the same
        directory and renamed into place when complete), or a URL (above),
        or the path inside ``store``.
      tree: any pytree of arrays (``numpy.ndarray``, ``jax.Array`` -- sharded
        ones are gathered --, NumPy scalars), Python ``int`` / ``float`` /
        ``bool`` / ``complex`` / ``str`` and ``None``, in dicts, lists, tuples,
        namedtuples and (with jax) any registered pytree node (dataclasses,
        ``eqx.Module``, ``flax.struct``, ``TrainState``, optax states, Flax /
        Penzai boxes). Callables (e.g. activation functions) are not saved:
        they are recorded as None and restored from ``like``. Dtypes: bool,
        (u)int8..64, float16/32/64, complex64/128, bfloat16, the float8
        types, and the sub-byte int2/uint2, int4/uint4, float4_e2m1fn and
        float6 types (packed in the file); the full table is docs/python.md
        "Dtypes" (SPEC.md "Dtypes").
      metadata: archive-level ``str -> str`` key-values.
      compression: "auto" (LZ4 where it saves >= 10%; such leaves are not
        zero-copy readable), "none" (always raw, zero-copy) or "lz4".
      overwrite: replace an existing file at ``path``.
      chunk_size: raw bytes per checksum/compression chunk (a multiple of 64 in
        [4096, 64 MiB]; default 1 MiB).
      threads: compression/hashing threads (0: all cores).
      durable: fsync the file and its directory before returning.
      max_part_bytes: advanced: the largest zero-copy piece of a raw leaf (a
        multiple of chunk_size, at most 1 GiB, the default); larger leaves are
        stored in several parts and read by copy.
      storage_options: for a URL, the object store's configuration (obstore
        config keys), overriding the environment's (as :func:`treecask.open`).
      shuffle: byte-shuffle each chunk of the LZ4-coded leaves whose dtype has
        2, 4, 8 or 16 bytes per element before compressing it (Blosc's
        shuffle; SPEC.md "Filters"): bf16/fp32 weights, which plain LZ4 barely
        shrinks, then compress. Use with ``compression="lz4"`` (or "auto",
        whose probe then tries shuffled samples). The file is format 2.0, which
        treecask 0.1 refuses (VersionError); without it, format 1.0.

    Returns:
      SaveStats (file size, raw and stored bytes, leaf and blob counts).

    Raises:
      InvalidArgumentError: an unsupported leaf type or dtype, a non-str key
        path component that is empty, duplicate key paths, bad metadata or
        options (the message names the key path).
      AlreadyExistsError: ``path`` exists and ``overwrite`` is False (for a
        URL, also when another saver commits the same object first).
      NotFoundError: the parent directory, or the bucket, does not exist.
      IoError: the OS refused (e.g. ENOSPC), or the store did (access denied,
        failures left after bounded retries: 503 SlowDown, dropped
        connections); any previous file or object is untouched.
      UnsupportedError: a URL scheme that cannot be written (``http(s)://``,
        or one treecask does not serve).
    """
    loc = stores.resolve(path, store, storage_options)  # resolved once: everything below receives it
    p = loc.shown
    code = compression_code(compression, p)
    md = metadata_items(metadata, p)
    # ---- multi-process (jax.distributed, > 1 process): a sharded checkpoint directory ----
    from . import _distributed

    if _distributed.active():
        try:
            # prepare then run in this thread: the tree is this call's argument, unchanged meanwhile
            return _distributed.run(_distributed.prepare(
                loc, tree, metadata=dict(md), compression=code, overwrite=bool(overwrite), chunk_size=chunk_size,
                threads=int(threads), durable=bool(durable), max_part_bytes=max_part_bytes, shuffle=bool(shuffle)))
        except Error as e:
            raise _with_file(e, p) from None

    def write(local: str, in_place: bool) -> SaveStats:
        request, _ = SaveRequest.of_tree(
            local, tree, leaf_extras=_leaf_extras, compression=code, chunk_size=chunk_size, threads=int(threads),
            overwrite=bool(overwrite) and in_place, durable=bool(durable) and in_place, metadata=md,
            max_part_bytes=max_part_bytes, shuffle=bool(shuffle))
        stats = _core.save(local, request)
        return SaveStats(**{k: int(v) for k, v in stats.items()})

    # In place (a local file: the core's commit), or local scratch then the store's commit.
    return loc.store.save_archive(loc.path, write, overwrite=bool(overwrite))
