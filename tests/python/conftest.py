"""Shared fixtures. JAX gets 8 CPU devices (set before any jax import) so the
sharded-restore tests run on one machine."""

import os

_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# No store client of any test, in this process or a child, asks a cloud metadata
# address for credentials: each test gives its own (tests/python/stores.py).
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
# Hypothesis' files go under the ignored .cache/, not into the source tree.
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY",
                      os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".cache", "hypothesis"))

import pathlib  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402



@pytest.fixture
def cask(tmp_path) -> pathlib.Path:
    """A path for one archive in a fresh directory."""
    return tmp_path / "ckpt.cask"


def mapping_of(addr: int):
    """(start, end, file offset, path) of the /proc/self/maps entry holding `addr`, or None."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= addr < hi:
                path = parts[5].strip() if len(parts) > 5 else ""
                return lo, hi, int(parts[2], 16), path
    return None


def data_address(arr: np.ndarray) -> int:
    return arr.__array_interface__["data"][0]


def file_offset_of(arr: np.ndarray, path) -> int:
    """Byte offset in `path` of a zero-copy view's first byte."""
    m = mapping_of(data_address(arr))
    assert m is not None and os.path.realpath(m[3]) == os.path.realpath(path), m
    return data_address(arr) - m[0] + m[2]


def bits(x) -> np.ndarray:
    """The bytes of an array (bit-exact comparison, NaN-safe)."""
    return np.ascontiguousarray(x).reshape(-1).view(np.uint8)


def trees_equal(a, b) -> bool:
    """Structure-and-value equality of nested dict/list/tuple trees of arrays and scalars."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(trees_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(trees_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray) or hasattr(a, "__array__") and not isinstance(a, (str, bytes)):
        a2, b2 = np.asarray(a), np.asarray(b)
        return a2.dtype == b2.dtype and a2.shape == b2.shape and np.array_equal(bits(a2), bits(b2))
    return type(a) is type(b) and (a == b or (a != a and b != b))


# Real object-store servers on 127.0.0.1 (tests/python/stores.py), one of each per
# session, started on first use. A missing binary fails the fixture (CI installs
# them: requirements-test.txt, scripts/setup.sh); TREECASK_NO_STORES=1 skips.

def _stores_wanted():
    if os.environ.get("TREECASK_NO_STORES") == "1":
        pytest.skip("TREECASK_NO_STORES=1: no object-store servers")


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """SeaweedFS S3 gateway: .endpoint, .env(), .create_bucket(), .put(), .store()."""
    _stores_wanted()
    import stores
    with stores.seaweedfs(tmp_path_factory.mktemp("s3")) as server:
        yield server


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    """fake-gcs-server: .endpoint, .env(), .create_bucket(), .put(), .store()."""
    _stores_wanted()
    import stores
    with stores.fake_gcs(tmp_path_factory.mktemp("gcs")) as server:
        yield server


@pytest.fixture(scope="session")
def http_server(tmp_path_factory):
    """nginx serving the directory .root: .url(relpath) (Range honoured) and
    .url(relpath, location="norange") (Range ignored, 200 + whole body)."""
    _stores_wanted()
    import stores
    with stores.nginx(tmp_path_factory.mktemp("www"), tmp_path_factory.mktemp("nginx")) as server:
        yield server


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 12 MiB tmpfs (a disk that fills up: a real ENOSPC in the middle of a
    save); skipped where mounting is not allowed."""
    import subprocess

    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
