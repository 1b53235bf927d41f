#include "lmdb_env.h"

#include <unistd.h>

#include <array>
#include <cstring>

#include "format.h"

namespace treecask::lmdb {

DbRecord decode_db_record(const std::byte* p) {
  using format::get_u16, format::get_u32, format::get_u64;
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

// LMDB 0.9 on-disk meta page (64-bit build): the 16-byte page header, then
// MDB_meta: magic u32, version u32, address u64, mapsize u64, dbs[2] (48 bytes
// each, see DbRecord; dbs[0].md_pad holds the page size), last_pg u64, txnid
// u64. SPEC.md "LMDB container".
namespace {
constexpr uint32_t kMagic = 0xBEEFC0DE;
constexpr uint32_t kDataVersion = 1;
constexpr size_t kMetaEnd = kPageHeaderSize + 136;  // through txnid

struct RawMeta {
  bool ok = false;
  std::string why;
  uint32_t magic = 0, version = 0, psize = 0;
  uint64_t mapsize = 0, last_pg = 0, txnid = 0;
  DbRecord main_db;
};

RawMeta read_meta(int fd, uint64_t offset, uint64_t file_size) {
  RawMeta m;
  std::array<std::byte, kMetaEnd> buf{};
  if (offset + kMetaEnd > file_size) {
    m.why = "file too short for an LMDB meta page (truncated?)";
    return m;
  }
  ssize_t n = pread(fd, buf.data(), buf.size(), static_cast<off_t>(offset));
  if (n != static_cast<ssize_t>(buf.size())) {
    m.why = "cannot read LMDB meta page";
    return m;
  }
  using format::get_u16, format::get_u32, format::get_u64;
  const std::byte* p = buf.data();
  uint16_t flags = get_u16(p + 10);
  const std::byte* meta = p + kPageHeaderSize;
  m.magic = get_u32(meta + 0);
  m.version = get_u32(meta + 4);
  m.mapsize = get_u64(meta + 16);
  m.psize = get_u32(meta + 24);  // dbs[0].md_pad
  m.last_pg = get_u64(meta + 120);
  m.txnid = get_u64(meta + 128);
  m.main_db = decode_db_record(meta + 24 + kDbRecordSize);
  if (m.magic != kMagic) { m.why = "no LMDB magic"; return m; }
  if (!(flags & kPageMeta)) { m.why = "meta page lacks the P_META flag"; return m; }
  if (m.version != kDataVersion) {
    m.why = "LMDB data version " + std::to_string(m.version) + ", expected 1";
    return m;
  }
  if (m.psize < 512 || m.psize > 65536 || (m.psize & (m.psize - 1)) != 0) {
    m.why = "LMDB page size " + std::to_string(m.psize) + " is not a power of two in [512, 65536]";
    return m;
  }
  m.ok = true;
  return m;
}
}  // namespace

std::string check_meta_pages(int fd, uint64_t file_size, MetaInfo* out, bool* not_lmdb) {
  *not_lmdb = false;
  RawMeta m0 = read_meta(fd, 0, file_size);
  if (!m0.ok) {
    *not_lmdb = m0.magic != kMagic;
    return "meta page 0: " + m0.why;
  }
  RawMeta m1 = read_meta(fd, m0.psize, file_size);
  if (!m1.ok) return "meta page 1: " + m1.why;
  if (m1.psize != m0.psize) return "the two LMDB meta pages disagree on the page size";
  const RawMeta& m = m1.txnid > m0.txnid ? m1 : m0;
  // Pages 0 and 1 are the metas; data needs at least root pages beyond them.
  if (m.last_pg < 1 || m.last_pg >= (uint64_t{1} << 40))
    return "LMDB last page number " + std::to_string(m.last_pg) + " is out of range";
  uint64_t need = (m.last_pg + 1) * m.psize;
  if (need > file_size)
    return "file is truncated: LMDB needs " + std::to_string(need) + " bytes, file has " +
           std::to_string(file_size);
  out->page_size = m.psize;
  out->last_page = m.last_pg;
  out->txnid = m.txnid;
  out->map_size = m.mapsize;
  out->main_db = m.main_db;
  return {};
}

}  // namespace treecask::lmdb
