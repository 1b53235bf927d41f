// RAII over LMDB: the environment, a transaction, and LMDB return codes as
// treecask::Error. The file's layout, and the checks that run before
// mdb_env_open ever sees an untrusted file, are in lmdb_layout.h and
// lmdb_check.h.
#pragma once

#include <lmdb.h>

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

}  // namespace treecask::lmdb
