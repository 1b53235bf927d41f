// Structural validation of an untrusted LMDB file before LMDB maps it
// (SPEC.md "Reader checks"): check_meta_pages(), then check_structure(). The
// layout they read is described in lmdb_layout.h.
//
// LMDB trusts its file: a page number, node offset, key size or data size
// read from a damaged page is followed without a bounds check, so a crafted
// or corrupted archive can make mdb_get() read outside the map (SIGSEGV /
// SIGBUS), trip an assert, or dereference a null sub-cursor. This check walks
// every page that treecask's read path can reach, with pread() and never
// through LMDB, and accepts the file only if every such page is well formed.
// Once it passes, the LMDB calls Archive::open makes (mdb_dbi_open, mdb_get,
// mdb_stat) only touch pages checked here.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "lmdb/layout.h"

namespace treecask::lmdb {

// The bytes of the file being checked: a local file (FdReader, pread) or a
// remote object (read/remote_open.cc). The checks below read through it only.
class FileReader {
 public:
  virtual ~FileReader() = default;
  // Fills buf[0, n) with the file's bytes at `offset`. Returns "" or why it
  // could not (a short read: "unexpected end of file").
  virtual std::string read(uint64_t offset, std::byte* buf, size_t n) const = 0;
  // Says that the pages at these file offsets, `n` bytes each, are read
  // next: a remote reader fetches them in one batch. Nothing is required.
  virtual void will_read(std::span<const uint64_t> offsets, size_t n) const {
    (void)offsets;
    (void)n;
  }
};

// A local file open at `fd`, read with pread() (thread-safe).
class FdReader final : public FileReader {
 public:
  explicit FdReader(int fd) : fd_(fd) {}
  std::string read(uint64_t offset, std::byte* buf, size_t n) const override;

 private:
  int fd_;
};

// Reads both meta pages of the LMDB file open at `fd` (size `file_size`
// bytes) and checks: the page flags, magic 0xBEEFC0DE, data version 1, a page
// size that is a power of two in [512, 65536], and that the newest meta's last
// page lies inside the file. Returns "" and fills `out` when valid, else a
// description; `not_lmdb` is set when the file is not LMDB at all.
std::string check_meta_pages(const FileReader& file, uint64_t file_size, MetaInfo* out, bool* not_lmdb);
inline std::string check_meta_pages(int fd, uint64_t file_size, MetaInfo* out, bool* not_lmdb) {
  return check_meta_pages(FdReader(fd), file_size, out, not_lmdb);
}

// Where a value of a named database lies in the file (recorded by
// check_structure when StructureStats::record_values is set): `offset` is
// its first byte (inside its leaf page, or kOverflowDataOffset into the
// first page of its overflow run), `size` its length in bytes.
struct ValueSite {
  std::string db;                       // the named database
  std::string key;                      // the key's bytes
  uint64_t offset = 0, size = 0;
  uint64_t overflow_page = UINT64_MAX;  // first page of its overflow run, if any
};

// What check_structure() walked, for tests and diagnostics.
struct StructureStats {
  uint64_t pages_read = 0;      // branch and leaf pages, plus first pages of overflow runs
  uint64_t tree_pages = 0;      // branch and leaf pages of all databases
  uint64_t overflow_runs = 0;   // F_BIGDATA values
  uint64_t overflow_pages = 0;  // pages those runs cover (bounds-checked, not read)
  uint64_t named_dbs = 0;       // named-database records in the main DB
  // The first page of each overflow run, sorted: the caller checks a run's
  // page header (check_overflow_head) before it uses the value (Archive: a
  // blob's first use, the manifest at open).
  std::vector<uint64_t> overflow_starts;
  // Whether the walk bounded an overflow run starting at page `pgno`.
  bool starts_overflow_run(uint64_t pgno) const;
  // Set before the call to have every value of every named database listed
  // in `values`, in key order per database (a reader without LMDB finds
  // values here instead of mdb_get).
  bool record_values = false;
  std::string record_only;  // with record_values: only this named database's values ("" = all)
  std::vector<ValueSite> values;
};

// REQUIRES: `meta` is what check_meta_pages() returned for the same `fd` and
// `file_size` (so the page size is sane and (last_page + 1) pages fit in the file).
//
// Walks the main DB from the newest meta page (mm_dbs[MAIN_DBI]), every
// named-database record in it, and each named database's B-tree, checking:
//  - every page number lies in [2, last_page] and no page is reached twice
//    (no cycles, no shared subtrees, overflow runs overlap nothing);
//  - each page's header: its own page number, exactly P_BRANCH or P_LEAF
//    (P_DIRTY / P_KEEP ignored), as the level requires (leaves at exactly
//    md_depth, depth <= 32 = LMDB's cursor stack), lower/upper bounds and the
//    node-offset array inside the page, at least 2 nodes per branch page and 1
//    per leaf page;
//  - each node inside its page (header, key and in-page data), keys strictly
//    increasing within a page and inside the key range the parent gives
//    (so LMDB's binary search finds what is there);
//  - leaf node flags: 0 or F_BIGDATA, plus F_SUBDATA (exactly 48 bytes of
//    MDB_db, flags 0) in the main DB only; never F_DUPDATA;
//  - an F_BIGDATA value: its run of ceil((16 + size) / page) pages inside the
//    file, and the first page's header (page number, P_OVERFLOW, page count)
//    -- the data pages themselves are not read, so the cost is proportional
//    to the number of index pages, not to the tensor bytes;
//  - each tree's md_depth, md_branch_pages, md_leaf_pages, md_overflow_pages
//    and md_entries equal what the walk counted; the main DB has flags 0.
//
// The free-page DB (mm_dbs[FREE_DBI]) is deliberately not walked: a read-only
// transaction never reads it (only write transactions allocate pages), so
// its contents cannot affect a reader. It is neither checked nor counted.
//
// Returns "" when the structure is sound, else a description of the first
// defect found. Sets *not_archive (when given) if the file is sound LMDB but
// of a kind treecask never writes (main DB flags other than 0). I/O errors
// are reported as defects. Thread-safe: reads only through `file`.
//
// With `read_overflow_heads` false, the first page of an overflow run is not
// read: the run's bounds and overlaps are checked over the pages its value
// needs, and stats->overflow_starts lists each run's first page. The caller
// then checks that page's header with check_overflow_head() before it uses
// the value (Archive: before the first read of a blob, SPEC.md "Reader
// checks"), so an open costs no read per value.
std::string check_structure(const FileReader& file, uint64_t file_size, const MetaInfo& meta,
                            StructureStats* stats = nullptr, bool* not_archive = nullptr,
                            bool read_overflow_heads = true);
inline std::string check_structure(int fd, uint64_t file_size, const MetaInfo& meta,
                                   StructureStats* stats = nullptr, bool* not_archive = nullptr,
                                   bool read_overflow_heads = true) {
  return check_structure(FdReader(fd), file_size, meta, stats, not_archive, read_overflow_heads);
}

// The header of the first page of an overflow run at page `first` holding a
// value of `value_size` bytes, in a file whose last page is `last_page`
// (check_structure's rule): its own page number, P_OVERFLOW (P_DIRTY and
// P_KEEP ignored), and a page count covering the value without passing the
// last page. `head` is the page's first 16 bytes. Returns "" or the defect.
std::string check_overflow_head(std::span<const std::byte> head, uint64_t first, uint64_t value_size,
                                uint64_t page_size, uint64_t last_page);

}  // namespace treecask::lmdb
