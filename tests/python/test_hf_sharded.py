"""Hugging Face sharded safetensors: treecask.import_safetensors /
export_safetensors and `treecask import DIR` / `treecask export --max-shard-size`
(one C++ implementation, src/interop/convert.h). Shards are read back with the
`safetensors` package itself; checkpoints to import are written with it."""

import json
import os
import pathlib
import subprocess

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open

import treecask
from conftest import bits

CLI = os.environ.get("TREECASK_CLI")
MODEL = pathlib.Path(__file__).resolve().parents[2] / ".cache" / "models" / "model.safetensors"


def tensors():
    """Several dtypes and shapes (a scalar, an empty tensor), insertion = archive order."""
    rng = np.random.default_rng(0)
    return {
        "embed.weight": rng.standard_normal((16, 8)).astype(np.float32),        # 512 bytes
        "layer.0.attn.q": rng.standard_normal((8, 8)).astype(ml_dtypes.bfloat16),  # 128
        "layer.0.attn.k": rng.standard_normal((8, 8)).astype(np.float16),       # 128
        "layer.0.norm": np.array(1.5, np.float32),                           # 4
        "layer.0.mask": rng.integers(0, 2, size=(10,)).astype(np.bool_),         # 10
        "layer.1.q8": rng.integers(-128, 127, size=(7, 9), dtype=np.int8),       # 63
        "layer.1.f8": rng.standard_normal(33).astype(ml_dtypes.float8_e4m3fn),   # 33
        "layer.1.ids": rng.integers(0, 2**62, size=(5,), dtype=np.uint64),       # 40
        "layer.1.empty": np.zeros((0, 3), np.float32),                           # 0
        "lm_head": rng.standard_normal((4, 50)).astype(np.float32),              # 800 > max
        "final.bias": rng.standard_normal(20).astype(np.float64),               # 160
    }


# safetensors.numpy cannot write or read float8 (it looks the dtype up on numpy):
# these few lines write and read such tensors as the format defines them.
_ST_DTYPES = {np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3", np.dtype(ml_dtypes.bfloat16): "BF16",
              np.dtype(np.float16): "F16", np.dtype(np.float32): "F32", np.dtype(np.float64): "F64",
              np.dtype(np.bool_): "BOOL", np.dtype(np.int8): "I8", np.dtype(np.uint64): "U64"}


def write_safetensors(path, ts, metadata=None):
    header, offset = {}, 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for k, v in ts.items():
        header[k] = {"dtype": _ST_DTYPES[v.dtype], "shape": list(v.shape), "data_offsets": [offset, offset + v.nbytes]}
        offset += v.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(bits(v).tobytes() for v in ts.values()))


def raw_tensor(path, name):
    """(dtype name, shape, bytes) of one tensor, read by the format's definition."""
    data = pathlib.Path(path).read_bytes()
    n = int.from_bytes(data[:8], "little")
    e = json.loads(data[8:8 + n])[name]
    b, end = e["data_offsets"]
    return e["dtype"], tuple(e["shape"]), data[8 + n + b:8 + n + end]


def make_archive(path, ts=None, metadata=None):
    """A flat-dict archive with the tensors in the given order (import keeps
    file order; treecask.save would sort dict keys)."""
    ts = tensors() if ts is None else ts
    st = path.with_suffix(".safetensors")
    write_safetensors(st, ts, metadata)
    treecask.import_safetensors(st, path)
    return ts


def leaves(path):
    """[(key path, dtype name, shape, bytes)] and metadata of an archive, in leaf order."""
    with treecask.open(path) as a:
        out = []
        for k in a.keys():
            i = a.info(k)
            out.append((k, i.dtype_name, i.shape, bytes(bits(a[k]))))
        return out, a.metadata


def read_shard(path):
    """({name: array}, __metadata__) read with safetensors.safe_open (float8 by raw_tensor)."""
    out = {}
    with safe_open(str(path), "np") as f:
        for k in f.keys():
            dt, shape, raw = raw_tensor(path, k)
            if dt == "F8_E4M3":
                out[k] = np.frombuffer(raw, ml_dtypes.float8_e4m3fn).reshape(shape)
            else:
                out[k] = f.get_tensor(k)
        return out, f.metadata()


