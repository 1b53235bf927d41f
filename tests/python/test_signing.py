"""Signed checkpoints (issue 36, docs/signing.md): OpenSSF model-signing bundles
checked by the core, both ways with the real ``model_signing`` 1.1.1 (a test
dependency: python/requirements-test.txt).

* A bundle treecask writes is accepted unchanged by ``model_signing``: its CLI
  ``model_signing verify key`` for file serialization; for shard serialization its
  Python API (``verifying.Config().use_elliptic_key_verifier(...).verify``, which
  reads the serialization from the bundle), because the 1.1.1 CLI always hashes as
  files and so refuses every shards bundle, model_signing's own included.
* A bundle ``model_signing`` writes (file and shard serialization; an archive file and
  a sharded checkpoint directory) is verified by ``treecask.verify``,
  ``treecask.open`` / ``load`` and ``treecask verify``.
* Everything else raises ``treecask.SignatureError`` (a ``ValueError``): an archive
  with one leaf changed under the first's signature (no byte the signature does not
  cover is ever handed out), a wrong key, a statement for another file, truncated /
  reordered / overlapping / missing shard resources (statements edited and re-signed
  with the key, so that only their content is wrong; model_signing refuses each too),
  a file appended to after signing, an unsupported key type or hash algorithm (named),
  a sharded directory with a shard file from another save.
* Over S3 (SeaweedFS on loopback) a verified read fetches only its covering shards.
* ``copy=False`` views are handed out only after their shards verify.

The keys are made at test time (``cryptography``, which model_signing depends on).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import uuid

import numpy as np
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

import model_signing
import treecask
from conftest import bits, file_offset_of, trees_equal
from treecask.errors import SignatureError

ROOT = pathlib.Path(__file__).resolve().parents[2]
VECTORS = ROOT / "format" / "vectors"
CLI = os.environ.get("TREECASK_CLI")
needs_cli = pytest.mark.skipif(
    not CLI, reason="TREECASK_CLI is not set (point it at the built CLI, e.g. build/src/cli/treecask)")

SHARD = 64 << 10  # shard size of the model_signing bundles below: several shards per leaf
IN_TOTO = b"application/vnd.in-toto+json"


# ---- keys, archives ----------------------------------------------------------------

def _pem_private(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _pem_public(key) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)


class KeyPair:
    """A key pair as PEM files (``private``, ``public``) and bytes (``private_pem``, ``public_pem``)."""

    def __init__(self, directory: pathlib.Path, name: str, key):
        self.key = key
        self.private_pem, self.public_pem = _pem_private(key), _pem_public(key)
        self.private = directory / f"{name}.pem"
        self.public = directory / f"{name}.pub.pem"
        self.private.write_bytes(self.private_pem)
        self.public.write_bytes(self.public_pem)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    return {
        "p256": KeyPair(d, "p256", ec.generate_private_key(ec.SECP256R1())),
        "other": KeyPair(d, "other", ec.generate_private_key(ec.SECP256R1())),
        "p384": KeyPair(d, "p384", ec.generate_private_key(ec.SECP384R1())),
        "rsa": KeyPair(d, "rsa", rsa.generate_private_key(public_exponent=65537, key_size=2048)),
        "ed25519": KeyPair(d, "ed25519", ed25519.Ed25519PrivateKey.generate()),
    }


def model_tree(changed: float = 0.0):
    """A small model: raw leaves of 96 KiB to 1 MiB (each over several 64 KiB shards),
    an LZ4-compressible one, scalars and a string. `changed` alters only ``params/dense/kernel``."""
    rng = np.random.default_rng(0)
    kernel = rng.standard_normal((256, 1024)).astype(np.float32)
    kernel[17, 100] += changed
    return {
        "params": {
            "embed": rng.standard_normal((96, 256)).astype(np.float32),
            "dense": {"kernel": kernel, "bias": np.arange(1024, dtype=np.float32)},
            "head": rng.standard_normal((1024, 64)).astype(np.float32),
        },
        "zeros": np.zeros(50_000, np.int32),
        "step": 1234,
        "note": "signed",
    }


def save(path, changed: float = 0.0) -> pathlib.Path:
    """The model, raw, in 64 KiB chunks (a read checks whole chunks: these are as small as the
    shards of the bundles below, so that reads of one leaf's rows touch only their shards)."""
    treecask.save(path, model_tree(changed), compression="none", overwrite=True, chunk_size=64 << 10)
    return pathlib.Path(path)


def same_layout_pair(tmp_path):
    """Two archives of one name in two directories, of the same layout: the second's
    ``params/dense/kernel`` differs in one element (its bytes and its checksum)."""
    (tmp_path / "first").mkdir(), (tmp_path / "second").mkdir()
    first = save(tmp_path / "first" / "model.cask")
    second = save(tmp_path / "second" / "model.cask", changed=1.0)
    assert first.stat().st_size == second.stat().st_size
    return first, second


@pytest.fixture
def archive(tmp_path) -> pathlib.Path:
    return save(tmp_path / "model.cask")


@pytest.fixture
def directory(tmp_path) -> pathlib.Path:
    """A sharded checkpoint directory (format 3.1: index.cask binding process_0/1.cask)."""
    d = tmp_path / "ckpt"
    shutil.copytree(VECTORS / "v3_1_bound", d)
    return d


def read_all(reader) -> dict:
    return {k: reader.read(k) for k in reader.keys()}


def same_arrays(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        x.dtype == y.dtype and x.shape == y.shape and np.array_equal(bits(x), bits(y))
        for x, y in ((a[k], b[k]) for k in a))


# ---- model_signing, its CLI and its Python API -------------------------------------------

def ms_sign(model, key: KeyPair, signature, *, shard_size=None, algorithm="sha256") -> pathlib.Path:
    """Signs with model_signing's Python API, as ``model_signing sign key`` does (which
    has no option for shards): file serialization, or shards of `shard_size` bytes."""
    h = model_signing.hashing.Config()
    if shard_size is None:
        h.use_file_serialization(hashing_algorithm=algorithm)
    else:
        h.use_shard_serialization(shard_size=shard_size, hashing_algorithm=algorithm)
    (model_signing.signing.Config().use_elliptic_key_signer(private_key=key.private)
     .set_hashing_config(h).sign(model, signature))
    return pathlib.Path(signature)


def ms_cli(*args):
    return subprocess.run([sys.executable, "-m", "model_signing", *map(str, args)], capture_output=True,
                          text=True, timeout=120)


def ms_verify(model, signature, public_key, *, shard_size=None) -> None:
    """model_signing's verification: its Python API with the hashing configuration read
    from the bundle (`shard_size` None; the 1.1.1 CLI cannot, see the module docstring),
    or given (`shard_size`: model_signing's own shards bundles write it as a float, which
    its reader cannot use). Raises ValueError (or TypeError) when it refuses."""
    cfg = model_signing.verifying.Config().use_elliptic_key_verifier(public_key=public_key)
    if shard_size is not None:
        cfg.set_hashing_config(model_signing.hashing.Config().use_shard_serialization(shard_size=shard_size))
    cfg.verify(model, signature)


def statement_of(signature) -> dict:
    bundle = json.loads(pathlib.Path(signature).read_text())
    return json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))


