// Bad files and bad API input: each gets a distinct typed error, never a crash.
#include <lmdb.h>

#include "craft.h"
#include "treecask_generated.h"

using namespace treecask;
using tc_test::FlatTree;
using tc_test::TempDir;
namespace fs = std::filesystem;

namespace {
fs::path sample(const TempDir& dir, FlatTree& t, Compression c = Compression::kNone) {
  t.add_random("layer/w", DType::kFloat32, {2000}, 1);
  t.add_random("layer/b", DType::kFloat32, {2000}, 2);
  t.add("z", DType::kInt32, {50000}, tc_test::compressible_bytes(200000, 3));
  SaveOptions opt;
  opt.compression = c;
  opt.overwrite = true;
  auto p = dir / "good.cask";
  t.save(p, opt);
  return p;
}
}  // namespace

TEST_CASE("files that are not archives") {
  TempDir dir;
  auto e = tc_test::expect_error(ErrorCode::kNotFound, [&] { Archive::open(dir / "missing.cask"); });
  CHECK(e.file() == (dir / "missing.cask").string());
  tc_test::expect_error(ErrorCode::kNotAnArchive, [&] { Archive::open(dir.path); });
  tc_test::write_file(dir / "empty", {});
  tc_test::expect_error(ErrorCode::kNotAnArchive, [&] { Archive::open(dir / "empty"); });
  tc_test::write_file(dir / "noise", tc_test::random_bytes(65536, 4));
  tc_test::expect_error(ErrorCode::kNotAnArchive, [&] { Archive::open(dir / "noise"); });
  std::string text = "{\"not\": \"an archive\"}\n";
  tc_test::write_file(dir / "text", std::as_bytes(std::span(text)));
  tc_test::expect_error(ErrorCode::kNotAnArchive, [&] { Archive::open(dir / "text"); });

  // A valid LMDB file that is not a treecask archive.
  MDB_env* env;
  mdb_env_create(&env);
  REQUIRE(mdb_env_open(env, (dir / "plain.mdb").c_str(), MDB_NOSUBDIR | MDB_NOLOCK, 0644) == 0);
  MDB_txn* txn;
  mdb_txn_begin(env, nullptr, 0, &txn);
  MDB_dbi dbi;
  mdb_dbi_open(txn, nullptr, 0, &dbi);
  MDB_val k{1, (void*)"k"}, v{1, (void*)"v"};
  mdb_put(txn, dbi, &k, &v, 0);
  mdb_txn_commit(txn);
  mdb_env_close(env);
  tc_test::expect_error(ErrorCode::kNotAnArchive, [&] { Archive::open(dir / "plain.mdb"); });
}

TEST_CASE("format versions: a newer major is refused, a newer minor is read") {
  TempDir dir;
  FlatTree t;
  auto good = sample(dir, t);
  {
    Archive a = Archive::open(good);  // no filter: written as 1.0, for 1.x readers
    CHECK(a.format_major() == 1);
    CHECK(a.format_minor() == 0);
  }
  tc_test::rewrite_archive(good, dir / "v5.cask", [](tc_test::Crafted& c) { c.header.major = 5; });
  auto e = tc_test::expect_error(ErrorCode::kUnsupportedVersion, [&] { Archive::open(dir / "v5.cask"); });
  CHECK(std::string(e.what()).find("5.0") != std::string::npos);
  CHECK(std::string(e.what()).find("(4.x)") != std::string::npos);
  tc_test::rewrite_archive(good, dir / "v1_7.cask", [](tc_test::Crafted& c) { c.header.minor = 7; });
  Archive a = Archive::open(dir / "v1_7.cask");
  CHECK(a.format_minor() == 7);
  CHECK(tc_test::same(a.view(0), t.data[0]));
}

TEST_CASE("a truncated file is an error at every cut, never a crash") {
  TempDir dir;
  FlatTree t;
  auto good = sample(dir, t);
  auto bytes = tc_test::read_file(good);
  for (size_t cut : {size_t(0), size_t(1), size_t(100), size_t(4095), size_t(4096), size_t(8192),
                     bytes.size() / 2, bytes.size() - 4096, bytes.size() - 1}) {
    INFO("cut at " << cut);
    auto p = dir / "cut.cask";
    tc_test::write_file(p, std::span(bytes).first(cut));
    try {
      Archive::open(p);
      FAIL("a truncated archive opened");
    } catch (const Error& e) {
      CHECK((e.code() == ErrorCode::kCorruption || e.code() == ErrorCode::kNotAnArchive));
      CHECK(e.file() == p.string());
    }
  }
}

