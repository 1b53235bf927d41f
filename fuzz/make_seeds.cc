// Writes the seed corpora of fuzz/corpus/ (run by hand after a format change:
// `build/fuzz/treecask_fuzz_make_seeds fuzz`; the outputs are committed).
//   corpus/archive/  the seed archives of fuzz_util.h (whole files)
//   corpus/manifest/ their manifests (the "manifest" record)
//   corpus/lz4/      3-byte declared size + an LZ4 block
//   corpus/mutate/   damage programs for mutate_fuzzer.cc (base index first)
#include <lmdb.h>

#include <cstdio>

#include "format/codec.h"
#include "format/format.h"
#include "fuzz_util.h"

namespace fs = std::filesystem;

static void spit(const fs::path& p, std::span<const std::byte> b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  std::printf("wrote %s (%zu bytes)\n", p.c_str(), b.size());
}

static std::vector<std::byte> manifest_of(const fs::path& archive) {
  MDB_env* env;
  mdb_env_create(&env);
  mdb_env_set_maxdbs(env, 2);
  if (mdb_env_open(env, archive.c_str(), MDB_RDONLY | MDB_NOSUBDIR | MDB_NOLOCK, 0) != 0) std::abort();
  MDB_txn* txn;
  mdb_txn_begin(env, nullptr, MDB_RDONLY, &txn);
  MDB_dbi dbi;
  if (mdb_dbi_open(txn, treecask::format::kMetaDb, 0, &dbi) != 0) std::abort();
  MDB_val k{treecask::format::kManifestKey.size(), const_cast<char*>(treecask::format::kManifestKey.data())}, v;
  if (mdb_get(txn, dbi, &k, &v) != 0) std::abort();
  auto* p = static_cast<const std::byte*>(v.mv_data);
  std::vector<std::byte> out(p, p + v.mv_size);
  mdb_txn_abort(txn);
  mdb_env_close(env);
  return out;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s FUZZ_DIR\n", argv[0]);
    return 2;
  }
  fs::path root = fs::path(argv[1]) / "corpus";
  for (const char* d : {"archive", "manifest", "lz4", "mutate"}) fs::create_directories(root / d);

  for (const auto& [name, tree] : tc_fuzz::seed_trees()) {
    fs::path p = root / "archive" / name;  // no .cask: .gitignore excludes *.cask
    tree.save(p);
    std::printf("wrote %s (%ju bytes)\n", p.c_str(), static_cast<uintmax_t>(fs::file_size(p)));
    spit(root / "manifest" / (name + ".tcm"), manifest_of(p));
  }

  auto lz4_seed = [&](const std::string& name, std::vector<std::byte> raw) {
    std::vector<std::byte> block(treecask::codec::lz4_bound(raw.size()));
    bool stored_raw;
    uint64_t n = treecask::codec::lz4_compress(raw, block.data(), &stored_raw);
    if (stored_raw) n = 0;  // incompressible: an empty block, which must fail to decode
    std::vector<std::byte> seed{std::byte(raw.size()), std::byte(raw.size() >> 8),
                                std::byte(raw.size() >> 16)};
    seed.insert(seed.end(), block.begin(), block.begin() + static_cast<ptrdiff_t>(n));
    spit(root / "lz4" / name, seed);
  };
  lz4_seed("runs_4k", tc_fuzz::runs(4096, 1));
  lz4_seed("runs_64k", tc_fuzz::runs(65536, 2));
  lz4_seed("zeros_1m_minus_1", std::vector<std::byte>((1u << 20) - 1));
  lz4_seed("text", [] {
    std::string s = "treecask treecask TREECASK TCMF TCBLOB treecask.meta treecask.blobs ";
    std::vector<std::byte> v;
    for (int i = 0; i < 8; ++i)
      for (char c : s) v.push_back(std::byte(c));
    return v;
  }());
  lz4_seed("noise_300", tc_fuzz::noise(300, 3));

  // Damage programs: base index, then operations (see mutate_fuzzer.cc).
  auto prog = [&](const std::string& name, std::vector<uint8_t> ops) {
    spit(root / "mutate" / name, std::as_bytes(std::span(ops)));
  };
  for (uint8_t b = 0; b < 5; ++b) prog("intact_" + std::to_string(b), {b});
  prog("swap_pages_2_3", {0, 5, 2, 0, 3, 0});
  prog("dup_page_3_over_4", {0, 6, 3, 0, 4, 0});
  prog("upper_ffff_page_2", {0, 2, 2, 0, 14, 0, 0xff, 0xff});
  prog("node_offset_page_3", {0, 2, 3, 0, 16, 0, 0xf0, 0x0f});
  prog("main_root_1", {0, 3, 1, 0, 128, 0, 1});  // meta page 1, mm_dbs[1].md_root
  prog("truncate_page_5", {0, 4, 10, 0, 0, 0});
  prog("wide_branch_child", {4, 2, 2, 0, 24, 0, 7, 0});
  prog("wide_fill_page_2", {4, 8, 2, 0, 0});
  return 0;
}
