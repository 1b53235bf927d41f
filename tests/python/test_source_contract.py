"""One Source contract (include/treecask/source.h "Contract"), the same cases
run against both transports (issue 34):

- ``libcurl``: the C++ ``treecask`` tool built with libcurl (TREECASK_CLI,
  build/src/cli/treecask), whose http_source.cc reads the URL;
- ``obstore``: the Python package's own ``treecask`` command
  (treecask/_cli.py, what pip installs), which runs the same tool's commands
  in-process with every object read through the package's store layer
  (obstore), as ``treecask.open`` reads it.

Both read an archive from nginx (tests/python/stores.py) through the
stores.py proxy, which logs each GET it forwards with its Range header; the
requests are counted from that log and nginx's access log, which must agree.
The cases:

1. the open is one round trip: the object's head and tail
   (_core.OPEN_HEAD_BYTES, OPEN_TAIL_BYTES) asked at once, both in flight
   together, and nothing else;
2. touching ranges go as one request: a leaf of 12 LZ4 chunks that the open
   did not fetch is one GET;
3. the version is pinned: an object replaced between the open and the read
   fails the read (corruption, "changed"), never mixes two versions;
4. a body cut short, or shorter than its Content-Range says, is refused
   (an I/O or corruption error), never taken for the bytes asked;
5. a missing object is "not found" (exit 2, NotFoundError).
"""

from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest

import stores
import treecask
from treecask import _core

CLI = os.environ.get("TREECASK_CLI")
PIP_TOOL = [sys.executable, "-c", "import sys; from treecask._cli import main; sys.exit(main())"]

TRANSPORTS = ["libcurl", "obstore"]


def tool(transport: str) -> list:
    if transport == "libcurl":
        if not CLI:
            pytest.skip("TREECASK_CLI (the C++ tool built with libcurl) is not set")
        return [CLI]
    return PIP_TOOL