TEST_CASE("a flipped byte in a blob is a checksum error on read and in verify()") {
  TempDir dir;
  for (Compression c : {Compression::kNone, Compression::kLZ4}) {
    FlatTree t;
    auto good = sample(dir, t, c);
    auto bytes = tc_test::read_file(good);
    size_t at = tc_test::find_bytes(bytes, std::span(t.data[1]).subspan(4000, 64));
    REQUIRE(at != SIZE_MAX);
    bytes[at + 10] ^= std::byte{0x04};
    auto p = dir / "flip.cask";
    tc_test::write_file(p, bytes);
    Archive a = Archive::open(p);
    std::vector<std::byte> out(8000);
    auto e = tc_test::expect_error(ErrorCode::kChecksumMismatch, [&] { a.read(1, out); });
    CHECK(e.key_path() == "layer~1b");
    a.read(0, out);  // the other leaf is intact
    CHECK(tc_test::same(out, t.data[0]));
    auto errors = a.verify();
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].key_path() == "layer~1b");
    a.read(1, out, Verify::kNo);  // explicitly unchecked reads return the stored bytes
    CHECK(!tc_test::same(out, t.data[1]));
  }
}

TEST_CASE("two payloads swapped between leaves fail verification") {
  TempDir dir;
  FlatTree t;
  auto good = sample(dir, t);
  auto bytes = tc_test::read_file(good);
  size_t a0 = tc_test::find_bytes(bytes, t.data[0]), a1 = tc_test::find_bytes(bytes, t.data[1]);
  REQUIRE(a0 != SIZE_MAX);
  REQUIRE(a1 != SIZE_MAX);
  std::swap_ranges(bytes.begin() + a0, bytes.begin() + a0 + 8000, bytes.begin() + a1);
  tc_test::write_file(dir / "swap.cask", bytes);
  Archive a = Archive::open(dir / "swap.cask");
  CHECK(a.verify().size() == 2);
}

TEST_CASE("a flipped byte in the manifest is a checksum error at open") {
  TempDir dir;
  FlatTree t;
  auto good = sample(dir, t);
  auto bytes = tc_test::read_file(good);
  std::string ident = "TCMF";
  size_t at = tc_test::find_bytes(bytes, std::as_bytes(std::span(ident)));
  REQUIRE(at != SIZE_MAX);
  bytes[at + 40] ^= std::byte{0x01};
  tc_test::write_file(dir / "m.cask", bytes);
  tc_test::expect_error(ErrorCode::kChecksumMismatch, [&] { Archive::open(dir / "m.cask"); });
}

TEST_CASE("a manifest whose byte length disagrees with dtype x shape is corrupt") {
  TempDir dir;
  FlatTree t;
  auto good = sample(dir, t);
  tc_test::rewrite_archive(good, dir / "len.cask", [](tc_test::Crafted& c) {
    fb::GetMutableManifest(c.manifest.data())->mutable_leaves()->GetMutableObject(1)->mutate_byte_length(7996);
  });
  auto e = tc_test::expect_error(ErrorCode::kCorruption, [&] { Archive::open(dir / "len.cask"); });
  CHECK(e.key_path() == "layer~1b");
  tc_test::rewrite_archive(good, dir / "dtype.cask", [](tc_test::Crafted& c) {
    fb::GetMutableManifest(c.manifest.data())->mutable_leaves()->GetMutableObject(0)->mutate_dtype(fb::DType::Float64);
  });
  e = tc_test::expect_error(ErrorCode::kCorruption, [&] { Archive::open(dir / "dtype.cask"); });
  CHECK(e.key_path() == "layer~1w");
  // A dtype code this reader does not know (a later format's): refused as
  // unsupported, naming the leaf and the code, not as corruption (SPEC.md
  // "Dtypes"). Code 0 is never valid: corruption.
  for (int code : {31, 99, 255}) {
    tc_test::rewrite_archive(good, dir / "dt_new.cask", [&](tc_test::Crafted& c) {
      fb::GetMutableManifest(c.manifest.data())->mutable_leaves()->GetMutableObject(0)->mutate_dtype(fb::DType(code));
    });
    e = tc_test::expect_error(ErrorCode::kUnsupported, [&] { Archive::open(dir / "dt_new.cask"); });
    CHECK(e.key_path() == "layer~1w");
    CHECK(std::string(e.what()).find("dtype code " + std::to_string(code)) != std::string::npos);
  }
  tc_test::rewrite_archive(good, dir / "dt0.cask", [](tc_test::Crafted& c) {
    fb::GetMutableManifest(c.manifest.data())->mutable_leaves()->GetMutableObject(0)->mutate_dtype(fb::DType(0));
  });
  tc_test::expect_error(ErrorCode::kCorruption, [&] { Archive::open(dir / "dt0.cask"); });
  // A dtype of format 4.0 in a file that says 3.0 or older: corruption.
  tc_test::rewrite_archive(good, dir / "dt_early.cask", [](tc_test::Crafted& c) {
    fb::GetMutableManifest(c.manifest.data())->mutable_leaves()->GetMutableObject(0)->mutate_dtype(fb::DType(26));
  });
  e = tc_test::expect_error(ErrorCode::kCorruption, [&] { Archive::open(dir / "dt_early.cask"); });
  CHECK(std::string(e.what()).find("4.0") != std::string::npos);
  tc_test::rewrite_archive(good, dir / "trunc_manifest.cask", [](tc_test::Crafted& c) { c.manifest.resize(c.manifest.size() / 2); });
  tc_test::expect_error(ErrorCode::kCorruption, [&] { Archive::open(dir / "trunc_manifest.cask"); });
  tc_test::rewrite_archive(good, dir / "off.cask", [](tc_test::Crafted& c) {
    auto* ch = fb::GetMutableManifest(c.manifest.data())->mutable_leaves()->GetMutableObject(0)->mutable_chunks();
    const_cast<fb::Chunk*>(ch->Get(0))->mutate_offset(1ull << 40);
  });
  tc_test::expect_error(ErrorCode::kCorruption, [&] { Archive::open(dir / "off.cask"); });
}