def dir_bytes(d):
    return {p.name: p.read_bytes() for p in sorted(pathlib.Path(d).iterdir())}


def test_round_trip_several_shards(tmp_path):
    a = tmp_path / "a.cask"
    ts = make_archive(a)
    with treecask.open(a) as arc:
        order = arc.keys()
    out = tmp_path / "hf"
    r = treecask.export_safetensors(a, out, max_shard_size=300)
    sizes = {k: v.nbytes for k, v in ts.items()}
    assert r.total_size == sum(sizes.values()) and r.num_tensors == len(ts)

    index = json.loads((out / "model.safetensors.index.json").read_text())
    n = len(r.shards)
    names = [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    assert [pathlib.Path(p).name for p in r.shards] == names
    assert sorted(p.name for p in out.iterdir()) == sorted(names + ["model.safetensors.index.json"])
    assert index["metadata"] == {"total_size": r.total_size}
    assert list(index["weight_map"]) == sorted(ts)  # transformers writes sort_keys=True

    # Every tensor read back by safetensors itself, in its shard; shards tile the
    # leaf order; greedy: a shard over the max holds one tensor, and no shard
    # could have taken the next shard's first tensor.
    seen = []
    shard_sizes = []
    for name in names:
        got, meta = read_shard(out / name)
        assert meta is None  # the archive has no metadata
        for k, v in got.items():
            assert index["weight_map"][k] == name
            assert v.dtype == ts[k].dtype and v.shape == ts[k].shape, k
            assert bits(v).tobytes() == bits(ts[k]).tobytes(), k
        with safe_open(str(out / name), "np") as f:
            keys_in_file = sorted(f.keys(), key=lambda k: order.index(k))
        seen += keys_in_file
        shard_sizes.append((sum(sizes[k] for k in keys_in_file), keys_in_file))
    assert seen == order
    for i, (size, keys) in enumerate(shard_sizes):
        assert size <= 300 or len(keys) == 1
        if i + 1 < n and size <= 300:
            assert size + sizes[shard_sizes[i + 1][1][0]] > 300
    assert any(keys == ["lm_head"] for _, keys in shard_sizes)  # 800 bytes > max: alone
    assert n >= 4

    # Import the directory again: the same archive content; export it again: the same files.
    b = tmp_path / "b.cask"
    imp = treecask.import_safetensors(out, b)
    assert imp.kind == "sharded safetensors" and imp.index == str(out / "model.safetensors.index.json")
    assert [pathlib.Path(f).name for f in imp.files] == names
    assert leaves(b) == leaves(a)
    out2 = tmp_path / "hf2"
    treecask.export_safetensors(b, out2, max_shard_size=300)
    assert dir_bytes(out2) == dir_bytes(out)


def test_metadata_kept(tmp_path):
    ts = tensors()
    src = tmp_path / "src"
    src.mkdir()
    keys = list(ts)
    parts = [keys[:4], keys[4:8], keys[8:]]
    wm = {}
    for i, part in enumerate(parts):
        name = f"model-{i + 1:05d}-of-00003.safetensors"
        write_safetensors(src / name, {k: ts[k] for k in part}, {"format": "pt"})
        wm.update({k: name for k in part})
    total = sum(v.nbytes for v in ts.values())
    (src / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total, "total_parameters": 1234, "note": "ünïcode"}, "weight_map": wm},
        indent=2, sort_keys=True))

    a = tmp_path / "a.cask"
    treecask.import_safetensors(src / "model.safetensors.index.json", a)
    content, md = leaves(a)
    assert [k for k, *_ in content] == keys  # shard by shard, file order
    assert md == {"format": "pt", treecask.interop.hf.HF_INDEX_METADATA: '{"note":"ünïcode","total_parameters":1234}'}

    out = tmp_path / "out"
    treecask.export_safetensors(a, out, max_shard_size="1KB")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["metadata"] == {"note": "ünïcode", "total_parameters": 1234, "total_size": total}
    shards = sorted(p for p in out.iterdir() if p.name.endswith(".safetensors"))
    assert len(shards) == 2
    for p in shards:
        assert read_shard(p)[1] == {"format": "pt"}
    b = tmp_path / "b.cask"
    treecask.import_safetensors(out, b)
    assert leaves(b) == leaves(a)


