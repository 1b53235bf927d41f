"""Contract tests of the loopback object-store servers (stores.py, fixtures in
conftest.py) that the remote-reading tests stand on: objects go in, byte ranges
come back, nginx honours (or, under /norange/, ignores) Range, and SeaweedFS
really checks S3 signatures."""

import urllib.request

import obstore
import pytest

import stores

DATA = bytes(range(256)) * 64  # 16 KiB, every offset distinguishable mod 256


@pytest.mark.parametrize("server", ["s3_server", "gcs_server"])
def test_put_and_range_read(server, request, monkeypatch):
    srv = request.getfixturevalue(server)
    srv.create_bucket("contract")
    srv.create_bucket("contract")  # idempotent
    srv.put("contract", "dir/ckpt.cask", DATA)
    store = srv.store("contract")
    assert bytes(obstore.get_range(store, "dir/ckpt.cask", start=1000, end=1100)) == DATA[1000:1100]
    assert obstore.head(store, "dir/ckpt.cask")["size"] == len(DATA)
    # The environment alone is enough for a client (S3: AWS_ENDPOINT_URL, keys,
    # AWS_ALLOW_HTTP; GCS: the emulator's base URL, no signature).
    for k, v in srv.env().items():
        monkeypatch.setenv(k, v)
    from_env = obstore.store.from_url(srv.url("contract", ""))
    assert bytes(obstore.get_range(from_env, "dir/ckpt.cask", start=len(DATA) - 7, length=7)) == DATA[-7:]


def test_s3_refuses_wrong_credentials(s3_server):
    s3_server.create_bucket("contract-auth")
    s3_server.put("contract-auth", "k", b"secret bytes")
    path = "/contract-auth/k"
    assert s3_server.request("GET", path)[0] == 200
    status, _, body = s3_server.request("GET", path, secret_key="not-the-secret")
    assert status == 403 and b"SignatureDoesNotMatch" in body
    status, _, body = s3_server.request("GET", path, access_key="NOSUCHACCESSKEY")
    assert status == 403 and b"InvalidAccessKeyId" in body
    assert stores._http("GET", s3_server.endpoint + path)[0] == 403  # unsigned
    with pytest.raises(obstore.exceptions.PermissionDeniedError):
        obstore.get_range(s3_server.store("contract-auth", secret_access_key="wrong"), "k", start=0, end=4)


def _get(url, range_=None):
    req = urllib.request.Request(url, headers={"Range": range_} if range_ else {})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, r.headers, r.read()


def test_http_range(http_server):
    (http_server.root / "sub").mkdir(exist_ok=True)
    (http_server.root / "sub" / "ckpt.cask").write_bytes(DATA)
    status, headers, body = _get(http_server.url("sub/ckpt.cask"), "bytes=1000-1099")
    assert status == 206 and body == DATA[1000:1100]
    assert headers["Content-Range"] == f"bytes 1000-1099/{len(DATA)}"
    status, _, body = _get(http_server.url("sub/ckpt.cask"), f"bytes=-{7}")
    assert status == 206 and body == DATA[-7:]


def test_http_norange_serves_whole_body(http_server):
    (http_server.root / "whole.cask").write_bytes(DATA)
    status, headers, body = _get(http_server.url("whole.cask", location="norange"), "bytes=1000-1099")
    assert status == 200 and body == DATA and "Content-Range" not in headers