def resign(signature, key: KeyPair, out, edit) -> pathlib.Path:
    """A copy of the bundle at `signature` whose in-toto statement `edit(statement)` changed,
    with the subject's root digest recomputed (SHA-256 over the resource digests, in order,
    as model_signing checks it) and signed again with `key` (DSSE PAE, ECDSA-SHA256): only
    the statement's content is wrong, never its signature."""
    bundle = json.loads(pathlib.Path(signature).read_text())
    st = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    edit(st)
    root = hashlib.sha256()
    for r in st["predicate"]["resources"]:
        root.update(bytes.fromhex(r["digest"]))
    st["subject"][0]["digest"]["sha256"] = root.hexdigest()
    payload = json.dumps(st, indent=2).encode()
    pae = b"DSSEv1 %d %s %d %s" % (len(IN_TOTO), IN_TOTO, len(payload), payload)
    sig = key.key.sign(pae, ec.ECDSA(hashes.SHA256()))
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(payload).decode()
    bundle["dsseEnvelope"]["signatures"] = [{"sig": base64.b64encode(sig).decode(), "keyid": ""}]
    pathlib.Path(out).write_text(json.dumps(bundle))
    return pathlib.Path(out)


def sha256_hex(path, start, end) -> str:
    with open(path, "rb") as f:
        f.seek(start)
        return hashlib.sha256(f.read(end - start)).hexdigest()


# ---- treecask's CLI ------------------------------------------------------------------

def tc_cli(*args):
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=120)


# ---- treecask -> model_signing --------------------------------------------------------

def test_signature_error_is_a_value_error():
    assert issubclass(SignatureError, treecask.Error) and issubclass(SignatureError, ValueError)
    assert treecask.SignatureError is SignatureError
    assert SignatureError.code == 12 and SignatureError.code_name == "signature"


def test_a_file_serialization_bundle_is_accepted_by_the_model_signing_cli(archive, keys):
    out = treecask.sign(archive, private_key=keys["p256"].private, files=True)
    assert out == str(archive) + ".sig" and pathlib.Path(out).is_file()
    st = statement_of(out)
    assert st["predicateType"] == "https://model_signing/signature/v1.0"
    assert st["predicate"]["serialization"]["method"] == "files"
    assert [r["name"] for r in st["predicate"]["resources"]] == ["."]  # a model that is one file
    r = ms_cli("verify", "key", archive, "--signature", out, "--public_key", keys["p256"].public)
    assert r.returncode == 0 and "Verification succeeded" in r.stdout, r.stdout + r.stderr
    # ... and model_signing's check is a real one: the archive changed, it refuses.
    save(archive, changed=1.0)
    r = ms_cli("verify", "key", archive, "--signature", out, "--public_key", keys["p256"].public)
    assert r.returncode != 0 and "Signature mismatch" in r.stderr


