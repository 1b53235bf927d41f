// RAII over LMDB, and the check of the LMDB meta pages that runs before
// mdb_env_open ever sees an untrusted file (SPEC.md "Reader checks").
#pragma once

#include <lmdb.h>

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

// What the newest valid LMDB meta page says.
struct MetaInfo {
  uint32_t page_size = 0;
  uint64_t last_page = 0;  // mm_last_pg
  uint64_t txnid = 0;
  uint64_t map_size = 0;
};

// Reads both meta pages of the LMDB file open at `fd` (size `file_size`
// bytes) and checks: the page flags, magic 0xBEEFC0DE, data version 1, a page
// size that is a power of two in [512, 65536], and that the newest meta's last
// page lies inside the file. Returns "" and fills `out` when valid, else a
// description; `not_lmdb` is set when the file is not LMDB at all.
std::string check_meta_pages(int fd, uint64_t file_size, MetaInfo* out, bool* not_lmdb);

}  // namespace treecask::lmdb
