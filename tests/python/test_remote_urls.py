"""URLs as given, and no secret in any message (docs/remote.md "URLs" and
"Secrets"), against real servers on loopback (nginx, SeaweedFS; conftest.py):

- an https:// URL is requested exactly as written: its path never rewritten
  (no "//path"), its query string kept, so a presigned S3 URL reads like a
  public object (nginx's access log shows each request line as received);
- every public entry point (treecask.open / load / save, CheckpointManager,
  treecask.orbax, the C++ tool and the pip-installed ``treecask`` command),
  handed URLs that carry credentials in real presigned-URL shapes, shows
  them only through the core's redact_url: in str(e), repr(e), e.args,
  e.file, e.message, every chained exception, warnings and stderr;
- credentials inside an s3:// / gs:// / az:// URL are refused; a 0-byte
  object or file is NotAnArchiveError."""

from __future__ import annotations

import datetime
import os
import pathlib
import shutil
import subprocess
import sys
import uuid
import warnings

import numpy as np
import pytest

import treecask
import treecask.orbax as tco
from treecask import _core
from treecask.errors import (Error, InvalidArgumentError, IoError, NotAnArchiveError, NotFoundError,
                             UnsupportedError)

CLI = os.environ.get("TREECASK_CLI")
# The `treecask` command pip installs (next to this interpreter).
PIP_CLI = shutil.which("treecask", path=os.path.dirname(sys.executable))

TREE = {"w": np.arange(4096, dtype=np.float32).reshape(64, 64), "b": np.ones(7, np.int16), "step": 3}

# What must never be printed: real shapes of presigned-URL credentials.
SIGNATURE = "5c0f7a8e9d1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5"
TOKEN = "IQoJb3JpZ2luX2VjEJr-SECRET-SESSION-TOKEN-0123456789"
ACCESS_KEY = "AKIASECRETACCESSKEY9"
PASSWORD = "pw-SECRET-hunter2"
SAS = "sv-SECRET-sig-Zm9vYmFyYmF6"
GOOG = "goog-SECRET-signature-abcdef0123456789"
SECRETS = [SIGNATURE, TOKEN, ACCESS_KEY, PASSWORD, SAS, GOOG]
# Query strings as S3 (SigV4, a percent-encoded parameter name too), GCS and Azure make them.
S3_QUERY = (f"X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={ACCESS_KEY}%2F20260101%2Fus-east-1%2Fs3"
            f"%2Faws4_request&X-Amz-Date=20260101T000000Z&X-Amz-Expires=900&X-Amz-SignedHeaders=host"
            f"&X-Amz-Security-Token={TOKEN}&X%2DAmz%2DSignature={SIGNATURE}")
GCS_QUERY = (f"X-Goog-Algorithm=GOOG4-HMAC-SHA256&X-Goog-Credential={ACCESS_KEY}%2F20260101%2Fauto"
             f"%2Fstorage%2Fgoog4_request&X-Goog-Date=20260101T000000Z&X-Goog-Expires=900"
             f"&X-Goog-SignedHeaders=host&X-Goog-Signature={GOOG}")
AZ_QUERY = f"sv=2022-11-02&ss=b&srt=o&sp=r&se=2026-01-01T00%3A00%3A00Z&spr=https&sig={SAS}"


def assert_clean(text: str, secrets=SECRETS):
    for s in secrets:
        assert s not in text, f"secret {s!r} in: {text}"


def exception_texts(e: BaseException):
    """The text of `e` and of every exception chained to it, as a traceback
    or a logger would show them: str, repr, args, and treecask's attributes."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield str(e)
        yield repr(e)
        yield repr(e.args)
        for attr in ("file", "message", "filename", "filename2"):
            v = getattr(e, attr, None)
            if v is not None:
                yield str(v)
        for chained in (e.__cause__, e.__context__):
            if chained is not None:
                yield from exception_texts(chained)
        e = None


def raises_clean(call, kind=Error, secrets=SECRETS):
    """Runs `call`, which must raise `kind`; asserts that no secret appears in
    the exception, its chain, or a warning. Returns the exception."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(kind) as info:
            call()
    for text in exception_texts(info.value):
        assert_clean(text, secrets)
    for w in caught:
        assert_clean(str(w.message), secrets)
    return info.value


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    p = tmp_path_factory.mktemp("urls") / "model.cask"
    treecask.save(p, TREE)
    return p


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    s3_server.create_bucket("urls")
    return s3_server


def access_log(http_server) -> pathlib.Path:
    return http_server.server.log_path.parent / "access.log"


