// LMDB 0.9's on-disk layout, as treecask reads and writes it (64-bit build,
// host byte order = little-endian; SPEC.md "LMDB container"): the page and
// node headers, the MDB_db record, the meta page, and where a value returned
// by LMDB lies in the file. Every reading of LMDB's bytes that treecask does
// itself (lmdb_check.cc before the map exists, writer.cc and archive.cc for
// the map base) uses the names here; lmdb_env.h is the RAII wrapper over the
// library, which never needs them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "util/coding.h"

namespace treecask::lmdb {

// ---- Pages ----
// Every page starts with a 16-byte header: pgno u64, pad u16, flags u16, then
// lower u16 and upper u16 (branch/leaf pages) or a page count u32 (the first
// page of an overflow run).
inline constexpr size_t kPageHeaderSize = 16;
inline constexpr size_t kPageFlagsOffset = 10;   // mp_flags
inline constexpr uint16_t kPageBranch = 0x01;    // P_BRANCH
inline constexpr uint16_t kPageLeaf = 0x02;      // P_LEAF
inline constexpr uint16_t kPageOverflow = 0x04;  // P_OVERFLOW
inline constexpr uint16_t kPageMeta = 0x08;      // P_META
inline constexpr uint16_t kPageDirty = 0x10;     // P_DIRTY: in-memory only, readers ignore it
inline constexpr uint16_t kPageKeep = 0x8000;    // P_KEEP: in-memory only, readers ignore it
inline constexpr uint64_t kInvalidPage = ~uint64_t{0};  // P_INVALID: root of an empty tree
inline constexpr uint64_t kFirstDataPage = 2;    // pages 0 and 1 are the meta pages
inline constexpr unsigned kMaxTreeDepth = 32;    // LMDB's CURSOR_STACK
// A value larger than half a page lives in an overflow run; its bytes start
// right after the run's first page header (so 16 bytes into a page).
inline constexpr size_t kOverflowDataOffset = kPageHeaderSize;

// ---- Nodes (branch and leaf pages) ----
// MDB_node: lo u16, hi u16, flags u16, ksize u16, then the key, then (leaf
// pages only) the data. A leaf node's data size is lo | hi << 16; a branch
// node's child page number is lo | hi << 16 | flags << 32.
inline constexpr size_t kNodeHeaderSize = 8;
inline constexpr uint16_t kNodeBigData = 0x01;  // F_BIGDATA: data is the page number of an overflow run
inline constexpr uint16_t kNodeSubData = 0x02;  // F_SUBDATA: data is an MDB_db (a named database)
inline constexpr uint16_t kNodeDupData = 0x04;  // F_DUPDATA: sorted duplicates (never in treecask)

// ---- MDB_db ----
inline constexpr size_t kDbRecordSize = 48;  // sizeof(MDB_db)

// One MDB_db record: in a meta page (free DB, main DB) or as the value of a
// named-database record in the main DB.
struct DbRecord {
  uint32_t pad = 0;        // md_pad (the page size, for the free DB of a meta page)
  uint16_t flags = 0;      // md_flags: persistent mdb_dbi_open flags
  uint16_t depth = 0;      // md_depth: levels of the B-tree, 0 when empty
  uint64_t branch_pages = 0;
  uint64_t leaf_pages = 0;
  uint64_t overflow_pages = 0;
  uint64_t entries = 0;
  uint64_t root = kInvalidPage;
};

// Decodes the kDbRecordSize bytes at `p`.
inline DbRecord decode_db_record(const std::byte* p) {
  using coding::get_u16, coding::get_u32, coding::get_u64;
  DbRecord d;
  d.pad = get_u32(p);
  d.flags = get_u16(p + 4);
  d.depth = get_u16(p + 6);
  d.branch_pages = get_u64(p + 8);
  d.leaf_pages = get_u64(p + 16);
  d.overflow_pages = get_u64(p + 24);
  d.entries = get_u64(p + 32);
  d.root = get_u64(p + 40);
  return d;
}

// ---- Meta pages (pages 0 and 1) ----
// The page header, then MDB_meta: magic u32, version u32, address u64,
// mapsize u64, dbs[2] (DbRecord each; dbs[0].md_pad holds the page size),
// last_pg u64, txnid u64.
inline constexpr uint32_t kMetaMagic = 0xBEEFC0DE;
inline constexpr uint32_t kDataVersion = 1;
inline constexpr size_t kMetaMagicOffset = 0;      // from the end of the page header
inline constexpr size_t kMetaVersionOffset = 4;
inline constexpr size_t kMetaMapSizeOffset = 16;
inline constexpr size_t kMetaDbsOffset = 24;       // dbs[0] = free DB, dbs[1] = main DB
inline constexpr size_t kMetaLastPageOffset = 120;
inline constexpr size_t kMetaTxnIdOffset = 128;
inline constexpr size_t kMetaEnd = kPageHeaderSize + 136;  // through txnid

// What the newest valid LMDB meta page says (check_meta_pages, lmdb_check.h).
struct MetaInfo {
  uint32_t page_size = 0;
  uint64_t last_page = 0;  // mm_last_pg
  uint64_t txnid = 0;
  uint64_t map_size = 0;
  DbRecord main_db;        // mm_dbs[MAIN_DBI]: the tree holding the named-DB records
};

// ---- Where a value lies in the file ----
// LMDB does not say where its map starts (me_mapaddr is only set with
// MDB_FIXEDMAP), but every page begins with its own page number. Given
// `value`, a pointer LMDB returned into the map of a file with `page_size`
// pages, returns the address of file offset 0 in that map: the page holding
// `value` minus its page number times the page size. Returns nullptr when
// that page number exceeds `last_page`.
// REQUIRES: the page holding `value` starts at a multiple of `page_size` in
// memory. Every page does when the map starts on a page boundary, which mmap
// guarantees for page_size up to the OS page size (a map starts on an OS page
// boundary). A file of larger pages may be mapped at any OS page boundary,
// and then the page found need not be the one holding `value`: Archive::open
// then takes the map's start from /proc/self/maps, and the writer uses this
// only for an overflow value whose first page it sees aligned.
// The result is only as good as the page header it read: a reader of an
// untrusted file confirms it (archive.cc compares bytes read with pread() at
// the implied offset).
inline const std::byte* map_base_of(const std::byte* value, uint32_t page_size,
                                    uint64_t last_page = ~uint64_t{0}) {
  const auto at = reinterpret_cast<uintptr_t>(value);
  const std::byte* page = value - at % page_size;
  const uint64_t pgno = coding::get_u64(page);
  if (pgno > last_page) return nullptr;
  return page - pgno * page_size;
}

}  // namespace treecask::lmdb