def test_shards_with_different_metadata(tmp_path):
    rng = np.random.default_rng(1)
    ts = {f"t{i}": rng.standard_normal(25).astype(np.float32) for i in range(7)}  # 100 bytes each
    keys = list(ts)
    src = tmp_path / "src"
    src.mkdir()
    wm = {}
    for i, (part, md) in enumerate([(keys[:5], {"format": "pt"}), (keys[5:], None)]):
        name = f"model-{i + 1:05d}-of-00002.safetensors"
        write_safetensors(src / name, {k: ts[k] for k in part}, md)
        wm.update({k: name for k in part})
    (src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    a = tmp_path / "a.cask"
    treecask.import_safetensors(src, a)
    md = leaves(a)[1]
    assert json.loads(md[treecask.interop.hf.HF_SHARD_METADATA]) == {
        "model-00001-of-00002.safetensors": {"format": "pt"}, "model-00002-of-00002.safetensors": None}
    # Exported with the same two shard names: each shard gets its own __metadata__ back.
    out = tmp_path / "out"
    treecask.export_safetensors(a, out, max_shard_size=500)
    assert sorted(p.name for p in out.iterdir()) == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json"]
    assert read_shard(out / "model-00001-of-00002.safetensors")[1] == {"format": "pt"}
    assert read_shard(out / "model-00002-of-00002.safetensors")[1] is None
    b = tmp_path / "b.cask"
    treecask.import_safetensors(out, b)
    assert leaves(b) == leaves(a)


def _malformed(tmp_path, case):
    """A two-shard checkpoint broken as `case` says; returns (dir, the file the error must name, tensor)."""
    ts = tensors()
    keys = list(ts)
    d = tmp_path / case
    d.mkdir()
    s1, s2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    p1, p2 = keys[:5], keys[5:]
    wm = {**{k: s1 for k in p1}, **{k: s2 for k in p2}}
    expect = (None, None)
    if case == "missing_shard":
        write_safetensors(d / s1, {k: ts[k] for k in p1})
        expect = (d / s2, "")
    elif case == "two_shards":
        write_safetensors(d / s1, {k: ts[k] for k in p1})
        write_safetensors(d / s2, {k: ts[k] for k in p2 + [keys[0]]})  # keys[0] in both
        expect = (d / s2, keys[0])
    elif case == "wrong_shard":
        write_safetensors(d / s1, {k: ts[k] for k in p1})
        write_safetensors(d / s2, {k: ts[k] for k in p2})
        wm[keys[6]] = s1  # the index says shard 1, the tensor is in shard 2
        expect = (d / s2, keys[6])
    elif case == "not_in_index":
        write_safetensors(d / s1, {k: ts[k] for k in p1})
        write_safetensors(d / s2, {k: ts[k] for k in p2})
        del wm[keys[7]]
        expect = (d / s2, keys[7])
    elif case == "index_entry_not_held":
        write_safetensors(d / s1, {k: ts[k] for k in p1})
        write_safetensors(d / s2, {k: ts[k] for k in p2})
        wm["ghost.weight"] = s2
        expect = (d / s2, "ghost.weight")
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    return d, expect


@pytest.mark.parametrize("case,error,message", [
    ("missing_shard", treecask.NotFoundError, "shard missing"),
    ("two_shards", treecask.CorruptionError, "found in two shards: model-00001-of-00002.safetensors and "
                                                  "model-00002-of-00002.safetensors"),
    ("wrong_shard", treecask.CorruptionError, "found in shard model-00002-of-00002.safetensors but the index"),
    ("not_in_index", treecask.CorruptionError, "not in the index"),
    ("index_entry_not_held", treecask.CorruptionError, "does not hold"),
])
def test_malformed_index_refused(tmp_path, case, error, message):
    d, (file, key) = _malformed(tmp_path, case)
    dst = tmp_path / "out.cask"
    with pytest.raises(error, match=message) as e:
        treecask.import_safetensors(d, dst)
    assert e.value.file == str(file) and e.value.key_path == key
    assert not dst.exists()


@pytest.mark.parametrize("text,key,message", [
    ('{"weight_map": {"w": 1}}', "w", "value is not a string"),
    ('{"weight_map": {"w": {"f": "x.safetensors"}}}', "w", "value is not a string"),
    ('{"weight_map": {"w": ["x.safetensors"]}}', "w", "value is not a string"),
    ('{"weight_map": {"w": "a.safetensors", "w": "b.safetensors"}}', "w", "lists the tensor twice"),
    ('{"weight_map": ["w"]}', "", "is not an object"),
    ('{"metadata": 3, "weight_map": {}}', "", "is not an object"),
    ('{"metadata": {}}', "", "has no \"weight_map\""),
    ('{"weight_map": {"w": "a.safetensors"', "", "not valid JSON"),
])
def test_malformed_index_json_refused(tmp_path, text, key, message):
    """The index's JSON itself is checked, naming the index file and the tensor where there is one."""
    (tmp_path / "model.safetensors.index.json").write_text(text)
    with pytest.raises(treecask.CorruptionError, match=message) as e:
        treecask.import_safetensors(tmp_path, tmp_path / "x.cask")
    assert e.value.file == str(tmp_path / "model.safetensors.index.json") and e.value.key_path == key


def test_directory_with_one_file_and_errors(tmp_path):
    ts = tensors()
    d = tmp_path / "single"
    d.mkdir()
    write_safetensors(d / "model.safetensors", ts, {"format": "pt"})
    a = tmp_path / "a.cask"
    r = treecask.import_safetensors(d, a)
    assert r.kind == "safetensors" and r.files == (str(d / "model.safetensors"),) and r.index == ""
    content, md = leaves(a)
    assert [k for k, *_ in content] == list(ts) and md == {"format": "pt"}

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(treecask.NotFoundError, match="no .safetensors file") as e:
        treecask.import_safetensors(empty, tmp_path / "x.cask")
    assert e.value.file == str(empty)
    with pytest.raises(treecask.NotFoundError):
        treecask.import_safetensors(tmp_path / "nope", tmp_path / "x.cask")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "model.safetensors.index.json").write_text('{"weight_map": {"w": "../escape.safetensors"}}')
    with pytest.raises(treecask.CorruptionError, match="file name in the index's directory"):
        treecask.import_safetensors(bad, tmp_path / "x.cask")