def test_a_shards_bundle_is_accepted_by_model_signing(archive, keys, tmp_path):
    sig = tmp_path / "model.sig"
    out = treecask.sign(archive, private_key=keys["p256"].private_pem, signature=sig)  # PEM bytes
    assert out == str(sig)
    st = statement_of(sig)
    ser = st["predicate"]["serialization"]
    assert ser["method"] == "shards" and ser["hash_type"] == "sha256"
    shard = ser["shard_size"]
    # The default keeps a 4 MiB leaf's verified read under 3x its bytes (S + 2 shards).
    assert (4 << 20) + 2 * shard < 3 * (4 << 20)
    size = archive.stat().st_size
    names = [r["name"] for r in st["predicate"]["resources"]]
    assert names[0] == ".:0:%d" % min(shard, size) and names[-1].endswith(":%d" % size)
    ms_verify(archive, sig, keys["p256"].public)  # the serialization read from the bundle
    save(archive, changed=1.0)
    with pytest.raises(ValueError, match="Signature mismatch"):
        ms_verify(archive, sig, keys["p256"].public)


def test_a_sharded_directory_signed_by_treecask_is_accepted_by_model_signing(directory, keys, tmp_path):
    for files in (True, False):
        sig = tmp_path / f"ckpt_{files}.sig"  # outside the model directory
        treecask.sign(directory, private_key=keys["p256"].private, signature=sig, files=files,
                      shard_size=None if files else 4096)
        names = {r["name"].split(":")[0] for r in statement_of(sig)["predicate"]["resources"]}
        assert names == {"index.cask", "process_0.cask", "process_1.cask"}
        if files:
            r = ms_cli("verify", "key", directory, "--signature", sig, "--public_key", keys["p256"].public)
            assert r.returncode == 0, r.stdout + r.stderr
        else:
            ms_verify(directory, sig, keys["p256"].public)
        treecask.verify(directory, signature=sig, public_key=keys["p256"].public)


def test_sign_then_verify_round_trip_with_every_supported_curve(archive, keys, tmp_path):
    for name in ("p256", "p384"):
        sig = treecask.sign(archive, private_key=keys[name].private, signature=tmp_path / f"{name}.sig",
                            shard_size=SHARD)
        treecask.verify(archive, signature=sig, public_key=keys[name].public)
        ms_verify(archive, sig, keys[name].public)
        with treecask.open(archive, signature=sig, public_key=keys[name].public_pem) as a:
            assert same_arrays(read_all(a), read_all(treecask.open(archive)))


# ---- model_signing -> treecask --------------------------------------------------------

@pytest.mark.parametrize("shard_size", [None, SHARD], ids=["files", "shards"])
def test_a_model_signing_bundle_of_an_archive_verifies_in_treecask(archive, keys, tmp_path, shard_size):
    sig = ms_sign(archive, keys["p256"], tmp_path / "model.sig", shard_size=shard_size)
    pub = keys["p256"].public
    treecask.verify(archive, signature=sig, public_key=pub)
    treecask.verify(archive, signature=sig.read_bytes(), public_key=keys["p256"].public_pem)  # bytes
    want = model_tree()
    with treecask.open(archive, signature=sig, public_key=pub) as a:
        assert same_arrays(read_all(a), read_all(treecask.open(archive)))
        assert a.verify() == []
    assert trees_equal(treecask.load(archive, signature=sig, public_key=pub), want)
    assert trees_equal(treecask.load(archive, subtree="params", signature=str(sig), public_key=str(pub)),
                       want["params"])


def test_a_model_signing_cli_bundle_verifies_in_treecask(archive, keys, tmp_path):
    sig = tmp_path / "cli.sig"
    r = ms_cli("sign", "key", archive, "--private_key", keys["p256"].private, "--signature", sig)
    assert r.returncode == 0, r.stdout + r.stderr
    treecask.verify(archive, signature=sig, public_key=keys["p256"].public)
    assert trees_equal(treecask.load(archive, signature=sig, public_key=keys["p256"].public), model_tree())


@pytest.mark.parametrize("shard_size", [None, 4096], ids=["files", "shards"])
def test_a_model_signing_bundle_of_a_sharded_directory_verifies_in_treecask(directory, keys, tmp_path,
                                                                           shard_size):
    sig = ms_sign(directory, keys["p256"], tmp_path / "ckpt.sig", shard_size=shard_size)
    pub = keys["p256"].public
    treecask.verify(directory, signature=sig, public_key=pub)
    with treecask.open(directory, signature=sig, public_key=pub) as c:
        assert isinstance(c, treecask.ShardedArchive)
        assert same_arrays(read_all(c), read_all(treecask.open(directory)))
    assert trees_equal(treecask.load(directory, signature=sig, public_key=pub), treecask.load(directory))


@needs_cli
@pytest.mark.parametrize("shard_size", [None, SHARD], ids=["files", "shards"])
def test_the_cli_verifies_and_reads_a_model_signing_bundle(archive, keys, tmp_path, shard_size):
    sig = ms_sign(archive, keys["p256"], tmp_path / "model.sig", shard_size=shard_size)
    pub = keys["p256"].public
    r = tc_cli("verify", archive, "--signature", sig, "--public-key", pub)
    assert r.returncode == 0, r.stdout + r.stderr
    out = tmp_path / "bias.npy"
    r = tc_cli("get", archive, "params/dense/bias", "-o", out, "--signature", sig, "--public-key", pub)
    assert r.returncode == 0, r.stdout + r.stderr
    np.testing.assert_array_equal(np.load(out), np.arange(1024, dtype=np.float32))
    r = tc_cli("verify", archive, "--signature", sig, "--public-key", keys["other"].public)
    assert r.returncode not in (0, 1) and "signature" in r.stderr, r.stdout + r.stderr


