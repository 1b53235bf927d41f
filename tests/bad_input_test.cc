// Bad files and bad API input: each gets a distinct typed error, never a crash.
#include <lmdb.h>

#include "craft.h"
#include "treecask_generated.h"

using namespace treecask;
using tc_test::FlatTree;
using tc_test::TempDir;
namespace fs = std::filesystem;
using tc_test::save_sample;


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
  auto good = save_sample(dir, t);
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
  auto good = save_sample(dir, t);
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
    auto good = save_sample(dir, t, c);
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
  auto good = save_sample(dir, t);
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
  auto good = save_sample(dir, t);
  auto bytes = tc_test::read_file(good);
  std::string ident = "TCMF";
  size_t at = tc_test::find_bytes(bytes, std::as_bytes(std::span(ident)));
  REQUIRE(at != SIZE_MAX);
  bytes[at + 40] ^= std::byte{0x01};
  tc_test::write_file(dir / "m.cask", bytes);
  tc_test::expect_error(ErrorCode::kChecksumMismatch, [&] { Archive::open(dir / "m.cask"); });
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

// SPEC.md "Reader checks" 36-37: a blob's 48-byte header and its LMDB
// overflow page header are checked before the first use of the blob's bytes,
// not at open. A damaged header of a blob nothing reads leaves open and the
// other leaves alone; every read, view and verify() of a leaf in that blob
// fails, naming the file and the leaf, and no byte of the blob is returned.
TEST_CASE("a damaged blob header fails the reads of that blob, not open") {
  TempDir dir;
  FlatTree t;
  t.add_random("a", DType::kFloat32, {32768}, 1);  // 128 KiB: not packed, a blob each
  t.add_random("b", DType::kFloat32, {32768}, 2);
  t.add_random("c", DType::kUInt8, {100}, 3);
  SaveOptions opt;
  opt.chunk_size = 16384;
  auto good = dir / "good.cask";
  t.save(good, opt);
  const auto bytes = tc_test::read_file(good);
  // The header of the blob holding b's first part: the last blob magic before
  // b's bytes; a's bytes lie in another blob.
  const size_t pa = tc_test::find_bytes(bytes, std::span(t.data[0]).subspan(0, 64));
  const size_t pb = tc_test::find_bytes(bytes, std::span(t.data[1]).subspan(0, 64));
  REQUIRE(pa != SIZE_MAX);
  REQUIRE(pb != SIZE_MAX);
  size_t header = SIZE_MAX;
  const auto magic = std::as_bytes(std::span(format::kBlobMagic));
  for (size_t from = 0;;) {
    size_t hit = tc_test::find_bytes(std::span(bytes).subspan(from), magic);
    if (hit == SIZE_MAX || from + hit >= pb) break;
    header = from + hit;
    from = header + 1;
  }
  REQUIRE(header != SIZE_MAX);
  REQUIRE(header >= 16);
  REQUIRE((pa < header || pa > pb));
  const size_t payload = header + 48;
  struct Case {
    const char* name;
    size_t at;  // byte to damage, relative to the payload
    const char* says;
  };
  const Case cases[] = {
      {"magic", payload - 48, "bad blob magic"},
      {"id", payload - 48 + 8, "header does not match the manifest"},
      {"reserved", payload - 48 + 30, "reserved blob header bytes"},
      {"length", payload - 48 + 16, "blob payload length"},
      {"page_flags", payload - 64 + 10, "LMDB overflow page"},
      {"page_number", payload - 64, "LMDB overflow page"},
  };
  for (const auto& k : cases) {
    for (bool validate : {true, false}) {
      CAPTURE(k.name);
      CAPTURE(validate);
      if (!validate && std::string(k.says) == "LMDB overflow page") continue;  // checked with the structure only
      auto damaged = bytes;
      damaged[k.at] ^= std::byte{0x21};
      auto p = dir / (std::string(k.name) + ".cask");
      tc_test::write_file(p, damaged);
      OpenOptions o;
      o.validate_structure = validate;
      Archive a = Archive::open(p, o);  // open reads no blob header
      std::vector<std::byte> out(131072);
      a.read(0, out);
      CHECK(tc_test::same(out, t.data[0]));
      auto expect_b = [&](const std::function<void()>& f) {
        auto e = tc_test::expect_error(ErrorCode::kCorruption, f);
        CHECK(e.key_path() == "b");
        CHECK(e.file() == p.string());
        CHECK(std::string(e.what()).find(k.says) != std::string::npos);
      };
      expect_b([&] { a.read(1, out); });
      expect_b([&] { a.read(1, out, Verify::kNo); });  // unchecked reads too: the header is structure
      expect_b([&] { (void)a.view_parts(1, Verify::kNo); });
      expect_b([&] { a.read_bytes(1, 0, std::span(out).subspan(0, 16)); });
      expect_b([&] { (void)a.view_many(std::vector<size_t>{0, 1}, Verify::kNo); });
      std::vector<std::byte> c(100);
      a.read(2, c);
      CHECK(tc_test::same(c, t.data[2]));
      auto errors = a.verify();
      REQUIRE(errors.size() == 1);
      CHECK(errors[0].key_path() == "b");
    }
  }
}

// SPEC.md S11: a manifest large enough for an LMDB overflow run has that
// run's first page header checked before the manifest's bytes are used, as a
// blob's is (the structure walk bounds the run without reading it).
TEST_CASE("a damaged overflow page header of the manifest fails open") {
  TempDir dir;
  FlatTree t;
  for (int i = 0; i < 300; ++i) t.add_random("leaf_" + std::to_string(i), DType::kUInt8, {4}, i);
  auto good = dir / "good.cask";
  t.save(good);
  const auto bytes = tc_test::read_file(good);
  const size_t tcmf = tc_test::find_bytes(bytes, std::as_bytes(std::span("TCMF", 4)));
  REQUIRE(tcmf != SIZE_MAX);
  const size_t page_header = tcmf - 4 - 16;  // root offset, then the identifier
  REQUIRE(page_header % 4096 == 0);           // the manifest starts an overflow run
  auto damaged = bytes;
  damaged[page_header + 10] ^= std::byte{0x04};  // mp_flags: P_OVERFLOW no longer alone
  auto p = dir / "bad.cask";
  tc_test::write_file(p, damaged);
  auto e = tc_test::expect_error(ErrorCode::kCorruption, [&] { (void)Archive::open(p); });
  CHECK(std::string(e.what()).find("manifest: LMDB overflow page") != std::string::npos);
  CHECK(e.file() == p.string());
  OpenOptions trusted;
  trusted.validate_structure = false;  // no walk: the page header is not checked
  CHECK(Archive::open(p, trusted).size() == 300);
}
