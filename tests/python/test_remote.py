"""Reading archives and multi-process checkpoints straight from object stores
(s3:// on SeaweedFS, gs:// on fake-gcs-server, http:// on nginx; the servers
are real, started on loopback by conftest.py): the same trees, checks and
errors as local files, one round trip to open, only the chunks a read needs
(format/SPEC.md "Remote reading", docs/remote.md)."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import time
import uuid

import ml_dtypes
import numpy as np
import pytest

import treecask
from treecask.errors import (ChecksumError, CorruptionError, IoError, NotFoundError,
                             UnsupportedError)

ROOT = pathlib.Path(__file__).resolve().parents[2]
CLI = os.environ.get("TREECASK_CLI")


def model_tree():
    """A small model's state: several dtypes, a compressible leaf, scalars, a string."""
    rng = np.random.default_rng(0)
    return {
        "params": {
            "embed": rng.standard_normal((512, 256)).astype(ml_dtypes.bfloat16),
            "dense": {"kernel": rng.standard_normal((256, 1024)).astype(np.float32),
                      "bias": np.zeros(1024, np.float32)},
            "mask": (np.arange(200_000) % 3 == 0),
        },
        "step": 1234,
        "lr": 0.25,
        "note": "remote",
    }


def assert_same(got, want):
    assert set(got) == set(want)
    for k, v in want.items():
        if isinstance(v, dict):
            assert_same(got[k], v)
        elif isinstance(v, np.ndarray):
            assert got[k].dtype == v.dtype and got[k].shape == v.shape
            assert np.array_equal(got[k].view(np.uint8), v.view(np.uint8))
        else:
            assert got[k] == v


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(path, tree) of an archive saved locally, to upload."""
    d = tmp_path_factory.mktemp("remote")
    tree = model_tree()
    p = d / "model.cask"
    treecask.save(p, tree, chunk_size=64 << 10)
    return p, tree


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """The boto3-style environment that points clients at the S3 server."""
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    return s3_server


def s3_object(s3, path, bucket="ckpts"):
    s3.create_bucket(bucket)
    key = f"{uuid.uuid4().hex}/{pathlib.Path(path).name}"
    s3.put(bucket, key, path)
    return f"s3://{bucket}/{key}"


def test_load_from_s3_gcs_and_http_equals_the_local_file(saved, s3_env, gcs_server, http_server, monkeypatch):
    path, tree = saved
    urls = [s3_object(s3_env, path)]
    gcs_server.create_bucket("gbucket")
    gcs_server.put("gbucket", "runs/model.cask", path)
    for k, v in gcs_server.env().items():
        monkeypatch.setenv(k, v)
    urls.append("gs://gbucket/runs/model.cask")
    shutil.copy(path, http_server.root / "model.cask")
    urls.append(http_server.url("model.cask"))
    local = treecask.open(path)
    for url in urls:
        assert_same(treecask.load(url), tree)
        with treecask.open(url) as a:
            assert a.path == url
            assert a.keys() == local.keys()
            info = a.info("params/dense/kernel")
            assert info.zero_copy is False  # no map to view: every leaf is read
            assert info.byte_length == local.info("params/dense/kernel").byte_length
            np.testing.assert_array_equal(a.read_slice("params/dense/kernel", (slice(3, 9), slice(100, 700))),
                                          tree["params"]["dense"]["kernel"][3:9, 100:700])
            np.testing.assert_array_equal(a.read_rows("params/embed", 10, 20), tree["params"]["embed"][10:20])
            assert a.verify() == []
        sub = treecask.load(url, subtree="params/dense")
        assert_same(sub, tree["params"]["dense"])


def test_storage_options_override_the_environment_and_never_print_a_secret(saved, s3_server, monkeypatch):
    path, tree = saved
    url = s3_object(s3_server, path)
    for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(k, raising=False)
    env = s3_server.env()
    good = {"endpoint": env["AWS_ENDPOINT_URL"], "access_key_id": env["AWS_ACCESS_KEY_ID"],
            "secret_access_key": env["AWS_SECRET_ACCESS_KEY"], "region": env["AWS_REGION"]}
    assert_same(treecask.load(url, storage_options=good), tree)
    secret = "wrong-secret-that-must-not-leak-9f8e7d"
    with pytest.raises(IoError) as e:
        treecask.load(url, storage_options=dict(good, secret_access_key=secret))
    assert url in str(e.value) and "access denied" in str(e.value)
    assert secret not in str(e.value) and env["AWS_SECRET_ACCESS_KEY"] not in str(e.value)


def test_missing_objects_and_buckets_are_not_found(s3_env):
    s3_env.create_bucket("present")
    for url in ("s3://present/no/such.cask", "s3://absent-bucket/x.cask"):
        with pytest.raises(NotFoundError) as e:
            treecask.open(url)
        assert url in str(e.value)


def test_a_scheme_treecask_does_not_serve_is_never_taken_for_a_local_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for url in ("hdfs://namenode/ckpt.cask", "s4://bucket/ckpt.cask"):
        with pytest.raises(UnsupportedError) as e:
            treecask.load(url)
        assert url.split("://")[0] + "://" in str(e.value)
    for url in ("hdfs://namenode/run", "https://example.invalid/run"):  # not served / read-only
        with pytest.raises(UnsupportedError):
            treecask.CheckpointManager(url)
    assert list(tmp_path.iterdir()) == []  # no local directory "s3:" was made


def test_a_tampered_object_is_a_checksum_error_naming_the_url_and_key_path(saved, s3_env, tmp_path):
    path, tree = saved
    data = bytearray(path.read_bytes())
    kernel = tree["params"]["dense"]["kernel"].tobytes()
    at = data.find(kernel[70_000:70_064])  # inside a raw chunk of the kernel
    assert at > 0
    data[at + 10] ^= 0xFF
    bad = tmp_path / "tampered.cask"
    bad.write_bytes(bytes(data))
    url = s3_object(s3_env, bad)
    with treecask.open(url) as a:
        np.testing.assert_array_equal(a.read("params/dense/bias"), tree["params"]["dense"]["bias"])  # others read
        with pytest.raises(ChecksumError) as e:
            a.read("params/dense/kernel")
        assert e.value.file == url and e.value.key_path == "params/dense/kernel"
    # A truncated object fails at open, never reads as something else.
    cut = tmp_path / "truncated.cask"
    cut.write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(CorruptionError) as e:
        treecask.open(s3_object(s3_env, cut))
    assert "truncated" in str(e.value) or "corruption" in str(e.value)


def test_an_object_replaced_after_open_is_detected_never_mixed(s3_env, tmp_path):
    # 12 MiB: larger than the bytes the open fetched, so the read goes to the store.
    tree = {"big": np.arange(3 << 20, dtype=np.float32), "step": 1}
    path = tmp_path / "v1.cask"
    treecask.save(path, tree)
    url = s3_object(s3_env, path)
    bucket, key = url[len("s3://"):].split("/", 1)
    a = treecask.open(url)
    p2 = tmp_path / "v2.cask"
    treecask.save(p2, dict(tree, step=2))
    s3_env.put(bucket, key, p2)
    with pytest.raises(CorruptionError) as e:
        a.read("big")
    assert "changed since it was opened" in str(e.value) and url in str(e.value)


def test_a_server_that_ignores_range_is_refused(saved, http_server):
    path, _ = saved
    shutil.copy(path, http_server.root / "norange.cask")
    with pytest.raises(CorruptionError) as e:
        treecask.load(http_server.url("norange.cask", location="norange"))
    assert "ignored the Range request" in str(e.value)


def test_a_multi_process_checkpoint_reads_from_a_bucket(s3_env):
    local_dir = ROOT / "format" / "vectors" / "v3_1_bound"
    s3_env.create_bucket("sharded")
    prefix = uuid.uuid4().hex
    for f in local_dir.iterdir():
        s3_env.put("sharded", f"{prefix}/step_1/{f.name}", f)
    local = treecask.open(local_dir)
    for url in (f"s3://sharded/{prefix}/step_1/", f"s3://sharded/{prefix}/step_1"):
        with treecask.open(url) as c:
            assert isinstance(c, treecask.ShardedArchive)
            assert c.keys() == local.keys()
            for k in local.keys():
                np.testing.assert_array_equal(c.read(k), local.read(k))
    # A restore onto a device: each array placed from its boxes, read by range.
    import jax
    placed = treecask.load(f"s3://sharded/{prefix}/step_1/",
                           shardings=jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    want = treecask.load(local_dir)
    pairs = list(zip(jax.tree_util.tree_leaves(placed), jax.tree_util.tree_leaves(want)))
    assert any(isinstance(w, np.ndarray) for _, w in pairs)
    for got, w in pairs:
        if isinstance(w, np.ndarray):  # arrays are placed; scalars come back as they were saved
            assert isinstance(got, jax.Array)
            np.testing.assert_array_equal(np.asarray(got), w)
        else:
            assert got == w


def access_log_lines(http_server, settle: float = 0.0):
    """nginx's access log. nginx writes a request's line once it has sent the
    last byte, which can be after the client has them all: with ``settle``
    the log is read until it has not grown for that many seconds (5 s at most)."""
    log = http_server.server.log_path.parent / "access.log"
    lines = log.read_text().splitlines()
    deadline = time.monotonic() + 5
    while settle and time.monotonic() < deadline:
        time.sleep(settle)
        again = log.read_text().splitlines()
        if len(again) == len(lines):
            break
        lines = again
    return lines


def test_open_and_a_tensor_of_10000_leaves_take_two_round_trips(http_server, tmp_path):
    # 40 MiB, stored raw: the middle leaf is not in what the open fetched.
    tree = {f"layer_{i:05d}": np.full((1024,), i, np.float32) for i in range(10_000)}
    p = http_server.root / "many.cask"
    treecask.save(p, tree, compression="none")
    assert p.stat().st_size > 32 << 20
    # The open: head and tail at once. The first leaf is in the head: no more.
    # A middle leaf: its chunk, and (deep in a 4 MiB pack) its blob's 64-byte
    # header as a second range of the same call, sent at once: one round trip.
    for key, most in (("layer_00000", 3), ("layer_05000", 4)):
        before = len(access_log_lines(http_server, settle=0.3))
        with treecask.open(http_server.url("many.cask")) as a:
            np.testing.assert_array_equal(a.read(key), tree[key])
        after = [line for line in access_log_lines(http_server, settle=0.3)[before:] if "many.cask" in line]
        assert 2 <= len(after) <= most, after
        # what came back: the head and tail of the open, then one chunk (4 KiB) and its blob header
        assert sum(int(line.split('"')[2].split()[1]) for line in after) < (4 << 20) + (64 << 10) + (1 << 20)


@pytest.mark.skipif(not CLI, reason="TREECASK_CLI is not set (point it at the built CLI)")
def test_the_cli_reads_urls_with_libcurl(saved, s3_env, http_server, tmp_path):
    path, tree = saved
    url = s3_object(s3_env, path)
    shutil.copy(path, http_server.root / "cli.cask")

    def cli(*args):
        return subprocess.run([CLI, *args], capture_output=True, text=True, env=os.environ.copy())

    for u in (url, http_server.url("cli.cask")):
        r = cli("info", u)
        assert r.returncode == 0, r.stderr
        assert "params/dense/kernel" in cli("ls", u).stdout
        r = cli("verify", u)
        assert r.returncode == 0, r.stderr
        out = tmp_path / (uuid.uuid4().hex + ".npy")
        r = cli("get", u, "params/dense/bias", "-o", str(out))
        assert r.returncode == 0, r.stderr
        np.testing.assert_array_equal(np.load(out), tree["params"]["dense"]["bias"])
    # export: an archive of arrays only (safetensors holds no scalars), from the bucket.
    arrays = tmp_path / "arrays.cask"
    treecask.save(arrays, tree["params"])
    st = tmp_path / "arrays.safetensors"
    r = cli("export", s3_object(s3_env, arrays), str(st))
    assert r.returncode == 0, r.stderr
    want = tmp_path / "local.safetensors"  # the same bytes as the local file's export
    assert cli("export", str(arrays), str(want)).returncode == 0
    assert st.read_bytes() == want.read_bytes()
    secret = "wrong-secret-for-the-cli-5a4b3c"
    r = subprocess.run([CLI, "info", url], capture_output=True, text=True,
                       env=dict(os.environ, AWS_SECRET_ACCESS_KEY=secret))
    assert r.returncode == 8 and "access denied" in r.stderr and secret not in r.stderr, r.stderr
    r = cli("info", http_server.url("cli.cask", location="norange"))  # a server ignoring Range
    assert r.returncode == 5 and "ignored the Range request" in r.stderr, r.stderr
    r = cli("info", "hdfs://nn/x.cask")
    assert r.returncode != 0 and "hdfs://" in r.stderr
    r = cli("info", "s3://ckpts/no/such.cask")
    assert r.returncode != 0 and "not found" in r.stderr


class _Flaky:
    """A real HTTP server on loopback (http.server) that serves one file with
    Range and ETag, but answers the first `failures` requests with 503
    SlowDown: what a throttled store does."""

    def __init__(self, data: bytes, failures: int):
        import http.server
        import threading

        self.failures, self.requests = failures, 0
        flaky = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                flaky.requests += 1
                if flaky.failures > 0:
                    flaky.failures -= 1
                    self.send_response(503)
                    self.send_header("Content-Length", "9")
                    self.end_headers()
                    self.wfile.write(b"SlowDown\n")
                    return
                size = len(data)
                spec = self.headers["Range"].split("=", 1)[1]
                a, b = spec.split("-")
                start, end = (size - int(b), size - 1) if a == "" else (int(a), min(int(b), size - 1))
                start = max(start, 0)
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
                self.send_header("Content-Length", str(end - start + 1))
                self.send_header("ETag", '"v1"')
                self.end_headers()
                self.wfile.write(data[start:end + 1])

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/model.cask"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_503_slowdown_is_retried_then_an_io_error_naming_the_url(saved):
    path, tree = saved
    data = path.read_bytes()
    flaky = _Flaky(data, failures=2)  # two refusals, then it serves: retried, loaded
    try:
        assert_same(treecask.load(flaky.url), tree)
        assert flaky.requests > 2
    finally:
        flaky.close()
    flaky = _Flaky(data, failures=10**6)  # never serves: bounded retries, then IoError
    try:
        with pytest.raises(IoError) as e:
            treecask.load(flaky.url)
        assert flaky.url in str(e.value)
        assert 2 <= flaky.requests <= 20
        if CLI:  # the libcurl source: the same policy
            flaky.requests = 0
            r = subprocess.run([CLI, "info", flaky.url], capture_output=True, text=True)
            assert r.returncode == 8 and flaky.url in r.stderr and "503" in r.stderr, r.stderr
            assert 2 <= flaky.requests <= 20
    finally:
        flaky.close()


def _ranges(gets, size):
    """[(first, end)) of each GET's Range header ("bytes=a-b", "bytes=-n"), in
    an object of ``size`` bytes, sorted."""
    out = []
    for _, rng, status in gets:
        assert status == 206 and rng and rng.startswith("bytes="), (rng, status)
        a, b = rng[len("bytes="):].split("-")
        out.append((max(size - int(b), 0), size) if a == "" else (int(a), min(int(b) + 1, size)))
    return sorted(out)


def test_a_full_load_fetches_no_range_twice_in_about_one_request_per_8_mib(s3_env, http_server, tmp_path):
    # ~66 MiB, many leaves: 16 raw leaves of 4 MiB (random bits: LZ4 cannot shrink
    # them, so their 1 MiB chunks are stored raw and land in the arrays in place), 4
    # LZ4 leaves of 2 MiB, 2,000 small leaves packed into 4 MiB blobs.
    import stores

    rng = np.random.default_rng(7)
    tree = {"raw": {f"w{i:02d}": rng.integers(0, 2**31, 1 << 20, np.int32).view(np.float32) for i in range(16)},
            "lz4": {f"z{i}": np.repeat(np.arange(1 << 13, dtype=np.float32), 64) + i for i in range(4)},
            "small": {f"s{i:04d}": rng.integers(0, 255, 1000, np.uint8) for i in range(2000)}}
    path = http_server.root / "full.cask"
    treecask.save(path, tree)
    size = path.stat().st_size
    assert size >= 64 << 20
    with treecask.open(path) as a:
        infos = [a.info(k) for k in a.keys()]
    assert {i.codec for i in infos} == {"none", "lz4"}, {i.codec for i in infos}
    max_chunk = max(i.chunk_size for i in infos)
    # The bound, from the chunking: the open is one round trip of two GETs (the first
    # 256 KiB and last 4 MiB). The load fetches what lies between in groups of at most
    # 8 MiB of chunks, each one GET with the blob headers inside it; a group is closed
    # only when its next chunk (at most max_chunk) would pass 8 MiB (a full load has no
    # gap over 64 KiB to close it), so every group but the last holds more than
    # 8 MiB - max_chunk of the file. (256 MiB of 4 MiB leaves of 1 MiB chunks: 2 + 32.)
    head, tail = treecask._core.OPEN_HEAD_BYTES, treecask._core.OPEN_TAIL_BYTES
    between = size - head - tail
    bound = 2 + -(-between // ((8 << 20) - max_chunk)) + 1
    s3_url = s3_object(s3_env, path)
    for backend, url in ((s3_env.endpoint, None), (http_server.endpoint, None)):
        proxy = stores.S3Proxy(backend)
        try:
            if backend == s3_env.endpoint:
                got = treecask.load(s3_url, storage_options={"endpoint": proxy.endpoint})
            else:
                got = treecask.load(proxy.endpoint + "/full.cask")
            assert_same(got, tree)
            ranges = _ranges(proxy.gets, size)
        finally:
            proxy.close()
        assert all(e <= b for (_, e), (b, _) in zip(ranges, ranges[1:])), ranges  # no byte twice
        assert sum(e - b for b, e in ranges) <= size
        assert len(ranges) <= bound, (backend, len(ranges), bound)


def test_a_user_source_opens_with_one_read_call(tmp_path):
    # A Source written by a user: size and read(offsets, lengths), nothing else. The
    # core asks for the object's first 256 KiB and last 4 MiB in one call, and keeps
    # them: a tree of this writer opens from them, and a leaf inside them costs no call.
    from treecask import _core

    tree = {f"w{i}": np.full((1 << 18,), i, np.float32) for i in range(6)}  # 6 leaves of 1 MiB
    p = tmp_path / "user.cask"
    treecask.save(p, tree, compression="none")
    size = p.stat().st_size
    head, tail = _core.OPEN_HEAD_BYTES, _core.OPEN_TAIL_BYTES
    assert size > head + tail

    class UserSource:
        def __init__(self, path, learns_size=False):
            self._data = pathlib.Path(path).read_bytes()
            self.size = None if learns_size else len(self._data)
            self.calls = []

        def read(self, offsets, lengths):
            self.calls.append(list(zip(offsets, lengths)))
            if self.size is None:  # the first read: a negative offset is a suffix
                self.size = len(self._data)
                return [self._data[o:] if o < 0 else self._data[o:o + n] for o, n in zip(offsets, lengths)]
            return [self._data[o:o + n] for o, n in zip(offsets, lengths)]

    for learns_size in (False, True):
        src = UserSource(p, learns_size)
        a = _core.Archive.open_source(src)
        assert len(src.calls) == 1
        want = [(0, head), (-tail, tail)] if learns_size else [(0, head), (size - tail, tail)]
        assert src.calls[0] == want
        assert a.file_size == size and len(a) == len(tree)
        out = np.empty(1 << 18, np.float32)
        a.read(a.index_of("w5"), out)  # stored last, in the tail the open read
        assert (out == 5).all() and len(src.calls) == 1
        a.read(a.index_of("w1"), out)  # between head and tail: one more call
        assert (out == 1).all() and len(src.calls) == 2