# ---- one changed leaf under the first archive's signature -------------------------------

@pytest.mark.parametrize("shard_size", [None, SHARD], ids=["files", "shards"])
def test_a_changed_leaf_under_the_first_archives_signature_is_never_handed_out(tmp_path, keys, shard_size):
    first, second = same_layout_pair(tmp_path)  # same layout, one leaf's bytes differ
    assert first.stat().st_size == second.stat().st_size
    sig = ms_sign(first, keys["p256"], tmp_path / "first.sig", shard_size=shard_size)
    pub = keys["p256"].public
    plain = read_all(treecask.open(first))
    assert not np.array_equal(read_all(treecask.open(second))["params/dense/kernel"], plain["params/dense/kernel"])

    with pytest.raises(SignatureError) as e:
        treecask.verify(second, signature=sig, public_key=pub)
    assert "model.cask" in str(e.value)
    for call in (lambda: treecask.load(second, signature=sig, public_key=pub),
                 lambda: treecask.load(second, signature=sig, public_key=pub, copy=False)):
        with pytest.raises(SignatureError):
            call()
    try:
        a = treecask.open(second, signature=sig, public_key=pub)
    except SignatureError as opened:  # the open's own pages differ (or file serialization)
        assert "model.cask" in str(opened)
        return
    assert shard_size is not None, "file serialization hashes the whole file at open"
    with a:
        for read in (lambda: a["params/dense/kernel"], lambda: a.read("params/dense/kernel"),
                     lambda: a.read_slice("params/dense/kernel", (17, slice(0, 200))),
                     lambda: a.read_rows("params/dense/kernel", 16, 18)):
            with pytest.raises(SignatureError) as e:
                read()
            assert "model.cask" in str(e.value)
        # Every other leaf: its bytes, when all its shards verify; else SignatureError.
        for k, want in plain.items():
            if k == "params/dense/kernel":
                continue
            try:
                got = a.read(k)
            except SignatureError:
                continue
            assert np.array_equal(bits(got), bits(want)), k
        assert a.verify() != []  # Reader.verify lists the changed leaf
    # The genuine archive, the same calls: everything verifies.
    with treecask.open(first, signature=sig, public_key=pub) as a:
        assert same_arrays(read_all(a), plain) and a.verify() == []


def flipped_copy(first: pathlib.Path, directory: pathlib.Path, key: str = "params/dense/kernel") -> pathlib.Path:
    """A copy of `first` (same name, in `directory`) with one byte flipped in the middle of
    leaf `key`'s stored bytes, its checksum left as it was: only that leaf's bytes differ."""
    with treecask.open(first) as a:
        at = file_offset_of(a[key], first) + a.info(key).byte_length // 2
    data = bytearray(first.read_bytes())
    data[at] ^= 0x40
    directory.mkdir(exist_ok=True)
    out = directory / first.name
    out.write_bytes(bytes(data))
    return out


@pytest.mark.parametrize("verify_checksums", [True, False])
def test_a_flipped_byte_in_one_leaf_fails_that_leafs_verified_reads_only(tmp_path, keys, verify_checksums):
    first = save(tmp_path / "model.cask")
    second = flipped_copy(first, tmp_path / "flipped")
    sig = ms_sign(first, keys["p256"], tmp_path / "first.sig", shard_size=SHARD)
    pub = keys["p256"].public
    plain = read_all(treecask.open(first))
    # The open's own pages are intact: it succeeds; the one leaf's reads raise SignatureError
    # (never its bytes, never a ChecksumError first: its shards are hashed before any use).
    with treecask.open(second, signature=sig, public_key=pub, verify_checksums=verify_checksums) as a:
        for read in (lambda: a["params/dense/kernel"], lambda: a.read("params/dense/kernel"),
                     lambda: a.read_many([a.keys().index("params/dense/kernel")]),
                     lambda: a.read_slice("params/dense/kernel", (slice(100, 160),)),
                     lambda: a.load(copy=False), lambda: a.load()):
            with pytest.raises(SignatureError) as e:
                read()
            assert "model.cask" in str(e.value)
        for k, want in plain.items():  # every other leaf lies in other shards: read, verified
            if k != "params/dense/kernel":
                assert np.array_equal(bits(a.read(k)), bits(want)), k
                assert np.array_equal(bits(a[k]), bits(want)), k
        # Rows far from the flipped byte lie in other shards of the same leaf: they verify.
        np.testing.assert_array_equal(a.read_rows("params/dense/kernel", 0, 8), plain["params/dense/kernel"][:8])
    with pytest.raises(SignatureError):
        treecask.verify(second, signature=sig, public_key=pub)
    if CLI:
        out = tmp_path / "kernel.npy"
        r = tc_cli("get", second, "params/dense/kernel", "-o", out, "--signature", sig, "--public-key", pub)
        assert r.returncode not in (0, 1) and not out.exists(), r.stdout + r.stderr
        r = tc_cli("get", second, "params/dense/bias", "-o", out, "--signature", sig, "--public-key", pub)
        assert r.returncode == 0, r.stdout + r.stderr