def test_existing_files_refused_and_overwrite(tmp_path):
    a = tmp_path / "a.cask"
    make_archive(a)
    out = tmp_path / "out"
    treecask.export_safetensors(a, out, max_shard_size=1000)
    before = dir_bytes(out)
    with pytest.raises(treecask.AlreadyExistsError) as e:
        treecask.export_safetensors(a, out, max_shard_size=1000)
    assert e.value.file.startswith(str(out))
    assert dir_bytes(out) == before  # nothing written, no temporary file left
    r = treecask.export_safetensors(a, out, max_shard_size=1000, overwrite=True)
    assert dir_bytes(out) == before and len(r.shards) >= 2
    treecask.save(tmp_path / "q.cask", {"q": np.zeros(4, ml_dtypes.int4)})
    with pytest.raises(treecask.UnsupportedError, match="int4"):
        treecask.export_safetensors(tmp_path / "q.cask", tmp_path / "q", max_shard_size=10)
    assert not (tmp_path / "q" / "model.safetensors.index.json").exists()


@pytest.mark.parametrize("text,value", [
    ("5GB", 5 * 10**9), ("100KB", 100_000), ("500MB", 500 * 10**6), ("1GiB", 2**30), ("2mib", 2 * 2**20),
    ("5Gb", 5 * 10**9 // 8), ("1.5GB", 1_500_000_000), ("12", 12), (4096, 4096), ("3TB", 3 * 10**12),
])
def test_parse_size(text, value):
    assert treecask.interop.hf.parse_size(text) == value


@pytest.mark.parametrize("text", ["", "GB", "5XB", "0", "0KB", "-5GB", "5 GB", "1.2.3GB", "99999PB", 0, -1, 2**64, 1.5, True])
def test_parse_size_refused(text):
    with pytest.raises(treecask.InvalidArgumentError):
        treecask.interop.hf.parse_size(text)


@pytest.mark.skipif(not CLI, reason="TREECASK_CLI is not set (point it at the built CLI)")
def test_cli(tmp_path):
    def cli(*args):
        return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=120)

    a = tmp_path / "a.cask"
    make_archive(a, metadata={"format": "pt"})
    out = tmp_path / "hf"
    r = cli("export", a, out, "--max-shard-size", "0.5KB")
    assert r.returncode == 0, r.stderr
    n = len([p for p in out.iterdir() if p.suffix == ".safetensors"])
    assert r.stdout.startswith(f"wrote {out}: {n} shards, 11 tensors, ") and "(max shard size 500 bytes)" in r.stdout
    b = tmp_path / "b.cask"
    r = cli("import", out, b)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"wrote {b} from sharded safetensors ({out}/model.safetensors.index.json, {n} shards)")
    assert leaves(b) == leaves(a)
    c = tmp_path / "c.cask"
    assert cli("import", out / "model.safetensors.index.json", c).returncode == 0
    assert leaves(c) == leaves(a)

    assert cli("export", a, out, "--max-shard-size", "1KB").returncode == 9
    r = cli("export", a, tmp_path / "x", "--max-shard-size", "5XB")
    assert r.returncode == 7 and "unknown unit" in r.stderr
    d, (file, key) = _malformed(tmp_path, "missing_shard")
    r = cli("import", d, tmp_path / "m.cask")
    assert r.returncode == 2 and str(file) in r.stderr
    d, (file, key) = _malformed(tmp_path, "two_shards")
    r = cli("import", d, tmp_path / "m.cask")
    assert r.returncode == 5 and str(file) in r.stderr and "two shards" in r.stderr
    assert not (tmp_path / "m.cask").exists()


