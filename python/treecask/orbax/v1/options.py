"""``treecask.orbax.v1.options``: Orbax v1's option classes
(``orbax.checkpoint.v1.options``), field for field with Orbax 0.12.8's
names and defaults, set on a :class:`treecask.orbax.v1.Context`
(``ctx.pytree.loading.partial_load = True``).

What treecask follows: ``PyTreeOptions.Loading.partial_load`` (load only the
abstract tree's fields), ``AsyncOptions.post_finalization_callback`` (called
once an asynchronous save is durable), ``CheckpointLayout.ORBAX`` / ``AUTO``
(a treecask archive). Accepted without effect, as they tune Orbax's own
storage, threads or processes (a treecask archive has its own chunking and
compression; one save is in flight at a time): the other ``AsyncOptions``,
``MultiprocessingOptions``, ``FileOptions``, ``ArrayOptions.Saving``'s
format switches (``use_ocdbt``, ``use_zarr3``, ``use_compression``...),
``PyTreeOptions.Saving``, ``MemoryOptions``, ``PathwaysOptions``,
``DeletionOptions``, ``AtomicityOptions`` (a checkpoint is committed by an
atomic rename), ``CheckpointablesOptions``. Followed as Orbax's:
``ArrayOptions.Saving.storage_options.dtype`` and
``scoped_storage_options_creator`` (each array leaf cast to the dtype before
it is saved), ``ArrayOptions.Loading.enable_padding_and_truncation`` (an
array whose abstract shape differs is truncated or zero-padded to it). Raise
``UnsupportedError`` when a save or load runs with them set:
``storage_options.chunk_byte_size`` / ``shard_axes`` (an archive's chunking is
``treecask.save``'s ``chunk_size``), ``ArrayOptions.Loading.use_load_and_broadcast``,
``CheckpointLayout.SAFETENSORS`` (``treecask.import_safetensors`` converts a
safetensors file).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Callable, Optional

__all__ = ["AsyncOptions", "MultiprocessingOptions", "FileOptions", "PyTreeOptions", "ArrayOptions",
           "CheckpointablesOptions", "PathwaysOptions", "DeletionOptions", "MemoryOptions", "SafetensorsOptions",
           "CheckpointLayout", "AtomicityOptions", "AtomicityMode"]


@dataclasses.dataclass(kw_only=True)
class AsyncOptions:
    """Asynchronous saves (Orbax ``AsyncOptions``): ``post_finalization_callback``
    is called (no arguments) once an asynchronous save is durable;
    ``timeout_secs`` and ``create_directories_asynchronously``: no effect."""

    timeout_secs: int = 1200
    post_finalization_callback: Optional[Callable[[], None]] = None
    create_directories_asynchronously: bool = True


class AtomicityMode(enum.Enum):
    """Orbax's commit protocols; a treecask checkpoint is always committed by an atomic rename."""

    AUTO = "auto"
    ATOMIC_RENAME = "atomic_rename"
    COMMIT_FILE = "commit_file"


@dataclasses.dataclass(kw_only=True)
class AtomicityOptions:
    """Orbax ``AtomicityOptions``: no effect (an atomic rename commits every checkpoint)."""

    mode: AtomicityMode = AtomicityMode.AUTO
    allow_legacy_atomic_rename: bool = False


@dataclasses.dataclass(kw_only=True)
class MultiprocessingOptions:
    """Orbax ``MultiprocessingOptions``: no effect (every jax process takes part, as treecask.save's)."""

    primary_host: Optional[int] = 0
    active_processes: Optional[set] = None
    barrier_sync_key_prefix: Optional[str] = None


@dataclasses.dataclass(kw_only=True)
class FileOptions:
    """Orbax ``FileOptions``: no effect (``path_class``: paths are ``os.PathLike`` or URLs)."""

    path_permission_mode: Optional[int] = None
    path_class: Optional[Any] = None
    skip_sync_file_validations: bool = False


@dataclasses.dataclass(kw_only=True)
class PyTreeOptions:
    """PyTree saving and loading (Orbax ``PyTreeOptions``).

    ``loading.partial_load``: True loads only the fields of the abstract tree
    (the checkpoint's other fields are not read), and a field of the abstract
    tree that the checkpoint lacks comes back as given there (an array or
    scalar; a ``ShapeDtypeStruct`` raises ``StructureError``: no value).
    ``saving.pytree_metadata_options``: no effect."""

    @dataclasses.dataclass(kw_only=True)
    class Saving:
        pytree_metadata_options: Optional[Any] = None

    @dataclasses.dataclass(kw_only=True)
    class Loading:
        partial_load: bool = False

    saving: Saving = dataclasses.field(default_factory=Saving)
    loading: Loading = dataclasses.field(default_factory=Loading)


