// Writes the seed corpora of fuzz/corpus/ (run by hand after a format change:
// `build/fuzz/treecask_fuzz_make_seeds fuzz`; the outputs are committed).
//   corpus/archive/  the seed archives of fuzz_util.h (whole files)
//   corpus/manifest/ their manifests (the "manifest" record)
//   corpus/lz4/      3-byte declared size + an LZ4 block
//   corpus/mutate/   damage programs for mutate_fuzzer.cc (base index first)
//   corpus/sharded/  the golden 3.x checkpoint directories as 'F' inputs, and
//                    layout programs (sharded_fuzzer.cc)
//   corpus/safetensors/ safetensors files and a Hub sharded layout, written by
//                    the reference writer's rules (safetensors_header)
#include <lmdb.h>

#include <cstdio>

#include "format/codec.h"
#include "format/format.h"
#include "fuzz_util.h"
#include "safetensors.h"

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
  for (const char* d : {"archive", "manifest", "lz4", "mutate", "sharded", "safetensors"})
    fs::create_directories(root / d);

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

  // sharded: each golden checkpoint directory as one 'F' input (index first).
  const fs::path vectors = fs::path(argv[1]) / ".." / "format" / "vectors";
  for (const char* d : {"v3_0_sharded", "v3_1_bound", "bad_v3_1_stale_shard"}) {
    std::vector<fs::path> files{vectors / d / "index.cask"};
    for (int k = 0; fs::exists(vectors / d / ("process_" + std::to_string(k) + ".cask")); ++k)
      files.push_back(vectors / d / ("process_" + std::to_string(k) + ".cask"));
    std::vector<std::byte> in{std::byte{'F'}, std::byte(files.size())};
    std::vector<std::byte> body;
    for (const auto& f : files) {
      auto b = tc_fuzz::slurp(f);
      for (int i = 0; i < 4; ++i) in.push_back(std::byte(b.size() >> (8 * i)));
      body.insert(body.end(), b.begin(), b.end());
    }
    in.insert(in.end(), body.begin(), body.end());
    spit(root / "sharded" / d, in);
  }
  // Layout programs (sharded_fuzzer.cc read_layout, then damage): mode 0, files - 1,
  // leaves - 1, flags (bit 0 bind, bits 1-3 LZ4 per file), per leaf (dtype, rank, dims,
  // boxes - 1, cuts, file per box), perturbations (count, then kind leaf box up), damages
  // (count, then kind file offset[3] bit).
  auto layout = [&](const std::string& name, std::vector<uint8_t> ops) {
    spit(root / "sharded" / name, std::as_bytes(std::span(ops)));
  };
  const std::vector<uint8_t> two_leaves{0, 1, 1, 1, 2, 2, 6, 5, 3, 2, 3, 5, 0, 1, 0, 1, 3, 1, 5, 0, 1};
  auto with = [&](std::vector<uint8_t> tail, uint8_t flags = 1) {
    auto v = two_leaves;
    v[3] = flags;
    v.insert(v.end(), tail.begin(), tail.end());
    return v;
  };
  layout("layout_bound", with({0, 0}));
  layout("layout_unbound_lz4", with({0, 0}, 0x0e));
  // One file: an int64 scalar; int16 [0] in 4 empty boxes; uint8 [4, 0] in one box.
  layout("layout_scalar_and_empty", {0, 0, 2, 1, 4, 0, 0, 1, 1, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 2, 4, 0, 0, 0, 0, 0});
  layout("layout_moved_box", with({1, 0, 0, 1, 1, 0}));
  layout("layout_other_dtype", with({1, 1, 0, 2, 0, 0}));
  layout("layout_self_reference", with({1, 5, 1, 0, 0, 0}, 0));
  layout("layout_bit_flip", with({0, 1, 0, 0, 0x40, 0x10, 0, 3}));
  layout("layout_foreign_file_bound", with({0, 1, 3, 1, 0, 0, 0, 0}));
  layout("layout_foreign_file_unbound", with({0, 1, 3, 1, 0, 0, 0, 0}, 0));
  layout("layout_missing_file", with({0, 1, 2, 0, 0, 0, 0, 0}));

  // safetensors: files as the reference writer lays them out (safetensors_header), 'S' + a
  // Hub sharded layout.
  using treecask::DType;
  using treecask::interop::SafetensorsTensor;
  auto st_file = [](bool has_meta, const treecask::KeyValues& meta, std::vector<SafetensorsTensor> ts,
                    const std::vector<std::vector<std::byte>>& data) {
    uint64_t at = 0;
    for (size_t k = 0; k < ts.size(); ++k) {
      ts[k].begin = at;
      ts[k].end = at += data[k].size();
    }
    std::string h = treecask::interop::safetensors_header(has_meta, meta, ts);
    std::vector<std::byte> out(reinterpret_cast<const std::byte*>(h.data()),
                               reinterpret_cast<const std::byte*>(h.data()) + h.size());
    for (const auto& d : data) out.insert(out.end(), d.begin(), d.end());
    return out;
  };
  auto st_seed = [&](const std::string& name, const std::vector<std::byte>& file) {
    std::vector<std::byte> in{std::byte{0}};
    in.insert(in.end(), file.begin(), file.end());
    spit(root / "safetensors" / name, in);
  };
  st_seed("dtypes_with_metadata",
          st_file(true, {{"format", "pt"}},
                  {{"w", DType::kFloat32, {2, 3}}, {"enc/b", DType::kBFloat16, {4}}, {"step", DType::kInt64, {}},
                   {"empty", DType::kUInt8, {0}}, {"mask", DType::kBool, {3}}, {"f8", DType::kFloat8E4M3FN, {2}}},
                  {tc_fuzz::noise(24, 1), tc_fuzz::noise(8, 2), tc_fuzz::noise(8, 3), {}, {std::byte{1}, std::byte{0}, std::byte{1}},
                   tc_fuzz::noise(2, 4)}));
  st_seed("one_f16", st_file(false, {}, {{"x", DType::kFloat16, {3}}}, {tc_fuzz::noise(6, 5)}));
  st_seed("no_tensors", st_file(true, {{"k", "v"}}, {}, {}));
  {
    auto a = st_file(true, {{"format", "pt"}}, {{"a", DType::kFloat32, {2}}}, {tc_fuzz::noise(8, 6)});
    auto b = st_file(true, {{"format", "pt"}}, {{"b", DType::kInt32, {1}}, {"c", DType::kUInt8, {2}}},
                     {tc_fuzz::noise(4, 7), tc_fuzz::noise(2, 8)});
    std::string index = R"({"metadata": {"total_size": 14}, "weight_map": {"a": "model-00001-of-00002.safetensors", )"
                        R"("b": "model-00002-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"}})";
    std::vector<std::byte> in{std::byte{'S'}, std::byte{1}};  // 1 + 1 % 3 = 2 shards
    for (uint64_t n : {uint64_t(index.size()), uint64_t(a.size()), uint64_t(b.size())})
      for (int i = 0; i < 4; ++i) in.push_back(std::byte(n >> (8 * i)));
    for (char c : index) in.push_back(std::byte(c));
    in.insert(in.end(), a.begin(), a.end());
    in.insert(in.end(), b.begin(), b.end());
    spit(root / "safetensors" / "hub_two_shards", in);
  }
  return 0;
}
