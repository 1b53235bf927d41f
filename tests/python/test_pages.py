"""Archives whose LMDB pages are not 4096 bytes (format/vectors/v1_0_pages_*.cask; SPEC.md
"LMDB container" makes readers accept 512 to 65536): they load, and a damaged header of blob 0's
LMDB overflow page (rule S11) is a CorruptionError for every way of reading the leaf in that
blob, whatever the page size and wherever the kernel maps the file."""

import pathlib

import numpy as np
import pytest

import treecask

VECTORS = pathlib.Path(__file__).resolve().parents[2] / "format" / "vectors"
PAGES = [512, 16384, 65536]


def vector(page: int) -> pathlib.Path:
    return VECTORS / f"v1_0_pages_{page}.cask"


def blob_zero_page(data: bytes, page: int) -> int:
    """File offset of the first page of blob 0's overflow run (its header, then the blob's)."""
    at = -1
    while True:
        at = data.find(b"TCBLOB\0\0", at + 1)
        assert at >= 0, "no blob 0"
        if (at - 16) % page == 0 and int.from_bytes(data[at + 8:at + 12], "little") == 0:
            return at - 16


@pytest.mark.parametrize("page", PAGES)
def test_page_size_vector_loads(page):
    data = vector(page).read_bytes()
    assert int.from_bytes(data[40:44], "little") == page  # meta page 0: mm_psize
    tree = treecask.load(vector(page))
    assert set(tree) == {"w", "b", "z"}
    assert tree["w"].dtype == np.float32 and tree["w"].shape == (17000,)
    assert tree["b"].dtype == np.uint8 and tree["b"].shape == (300,)
    assert tree["z"].dtype == np.int16 and tree["z"].shape == (3000,)
    start = blob_zero_page(data, page) + 16 + 48  # w, raw, from blob 0's payload offset 0
    assert tree["w"].tobytes() == data[start:start + 68000]
    with treecask.open(vector(page)) as a:
        assert a.verify() == []
        for k in ("w", "b", "z"):
            assert a[k].tobytes() == tree[k].tobytes()  # w holds NaNs: compare bytes


DAMAGES = {
    "mp_flags = 0": (10, 2),
    "wrong mp_pgno": (0, None),
    "mp_pages = 0": (12, 4),
}


@pytest.mark.parametrize("page", PAGES)
@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_damaged_overflow_page_header_is_corruption(page, damage, tmp_path):
    good = treecask.load(vector(page))
    data = bytearray(vector(page).read_bytes())
    head = blob_zero_page(bytes(data), page)
    at, n = DAMAGES[damage]
    if n is None:
        data[head + at] ^= 0x01
    else:
        data[head + at:head + at + n] = bytes(n)
    bad = tmp_path / "bad.cask"
    bad.write_bytes(bytes(data))
    for _ in range(8):  # each open maps the file afresh, wherever the kernel puts it
        with pytest.raises(treecask.CorruptionError) as e:
            treecask.load(bad)
        assert "LMDB overflow page" in str(e.value) and e.value.key_path == "w"
        with treecask.open(bad) as a:
            errs = a.verify()
            assert len(errs) == 1 and isinstance(errs[0], treecask.CorruptionError)
            assert errs[0].key_path == "w" and "LMDB overflow page" in str(errs[0])
            with pytest.raises(treecask.CorruptionError):
                a["w"]
            assert np.array_equal(a["b"], good["b"]) and np.array_equal(a["z"], good["z"])  # other blob