TEST_CASE("save rejects bad input before writing anything") {
  TempDir dir;
  auto path = dir / "bad.cask";
  auto expect_bad = [&](FlatTree& t, TreeDef def, const char* why) {
    INFO(why);
    auto in = t.inputs();
    tc_test::expect_error(ErrorCode::kInvalidArgument, [&] { save(path, def, in); });
    CHECK(fs::is_empty(dir.path));
  };
  auto one = [](const std::string& key, DType d, std::vector<int64_t> shape, size_t bytes) {
    FlatTree t;
    t.add(key, d, std::move(shape), std::vector<std::byte>(bytes));
    return t;
  };
  { auto t = one("a", DType(0), {1}, 1); expect_bad(t, t.treedef(), "dtype 0"); }
  { auto t = one("a", DType(99), {1}, 1); expect_bad(t, t.treedef(), "dtype 99"); }
  { auto t = one("a", DType::kFloat32, {-1}, 0); expect_bad(t, t.treedef(), "negative dim"); }
  { auto t = one("a", DType::kFloat32, {1ll << 40, 1ll << 40}, 0); expect_bad(t, t.treedef(), "overflow"); }
  { auto t = one("a", DType::kFloat32, {3}, 11); expect_bad(t, t.treedef(), "byte length"); }
  { auto t = one("", DType::kUInt8, {1}, 1); expect_bad(t, t.treedef(), "empty key"); }
  { auto t = one("\xff\xfe", DType::kUInt8, {1}, 1); expect_bad(t, t.treedef(), "non-UTF-8 key"); }
  { auto t = one(std::string("a\0b", 3), DType::kUInt8, {1}, 1); expect_bad(t, t.treedef(), "NUL key"); }
  { auto t = one(std::string(4097, 'k'), DType::kUInt8, {1}, 1); expect_bad(t, t.treedef(), "long key"); }
  {
    FlatTree t;
    t.add("a", DType::kUInt8, {1}, std::vector<std::byte>(1));
    t.add("a", DType::kUInt8, {1}, std::vector<std::byte>(1));
    expect_bad(t, t.treedef(), "duplicate key");
  }
  {
    auto t = one("a", DType::kUInt8, std::vector<int64_t>(65, 1), 1);
    expect_bad(t, t.treedef(), "rank 65");
    auto ok = one("a", DType::kUInt8, std::vector<int64_t>(64, 1), 1);
    auto in = ok.inputs();
    save(dir / "rank64.cask", ok.treedef(), in);
    CHECK(Archive::open(dir / "rank64.cask").leaf(0).shape.size() == 64);
    fs::remove(dir / "rank64.cask");
  }
  {
    auto nested = [](size_t depth) {
      TreeDef def;
      for (size_t i = 0; i < depth; ++i) def.push_back(TreeNode{NodeKind::kList, 1, {}, {}});
      def.push_back(TreeNode{});
      return def;
    };
    auto t = one("x", DType::kUInt8, {1}, 1);
    expect_bad(t, nested(65), "depth 65");
    auto in = t.inputs();
    save(dir / "depth64.cask", nested(64), in);
    CHECK(Archive::open(dir / "depth64.cask").leaf(0).key_path.size() == 127);
    fs::remove(dir / "depth64.cask");
  }
  {
    auto t = one("a", DType::kUInt8, {1}, 1);
    expect_bad(t, flat_dict_treedef({"a", "b"}), "leaf count");
    TreeDef trailing = t.treedef();
    trailing.push_back(TreeNode{});
    expect_bad(t, trailing, "nodes after the tree");
  }
  {
    auto t = one("a", DType::kUInt8, {1}, 1);
    auto in = t.inputs();
    SaveOptions opt;
    opt.chunk_size = 1000;
    tc_test::expect_error(ErrorCode::kInvalidArgument, [&] { save(path, t.treedef(), in, opt); });
  }
  tc_test::expect_error(ErrorCode::kNotFound, [&] {
    auto t = one("a", DType::kUInt8, {1}, 1);
    t.save(dir / "no-such-dir" / "x.cask");
  });
}