@pytest.mark.skipif(not MODEL.exists(), reason=f"{MODEL} not downloaded (scripts/main_job.sh fetches it)")
def test_real_model_sharded_round_trip(tmp_path):
    """all-MiniLM-L6-v2 (90,868,376 bytes): sharded at 20MB, every tensor read
    back by safetensors equals the original; re-imported and exported as one
    file, byte-identical to the original file."""
    a = tmp_path / "minilm.cask"
    treecask.import_safetensors(MODEL, a)
    out = tmp_path / "hf"
    r = treecask.export_safetensors(a, out, max_shard_size="20MB")
    assert len(r.shards) >= 4
    index = json.loads((out / "model.safetensors.index.json").read_text())
    with safe_open(str(MODEL), "np") as orig:
        names = list(orig.keys())
        assert sorted(index["weight_map"]) == sorted(names)
        for shard in r.shards:
            with safe_open(shard, "np") as f:
                assert f.metadata() == orig.metadata()
                data = sum(len(raw_tensor(shard, k)[2]) for k in f.keys())
                assert data <= 20 * 10**6 or len(f.keys()) == 1  # the 46.9 MB embedding is alone
                for k in f.keys():
                    x, y = f.get_tensor(k), orig.get_tensor(k)
                    assert x.dtype == y.dtype and x.shape == y.shape and bits(x).tobytes() == bits(y).tobytes(), k
    b = tmp_path / "b.cask"
    treecask.import_safetensors(out, b)
    assert leaves(b) == leaves(a)
    if CLI:
        one = tmp_path / "one.safetensors"
        r = subprocess.run([CLI, "export", b, one], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert one.read_bytes() == MODEL.read_bytes()


def test_interrupted_overwrite_leaves_no_index(tmp_path):
    # The commit order: a rename that fails half-way through overwriting an
    # export leaves no index (the old one is removed first), so the directory
    # is refused rather than read as a mix of old and new shards.
    a = tmp_path / "a.cask"
    make_archive(a)
    out = tmp_path / "out"
    r = treecask.export_safetensors(a, out, max_shard_size=300)
    second = pathlib.Path(r.shards[1])
    second.unlink()
    second.mkdir()  # a non-empty directory: renaming the new shard onto it fails
    (second / "keep").write_text("x")
    with pytest.raises(treecask.IoError) as e:
        treecask.export_safetensors(a, out, max_shard_size=300, overwrite=True)
    assert e.value.file == str(second)
    assert not (out / "model.safetensors.index.json").exists()
    assert not [p.name for p in out.iterdir() if ".tmp." in p.name]  # temporaries removed
    with pytest.raises(treecask.InvalidArgumentError, match="no index"):
        treecask.import_safetensors(out, tmp_path / "b.cask")


GOLDEN_SHARDED = pathlib.Path(__file__).resolve().parents[2] / "format" / "vectors" / "v3_0_sharded"


def test_export_reads_a_sharded_checkpoint_directory(tmp_path):
    """export_safetensors of a sharded checkpoint directory (format/vectors/v3_0_sharded)
    reads it as one checkpoint, as `treecask export DIR` does: its leaves are the global
    arrays, and its int scalar `step` is refused the same way by both, naming the directory."""
    with pytest.raises(treecask.UnsupportedError, match="scalar/str leaf") as e:
        treecask.export_safetensors(GOLDEN_SHARDED, tmp_path / "hf", max_shard_size=100)
    assert e.value.file == str(GOLDEN_SHARDED) and e.value.key_path == "step"
    assert not (tmp_path / "hf" / "model.safetensors.index.json").exists()
    if CLI:
        for args in ((tmp_path / "one.safetensors",), (tmp_path / "hf", "--max-shard-size", "100")):
            r = subprocess.run([CLI, "export", GOLDEN_SHARDED, *args], capture_output=True, text=True, timeout=120)
            assert r.returncode == 10, r.stderr
            assert r.stderr.startswith(f"treecask: {GOLDEN_SHARDED}: step: unsupported: a Python scalar/str leaf"), r.stderr


def test_damaged_safetensors_is_corruption(tmp_path):
    """A damaged or malformed .safetensors file (one file or a shard) is CorruptionError
    naming the file and the tensor; a bad argument stays InvalidArgumentError."""
    ts = tensors()
    good = tmp_path / "good.safetensors"
    write_safetensors(good, ts)
    data = bytearray(good.read_bytes())
    n = int.from_bytes(data[:8], "little")
    cases = {
        "truncated": bytes(data[:-1]),                                   # the last tensor runs past the end
        "header_length": (2**40).to_bytes(8, "little") + bytes(data[8:]),  # over the 100 MB cap
        "not_json": bytes(data[:8]) + b"{" + b"x" * (n - 1) + bytes(data[8 + n:]),
        "trailing": bytes(data) + b"\0",                                   # a hole at the end
    }
    for name, blob in cases.items():
        bad = tmp_path / f"{name}.safetensors"
        bad.write_bytes(blob)
        with pytest.raises(treecask.CorruptionError, match="safetensors: ") as e:
            treecask.import_safetensors(bad, tmp_path / f"{name}.cask")
        assert e.value.file == str(bad), name
        assert not (tmp_path / f"{name}.cask").exists()
    # A shard of a sharded checkpoint: the same, naming the shard.
    src = tmp_path / "src"
    src.mkdir()
    keys = list(ts)
    wm = {}
    for i, part in enumerate([keys[:5], keys[5:]]):
        shard = f"model-{i + 1:05d}-of-00002.safetensors"
        write_safetensors(src / shard, {k: ts[k] for k in part})
        wm.update({k: shard for k in part})
    (src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    second = src / "model-00002-of-00002.safetensors"
    second.write_bytes(second.read_bytes()[:-1])
    with pytest.raises(treecask.CorruptionError) as e:
        treecask.import_safetensors(src, tmp_path / "sharded.cask")
    assert e.value.file == str(second) and e.value.key_path == keys[-1]
    if CLI:
        r = subprocess.run([CLI, "import", src, tmp_path / "sharded.cask"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 5 and f"{second}: {keys[-1]}: corruption: safetensors: " in r.stderr, r.stderr
    # Bad arguments: a bad option, a directory with several candidates.
    with pytest.raises(treecask.InvalidArgumentError):
        treecask.import_safetensors(good, tmp_path / "x.cask", chunk_size=1000)
    two = tmp_path / "two"
    two.mkdir()
    write_safetensors(two / "a.safetensors", ts)
    write_safetensors(two / "b.safetensors", ts)
    with pytest.raises(treecask.InvalidArgumentError, match="several .safetensors files"):
        treecask.import_safetensors(two, tmp_path / "x.cask")
