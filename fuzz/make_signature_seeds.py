"""Writes fuzz/corpus/signature/: real OpenSSF model-signing bundles, the seed corpus of the
signature (bundle / DSSE envelope / in-toto statement) fuzz target.

Every seed is made by `model-signing` 1.1.1 itself (its Python API, the same code path as
`model_signing sign key`), over the golden archives in format/vectors/, with the test keys in
fuzz/signature_keys/ (P-256 and P-384; test keys, never a secret). ECDSA signatures are
randomized and model_signing writes `ignore_paths` in set order, so a rerun changes the bytes but
not what the seeds cover; rerun only when the bundle format changes, and commit the result:

    /work/main/.venv/bin/python fuzz/make_signature_seeds.py

Seeds (file name = what it covers):
  file_files.sig       v1_0_tree.cask signed as a file, "files" serialization (resource ".")
  file_shards.sig      the same, "shards" serialization, 4096-byte shards (".:0:4096", ...)
  dir_files.sig        format/vectors/v3_1_bound/ (a sharded checkpoint directory), "files"
  dir_shards.sig       the same directory, "shards", 4096-byte shards ("index.cask:0:4096", ...)
  file_files_p384.sig  v1_0_tree.cask, "files", signed with the P-384 key (ECDSA over SHA-384)
  statement_*.json     the decoded in-toto statements of the four P-256 bundles (the DSSE
                       payload), for a target that also parses a bare statement
"""

import base64
import json
import pathlib
import shutil
import sys
import tempfile

import model_signing

ROOT = pathlib.Path(__file__).resolve().parent.parent
KEYS = ROOT / "fuzz" / "signature_keys"
OUT = ROOT / "fuzz" / "corpus" / "signature"
VECTORS = ROOT / "format" / "vectors"


def sign(model: pathlib.Path, key: pathlib.Path, out: pathlib.Path, shard_size: int | None) -> None:
    hashing = model_signing.hashing.Config()
    if shard_size is not None:
        hashing.use_shard_serialization(shard_size=shard_size)
    (model_signing.signing.Config()
     .use_elliptic_key_signer(private_key=key)
     .set_hashing_config(hashing)
     .sign(model, out))


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        archive = tmp / "v1_0_tree.cask"
        shutil.copyfile(VECTORS / "v1_0_tree.cask", archive)
        directory = tmp / "v3_1_bound"
        shutil.copytree(VECTORS / "v3_1_bound", directory)
        p256, p384 = KEYS / "p256.pem", KEYS / "p384.pem"
        sign(archive, p256, OUT / "file_files.sig", None)
        sign(archive, p256, OUT / "file_shards.sig", 4096)
        sign(directory, p256, OUT / "dir_files.sig", None)
        sign(directory, p256, OUT / "dir_shards.sig", 4096)
        sign(archive, p384, OUT / "file_files_p384.sig", None)
    for name in ("file_files", "file_shards", "dir_files", "dir_shards"):
        bundle = json.loads((OUT / f"{name}.sig").read_text())
        payload = base64.b64decode(bundle["dsseEnvelope"]["payload"])
        (OUT / f"statement_{name}.json").write_bytes(payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
