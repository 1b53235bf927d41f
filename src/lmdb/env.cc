#include "lmdb/env.h"

namespace treecask::lmdb {

void fail(int rc, const std::string& file, const std::string& what, ErrorCode code) {
  // The OS refusing (no memory for the map, I/O error, no descriptors...) is
  // never damage in the file, whatever the caller expected.
  if (rc == MDB_MAP_FULL || rc == ENOSPC || rc == ENOMEM || rc == EIO || rc == EACCES ||
      rc == EAGAIN || rc == EMFILE || rc == ENFILE)
    code = ErrorCode::kIo;
  throw Error(code, file, "", what + ": " + mdb_strerror(rc));
}

void Env::create(const std::string& file) {
  close();
  check(mdb_env_create(&env_), file, "mdb_env_create");
}
Env::~Env() { close(); }
void Env::close() {
  if (env_) mdb_env_close(env_);
  env_ = nullptr;
}

Txn::Txn(MDB_env* env, unsigned flags, const std::string& file) {
  check(mdb_txn_begin(env, nullptr, flags, &txn_), file, "mdb_txn_begin");
}
void Txn::commit(const std::string& file) {
  MDB_txn* t = txn_;
  txn_ = nullptr;
  check(mdb_txn_commit(t), file, "mdb_txn_commit");
}
void Txn::abort() {
  if (txn_) mdb_txn_abort(txn_);
  txn_ = nullptr;
}

}  // namespace treecask::lmdb
