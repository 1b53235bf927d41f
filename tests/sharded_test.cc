// A sharded checkpoint is bound to its own shard files (format 3.1, SPEC.md
// "Sharded checkpoints" R8 and R9): the golden 3.1 vectors, a shard file of
// another save refused, the writer's and the reader's R8 checks.
#include "../format/vectors/contents.h"
#include "format/manifest.h"
#include "testutil.h"
#include "treecask/sharded.h"

using namespace treecask;
namespace fs = std::filesystem;

static fs::path vectors() { return fs::path(TREECASK_SOURCE_DIR) / "format" / "vectors"; }

static std::string save_id_of(const Archive& a) {
  for (const auto& [k, v] : a.metadata())
    if (k == kSaveIdKey) return v;
  return "";
}

TEST_CASE("the v3.1 vector: the index binds each shard file by its manifest's length and XXH3") {
  golden::ShardedVector v = golden::sharded_vector();
  ShardedArchive s = ShardedArchive::open(vectors() / "v3_1_bound");
  CHECK(s.index().format_major() == 3);
  CHECK(s.index().format_minor() == 1);
  CHECK(save_id_of(s.index()) == "00112233445566778899aabbccddeeff");
  REQUIRE(s.index().shard_files().size() == 2);
  for (const ShardFile& f : s.index().shard_files()) {
    INFO(f.file);
    CHECK(s.file(f.file).manifest_fingerprint() == f);
    CHECK(save_id_of(s.file(f.file)) == "00112233445566778899aabbccddeeff");
    CHECK(s.file(f.file).format_major() == 1);  // shard files stay 1.0
  }
  CHECK(s.verify().empty());
  for (size_t i = 0; i < v.leaves.size(); ++i) {
    std::vector<std::byte> out(s.leaf(i).byte_length);
    s.read(i, out);
    CHECK(tc_test::same(out, v.global_bytes(i)));
  }
  // An unbound (3.0) index binds nothing and still opens.
  ShardedArchive old = ShardedArchive::open(vectors() / v.dir);
  CHECK(old.index().shard_files().empty());
  CHECK(old.index().format_minor() == 0);
}

TEST_CASE("bad_v3_1_stale_shard: a shard file of another save is refused, naming it and both saves") {
  auto e = tc_test::expect_error(ErrorCode::kCorruption,
                                 [] { ShardedArchive::open(vectors() / "bad_v3_1_stale_shard"); });
  CHECK(e.file() == (vectors() / "bad_v3_1_stale_shard" / "process_1.cask").string());
  std::string what = e.what();
  CHECK(what.find("not the shard file this checkpoint was committed with") != std::string::npos);
  CHECK(what.find("ffeeddccbbaa99887766554433221100") != std::string::npos);
  CHECK(what.find("00112233445566778899aabbccddeeff") != std::string::npos);
  // Each file of the stale directory is still an intact archive on its own.
  CHECK(Archive::open(vectors() / "bad_v3_1_stale_shard" / "process_1.cask").verify().empty());
}

TEST_CASE("a shard file replaced by any other save's, in each position, is refused") {
  tc_test::TempDir tmp;
  golden::write_sharded(tmp / "a", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", true);
  golden::write_sharded(tmp / "same_id", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", true);  // equal ids, another save
  golden::write_sharded(tmp / "unbound", "", false);
  for (const char* donor : {"same_id", "unbound"})
    for (const char* name : {"process_0.cask", "process_1.cask"}) {
      INFO(donor << " " << name);
      fs::path d = tmp / (std::string("mix_") + donor + "_" + name);
      fs::copy(tmp / "a", d);
      fs::copy_file(tmp / donor / name, d / name, fs::copy_options::overwrite_existing);
      auto e = tc_test::expect_error(ErrorCode::kCorruption, [&] { ShardedArchive::open(d); });
      CHECK(e.file() == (d / name).string());
    }
  // The unbound copy of the same layout reads any of them: nothing to compare with (R9 needs 3.1).
  fs::copy_file(tmp / "a" / "process_1.cask", tmp / "unbound" / "process_1.cask", fs::copy_options::overwrite_existing);
  CHECK(ShardedArchive::open(tmp / "unbound").verify().empty());
}

TEST_CASE("the writer checks the shard files an index binds (R8) before writing anything") {
  golden::ShardedVector v = golden::sharded_vector();
  tc_test::TempDir tmp;
  std::vector<LeafInput> idx;
  for (const auto& m : v.leaves) idx.push_back({m, {}, std::nullopt});
  auto attempt = [&](std::vector<ShardFile> files, std::span<const LeafInput> leaves, const TreeDef& def) {
    SaveOptions o;
    o.shard_files = std::move(files);
    tc_test::expect_error(ErrorCode::kInvalidArgument, [&] { save(tmp / "index.cask", def, leaves, o); });
    CHECK_FALSE(fs::exists(tmp / "index.cask"));
  };
  attempt({{"process_0.cask", 1, 2}}, idx, v.treedef);                                           // process_1 not listed
  attempt({{"process_0.cask", 1, 2}, {"process_1.cask", 3, 4}, {"process_0.cask", 1, 2}}, idx, v.treedef);
  attempt({{"process_0.cask", 1, 2}, {"../process_1.cask", 3, 4}}, idx, v.treedef);
  std::vector<std::byte> one(4);
  TreeDef flat = flat_dict_treedef({"x"});
  LeafMeta m;
  m.dtype = DType::kFloat32;
  m.shape = {1};
  std::vector<LeafInput> plain{{m, one, std::nullopt}};
  attempt({{"process_0.cask", 1, 2}}, plain, flat);  // not an index
  SaveOptions ok;
  ok.shard_files = {{"process_1.cask", 3, 4}, {"process_0.cask", 1, 2}, {"spare.cask", 5, 6}};
  save(tmp / "index.cask", v.treedef, idx, ok);
  Archive a = Archive::open(tmp / "index.cask");
  CHECK(a.format_minor() == 1);
  CHECK(a.shard_files() == ok.shard_files);  // as given, in order
}

TEST_CASE("a reader refuses an index whose shard_files break R8") {
  golden::ShardedVector v = golden::sharded_vector();
  std::vector<LeafInput> idx;
  for (const auto& m : v.leaves) idx.push_back({m, {}, std::nullopt});
  auto paths = leaf_key_paths(v.treedef, ErrorCode::kInvalidArgument, "");
  std::vector<LeafOut> out(idx.size());
  std::vector<EncodeLeaf> encode;
  for (const auto& l : idx) encode.push_back({&l.meta, 0});
  auto parse = [&](std::vector<ShardFile> files, uint16_t major) {
    auto buf = build_manifest(v.treedef, encode, paths, out, {}, {major, 1, 4096, {}, std::move(files)});
    return parse_manifest(std::as_bytes(std::span(buf)), "index.cask");
  };
  CHECK(parse({{"process_0.cask", 1, 2}, {"process_1.cask", 3, 4}}, 3)->shard_files.size() == 2);
  auto e = tc_test::expect_error(ErrorCode::kCorruption, [&] { parse({{"process_0.cask", 1, 2}}, 3); });
  CHECK(e.key_path() == "params/w");  // its boxes in process_1.cask are not bound
  tc_test::expect_error(ErrorCode::kCorruption,
                        [&] { parse({{"process_0.cask", 1, 2}, {"process_1.cask", 3, 4}, {"process_0.cask", 1, 2}}, 3); });
  tc_test::expect_error(ErrorCode::kCorruption, [&] { parse({{"process_0.cask", 1, 2}, {"a/b", 3, 4}}, 3); });
}
