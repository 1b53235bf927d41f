"""treecask.import_safetensors / export_safetensors: Hugging Face safetensors
layouts (one file, or the Hub's sharded directory) <-> one archive.

Thin layers over the C++ routines the ``treecask`` tool runs
(src/interop/convert.h, linked into the extension as the treecask_interop
library): the parsing, validation and writing happen there, once, for both.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Tuple, Union

import treecask._core as _core
from .. import stores
from .._request import compression_code
from .._types import PathLike, SaveStats
from ..errors import InvalidArgumentError


#: Archive metadata key holding a sharded checkpoint's index "metadata" (JSON).
HF_INDEX_METADATA = "treecask.hf.index_metadata"
#: Archive metadata key holding each shard's __metadata__ (JSON) when the shards differ.
HF_SHARD_METADATA = "treecask.hf.shard_metadata"


@dataclass(frozen=True)
class SafetensorsImport:
    """What ``import_safetensors`` read: ``kind`` "safetensors" (one file) or
    "sharded safetensors", ``index`` the index file ("" for one file),
    ``files`` the .safetensors files in leaf order, ``stats`` the archive written."""

    kind: str
    index: str
    files: Tuple[str, ...]
    stats: SaveStats


@dataclass(frozen=True)
class SafetensorsExport:
    """What ``export_safetensors`` wrote: the ``index`` path, the ``shards``
    paths in order, the tensor count and ``total_size`` (tensor data bytes,
    the index's ``metadata.total_size``)."""

    index: str
    shards: Tuple[str, ...]
    num_tensors: int
    total_size: int


def parse_size(size: Union[int, str]) -> int:
    """Bytes for a Hub size: an int is bytes; a str as transformers'
    ``convert_file_size_to_int`` reads it ("5GB", "100KB", "500MB" decimal,
    "1GiB" binary, units case-insensitive, "5Gb" in bits; fractions such as
    "1.5GB" allowed as huggingface_hub allows them). Raises
    InvalidArgumentError for anything else or a size under one byte."""
    if isinstance(size, bool) or not isinstance(size, (int, str)):
        raise InvalidArgumentError(f"max_shard_size must be an int or a str, got {type(size).__name__}")
    if isinstance(size, int):
        if not 1 <= size < 2**63:
            raise InvalidArgumentError(f"max_shard_size must be in [1, 2**63) bytes, got {size}")
        return size
    return int(_core.parse_size(size))


def import_safetensors(src: PathLike, dst: PathLike, *, compression: str = "auto",
                       chunk_size: Optional[int] = None, threads: int = 0, shuffle: bool = False,
                       overwrite: bool = False, durable: bool = True) -> SafetensorsImport:
    """Writes every tensor of a safetensors checkpoint into one archive (a flat
    dict keyed by tensor name), as ``treecask import SRC DST`` does.

    ``src`` is a ``.safetensors`` file, a ``*.safetensors.index.json`` or a
    directory holding them; metadata kept and files validated as
    docs/python.md "Hugging Face safetensors checkpoints" says. ``dst`` may be
    the URL of an object store (committed as ``treecask.save`` commits to a
    store). The other arguments are ``treecask.save``'s. Returns
    SafetensorsImport.

    Raises:
      NotFoundError: ``src``, or a shard the index names, does not exist
        (``.file`` names it).
      CorruptionError: a damaged or malformed ``.safetensors`` file (one
        file or a shard): a bad header length, a header that is not JSON,
        offsets out of range, holes or overlaps, an unknown dtype, an F4 /
        F6_* tensor whose elements do not fill whole bytes (``.file`` names
        the file, ``.key_path`` the tensor where there is one). (Every
        safetensors 0.8 dtype has a treecask dtype; F4, F6_*, F8_E8M0 and the
        FNUZ float8s make a format 4.0 archive.)
      InvalidArgumentError: a malformed index; a tensor found in two shards,
        in a shard other than the index says, or absent from the index; an
        index entry no shard holds (``.file`` names the file, ``.key_path``
        the tensor); a directory with several candidates; a bad option.
      AlreadyExistsError: ``dst`` exists and ``overwrite`` is False.
    """
    loc = stores.resolve(dst)  # a file path, or a URL: written to local scratch and committed by its store
    code = compression_code(compression, loc.shown)

    def write(local: str, in_place: bool) -> dict:
        return _core.import_safetensors(os.fspath(src), local, code, chunk_size, int(threads), bool(shuffle),
                                        bool(overwrite) and in_place, bool(durable) and in_place)

    r = loc.store.save_archive(loc.path, write, overwrite=bool(overwrite))
    return SafetensorsImport(kind=r["kind"], index=r["index"], files=tuple(r["files"]),
                             stats=SaveStats(**{k: int(v) for k, v in r["stats"].items()}))


def export_safetensors(src: PathLike, dst: PathLike, *, max_shard_size: Union[int, str] = "5GB",
                       overwrite: bool = False) -> SafetensorsExport:
    """Writes ``src`` (an archive file, or a sharded checkpoint directory)
    into directory ``dst`` in the Hugging Face Hub layout, as ``treecask
    export SRC DST --max-shard-size SIZE`` does: shards of at most
    ``max_shard_size`` tensor data bytes (``parse_size``; default "5GB") and
    ``model.safetensors.index.json``, tensors named by a flat dict's keys (else
    key paths) and packed greedily in leaf order, the index renamed last (docs/python.md "Hugging Face
    safetensors checkpoints"). Importing ``dst`` again gives the same archive
    content.

    Raises:
      AlreadyExistsError: a file to write exists and ``overwrite`` is False
        (nothing is written).
      UnsupportedError: a leaf safetensors cannot hold (complex128, int2,
        uint2, int4, uint4, float8_e3m4, float8_e4m3, float8_e4m3b11fnuz,
        float4/float6 leaves whose elements do not fill whole bytes, Python
        scalar or str leaves), naming it.
      InvalidArgumentError: a bad ``max_shard_size``.
      What ``treecask.open`` and reading raise for ``src``; IoError.
    """
    r = _core.export_safetensors(os.fspath(src), os.fspath(dst), parse_size(max_shard_size), bool(overwrite))
    return SafetensorsExport(index=r["index"], shards=tuple(r["shards"]), num_tensors=int(r["num_tensors"]),
                             total_size=int(r["total_size"]))
