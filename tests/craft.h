// Crafting damaged archives for tests: small real archives to start from
// (save_sample, Sample), copying an archive into a new LMDB file while editing
// its header record or manifest, or damaging raw file bytes.
#pragma once

#include <fcntl.h>
#include <lmdb.h>
#include <unistd.h>

#include <functional>

#include "format/format.h"
#include "lmdb/check.h"
#include "testutil.h"

namespace tc_test {

// Saves a three-leaf archive (two raw float32 leaves and a compressible
// int32 one, compression `c`) built in `t` to dir/good.cask and returns its path.
inline fs::path save_sample(const TempDir& dir, FlatTree& t, treecask::Compression c = treecask::Compression::kNone) {
  t.add_random("layer/w", treecask::DType::kFloat32, {2000}, 1);
  t.add_random("layer/b", treecask::DType::kFloat32, {2000}, 2);
  t.add("z", treecask::DType::kInt32, {50000}, tc_test::compressible_bytes(200000, 3));
  treecask::SaveOptions opt;
  opt.compression = c;
  opt.overwrite = true;
  auto p = dir / "good.cask";
  t.save(p, opt);
  return p;
}

// A small archive with every storage path a reader has: raw and LZ4 leaves
// packed into one shared blob, a multi-chunk raw leaf, an LZ4 leaf with its
// own blob and a chunk stored raw, an empty leaf and a scalar.
struct Sample {
  TempDir dir;
  FlatTree tree;
  fs::path path;
  std::vector<std::byte> bytes;
  uint32_t page = 0;

  Sample() {
    tree.add_random("raw/f32", treecask::DType::kFloat32, {300}, 11);
    tree.add("lz4/i32", treecask::DType::kInt32, {1024}, tc_test::compressible_bytes(4096, 12));
    tree.leaves.back().compression = treecask::Compression::kLZ4;
    tree.add_random("raw/two_chunks", treecask::DType::kUInt8, {6000}, 13);
    tree.add("big/lz4", treecask::DType::kInt16, {40000}, tc_test::compressible_bytes(80000, 14));
    tree.leaves.back().compression = treecask::Compression::kLZ4;
    tree.add_random("lz4/noise", treecask::DType::kUInt8, {4100}, 15);  // LZ4 leaf, chunk 0 stored raw
    tree.leaves.back().compression = treecask::Compression::kLZ4;
    tree.add("empty", treecask::DType::kFloat32, {0, 3}, {});
    tree.add_random("scalar", treecask::DType::kInt64, {}, 16);
    treecask::SaveOptions opt;
    opt.compression = treecask::Compression::kNone;
    opt.chunk_size = 4096;
    opt.durable = false;
    path = dir / "sample.cask";
    tree.save(path, opt);
    bytes = tc_test::read_file(path);
    treecask::lmdb::MetaInfo meta;
    bool not_lmdb;
    int fd = ::open(path.c_str(), O_RDONLY);
    REQUIRE(fd >= 0);
    REQUIRE(treecask::lmdb::check_meta_pages(fd, bytes.size(), &meta, &not_lmdb).empty());
    ::close(fd);
    page = meta.page_size;
  }
};

struct Crafted {
  treecask::format::Header header;
  std::vector<uint8_t> manifest;
  bool fix_checksum = true;  // recompute the header's manifest checksum
};

// Copies every record of `src` into a fresh archive at `dst`, letting `edit`
// change the header and manifest first.
inline void rewrite_archive(const fs::path& src, const fs::path& dst,
                            const std::function<void(Crafted&)>& edit) {
  namespace f = treecask::format;
  MDB_env *in, *out;
  REQUIRE(mdb_env_create(&in) == 0);
  mdb_env_set_maxdbs(in, 2);
  REQUIRE(mdb_env_open(in, src.c_str(), MDB_RDONLY | MDB_NOSUBDIR | MDB_NOLOCK, 0) == 0);
  REQUIRE(mdb_env_create(&out) == 0);
  mdb_env_set_maxdbs(out, 2);
  mdb_env_set_mapsize(out, fs::file_size(src) * 2 + (16 << 20));
  REQUIRE(mdb_env_open(out, dst.c_str(), MDB_NOSUBDIR | MDB_NOLOCK, 0644) == 0);
  MDB_txn *rt, *wt;
  REQUIRE(mdb_txn_begin(in, nullptr, MDB_RDONLY, &rt) == 0);
  REQUIRE(mdb_txn_begin(out, nullptr, 0, &wt) == 0);
  for (const char* db : {f::kMetaDb, f::kBlobDb}) {
    MDB_dbi a, b;
    REQUIRE(mdb_dbi_open(rt, db, 0, &a) == 0);
    REQUIRE(mdb_dbi_open(wt, db, MDB_CREATE, &b) == 0);
    MDB_cursor* cur;
    mdb_cursor_open(rt, a, &cur);
    MDB_val k, v;
    Crafted c;
    std::vector<std::byte> header(f::kHeaderSize);
    for (int rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
      std::string_view key(static_cast<char*>(k.mv_data), k.mv_size);
      if (db == f::kMetaDb && key == f::kManifestKey) {
        auto* p = static_cast<uint8_t*>(v.mv_data);
        c.manifest.assign(p, p + v.mv_size);
      } else if (db == f::kMetaDb && key == f::kHeaderKey) {
        f::decode_header({static_cast<std::byte*>(v.mv_data), v.mv_size}, &c.header);
      } else {
        REQUIRE(mdb_put(wt, b, &k, &v, 0) == 0);
      }
    }
    mdb_cursor_close(cur);
    if (db == f::kMetaDb) {
      edit(c);
      if (c.fix_checksum) {
        c.header.manifest_length = c.manifest.size();
        c.header.manifest_checksum = f::xxh3(std::as_bytes(std::span(c.manifest)), 0);
      }
      f::encode_header(c.header, header.data());
      MDB_val hk{f::kHeaderKey.size(), const_cast<char*>(f::kHeaderKey.data())}, hv{header.size(), header.data()};
      MDB_val mk{f::kManifestKey.size(), const_cast<char*>(f::kManifestKey.data())},
          mv{c.manifest.size(), c.manifest.data()};
      REQUIRE(mdb_put(wt, b, &hk, &hv, 0) == 0);
      REQUIRE(mdb_put(wt, b, &mk, &mv, 0) == 0);
    }
  }
  REQUIRE(mdb_txn_commit(wt) == 0);
  mdb_txn_abort(rt);
  mdb_env_close(in);
  mdb_env_close(out);
}

// Offset of `needle` in `hay`, or SIZE_MAX.
inline size_t find_bytes(std::span<const std::byte> hay, std::span<const std::byte> needle) {
  auto it = std::search(hay.begin(), hay.end(), needle.begin(), needle.end());
  return it == hay.end() ? SIZE_MAX : static_cast<size_t>(it - hay.begin());
}

}  // namespace tc_test