def test_the_mismatch_names_the_file_and_byte_range(tmp_path, keys):
    first, second = same_layout_pair(tmp_path)
    sig = ms_sign(first, keys["p256"], tmp_path / "first.sig", shard_size=SHARD)
    st = statement_of(sig)
    # The shards whose digests differ between the two files: the only ranges a message may name.
    bad = [r["name"].split(":") for r in st["predicate"]["resources"]
           if sha256_hex(second, int(r["name"].split(":")[1]), int(r["name"].split(":")[2])) != r["digest"]]
    assert bad
    with pytest.raises(SignatureError) as e:
        treecask.verify(second, signature=sig, public_key=keys["p256"].public)
    msg = str(e.value)
    assert any(start in msg and end in msg for _, start, end in bad), (msg, bad)


# ---- wrong key, another file, another statement ---------------------------------------------

@pytest.mark.parametrize("shard_size", [None, SHARD], ids=["files", "shards"])
def test_a_wrong_public_key_is_refused(archive, keys, tmp_path, shard_size):
    sig = ms_sign(archive, keys["p256"], tmp_path / "model.sig", shard_size=shard_size)
    for pub in (keys["other"].public, keys["p384"].public):
        with pytest.raises(SignatureError):
            treecask.verify(archive, signature=sig, public_key=pub)
        with pytest.raises(SignatureError):
            treecask.open(archive, signature=sig, public_key=pub)
        with pytest.raises(SignatureError):
            treecask.load(archive, signature=sig, public_key=pub)


def test_a_statement_for_another_file_is_refused(archive, keys, tmp_path, directory):
    other = save(tmp_path / "other.cask", changed=2.0)
    for shard_size in (None, SHARD):
        sig = ms_sign(other, keys["p256"], tmp_path / f"other_{shard_size}.sig", shard_size=shard_size)
        with pytest.raises(SignatureError):
            treecask.verify(archive, signature=sig, public_key=keys["p256"].public)
        with pytest.raises(SignatureError):
            treecask.load(archive, signature=sig, public_key=keys["p256"].public)
    # A directory's statement (resources index.cask, process_*.cask) names no resource of this file.
    sig = ms_sign(directory, keys["p256"], tmp_path / "dir.sig", shard_size=4096)
    with pytest.raises(SignatureError):
        treecask.verify(archive, signature=sig, public_key=keys["p256"].public)
    with pytest.raises(SignatureError):
        treecask.open(archive, signature=sig, public_key=keys["p256"].public)


def test_a_statement_naming_another_file_is_refused_even_for_the_same_bytes(archive, keys, tmp_path):
    """The statement's subject names the file it signs; treecask holds it to that name (a
    statement for another file name is refused, issue 36), where model_signing treats the
    name as informative and accepts a renamed copy (docs/signing.md "Interop")."""
    sig = ms_sign(archive, keys["p256"], tmp_path / "model.sig")
    renamed = tmp_path / "renamed.cask"
    shutil.copyfile(archive, renamed)
    ms_verify(renamed, sig, keys["p256"].public)
    with pytest.raises(SignatureError) as e:
        treecask.verify(renamed, signature=sig, public_key=keys["p256"].public)
    assert "model.cask" in str(e.value) and "renamed.cask" in str(e.value)


def _drop_last(st):
    st["predicate"]["resources"].pop()


