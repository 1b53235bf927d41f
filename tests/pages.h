// Archives with LMDB pages of every size SPEC.md allows (512 to 65536), and
// maps of them at chosen alignments, for tests and the golden-vector
// generator (link tests/page_shim.c). Page sizes up to LMDB 0.9's
// MAX_PAGESIZE (32768) come from LMDB itself, told a different OS page size;
// 65536-byte pages from double_pages() of a file of 32768-byte pages.
#pragma once

#include <cstring>
#include <span>
#include <stdexcept>
#include <vector>

#include "format/format.h"
#include "lmdb/layout.h"

extern "C" {
void tc_pages_set_os_page_size(long p);
void tc_pages_set_map_shift(long s);
void tc_pages_set_map_copy(int on);
long tc_pages_maps_placed(void);
}

namespace tc_test {

// While alive, sysconf(_SC_PAGESIZE) says `p`: LMDB environments created
// meanwhile write min(p, 32768)-byte pages.
struct OsPageSize {
  explicit OsPageSize(long p) { tc_pages_set_os_page_size(p); }
  ~OsPageSize() { tc_pages_set_os_page_size(0); }
  OsPageSize(const OsPageSize&) = delete;
  OsPageSize& operator=(const OsPageSize&) = delete;
};

// While alive, a file mapped at offset 0 without a requested address (LMDB's
// map) starts `shift` bytes past a 2 MiB boundary; shift -1 leaves the
// choice to the kernel.
struct MapShift {
  explicit MapShift(long shift) { tc_pages_set_map_shift(shift); }
  ~MapShift() { tc_pages_set_map_shift(-1); }
  MapShift(const MapShift&) = delete;
  MapShift& operator=(const MapShift&) = delete;
};

// While alive, a read-only file mapping at offset 0 without a requested
// address (a reader's LMDB map) is an anonymous mapping holding a copy of the
// file: its bytes are the file's, but the OS lists no file behind it.
struct MapCopy {
  MapCopy() { tc_pages_set_map_copy(1); }
  ~MapCopy() { tc_pages_set_map_copy(0); }
  MapCopy(const MapCopy&) = delete;
  MapCopy& operator=(const MapCopy&) = delete;
};

// The LMDB page size recorded in meta page 0 of `file`.
inline uint32_t page_size_of(std::span<const std::byte> file) {
  namespace l = treecask::lmdb;
  return treecask::format::get_u32(file.data() + l::kPageHeaderSize + l::kMetaDbsOffset);
}

// The LMDB file `src` (pages of P bytes) as a file of 2P-byte pages holding
// the same databases: page n keeps its number; a branch or leaf page keeps
// its bytes (node offsets stay valid) followed by P zero bytes; an overflow
// value starts its run's first page as before and runs on contiguously, and
// the run's page count (mp_pages) and each tree's md_overflow_pages count the
// 2P-byte pages the value now needs. Both meta pages give the new page size.
// Throws std::runtime_error when `src` is not such a file.
inline std::vector<std::byte> double_pages(std::span<const std::byte> src) {
  namespace l = treecask::lmdb;
  namespace f = treecask::format;
  auto require = [](bool ok) {
    if (!ok) throw std::runtime_error("double_pages: not a sound LMDB file");
  };
  require(src.size() >= 2 * l::kMetaEnd);
  const uint64_t p = page_size_of(src), q = 2 * p;
  require(p >= 512 && p <= 32768 && (p & (p - 1)) == 0 && src.size() >= 2 * p);
  const std::byte* meta0 = src.data() + l::kPageHeaderSize;
  const std::byte* meta1 = src.data() + p + l::kPageHeaderSize;
  const bool newest1 = f::get_u64(meta1 + l::kMetaTxnIdOffset) > f::get_u64(meta0 + l::kMetaTxnIdOffset);
  const uint64_t newest = newest1 ? 1 : 0;
  const uint64_t last = f::get_u64((newest1 ? meta1 : meta0) + l::kMetaLastPageOffset);
  require((last + 1) * p <= src.size());
  std::vector<std::byte> out((last + 1) * q);
  auto put16 = [&](uint64_t at, uint16_t v) { std::memcpy(out.data() + at, &v, 2); };
  auto put32 = [&](uint64_t at, uint32_t v) { std::memcpy(out.data() + at, &v, 4); };
  auto put64 = [&](uint64_t at, uint64_t v) { std::memcpy(out.data() + at, &v, 8); };
  // Copies the tree rooted at page `pg`; returns the overflow pages it now has.
  auto walk = [&](auto& self, uint64_t pg) -> uint64_t {
    require(pg >= l::kFirstDataPage);
    require(pg <= last);
    const std::byte* page = src.data() + pg * p;
    std::memcpy(out.data() + pg * q, page, p);
    const uint16_t flags = f::get_u16(page + l::kPageFlagsOffset);
    const uint16_t lower = f::get_u16(page + 12);
    require(lower >= l::kPageHeaderSize && lower <= p);
    uint64_t overflow = 0;
    for (uint16_t i = 0; i < (lower - l::kPageHeaderSize) / 2; ++i) {
      const uint16_t at = f::get_u16(page + l::kPageHeaderSize + 2 * i);
      const std::byte* node = page + at;
      const uint64_t lo = f::get_u16(node), hi = f::get_u16(node + 2), nflags = f::get_u16(node + 4);
      const uint16_t ksize = f::get_u16(node + 6);
      if (flags & l::kPageBranch) {
        overflow += self(self, lo | hi << 16 | nflags << 32);
        continue;
      }
      require(flags & l::kPageLeaf);
      const uint64_t size = lo | hi << 16;
      const uint64_t data = at + l::kNodeHeaderSize + ksize;  // in the page
      if (nflags & l::kNodeBigData) {
        const uint64_t first = f::get_u64(page + data);
        const uint64_t pages = (l::kPageHeaderSize - 1 + size) / q + 1;  // OVPAGES at 2P
        require((first + pages) * q <= out.size());
        std::memcpy(out.data() + first * q + l::kOverflowDataOffset,
                    src.data() + first * p + l::kOverflowDataOffset, size);
        put64(first * q, first);
        put16(first * q + 8, 0);
        put16(first * q + l::kPageFlagsOffset, l::kPageOverflow);
        put32(first * q + 12, static_cast<uint32_t>(pages));
        overflow += pages;
      } else if (nflags & l::kNodeSubData) {  // a named database: copy it, fix its count
        const l::DbRecord db = l::decode_db_record(page + data);
        const uint64_t n = db.root == l::kInvalidPage ? 0 : self(self, db.root);
        put64(pg * q + data + 24, n);  // md_overflow_pages
      }
    }
    return overflow;
  };
  for (uint64_t m = 0; m < 2; ++m) {
    std::memcpy(out.data() + m * q, src.data() + m * p, l::kMetaEnd);
    put32(m * q + l::kPageHeaderSize + l::kMetaDbsOffset, static_cast<uint32_t>(q));  // mm_psize
  }
  for (uint64_t db = 0; db < 2; ++db) {  // the free-page DB and the main DB of the newest meta
    const uint64_t rec = newest * q + l::kPageHeaderSize + l::kMetaDbsOffset + db * l::kDbRecordSize;
    const l::DbRecord d = l::decode_db_record(out.data() + rec);
    if (d.root != l::kInvalidPage) put64(rec + 24, walk(walk, d.root));
  }
  return out;
}

}  // namespace tc_test