def request_uris(http_server, since: int, name: str, settle: float = 0.3):
    """The request URIs (as nginx received them) of the requests logged after
    byte `since` of the access log that name `name`."""
    import time
    log = access_log(http_server)
    text = ""
    for _ in range(20):  # nginx logs a request after its last byte: let it settle
        time.sleep(settle)
        again = log.read_bytes()[since:].decode()
        if again == text:
            break
        text = again
    return [line.split('"')[1].split(" ")[1] for line in text.splitlines() if name in line]


def test_https_urls_are_requested_exactly_as_given(archive, http_server):
    """No "//path", no query moved into the path: every request line is the URL's own."""
    (http_server.root / "sub").mkdir(exist_ok=True)
    shutil.copy(archive, http_server.root / "top.cask")
    shutil.copy(archive, http_server.root / "sub" / "deep.cask")
    for rel in ("top.cask", "sub/deep.cask"):
        for query in ("", "?" + S3_QUERY, "?" + AZ_QUERY + "&x=a%2Fb"):
            url = http_server.url(rel) + query
            want = url[len(http_server.endpoint):]
            since = access_log(http_server).stat().st_size
            got = treecask.load(url)
            np.testing.assert_array_equal(got["w"], TREE["w"])
            with treecask.open(url) as a:
                assert a.path == _core.redact_url(url)  # the URL as given, its secrets redacted
                assert_clean(repr(a))
                np.testing.assert_array_equal(a.read("b"), TREE["b"])
            uris = request_uris(http_server, since, rel.split("/")[-1])
            assert uris and set(uris) == {want}, uris
            if CLI:  # the libcurl tool requests the same
                since = access_log(http_server).stat().st_size
                r = subprocess.run([CLI, "ls", url], capture_output=True, text=True)
                assert r.returncode == 0 and "w" in r.stdout, r.stderr
                uris = request_uris(http_server, since, rel.split("/")[-1])
                assert uris and set(uris) == {want}, uris