def run(transport: str, *args, timeout: float = 120):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run([*tool(transport), *args], capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    """12 MiB of incompressible bytes stored as 12 LZ4 chunks of 1 MiB (leaf
    "big"), beyond what the open fetches (256 KiB head, 4 MiB tail)."""
    d = tmp_path_factory.mktemp("contract")
    big = np.random.default_rng(7).integers(0, 256, 12 << 20, dtype=np.uint8)
    p = d / "v1.cask"
    treecask.save(p, {"big": big, "step": 1}, compression="lz4", chunk_size=1 << 20)
    p2 = d / "v2.cask"
    treecask.save(p2, {"big": big[::-1].copy(), "step": 2}, compression="lz4", chunk_size=1 << 20)
    return p, p2, big


def nginx_gets(http_server, since: int, name: str, settle: float = 0.3):
    """nginx's access-log lines after byte `since` that name `name` (read until
    the log stops growing: nginx logs a request after its last byte)."""
    log = http_server.server.log_path.parent / "access.log"
    text, deadline = None, time.monotonic() + 5
    while time.monotonic() < deadline:
        again = log.read_bytes()[since:].decode()
        if again == text:
            break
        text = again
        time.sleep(settle)
    return [line for line in text.splitlines() if name in line]


def log_size(http_server) -> int:
    return (http_server.server.log_path.parent / "access.log").stat().st_size


@contextlib.contextmanager
def proxied(http_server, hold=None):
    """The stores.py proxy in front of nginx: (proxy, url of a path on it)."""
    proxy = stores.S3Proxy(http_server.endpoint, hold=hold)
    try:
        yield proxy, lambda rel: f"{proxy.endpoint}/{rel}"
    finally:
        proxy.close()


def publish(http_server, src, name: str, mtime: float | None = None):
    """Places `src` at nginx's `name` (atomically: rename), with `mtime`, so
    that nginx's ETag ("<mtime>-<size>") names this version."""
    tmp = http_server.root / f".{name}.{uuid.uuid4().hex}"
    shutil.copy(src, tmp)
    if mtime is not None:
        os.utime(tmp, (mtime, mtime))
    os.replace(tmp, http_server.root / name)


# ---- 1. the open: one round trip -------------------------------------------------------------

@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_open_is_head_and_tail_in_one_round_trip(transport, archive, http_server):
    v1, _, _ = archive
    name = f"open-{transport}-{uuid.uuid4().hex[:8]}.cask"
    publish(http_server, v1, name)
    # Each GET of the object waits (up to 5 s) until a second one has arrived:
    # a transport that sends the tail only after the head's answer shows as
    # "alone" (and is 5 s late), one that sends both at once never waits.
    arrived, both = [], threading.Event()
    lock = threading.Lock()
    alone = []

    def barrier(method, path):
        if method == "GET" and name in path:
            with lock:
                arrived.append(path)
                if len(arrived) == 2:
                    both.set()
            if not both.wait(5):
                alone.append(path)
        return False  # forward it

    since = log_size(http_server)
    with proxied(http_server, hold=barrier) as (proxy, url):
        r = run(transport, "info", url(name))
        assert r.returncode == 0, r.stderr
        gets = [g for g in proxy.gets if name in g[0]]
    ranges = sorted(g[1] for g in gets)
    size = v1.stat().st_size
    assert len(gets) == 2, gets
    assert not alone, f"{transport}: the head and the tail were not in flight together: {gets}"
    # The head from byte 0 and the tail counted from the end (size unknown before).
    head = [r for r in ranges if r.startswith("bytes=0-")]
    tail = [r for r in ranges if not r.startswith("bytes=0-")]
    assert len(head) == 1 and len(tail) == 1, ranges
    assert int(head[0].split("-")[1]) + 1 == _core.OPEN_HEAD_BYTES, ranges
    suffix = tail[0].split("=")[1]
    assert (suffix == f"-{_core.OPEN_TAIL_BYTES}"
            or suffix == f"{size - _core.OPEN_TAIL_BYTES}-{size - 1}"
            or suffix == f"{size - _core.OPEN_TAIL_BYTES}-"), ranges
    assert all(g[2] == 206 for g in gets), gets
    assert len(nginx_gets(http_server, since, name)) == 2  # nginx saw the same two


# ---- 2. touching ranges: one request ---------------------------------------------------------

@pytest.mark.parametrize("transport", TRANSPORTS)
def test_touching_ranges_go_as_one_request(transport, archive, http_server, tmp_path):
    v1, _, big = archive
    name = f"merge-{transport}-{uuid.uuid4().hex[:8]}.cask"
    publish(http_server, v1, name)
    out = tmp_path / "big.npy"
    with proxied(http_server) as (proxy, url):
        r = run(transport, "get", url(name), "big", "-o", str(out))
        assert r.returncode == 0, r.stderr
        gets = [g for g in proxy.gets if name in g[0]]
    np.testing.assert_array_equal(np.load(out), big)
    after_open = gets[2:]
    # 12 chunks of 1 MiB, those the open did not fetch touching each other:
    # one stretch, one GET (a stretch over 16 MiB would go as 8 MiB requests).
    assert len(after_open) == 1, f"{transport}: {after_open}"
    first, last = (int(x) for x in after_open[0][1].split("=")[1].split("-"))
    assert last - first + 1 < (12 << 20), after_open  # only what the open did not bring


# ---- 3. the version is pinned ----------------------------------------------------------------

@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_object_replaced_between_open_and_read_fails_the_read(transport, archive, http_server, tmp_path):
    v1, v2, _ = archive
    name = f"pin-{transport}-{uuid.uuid4().hex[:8]}.cask"
    publish(http_server, v1, name, mtime=time.time() - 100)
    seen = []

    def replace_after_open(method, path):
        if method == "GET" and name in path:
            seen.append(path)
            if len(seen) == 3:  # the open's two are answered: the read's first request
                publish(http_server, v2, name, mtime=time.time())
        return False

    out = tmp_path / "big.npy"
    with proxied(http_server, hold=replace_after_open) as (proxy, url):
        r = run(transport, "get", url(name), "big", "-o", str(out))
        statuses = [g[2] for g in proxy.gets if name in g[0]]
    assert len(seen) >= 3, seen  # the read did go to the server
    assert r.returncode == 5, (transport, r.returncode, r.stderr, statuses)  # corruption
    assert "changed" in r.stderr, r.stderr
    assert not out.exists() or out.stat().st_size == 0
    assert len(r.stderr.strip().splitlines()) <= 2, r.stderr


def test_an_object_replaced_between_open_and_read_fails_the_python_read(archive, http_server):
    """The same through treecask.open: the open pins the version, the read fails."""
    v1, v2, _ = archive
    name = f"pin-api-{uuid.uuid4().hex[:8]}.cask"
    publish(http_server, v1, name, mtime=time.time() - 100)
    with treecask.open(http_server.url(name)) as a:
        publish(http_server, v2, name, mtime=time.time())
        with pytest.raises(treecask.CorruptionError) as e:
            a.read("big")
    assert "changed" in str(e.value) and http_server.url(name) in str(e.value)


# ---- 4. a short or cut body ------------------------------------------------------------------

class _Cutting:
    """A real HTTP server on loopback serving one file by Range with an ETag,
    whose answers to every request after the first `whole` are short:
    ``mode="cut"`` promises the full Content-Length, sends half and closes
    the connection; ``mode="short"`` answers 206 with the Content-Range asked
    but a Content-Length (and body) half as long."""

    def __init__(self, data: bytes, mode: str, whole: int = 2):
        self.requests = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                with lock:
                    outer.requests += 1
                    n = outer.requests
                size = len(data)
                spec = self.headers["Range"].split("=", 1)[1]
                a, b = spec.split("-")
                start, end = (max(size - int(b), 0), size - 1) if a == "" else (int(a), min(int(b or size - 1), size - 1))
                body = data[start:end + 1]
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
                self.send_header("ETag", '"v1"')
                if n <= whole:
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                elif mode == "cut":
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                else:
                    self.send_header("Content-Length", str(len(body) // 2))
                    self.end_headers()
                    self.wfile.write(body[: len(body) // 2])

        lock = threading.Lock()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/model.cask"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("transport,mode", [
    ("libcurl", "cut"), ("libcurl", "short"),
    ("obstore", "cut"), ("obstore", "short")])
def test_a_short_or_cut_body_is_refused(transport, mode, archive, tmp_path):
    v1, _, _ = archive
    server = _Cutting(v1.read_bytes(), mode)
    out = tmp_path / "big.npy"
    try:
        r = run(transport, "get", server.url, "big", "-o", str(out))
    finally:
        server.close()
    assert server.requests > 2, server.requests  # the read went to the server
    assert r.returncode in (5, 8), (transport, mode, r.returncode, r.stderr)  # corruption or I/O error
    assert r.stderr.startswith("treecask: ") and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2, r.stderr  # one line, and at most its cause's first
    assert not out.exists() or out.stat().st_size == 0


# ---- 5. not found ----------------------------------------------------------------------------

@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_missing_object_is_not_found(transport, http_server):
    url = http_server.url(f"missing-{uuid.uuid4().hex}.cask")
    r = run(transport, "info", url)
    assert r.returncode == 2 and "not found" in r.stderr, (transport, r.returncode, r.stderr)
    assert len(r.stderr.strip().splitlines()) <= 2, r.stderr
    with pytest.raises(treecask.NotFoundError) as e:
        treecask.open(url)
    assert e.value.file == url