def _drop_middle(st):
    res = st["predicate"]["resources"]
    res.pop(len(res) // 2)


def _swap_digests(st):  # the ranges listed in another order than their digests
    res = st["predicate"]["resources"]
    res[1]["digest"], res[2]["digest"] = res[2]["digest"], res[1]["digest"]


def _shorten_last(path):
    def edit(st):  # the last shard ends one byte early, its digest that range's
        r = st["predicate"]["resources"][-1]
        name, start, end = r["name"].split(":")
        r["name"] = f"{name}:{start}:{int(end) - 1}"
        r["digest"] = sha256_hex(path, int(start), int(end) - 1)
    return edit


def _overlap(path):
    def edit(st):  # shard 1 starts half a shard early, its digest that range's
        r = st["predicate"]["resources"][1]
        name, start, end = r["name"].split(":")
        start = int(start) - SHARD // 2
        r["name"] = f"{name}:{start}:{end}"
        r["digest"] = sha256_hex(path, start, int(end))
    return edit


def _split_first(path):
    def edit(st):  # shard 0 as two half shards, each with its true digest
        res = st["predicate"]["resources"]
        half = SHARD // 2
        res[0:1] = [{"name": f".:0:{half}", "algorithm": res[0]["algorithm"], "digest": sha256_hex(path, 0, half)},
                    {"name": f".:{half}:{SHARD}", "algorithm": res[0]["algorithm"],
                     "digest": sha256_hex(path, half, SHARD)}]
    return edit


@pytest.mark.parametrize("how", ["truncated", "missing", "reordered", "short", "overlapping", "split"])
def test_bad_shard_resources_are_refused_like_model_signing_does(archive, keys, tmp_path, how):
    good = ms_sign(archive, keys["p256"], tmp_path / "good.sig", shard_size=SHARD)
    edit = {"truncated": _drop_last, "missing": _drop_middle, "reordered": _swap_digests,
            "short": _shorten_last(archive), "overlapping": _overlap(archive),
            "split": _split_first(archive)}[how]
    bad = resign(good, keys["p256"], tmp_path / "bad.sig", edit)
    pub = keys["p256"].public
    with pytest.raises(ValueError):  # model_signing refuses it too
        ms_verify(archive, bad, pub, shard_size=SHARD)
    with pytest.raises(SignatureError) as e:
        treecask.verify(archive, signature=bad, public_key=pub)
    assert "model.cask" in str(e.value)
    # A verified open of everything: refused at the open or at some read, never all bytes handed out.
    with pytest.raises(SignatureError):
        with treecask.open(archive, signature=bad, public_key=pub) as a:
            read_all(a)
            a.verify()


def test_resources_listed_in_another_order_with_their_digests_verify_as_in_model_signing(archive, keys, tmp_path):
    good = ms_sign(archive, keys["p256"], tmp_path / "good.sig", shard_size=SHARD)
    moved = resign(good, keys["p256"], tmp_path / "moved.sig",
                   lambda st: st["predicate"]["resources"].reverse())
    ms_verify(archive, moved, keys["p256"].public, shard_size=SHARD)
    treecask.verify(archive, signature=moved, public_key=keys["p256"].public)


def test_a_resigned_statement_with_a_wrong_root_digest_is_refused(archive, keys, tmp_path):
    good = ms_sign(archive, keys["p256"], tmp_path / "good.sig")

    def edit(st):
        st["predicate"]["resources"][0]["digest"] = "00" * 32

    bad = resign(good, keys["p256"], tmp_path / "bad.sig", edit)
    with pytest.raises(SignatureError):
        treecask.verify(archive, signature=bad, public_key=keys["p256"].public)


@pytest.mark.parametrize("shard_size", [None, SHARD], ids=["files", "shards"])
def test_a_file_appended_to_after_signing_is_refused(archive, keys, tmp_path, shard_size):
    sig = ms_sign(archive, keys["p256"], tmp_path / "model.sig", shard_size=shard_size)
    with open(archive, "ab") as f:
        f.write(b"\0" * 4096)
    pub = keys["p256"].public
    with pytest.raises(ValueError):
        ms_verify(archive, sig, pub, shard_size=shard_size)
    with pytest.raises(SignatureError):
        treecask.verify(archive, signature=sig, public_key=pub)
    with pytest.raises(SignatureError):
        treecask.open(archive, signature=sig, public_key=pub)


def test_unsupported_key_types_are_named(archive, keys, tmp_path):
    sig = ms_sign(archive, keys["p256"], tmp_path / "model.sig")
    for name, shown in (("rsa", "rsa"), ("ed25519", "ed25519")):
        with pytest.raises(SignatureError) as e:
            treecask.verify(archive, signature=sig, public_key=keys[name].public)
        assert shown in str(e.value).lower(), str(e.value)
        with pytest.raises(treecask.Error) as e:
            treecask.sign(archive, private_key=keys[name].private, signature=tmp_path / f"{name}.sig")
        assert shown in str(e.value).lower(), str(e.value)


@pytest.mark.parametrize("algorithm", ["blake2", "blake3"])
def test_unsupported_hash_algorithms_are_named(archive, keys, tmp_path, algorithm):
    sig = ms_sign(archive, keys["p256"], tmp_path / "model.sig", algorithm=algorithm)
    assert statement_of(sig)["predicate"]["serialization"]["hash_type"].startswith(algorithm)
    if algorithm == "blake3":  # a valid bundle, of another hash (model_signing 1.1.1 writes
        ms_verify(archive, sig, keys["p256"].public)  # "blake2b" for blake2, which it cannot read back)
    with pytest.raises(SignatureError) as e:
        treecask.verify(archive, signature=sig, public_key=keys["p256"].public)
    assert algorithm in str(e.value), str(e.value)


# ---- sharded directories ------------------------------------------------------------

@pytest.mark.parametrize("shard_size", [None, 4096], ids=["files", "shards"])
def test_a_sharded_directory_with_a_shard_file_from_another_save_is_refused(directory, keys, tmp_path, shard_size):
    sig = ms_sign(directory, keys["p256"], tmp_path / "ckpt.sig", shard_size=shard_size)
    pub = keys["p256"].public
    shutil.copy(VECTORS / "bad_v3_1_stale_shard" / "process_1.cask", directory / "process_1.cask")
    with pytest.raises(SignatureError) as e:
        treecask.verify(directory, signature=sig, public_key=pub)
    assert "process_1.cask" in str(e.value)
    with pytest.raises(SignatureError):
        with treecask.open(directory, signature=sig, public_key=pub) as c:
            read_all(c)
    with pytest.raises(SignatureError):
        treecask.load(directory, signature=sig, public_key=pub)
    if CLI:
        r = tc_cli("verify", directory, "--signature", sig, "--public-key", pub)
        assert r.returncode not in (0, 1) and "process_1.cask" in r.stderr, r.stdout + r.stderr


def test_a_sharded_directory_missing_a_signed_file_is_refused(directory, keys, tmp_path):
    sig = ms_sign(directory, keys["p256"], tmp_path / "ckpt.sig", shard_size=4096)
    (directory / "process_0.cask").unlink()
    with pytest.raises(treecask.Error) as e:
        treecask.verify(directory, signature=sig, public_key=keys["p256"].public)
    assert "process_0.cask" in str(e.value)


# ---- zero-copy views -----------------------------------------------------------------

def test_zero_copy_views_come_only_after_their_shards_verify(tmp_path, keys):
    first = save(tmp_path / "model.cask")
    second = flipped_copy(first, tmp_path / "flipped")
    sig = ms_sign(first, keys["p256"], tmp_path / "first.sig", shard_size=SHARD)
    pub = keys["p256"].public
    tree = treecask.load(first, copy=False, signature=sig, public_key=pub)
    kernel = tree["params"]["dense"]["kernel"]
    assert not kernel.flags.writeable
    assert file_offset_of(kernel, first) > 0  # a view of the mapped file, handed out verified
    assert trees_equal(tree, model_tree())
    with treecask.open(first, signature=sig, public_key=pub) as a:
        view = a["params/head"]
        assert file_offset_of(view, first) > 0
        np.testing.assert_array_equal(view, model_tree()["params"]["head"])
    with treecask.open(second, signature=sig, public_key=pub) as b:
        with pytest.raises(SignatureError):
            b["params/dense/kernel"]
        with pytest.raises(SignatureError):
            b.load(copy=False)
        view = b["params/head"]  # another leaf's shards verify: its view is handed out
        assert file_offset_of(view, second) > 0
    with pytest.raises(SignatureError):
        treecask.load(second, copy=False, signature=sig, public_key=pub)


# ---- over S3: only the covering shards ------------------------------------------------------

@pytest.fixture
def s3_env(s3_server, monkeypatch):
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    return s3_server


def test_a_verified_read_over_s3_fetches_only_its_covering_shards(s3_env, keys, tmp_path):
    import stores

    shard = 256 << 10
    # 24 leaves of 1 MiB, raw: a 24 MiB object, far larger than what the open fetches.
    tree = {f"w{i:02d}": np.full((1 << 18,), i, np.float32) for i in range(24)}
    path = tmp_path / "big.cask"
    treecask.save(path, tree, compression="none")
    size = path.stat().st_size
    sig = treecask.sign(path, private_key=keys["p256"].private, shard_size=shard)
    with treecask.open(path) as local:
        offset = file_offset_of(local["w12"], path)
    s3_env.create_bucket("signed")
    key = f"{uuid.uuid4().hex}/big.cask"
    s3_env.put("signed", key, path)
    s3_env.put("signed", key + ".sig", sig)
    url = f"s3://signed/{key}"

    def fetched(**signed):
        proxy = stores.S3Proxy(s3_env.endpoint)
        try:
            with treecask.open(url, storage_options={"endpoint": proxy.endpoint}, **signed) as a:
                np.testing.assert_array_equal(a.read("w12"), tree["w12"])
            return proxy.bytes_read, [g[1] for g in proxy.gets]
        finally:
            proxy.close()

    plain, plain_ranges = fetched()
    pub = keys["p256"].public
    for signature in (sig, url + ".sig"):  # the signature file local, or a URL in the store
        got, ranges = fetched(signature=signature, public_key=pub)
        sig_bytes, sig_gets = (os.path.getsize(sig), 1) if signature == url + ".sig" else (0, 0)
        # The open's head and tail and the leaf's 1 MiB, each widened to whole shards, in as many
        # requests as the unsigned open and read (the size learned from the open's own first read).
        assert got <= plain + 4 * shard + sig_bytes, (got, plain, ranges)
        assert len(ranges) == len(plain_ranges) + sig_gets, (ranges, plain_ranges)
        assert got < size // 3
        # No byte of a leaf two away from w12 was fetched (the open's head and tail aside).
        far = (offset - (2 << 20), offset - (1 << 20))
        for r in ranges:
            if r and r.startswith("bytes="):
                lo, _, hi = r[len("bytes="):].partition("-")
                if lo and hi:
                    assert int(hi) < far[0] or int(lo) >= far[1] or int(lo) < (1 << 20) or \
                        int(hi) >= size - (5 << 20), (r, far)
    # A full verify over S3 (every signed byte fetched and hashed, then every chunk), as of a file.
    for signature in (sig, url + ".sig"):
        treecask.verify(url, signature=signature, public_key=pub)
    # A tampered object under the same signature: the read raises, never returns its bytes.
    other = tmp_path / "other.cask"
    tree["w12"] = tree["w12"] + 1
    treecask.save(other, tree, compression="none")
    s3_env.put("signed", key, other)
    with pytest.raises(SignatureError):
        with treecask.open(url, signature=sig, public_key=pub) as a:
            a.read("w12")
    with pytest.raises(SignatureError) as e:
        treecask.verify(url, signature=sig, public_key=pub)
    assert "do not match their signed SHA-256 digest" in str(e.value) and key in str(e.value)


@pytest.mark.parametrize("change", ["appended to", "truncated"])
def test_an_object_resized_after_signing_is_refused_over_s3(s3_env, archive, keys, tmp_path, change):
    # The object's size is learned from the open's first read: no byte of it is used
    # before that size is the signed one.
    sig = treecask.sign(archive, private_key=keys["p256"].private, shard_size=4096)
    data = archive.read_bytes()
    data = data + b"\0" * 4096 if change == "appended to" else data[:-4096]
    s3_env.create_bucket("signed")
    key = f"{uuid.uuid4().hex}/model.cask"
    s3_env.put("signed", key, data)
    url = f"s3://signed/{key}"
    pub = keys["p256"].public
    with pytest.raises(SignatureError) as e:
        treecask.open(url, signature=sig, public_key=pub)
    assert f"{change} after signing" in str(e.value) and key in str(e.value), str(e.value)
    with pytest.raises(SignatureError) as e:
        treecask.verify(url, signature=sig, public_key=pub)
    assert f"{change} after signing" in str(e.value), str(e.value)


def test_a_signed_open_of_a_missing_object_is_not_found(s3_env, archive, keys):
    # The statement names a file: the key is opened as one object, never as a directory.
    sig = treecask.sign(archive, private_key=keys["p256"].private)
    s3_env.create_bucket("signed")
    url = f"s3://signed/{uuid.uuid4().hex}/model.cask"
    with pytest.raises(treecask.NotFoundError):
        treecask.open(url, signature=sig, public_key=keys["p256"].public)


def test_a_signed_sharded_directory_reads_verified_from_s3(s3_env, keys, directory, tmp_path):
    sig = treecask.sign(directory, private_key=keys["p256"].private, shard_size=4096)
    s3_env.create_bucket("signed")
    prefix = f"{uuid.uuid4().hex}/ckpt"
    for f in directory.iterdir():
        s3_env.put("signed", f"{prefix}/{f.name}", f)
    url = f"s3://signed/{prefix}"
    pub = keys["p256"].public
    with treecask.open(url, signature=sig, public_key=pub) as c:
        assert isinstance(c, treecask.ShardedArchive)
        assert same_arrays(read_all(c), read_all(treecask.open(directory)))
    # A full verify of the directory in the store: exactly the signed files, every signed byte.
    treecask.verify(url, signature=sig, public_key=pub)
    s3_env.put("signed", f"{prefix}/notes.txt", b"not signed")
    with pytest.raises(SignatureError) as e:
        treecask.verify(url, signature=sig, public_key=pub)
    assert "notes.txt" in str(e.value) and "not covered by the signature" in str(e.value), str(e.value)
    import obstore
    obstore.delete(s3_env.store("signed"), f"{prefix}/notes.txt")
    # A shard file from another save, uploaded under the same name: refused.
    s3_env.put("signed", f"{prefix}/process_1.cask", VECTORS / "bad_v3_1_stale_shard" / "process_1.cask")
    with pytest.raises(SignatureError) as e:
        with treecask.open(url, signature=sig, public_key=pub) as c:
            read_all(c)
    assert "process_1.cask" in str(e.value)
    with pytest.raises(SignatureError) as e:
        treecask.verify(url, signature=sig, public_key=pub)
    assert "process_1.cask" in str(e.value)
    with pytest.raises(treecask.InvalidArgumentError) as e:
        treecask.open(url, signature=sig)
    assert "public_key" in str(e.value)



# ---- CheckpointManager(sign_with=): each step signed after its commit, restores verified ----

@pytest.mark.parametrize("async_save", [True, False])
def test_a_manager_signs_each_step_and_its_restores_verify(tmp_path, keys, async_save):
    run = tmp_path / "run"
    tree = model_tree()
    with treecask.CheckpointManager(run, max_to_keep=2, async_save=async_save,
                                    sign_with=keys["p256"].private) as mngr:
        for step in (1, 2, 3):
            mngr.save(step, tree)
        mngr.wait_until_finished()
        assert mngr.all_steps() == [2, 3]
        # retention took step 1's bundle with it; each kept step has its own, accepted by model_signing
        assert sorted(p.name for p in run.glob("*.sig")) == ["step_00000002.cask.sig", "step_00000003.cask.sig"]
        ms_verify(run / "step_00000003.cask", run / "step_00000003.cask.sig", keys["p256"].public,
                  shard_size=treecask._core.sign_shard_size(str(run / "step_00000003.cask")))
        restored = mngr.restore()
        np.testing.assert_array_equal(restored["params"]["dense"]["kernel"], tree["params"]["dense"]["kernel"])
        # a step whose bytes changed after signing is refused by restore, never returned
        latest = run / "step_00000003.cask"
        bad = flipped_copy(latest, tmp_path / "flipped")
        latest.write_bytes(bad.read_bytes())
        with pytest.raises(treecask.SignatureError):
            mngr.restore(3)
        # delete takes the bundle with the step
        mngr.delete(2)
        assert not (run / "step_00000002.cask.sig").exists()


def test_a_manager_refuses_a_key_it_cannot_sign_with_or_an_object_store_at_once(tmp_path, keys):
    with pytest.raises(treecask.UnsupportedError, match="RSA") as e:
        treecask.CheckpointManager(tmp_path / "rsa", sign_with=keys["rsa"].private)
    assert e.value.file == str(tmp_path / "rsa")
    import obstore.store

    with pytest.raises(treecask.UnsupportedError, match="local directory"):
        treecask.CheckpointManager("run", store=treecask.stores.ObjectStore(obstore.store.MemoryStore()),
                                   sign_with=keys["p256"].private)