// Large manifests are checked by two threads (src/manifest.cc), small ones by
// one; both must report the same finding, in SPEC.md "Reader checks" order.
TEST_CASE("manifest findings are the same whether one or two threads check them") {
  for (int n : {24, 12000}) {
    CAPTURE(n);
    TempDir dir;
    FlatTree t;
    char key[16];
    for (int i = 0; i < n; ++i) {
      std::snprintf(key, sizeof key, "k%05d", i);
      t.add_random(key, DType::kFloat32, {16}, i);
    }
    auto good = dir / "good.cask";
    t.save(good);
    const int a = n / 3, b = 2 * n / 3;
    auto leaf = [](tc_test::Crafted& c, int i) {
      return fb::GetMutableManifest(c.manifest.data())->mutable_leaves()->GetMutableObject(i);
    };
    // The characters of a FlatBuffers string, to edit in place.
    auto chars = [](const flatbuffers::String* s) { return const_cast<char*>(s->c_str()); };
    auto root_key = [&](tc_test::Crafted& c, int i) {
      return chars(fb::GetManifest(c.manifest.data())->nodes()->Get(0)->keys()->Get(i));
    };
    auto open_bad = [&](const char* name, const std::function<void(tc_test::Crafted&)>& edit) {
      tc_test::rewrite_archive(good, dir / name, edit);
      try {
        Archive::open(dir / name);
      } catch (const Error& e) {
        return e;
      }
      FAIL("opened a damaged archive: " << name);
      return Error(ErrorCode::kIo, "", "", "");
    };
    {
      Archive ok = Archive::open(good);
      REQUIRE(ok.size() == size_t(n));
    }

    // A damaged manifest is a checksum mismatch before anything else.
    auto e = open_bad("sum.cask", [&](tc_test::Crafted& c) {
      leaf(c, b)->mutate_byte_length(4);
      c.fix_checksum = false;
    });
    CHECK(e.code() == ErrorCode::kChecksumMismatch);

    // One bad leaf is named; of two, the first in index order.
    e = open_bad("len.cask", [&](tc_test::Crafted& c) { leaf(c, b)->mutate_byte_length(4); });
    CHECK(e.code() == ErrorCode::kCorruption);
    CHECK(e.key_path() == t.keys[b]);
    e = open_bad("len2.cask", [&](tc_test::Crafted& c) {
      leaf(c, b)->mutate_byte_length(4);
      leaf(c, a)->mutate_byte_length(4);
    });
    CHECK(e.key_path() == t.keys[a]);

    // A table the FlatBuffers verifier rejects outranks a leaf error before it.
    e = open_bad("table.cask", [&](tc_test::Crafted& c) {
      leaf(c, a)->mutate_byte_length(4);
      int32_t far = 0x7ffffff0;  // the table's offset to its vtable
      std::memcpy(reinterpret_cast<uint8_t*>(leaf(c, b)), &far, 4);
    });
    CHECK(e.code() == ErrorCode::kCorruption);
    CHECK(std::string(e.what()).find("FlatBuffers verifier") != std::string::npos);

    // A treedef key that disagrees with the leaf's stored key path.
    e = open_bad("path.cask", [&](tc_test::Crafted& c) { root_key(c, a)[0] = 'j'; });
    CHECK(e.code() == ErrorCode::kCorruption);
    CHECK(e.key_path() == "j" + t.keys[a].substr(1));
    CHECK(std::string(e.what()).find("but the treedef gives") != std::string::npos);

    // A treedef defect outranks a leaf error.
    e = open_bad("arity.cask", [&](tc_test::Crafted& c) {
      leaf(c, a)->mutate_byte_length(4);
      fb::GetMutableManifest(c.manifest.data())->mutable_nodes()->GetMutableObject(0)->mutate_arity(n - 1);
    });
    CHECK(std::string(e.what()).find("treedef node 0:") != std::string::npos);

    // Two leaves with one key path: treedef and stored paths agree, the index refuses.
    e = open_bad("dup.cask", [&](tc_test::Crafted& c) {
      std::memcpy(root_key(c, b), t.keys[b - 1].data(), t.keys[b].size());
      std::memcpy(chars(leaf(c, b)->key_path()), t.keys[b - 1].data(), t.keys[b].size());
    });
    CHECK(e.code() == ErrorCode::kCorruption);
    CHECK(e.key_path() == t.keys[b - 1]);
    CHECK(std::string(e.what()).find("duplicate key path") != std::string::npos);

    // Two leaves' chunks on the same bytes: coverage.
    e = open_bad("overlap.cask", [&](tc_test::Crafted& c) {
      uint64_t off = leaf(c, b - 1)->chunks()->Get(0)->offset();
      const_cast<fb::Chunk*>(leaf(c, b)->chunks()->Get(0))->mutate_offset(off);
    });
    CHECK(e.code() == ErrorCode::kCorruption);
    CHECK(std::string(e.what()).find("overlap") != std::string::npos);
  }
}