@dataclasses.dataclass(kw_only=True)
class ArrayOptions:
    """Array saving and loading (Orbax ``ArrayOptions``). The storage format
    switches of ``saving`` have no effect. ``saving.storage_options.dtype``:
    every array leaf is cast to it before saving;
    ``saving.scoped_storage_options_creator(key_path, value)`` (a jax key
    path, the leaf) returns a ``StorageOptions`` whose ``dtype`` overrides it
    for that leaf, or None. ``loading.enable_padding_and_truncation``: an
    array whose abstract leaf's shape differs from the saved one is
    truncated or zero-padded (at the end of each axis) to it.
    ``storage_options.chunk_byte_size`` / ``shard_axes`` and
    ``loading.use_load_and_broadcast`` raise ``UnsupportedError`` when set."""

    @dataclasses.dataclass(kw_only=True)
    class Saving:
        @dataclasses.dataclass(kw_only=True)
        class StorageOptions:
            dtype: Optional[Any] = None
            chunk_byte_size: Optional[int] = None
            shard_axes: Optional[tuple] = None

        storage_options: StorageOptions = dataclasses.field(default_factory=StorageOptions)
        use_ocdbt: bool = True
        use_zarr3: bool = True
        use_compression: bool = True
        ocdbt_target_data_file_size: Optional[int] = None
        enable_pinned_host_transfer: Optional[bool] = None
        enable_post_merge_validation: bool = True
        use_replica_parallel: Optional[bool] = None
        min_slice_bytes_for_replica_parallel: Optional[int] = None
        max_replicas_for_replica_parallel: Optional[int] = None
        enable_replica_parallel_separate_folder: bool = False
        enable_write_sharding_file: bool = True
        array_metadata_store: Optional[Any] = None
        scoped_storage_options_creator: Optional[Callable[..., Any]] = None

    @dataclasses.dataclass(kw_only=True)
    class Loading:
        enable_padding_and_truncation: bool = False
        raise_array_data_missing_error: bool = True
        use_load_and_broadcast: bool = False
        load_and_broadcast_options: Optional[Any] = None

    saving: Saving = dataclasses.field(default_factory=Saving)
    loading: Loading = dataclasses.field(default_factory=Loading)


@dataclasses.dataclass(kw_only=True)
class CheckpointablesOptions:
    """Orbax ``CheckpointablesOptions`` (a handler registry): no effect; every
    checkpointable is a pytree of what :func:`treecask.save` takes."""

    registry: Optional[Any] = None


@dataclasses.dataclass(kw_only=True)
class PathwaysOptions:
    """Orbax ``PathwaysOptions``: no effect."""

    checkpointing_impl: Optional[Any] = None


@dataclasses.dataclass(kw_only=True)
class DeletionOptions:
    """Orbax ``DeletionOptions``: no effect (a deleted step is removed)."""

    @dataclasses.dataclass(kw_only=True)
    class GcsDeletionOptions:
        todelete_full_path: Optional[str] = None

    gcs_deletion_options: GcsDeletionOptions = dataclasses.field(default_factory=GcsDeletionOptions)


@dataclasses.dataclass(kw_only=True)
class MemoryOptions:
    """Orbax ``MemoryOptions``: no effect (treecask's asynchronous save copies
    NumPy leaves once and holds jax.Array leaves as read-only views)."""

    write_concurrent_bytes: Optional[int] = None
    read_concurrent_bytes: Optional[int] = None
    transfer_concurrent_bytes: Optional[int] = None
    regulator_options: Optional[Any] = None
    expected_surge_bytes: Optional[Any] = None
    is_prioritized_key_fn: Optional[Callable[..., Any]] = None
    serialization_status_callback: Optional[Any] = None
    deepcopy_host_arrays: bool = True


@dataclasses.dataclass(kw_only=True)
class SafetensorsOptions:
    """Orbax ``SafetensorsOptions``: no effect (the safetensors layout is not supported)."""

    max_over_read_ratio: Optional[float] = None
    read_chunk_bytes: Optional[int] = None


class CheckpointLayout(enum.Enum):
    """A checkpoint's layout (Orbax ``CheckpointLayout``): ORBAX and AUTO are a
    treecask archive here; SAFETENSORS raises ``UnsupportedError``."""

    ORBAX = "orbax"
    SAFETENSORS = "safetensors"
    AUTO = "auto"
