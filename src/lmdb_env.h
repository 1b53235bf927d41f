// RAII over LMDB, and the check of the LMDB meta pages that runs before
// mdb_env_open ever sees an untrusted file (SPEC.md "Reader checks").
#pragma once

#include <lmdb.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "treecask/error.h"

namespace treecask::lmdb {

// Throws Error(code) with LMDB's message for a non-zero return code.
[[noreturn]] void fail(int rc, const std::string& file, const std::string& what,
                       ErrorCode code = ErrorCode::kIo);
inline void check(int rc, const std::string& file, const char* what,
                  ErrorCode code = ErrorCode::kIo) {
  if (rc != MDB_SUCCESS) fail(rc, file, what, code);
}

class Env {
 public:
  Env() = default;
  Env(const Env&) = delete;
  Env& operator=(const Env&) = delete;
  void create(const std::string& file);  // mdb_env_create
  ~Env();
  MDB_env* get() const { return env_; }
  void close();

 private:
  MDB_env* env_ = nullptr;
};

class Txn {
 public:
  Txn() = default;
  Txn(MDB_env* env, unsigned flags, const std::string& file);
  Txn(Txn&& o) noexcept : txn_(o.txn_) { o.txn_ = nullptr; }
  Txn& operator=(Txn&&) = delete;
  ~Txn() { abort(); }
  MDB_txn* get() const { return txn_; }
  void commit(const std::string& file);
  void abort();

 private:
  MDB_txn* txn_ = nullptr;
};

// ---- LMDB 0.9 on-disk layout (64-bit build, host byte order = little-endian) ----
// Every page starts with a 16-byte header: pgno u64, pad u16, flags u16, then
// lower u16 and upper u16 (branch/leaf pages) or a page count u32 (the first
// page of an overflow run). SPEC.md "LMDB container".
inline constexpr size_t kPageHeaderSize = 16;
inline constexpr uint16_t kPageBranch = 0x01;    // P_BRANCH
inline constexpr uint16_t kPageLeaf = 0x02;      // P_LEAF
inline constexpr uint16_t kPageOverflow = 0x04;  // P_OVERFLOW
inline constexpr uint16_t kPageMeta = 0x08;      // P_META
inline constexpr uint16_t kPageDirty = 0x10;     // P_DIRTY: in-memory only, readers ignore it
inline constexpr uint16_t kPageKeep = 0x8000;    // P_KEEP: in-memory only, readers ignore it
inline constexpr uint64_t kInvalidPage = ~uint64_t{0};  // P_INVALID: root of an empty tree
inline constexpr size_t kDbRecordSize = 48;      // sizeof(MDB_db)

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
DbRecord decode_db_record(const std::byte* p);

// What the newest valid LMDB meta page says.
struct MetaInfo {
  uint32_t page_size = 0;
  uint64_t last_page = 0;  // mm_last_pg
  uint64_t txnid = 0;
  uint64_t map_size = 0;
  DbRecord main_db;        // mm_dbs[MAIN_DBI]: the tree holding the named-DB records
};

// Reads both meta pages of the LMDB file open at `fd` (size `file_size`
// bytes) and checks: the page flags, magic 0xBEEFC0DE, data version 1, a page
// size that is a power of two in [512, 65536], and that the newest meta's last
// page lies inside the file. Returns "" and fills `out` when valid, else a
// description; `not_lmdb` is set when the file is not LMDB at all.
std::string check_meta_pages(int fd, uint64_t file_size, MetaInfo* out, bool* not_lmdb);

}  // namespace treecask::lmdb
