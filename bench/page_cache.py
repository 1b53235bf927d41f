"""How the kernel holds a mapped array's bytes in the page cache: the sizes of
the folios behind it, read from /proc/self/pagemap and /proc/kpageflags.

Why a benchmark cares: a file written in 4 KiB folios costs every reader a
page-cache lookup per 4 KiB in ``pread`` and a fault per 64 KiB through a
map, where larger folios cost one per folio (docs/performance.md, "Serving
paths", third pass). Two files holding the same bytes can differ 2x in read speed by this alone,
so a read benchmark should say what it read.

    folio_pages(array) -> list of folio sizes in 4 KiB pages, one per folio
    summary(array) -> "x% of pages in 4 KiB folios, median folio y KiB"

Needs root (the page-frame numbers in pagemap read as 0 otherwise); every
function returns None where the files cannot be read. Linux only. Not a test.
"""

from __future__ import annotations

import os
import statistics
import struct
from typing import List, Optional

import numpy as np

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_PFN_MASK = (1 << 55) - 1
_KPF_COMPOUND_TAIL = 16  # include/uapi/linux/kernel-page-flags.h


def folio_pages(array: np.ndarray) -> Optional[List[int]]:
    """Folio sizes (in pages, in address order) behind the pages of `array`
    (a view of a mapped file), touching each page first so that it is mapped.
    A folio cut by the array's first or last byte counts only its pages inside.
    None when /proc/self/pagemap or /proc/kpageflags cannot be read (not root,
    not Linux) or a page is not present."""
    flat = np.asarray(array).reshape(-1).view(np.uint8)
    if flat.size == 0:
        return []
    addr = flat.__array_interface__["data"][0]
    first, last = addr // _PAGE, (addr + flat.size - 1) // _PAGE
    int(flat[:: _PAGE].sum()) + int(flat[-1])  # fault every page in
    try:
        with open("/proc/self/pagemap", "rb") as pm, open("/proc/kpageflags", "rb") as kf:
            pm.seek(first * 8)
            entries = struct.unpack(f"<{last - first + 1}Q", pm.read((last - first + 1) * 8))
            sizes: List[int] = []
            for e in entries:
                pfn = e & _PFN_MASK
                if not (e >> 63) or pfn == 0:
                    return None
                kf.seek(pfn * 8)
                (flags,) = struct.unpack("<Q", kf.read(8))
                if sizes and (flags >> _KPF_COMPOUND_TAIL) & 1:
                    sizes[-1] += 1
                else:
                    sizes.append(1)
            return sizes
    except OSError:
        return None


def summary(array: np.ndarray) -> Optional[str]:
    """One line on the folios behind `array`: the share of its pages held in
    4 KiB folios and the median folio size (KiB) weighted by pages. None where
    folio_pages is."""
    sizes = folio_pages(array)
    if not sizes:
        return None
    pages = sum(sizes)
    small = sum(s for s in sizes if s == 1)
    weighted = sorted(s for s in sizes for _ in range(s))
    return (f"{100 * small / pages:.0f}% of {pages} pages in 4 KiB folios, "
            f"median folio {statistics.median(weighted) * _PAGE // 1024:.0f} KiB")
