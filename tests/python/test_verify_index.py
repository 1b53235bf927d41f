"""Verifying the index of a sharded checkpoint verifies the checkpoint (SPEC.md
"Sharded checkpoints"): ``treecask.open(DIR / "index.cask").verify()`` and
``treecask verify DIR/index.cask`` open the shard files beside the index, check
that each is the file the index binds (R9), holds its boxes (R6) and that the
boxes tile every leaf (R7), then check every chunk -- never "intact" for bytes
they never read.

The checkpoints are copies of the golden vector ``format/vectors/v3_1_bound``
(an index bound to two shard files) and ``bad_v3_1_stale_shard`` (the same
layout, another save), damaged in each way a copy of a directory can be.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import treecask
from treecask import _core
from treecask._distributed import _flat_nodes
from treecask._request import SaveRequest

VECTORS = Path(__file__).resolve().parents[2] / "format" / "vectors"
CLI = os.environ.get("TREECASK_CLI")


@pytest.fixture
def ckpt(tmp_path):
    d = tmp_path / "ckpt"
    shutil.copytree(VECTORS / "v3_1_bound", d)
    return d


def verify_index(d: Path):
    """What the Python package's verify of the index returns."""
    with treecask.open(d / "index.cask") as a:
        assert isinstance(a, treecask.Archive)
        return a.verify()


def cli_verify(path: Path):
    if not CLI:
        return None
    return subprocess.run([CLI, "verify", str(path)], capture_output=True, text=True, timeout=60)


def test_intact_index_verifies_every_shard_file(ckpt):
    assert verify_index(ckpt) == []
    r = cli_verify(ckpt / "index.cask")
    if r is not None:
        assert r.returncode == 0, r
        assert "OK: 3 leaves in 2 shard files, shards tile every leaf, 220 raw bytes verified" in r.stdout, r


def test_index_alone_is_not_found_naming_a_shard_file(tmp_path, ckpt):
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(ckpt / "index.cask", alone / "index.cask")
    with pytest.raises(treecask.NotFoundError) as e:
        verify_index(alone)
    assert e.value.file == str(alone / "process_0.cask")
    r = cli_verify(alone / "index.cask")
    if r is not None:
        assert r.returncode == 2, r
        assert f"treecask: {alone / 'process_0.cask'}: not found" in r.stderr, r


def test_missing_shard_file_is_not_found_naming_it(ckpt):
    os.remove(ckpt / "process_1.cask")
    with pytest.raises(treecask.NotFoundError) as e:
        verify_index(ckpt)
    assert e.value.file == str(ckpt / "process_1.cask")
    r = cli_verify(ckpt / "index.cask")
    if r is not None:
        assert r.returncode == 2 and str(ckpt / "process_1.cask") in r.stderr, r


def test_shard_file_of_another_save_is_corruption_naming_it(ckpt):
    shutil.copy(VECTORS / "bad_v3_1_stale_shard" / "process_1.cask", ckpt / "process_1.cask")
    with pytest.raises(treecask.CorruptionError) as e:
        verify_index(ckpt)
    assert e.value.file == str(ckpt / "process_1.cask")
    assert "not the shard file this checkpoint was committed with" in str(e.value)
    r = cli_verify(ckpt / "index.cask")
    if r is not None:
        assert r.returncode == 5 and "not the shard file this checkpoint was committed with" in r.stderr, r


def test_overlapping_boxes_are_corruption_naming_the_index(ckpt):
    # An index of one leaf "w" (int32 [6, 8]) over the four boxes of params/w, one of them moved
    # from [0:3, 4:8] to [0:3, 3:7]: inside the shape, element counts adding up, but overlapping.
    refs = [tuple(r) for r in _core.Archive.open(str(ckpt / "index.cask"), True, True).leaf(0)["shards"]]
    assert [(list(r[2]), list(r[3])) for r in refs][1] == ([0, 4], [3, 8])
    refs[1] = (refs[1][0], refs[1][1], (0, 3), (3, 7))
    bound = [_core.Archive.open(str(ckpt / n), True, True).manifest_fingerprint
             for n in ("process_0.cask", "process_1.cask")]
    request = SaveRequest(_flat_nodes(["w"]), ["w"], [0], ["int32"], [(6, 8)], [np.empty(0, np.uint8)],
                          {0: ((), None, [], refs)}, threads=1, overwrite=True, shard_files=bound)
    _core.save(str(ckpt / "index.cask"), request)
    with pytest.raises(treecask.CorruptionError) as e:
        verify_index(ckpt)
    assert e.value.file == str(ckpt / "index.cask")
    assert e.value.key_path == "w"
    assert "overlap" in str(e.value)
    r = cli_verify(ckpt / "index.cask")
    if r is not None:
        assert r.returncode == 5 and "overlap" in r.stderr, r


def test_bit_flip_in_a_shard_file_is_a_checksum_error_naming_it(ckpt):
    shard = ckpt / "process_0.cask"
    with treecask.open(shard) as a:
        key = next(k for k in a.keys() if k.startswith("params~1w"))
        box = a.read(key)
    data = bytearray(shard.read_bytes())
    at = data.find(box.tobytes())
    assert at > 0
    data[at + 5] ^= 0x10
    shard.write_bytes(bytes(data))
    errors = verify_index(ckpt)
    assert len(errors) == 1
    assert isinstance(errors[0], treecask.ChecksumError)
    assert errors[0].file == str(shard) and errors[0].key_path == key
    r = cli_verify(ckpt / "index.cask")
    if r is not None:
        assert r.returncode == 5, r
        assert f"DAMAGED {shard}: {key}: checksum mismatch" in r.stdout, r