def test_a_presigned_s3_url_reads_like_a_public_object(archive, s3_env, monkeypatch):
    """A URL presigned with AWS Signature V4 in its query (as boto3's
    generate_presigned_url makes it), checked by SeaweedFS: read without any
    credentials; the same URL with its signature altered is refused, and the
    altered signature is never printed."""
    key = f"{uuid.uuid4().hex}/model.cask"
    s3_env.put("urls", key, archive)
    url = s3_env.presign("urls", key)
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(k)
    got = treecask.load(url)
    np.testing.assert_array_equal(got["w"], TREE["w"])
    assert got["step"] == 3
    signature = url.rsplit("X-Amz-Signature=", 1)[1]
    bad = url[: -len(signature)] + signature[::-1]
    e = raises_clean(lambda: treecask.load(bad), IoError, [signature[::-1], signature, s3_env.secret_key])
    assert "access denied" in str(e) and "X-Amz-Signature=***" in e.file
    if CLI:
        r = subprocess.run([CLI, "info", url], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        r = subprocess.run([CLI, "info", bad], capture_output=True, text=True)
        assert r.returncode == 8 and "access denied" in r.stderr, r.stderr
        assert_clean(r.stderr, [signature[::-1], s3_env.secret_key])


def test_credentials_inside_a_bucket_url_are_refused(tmp_path):
    for scheme in ("s3", "gs", "az"):
        url = f"{scheme}://{ACCESS_KEY}:{PASSWORD}@bucket/run/model.cask"
        for call in (lambda: treecask.load(url), lambda: treecask.save(url, TREE),
                     lambda: treecask.CheckpointManager(url.rsplit("/", 1)[0])):
            e = raises_clean(call, InvalidArgumentError)
            assert "credentials belong in the environment or storage_options" in e.message
            assert e.file == f"{scheme}://***@bucket/run/model.cask" or e.file == f"{scheme}://***@bucket/run"
    if CLI:
        for scheme in ("s3", "gs"):
            r = subprocess.run([CLI, "info", f"{scheme}://{ACCESS_KEY}:{PASSWORD}@bucket/k.cask"],
                               capture_output=True, text=True)
            assert r.returncode == 7 and "credentials belong in the environment" in r.stderr, r.stderr
            assert_clean(r.stderr)


def test_the_url_rule_is_the_cores_and_drives_the_package():
    # The binding's answers (include/treecask/remote.h parse_url), for every scheme it knows.
    assert _core.URL_SCHEMES == ("s3", "gs", "az", "http", "https")
    assert _core.parse_url("S3://bucket/run/x.cask") == {
        "scheme": "s3", "bucket": "bucket", "key": "run/x.cask", "directory": False}
    assert _core.parse_url("gs://b/run/ckpt/", prefix=True) == {
        "scheme": "gs", "bucket": "b", "key": "run/ckpt/", "directory": True}
    assert _core.parse_url("az://container", prefix=True) == {
        "scheme": "az", "bucket": "container", "key": "", "directory": False}
    assert _core.parse_url(f"https://h/a//b.cask?{S3_QUERY}") == {
        "scheme": "https", "bucket": "", "key": "", "directory": False}
    assert _core.parse_url("http://h/run/", prefix=True)["directory"]
    for url in ("hdfs://namenode/x.cask", "s4://bucket/x.cask", "file:///tmp/x.cask"):
        e = raises_clean(lambda: _core.parse_url(url), UnsupportedError)
        assert url.split("://")[0] + "://" in e.message and e.file == url
    for url in ("s3://bucket", "s3://bucket/", "gs:///k", "az://", "https:///x.cask", "not a url"):
        raises_clean(lambda: _core.parse_url(url), InvalidArgumentError)
    e = raises_clean(lambda: _core.parse_url(f"az://u:{PASSWORD}@c/k", prefix=True), InvalidArgumentError)
    assert "credentials belong in the environment or storage_options" in e.message and e.file == "az://***@c/k"

    # The package takes URLs apart with it: the store of a URL and the path in it.
    store, path = treecask.stores.ObjectStore.from_url("S3://bucket/run/x.cask?v=1")
    assert (store.name, path) == ("s3://bucket", "run/x.cask?v=1")  # the key verbatim
    url = f"https://h/a//b.cask?{S3_QUERY}"
    store, path = treecask.stores.ObjectStore.from_url(url)
    assert path == "" and store.display() == _core.redact_url(url)
    # A "directory" URL: the path without its trailing "/", the caller's "directory" kept.
    loc = treecask.stores.resolve("gs://b/run//")
    assert (loc.path, loc.directory, loc.shown) == ("run", True, "gs://b/run")
    assert treecask.stores.resolve("gs://b").path == ""
    # is_url: any "<letters>://" string is a URL, never a local path.
    is_url = treecask.stores.is_url
    assert is_url("hdfs://x") and is_url("S3://b/k") and not is_url("s3:/b/k")
    assert not is_url(pathlib.Path("s3://b/k")) and not is_url("./s3://b")


def test_obstore_gets_the_cores_retry_policy_and_concurrency():
    r = _core.RETRY_POLICY
    assert r == {"max_retries": 5, "initial_backoff_s": 0.05, "max_backoff_s": 2.0, "backoff_base": 2.0,
                 "timeout_s": 60.0, "connect_timeout_s": 10.0, "stall_timeout_s": 30.0}
    expected = {"max_retries": r["max_retries"], "retry_timeout": datetime.timedelta(seconds=r["timeout_s"]),
                "backoff": {"init_backoff": datetime.timedelta(seconds=r["initial_backoff_s"]),
                            "max_backoff": datetime.timedelta(seconds=r["max_backoff_s"]),
                            "base": r["backoff_base"]}}
    for url in ("s3://bucket/x.cask", "gs://bucket/x.cask", "https://h/x.cask?sig=1", "http://h/x.cask"):
        store, _ = treecask.stores.ObjectStore.from_url(url)
        assert store.store.retry_config == expected, url  # what obstore holds, read back
    store, path = treecask.stores.ObjectStore.from_url("http://h/x.cask")
    assert store.source(path).concurrency == _core.OBJECT_CONCURRENCY == 16


def test_an_empty_object_or_file_is_not_an_archive(s3_env, http_server, tmp_path):
    empty = tmp_path / "empty.cask"
    empty.write_bytes(b"")
    key = f"{uuid.uuid4().hex}/empty.cask"
    s3_env.put("urls", key, b"")
    shutil.copy(empty, http_server.root / "empty.cask")
    for target in (empty, f"s3://urls/{key}", http_server.url("empty.cask")):
        with pytest.raises(NotAnArchiveError):
            treecask.open(target)
        with pytest.raises(NotAnArchiveError):
            treecask.load(target)
        if CLI:
            r = subprocess.run([CLI, "info", str(target)], capture_output=True, text=True)
            assert r.returncode == 3 and "not an archive" in r.stderr, r.stderr


def _manager_save(url, **kw):
    with treecask.CheckpointManager(url, **kw) as m:
        m.save(1, TREE)
        m.wait_until_finished()


def _orbax_manager_save(url):
    with tco.CheckpointManager(url) as m:
        m.save(1, args=tco.args.StandardSave(TREE))
        m.wait_until_finished()


def test_no_secret_in_any_message(archive, s3_env, http_server, capfd):
    """Every public entry point, handed URLs that carry credentials (userinfo,
    presigned S3 / GCS query strings, an Azure SAS, percent-encoded names,
    storage_options), fails without printing one: not in str, repr, args,
    file or message of the error, nor of any exception chained to it, nor in
    a warning, nor on stderr; both tools likewise."""
    shutil.copy(archive, http_server.root / "sweep.cask")
    host = http_server.endpoint.split("//", 1)[1]
    reads = {  # url -> the error it must raise
        f"http://{ACCESS_KEY}:{PASSWORD}@{host}/missing.cask?{S3_QUERY}": NotFoundError,
        http_server.url("sweep.cask", location="norange") + "?" + GCS_QUERY: Error,  # Range ignored
        f"{s3_env.endpoint}/urls/missing.cask?{S3_QUERY}": IoError,  # SeaweedFS: 403, unknown key
        f"http://127.0.0.1:9/x.cask?{AZ_QUERY}": IoError,  # nothing listens
        f"s3://{ACCESS_KEY}:{PASSWORD}@urls/run/x.cask": InvalidArgumentError,
        f"gs://user:{PASSWORD}@bucket/x.cask?{GCS_QUERY}": InvalidArgumentError,
        f"az://user:{PASSWORD}@container/x.cask?{AZ_QUERY}": InvalidArgumentError,
    }
    bad_options = {"access_key_id": ACCESS_KEY, "secret_access_key": PASSWORD}
    calls = []
    for url, kind in reads.items():
        calls += [(kind, lambda u=url: treecask.open(u)), (kind, lambda u=url: treecask.load(u)),
                  (kind, lambda u=url: tco.StandardCheckpointer().restore(u)),
                  (kind, lambda u=url: tco.PyTreeCheckpointer().restore(u)),
                  (Error, lambda u=url: treecask.save(u, TREE)),  # http(s) read-only, or refused
                  (Error, lambda u=url: tco.StandardCheckpointer().save(u, TREE)),
                  (Error, lambda u=url: _manager_save(u.rsplit("/", 1)[0])),
                  (Error, lambda u=url: _orbax_manager_save(u.rsplit("/", 1)[0]))]
    calls += [(IoError, lambda: treecask.load("s3://urls/missing.cask", storage_options=bad_options)),
              (IoError, lambda: treecask.save(f"s3://urls/{uuid.uuid4().hex}.cask", TREE,
                                              storage_options=bad_options)),
              (IoError, lambda: _manager_save(f"s3://urls/{uuid.uuid4().hex}", storage_options=bad_options))]
    for kind, call in calls:
        raises_clean(call, kind)
    out, err = capfd.readouterr()
    assert_clean(out + err)

    for tool in (t for t in (CLI, PIP_CLI) if t):
        for url in reads:
            for cmd in (["info", url], ["ls", url], ["verify", url], ["get", url, "w", "-o", os.devnull]):
                r = subprocess.run([tool, *cmd], capture_output=True, text=True)
                # (libcurl's source reads an archive below 256 KiB from a server that ignores Range)
                assert r.returncode != 11 and (r.returncode == 0 or r.stderr.startswith("treecask: ")), r.stderr
                assert_clean(r.stdout + r.stderr)


@pytest.mark.skipif(not PIP_CLI, reason="no pip-installed treecask command next to this Python")
def test_the_pip_installed_command_reads_urls(archive, s3_env, http_server, tmp_path):
    """`pip install treecask` then `treecask info|ls|verify|get|export URL`:
    the tool's own commands, the objects read through obstore."""
    key = f"{uuid.uuid4().hex}/model.cask"
    s3_env.put("urls", key, archive)
    shutil.copy(archive, http_server.root / "pip.cask")
    for url in (f"s3://urls/{key}", http_server.url("pip.cask") + "?" + S3_QUERY):
        r = subprocess.run([PIP_CLI, "info", url], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert_clean(r.stdout)
        r = subprocess.run([PIP_CLI, "ls", url], capture_output=True, text=True)
        assert r.returncode == 0 and "w" in r.stdout.split(), r.stderr
        assert subprocess.run([PIP_CLI, "verify", url], capture_output=True).returncode == 0
        out = tmp_path / f"{uuid.uuid4().hex}.npy"
        r = subprocess.run([PIP_CLI, "get", url, "w", "-o", str(out)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        np.testing.assert_array_equal(np.load(out), TREE["w"])
    arrays = tmp_path / "arrays.cask"
    treecask.save(arrays, {"w": TREE["w"], "b": TREE["b"]})
    s3_env.put("urls", f"{key}.arrays", arrays)
    st, want = tmp_path / "remote.safetensors", tmp_path / "local.safetensors"
    assert subprocess.run([PIP_CLI, "export", f"s3://urls/{key}.arrays", str(st)]).returncode == 0
    assert subprocess.run([PIP_CLI, "export", str(arrays), str(want)]).returncode == 0
    assert st.read_bytes() == want.read_bytes()
    r = subprocess.run([PIP_CLI, "info", f"s3://urls/{key}.missing"], capture_output=True, text=True)
    assert r.returncode == 2 and "not found" in r.stderr, r.stderr