TEST_CASE("a filter the file's version or leaf cannot have is corruption") {
  TempDir dir;
  FlatTree t;
  t.add("w", DType::kFloat32, {4096}, tc_test::compressible_bytes(16384, 1));
  t.add("b", DType::kUInt8, {4096}, tc_test::compressible_bytes(4096, 2));
  t.add("r", DType::kFloat32, {4096}, tc_test::compressible_bytes(16384, 3));
  t.leaves[2].compression = Compression::kNone;
  SaveOptions opt;
  opt.compression = Compression::kLZ4;
  opt.shuffle = true;
  auto good = dir / "good.cask";
  t.save(good, opt);
  {
    Archive a = Archive::open(good);
    REQUIRE(a.format_major() == 2);
    REQUIRE(a.leaf(0).filter == Filter::kByteShuffle);
    REQUIRE(a.leaf(1).filter == Filter::kNone);  // 1-byte elements
    REQUIRE(a.leaf(2).codec == Codec::kNone);
  }
  auto leaf = [](tc_test::Crafted& c, int i) {
    return fb::GetMutableManifest(c.manifest.data())->mutable_leaves()->GetMutableObject(i);
  };
  struct Case {
    const char* name;
    std::function<void(tc_test::Crafted&)> edit;
    const char* key;
    const char* says;
  };
  const Case cases[] = {
      {"v1.cask",
       [](tc_test::Crafted& c) {
         c.header.major = 1;
         fb::GetMutableManifest(c.manifest.data())->mutate_format_major(1);
       },
       "w", "format 1.x does not have"},
      {"unknown.cask", [&](tc_test::Crafted& c) { leaf(c, 0)->mutate_filter(fb::Filter(7)); }, "w", "unknown filter 7"},
  };
  for (const auto& k : cases) {
    CAPTURE(k.name);
    tc_test::rewrite_archive(good, dir / k.name, k.edit);
    auto e = tc_test::expect_error(ErrorCode::kCorruption, [&] { Archive::open(dir / k.name); });
    CHECK(e.key_path() == k.key);
    CHECK(std::string(e.what()).find(k.says) != std::string::npos);
  }
  // A filter on a 1-byte dtype (same byte length), or on a raw leaf.
  tc_test::rewrite_archive(good, dir / "u8.cask", [&](tc_test::Crafted& c) {
    leaf(c, 0)->mutate_dtype(fb::DType::UInt8);
    leaf(c, 0)->mutable_shape()->Mutate(0, 16384);
  });
  auto e = tc_test::expect_error(ErrorCode::kCorruption, [&] { Archive::open(dir / "u8.cask"); });
  CHECK(e.key_path() == "w");
  CHECK(std::string(e.what()).find("byte shuffle of uint8") != std::string::npos);
  tc_test::rewrite_archive(good, dir / "none.cask", [&](tc_test::Crafted& c) { leaf(c, 0)->mutate_codec(fb::Codec::None); });
  e = tc_test::expect_error(ErrorCode::kCorruption, [&] { Archive::open(dir / "none.cask"); });
  CHECK(e.key_path() == "w");
  CHECK(std::string(e.what()).find("only defined before LZ4") != std::string::npos);
}
