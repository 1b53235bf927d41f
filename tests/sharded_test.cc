// A sharded checkpoint is bound to its own shard files (format 3.1, SPEC.md
// "Sharded checkpoints" R8 and R9): the golden 3.1 vectors, a shard file of
// another save refused, the writer's and the reader's R8 checks.
#include "../format/vectors/contents.h"
#include "format/manifest.h"
#include "testutil.h"
#include "treecask/sharded.h"
#include "treecask/writer.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>

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

// Rewrites <dir>/index.cask from the golden sharded vector with `edit`
// applied to its leaves (their ShardRefs), binding the shard files there
// when `bind` (format 3.1), else unbound (3.0).
static void rewrite_index(const fs::path& dir, const std::function<void(std::vector<LeafMeta>&)>& edit, bool bind) {
  golden::ShardedVector v = golden::sharded_vector();
  edit(v.leaves);
  std::vector<LeafInput> idx;
  for (const auto& m : v.leaves) idx.push_back({m, {}, std::nullopt});
  SaveOptions o;
  o.overwrite = true;
  if (bind)
    for (const char* name : {"process_0.cask", "process_1.cask"})
      o.shard_files.push_back(Archive::open(dir / name).manifest_fingerprint());
  save(dir / "index.cask", v.treedef, idx, o);
}

// Archive::verify() of an index, and the error it throws (or kOk: none).
static Error verify_index_error(const fs::path& index, ErrorCode code) {
  return tc_test::expect_error(code, [&] { Archive::open(index).verify(); });
}

TEST_CASE("verify of a sharded checkpoint's index verifies every shard file it binds, or names what is wrong") {
  golden::ShardedVector v = golden::sharded_vector();
  tc_test::TempDir tmp;
  const std::string id = "0123456789abcdef0123456789abcdef";
  golden::write_sharded(tmp / "a", id, true);
  golden::write_sharded(tmp / "step2", "fedcba9876543210fedcba9876543210", true);  // another step, same layout
  auto copy_of = [&](const std::string& name) {
    fs::copy(tmp / "a", tmp / name);
    return tmp / name;
  };

  // Intact: every chunk of both shard files checked, progress over their bytes.
  uint64_t last_done = 0, last_total = 0;
  CHECK(Archive::open(tmp / "a" / "index.cask").verify([&](uint64_t d, uint64_t t) {
    last_done = d;
    last_total = t;
  }).empty());
  CHECK(last_total == 220);  // params/w 192 + params/b 20 + step 8, all in the shard files
  CHECK(last_done == 220);
  CHECK(ShardedArchive::is_index(Archive::open(tmp / "a" / "index.cask")));
  CHECK_FALSE(ShardedArchive::is_index(Archive::open(tmp / "a" / "process_0.cask")));
  // A copy of the index under another name beside its shard files: that index, checked against them.
  fs::copy_file(tmp / "a" / "index.cask", tmp / "a" / "index_copy.cask");
  CHECK(Archive::open(tmp / "a" / "index_copy.cask").verify().empty());
  CHECK(ShardedArchive::open_index(Archive::open(tmp / "a" / "index_copy.cask")).path() == (tmp / "a").string());

  SUBCASE("the index alone: kNotFound naming the first shard file") {
    fs::create_directories(tmp / "alone");
    fs::copy_file(tmp / "a" / "index.cask", tmp / "alone" / "index.cask");
    Error e = verify_index_error(tmp / "alone" / "index.cask", ErrorCode::kNotFound);
    CHECK(e.file() == (tmp / "alone" / "process_0.cask").string());
  }
  SUBCASE("a shard file missing: kNotFound naming it") {
    fs::path d = copy_of("missing");
    fs::remove(d / "process_1.cask");
    Error e = verify_index_error(d / "index.cask", ErrorCode::kNotFound);
    CHECK(e.file() == (d / "process_1.cask").string());
  }
  SUBCASE("a shard file swapped for another step's: kCorruption naming it and both saves") {
    fs::path d = copy_of("swapped");
    fs::copy_file(tmp / "step2" / "process_1.cask", d / "process_1.cask", fs::copy_options::overwrite_existing);
    Error e = verify_index_error(d / "index.cask", ErrorCode::kCorruption);
    CHECK(e.file() == (d / "process_1.cask").string());
    CHECK(std::string(e.what()).find("fedcba9876543210fedcba9876543210") != std::string::npos);
    CHECK(Archive::open(d / "process_1.cask").verify().empty());  // intact on its own: only the binding fails
  }
  SUBCASE("overlapping boxes: kCorruption naming the index and the leaf") {
    fs::path d = copy_of("overlap");
    // params/w's box [0:3, 4:8] moved to [0:3, 3:7]: the element counts still add up (R3) and
    // the box is inside the shape (R2), but it overlaps [0:3, 0:4] and leaves column 7 unsaved.
    rewrite_index(d, [](std::vector<LeafMeta>& leaves) {
      leaves[0].shards[1].start = {0, 3};
      leaves[0].shards[1].stop = {3, 7};
    }, true);
    Error e = verify_index_error(d / "index.cask", ErrorCode::kCorruption);
    CHECK(e.file() == (d / "index.cask").string());
    CHECK(e.key_path() == "params/w");
    CHECK(std::string(e.what()).find("overlap") != std::string::npos);
  }
  SUBCASE("a bit flipped in a shard file: one kChecksumMismatch naming the shard file and its box") {
    fs::path d = copy_of("flipped");
    auto box = golden::box_bytes(v.global_bytes(0), v.leaves[0].shape, {3, 0}, {6, 4}, 4);
    auto bytes = tc_test::read_file(d / "process_0.cask");
    auto at = std::search(bytes.begin(), bytes.end(), box.begin(), box.end());
    REQUIRE(at != bytes.end());
    at[5] ^= std::byte{0x10};
    tc_test::write_file(d / "process_0.cask", bytes);
    auto errors = Archive::open(d / "index.cask").verify();
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].code() == ErrorCode::kChecksumMismatch);
    CHECK(errors[0].file() == (d / "process_0.cask").string());
    CHECK(errors[0].key_path() == escape_key(golden::shard_key("params/w", {3, 0}, {6, 4})));
    CHECK(ShardedArchive::open(d).verify().size() == 1);  // the directory form agrees
  }
  SUBCASE("an index read through a Source: kUnsupported, naming the directory form") {
    // The index's bytes from memory, as a store would serve them: it has no directory beside it.
    struct Bytes final : Source {
      std::string shown = "mem://ckpt/index.cask";
      std::vector<std::byte> b;
      const std::string& name() const noexcept override { return shown; }
      uint64_t size() const noexcept override { return b.size(); }
      void read(std::span<const ReadRange> ranges) const override {
        for (const ReadRange& r : ranges) std::memcpy(r.out.data(), b.data() + r.offset, r.out.size());
      }
    };
    auto src = std::make_shared<Bytes>();
    src->b = tc_test::read_file(tmp / "a" / "index.cask");
    Archive remote = Archive::open(std::shared_ptr<const Source>(src));
    REQUIRE(ShardedArchive::is_index(remote));
    Error e = tc_test::expect_error(ErrorCode::kUnsupported, [&] { remote.verify(); });
    CHECK(e.file() == "mem://ckpt/index.cask");
    CHECK(std::string(e.what()).find("directory URL") != std::string::npos);
  }
  SUBCASE("a box that is itself a reference into other files (the index naming itself): kCorruption") {
    fs::path d = copy_of("self");
    // params/b's one box named as leaf params/b of index.cask: the same dtype and shape, but no
    // bytes of its own (verifying it would verify the index again, forever).
    rewrite_index(d, [](std::vector<LeafMeta>& leaves) {
      leaves[1].shards = {ShardRef{"index.cask", "params/b", {0}, {5}}};
    }, false);
    Error e = verify_index_error(d / "index.cask", ErrorCode::kCorruption);
    CHECK(e.file() == (d / "index.cask").string());
    CHECK(std::string(e.what()).find("shard references of its own") != std::string::npos);
    tc_test::expect_error(ErrorCode::kCorruption, [&] { ShardedArchive::open(d); });
  }
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

// The reads every Reader serves, checked through the interface alone against
// `want(i)`, leaf i's bytes: read, read_many, find, subtree, and read_slices
// of two boxes (one strided) against read_slice of each.
static void check_reader(const Reader& r, const std::function<std::vector<std::byte>(size_t)>& want) {
  REQUIRE(r.size() > 0);
  std::vector<size_t> all(r.size());
  std::vector<std::vector<std::byte>> outs;
  std::vector<std::span<std::byte>> spans;
  for (size_t i = 0; i < r.size(); ++i) {
    all[i] = i;
    LeafInfo info = r.leaf(i);
    INFO(info.key_path);
    CHECK(r.find(info.key_path) == i);
    outs.emplace_back(info.byte_length);
    std::vector<std::byte> one(info.byte_length);
    r.read(i, one);
    CHECK(tc_test::same(one, want(i)));
  }
  for (auto& o : outs) spans.emplace_back(o);
  r.read_many(all, spans);
  for (size_t i = 0; i < r.size(); ++i) CHECK(tc_test::same(outs[i], want(i)));
  CHECK(r.subtree("") == all);
  CHECK_FALSE(r.find("no/such/leaf"));
  tc_test::expect_error(ErrorCode::kKeyNotFound, [&] { r.subtree("no/such/leaf"); });
  tc_test::expect_error(ErrorCode::kInvalidArgument, [&] { r.read_many(all, std::span(spans).first(1)); });
  tc_test::expect_error(ErrorCode::kInvalidArgument, [&] { r.leaf(r.size()); });
  CHECK(r.verify().empty());
  // Two boxes of the first rank-2 leaf of 4-byte elements at least 2 x 2.
  for (size_t i = 0; i < r.size(); ++i) {
    LeafInfo info = r.leaf(i);
    if (info.shape.size() != 2 || info.shape[0] < 2 || info.shape[1] < 2 || dtype_bits(info.dtype) != 32) continue;
    std::vector<int64_t> b0{0, 0}, e0{2, 2}, b1{info.shape[0] - 2, 1}, e1{info.shape[0], 2};
    std::vector<std::byte> want0(16), want1(8), got0(16), got1(8, std::byte{0}), wide(2 * 12, std::byte{0});
    r.read_slice(i, b0, e0, want0);
    r.read_slice(i, b1, e1, want1);
    std::vector<int64_t> strides{12, 4};  // box 1 into column 0 of a 2 x 3 int32 buffer
    std::vector<SliceRequest> boxes{{b0, e0, got0, {}}, {b1, e1, std::span(wide).first(16), strides}};
    r.read_slices(i, boxes);
    CHECK(tc_test::same(got0, want0));
    CHECK(std::memcmp(wide.data(), want1.data(), 4) == 0);
    CHECK(std::memcmp(wide.data() + 12, want1.data() + 4, 4) == 0);
    return;
  }
  FAIL("no rank-2 leaf of 4-byte elements to slice");
}

// Reader's "arguments before bytes" (reader.h): a read_many or read_slices
// whose second leaf or box is bad throws before the first is read, so the
// first output keeps its sentinel bytes; a bad first argument likewise
// leaves a good second output untouched.
static void check_arguments_first(const Reader& r) {
  const std::byte sentinel{0xA5};
  auto untouched = [&](std::span<std::byte> o) {  // true when o holds only sentinels; refills it
    bool all = std::all_of(o.begin(), o.end(), [&](std::byte b) { return b == sentinel; });
    std::fill(o.begin(), o.end(), sentinel);
    return all;
  };
  REQUIRE(r.size() >= 2);
  LeafInfo l0 = r.leaf(0), l1 = r.leaf(1);
  std::vector<std::byte> o0(l0.byte_length, sentinel), o1(l1.byte_length, sentinel), short1(l1.byte_length - 1, sentinel);
  std::vector<size_t> bad_index{0, r.size()};
  std::vector<std::span<std::byte>> two{o0, o1};
  tc_test::expect_error(ErrorCode::kInvalidArgument, [&] { r.read_many(bad_index, two); });
  CHECK(untouched(o0));
  std::vector<size_t> good{0, 1};
  std::vector<std::span<std::byte>> wrong_size{o0, short1};
  tc_test::expect_error(ErrorCode::kShapeMismatch, [&] { r.read_many(good, wrong_size); });
  CHECK(untouched(o0));
  std::vector<size_t> reversed{r.size(), 1};
  tc_test::expect_error(ErrorCode::kInvalidArgument, [&] { r.read_many(reversed, two); });
  CHECK(untouched(o1));

  // Boxes of the first rank-2 leaf of 4-byte elements at least 2 x 2: a
  // valid first box, then a bad second one of each kind.
  for (size_t i = 0; i < r.size(); ++i) {
    LeafInfo info = r.leaf(i);
    if (info.shape.size() != 2 || info.shape[0] < 2 || info.shape[1] < 2 || dtype_bits(info.dtype) != 32) continue;
    INFO(info.key_path);
    std::vector<int64_t> b0{0, 0}, e0{2, 2}, past{0, 0}, past_end{1, info.shape[1] + 1}, b1{0}, e1{1};
    std::vector<int64_t> strides3{4, 4, 4}, zero_row{0, 4};
    std::vector<std::byte> got0(16, sentinel), got1(16, sentinel), small(12, sentinel);
    auto first_box_untouched = [&](ErrorCode code, SliceRequest second) {
      std::vector<SliceRequest> boxes{{b0, e0, got0, {}}, second};
      tc_test::expect_error(code, [&] { r.read_slices(i, boxes); });
      CHECK(untouched(got0));
    };
    first_box_untouched(ErrorCode::kInvalidArgument, {past, past_end, got1, {}});   // out of range
    first_box_untouched(ErrorCode::kInvalidArgument, {b1, e1, got1, {}});           // wrong rank
    first_box_untouched(ErrorCode::kInvalidArgument, {b0, e0, got1, strides3});     // wrong stride count
    first_box_untouched(ErrorCode::kShapeMismatch, {b0, e0, small, {}});            // out too small
    first_box_untouched(ErrorCode::kInvalidArgument, {b0, e0, got1, zero_row});     // 2 rows to one place
    std::vector<SliceRequest> boxes{{past, past_end, got1, {}}, {b0, e0, got0, {}}};
    tc_test::expect_error(ErrorCode::kInvalidArgument, [&] { r.read_slices(i, boxes); });
    CHECK(untouched(got0));
    return;
  }
  FAIL("no rank-2 leaf of 4-byte elements to slice");
}

TEST_CASE("Reader: open_reader picks the reader; an archive and a sharded checkpoint serve one read API") {
  golden::ShardedVector v = golden::sharded_vector();
  std::unique_ptr<Reader> sharded = open_reader(vectors() / v.dir);
  const auto* s = dynamic_cast<const ShardedArchive*>(sharded.get());
  REQUIRE(s);
  CHECK(&sharded->treedef() == &s->index().treedef());
  CHECK(sharded->metadata() == s->index().metadata());
  CHECK(sharded->path() == s->path());
  check_reader(*sharded, [&](size_t i) { return v.global_bytes(i); });
  for (size_t i = 0; i < s->size(); ++i) CHECK_FALSE(s->leaf(i).zero_copy());  // assembled from boxes: no view
  check_arguments_first(*sharded);

  // The same global arrays saved as one archive file read the same through Reader.
  tc_test::TempDir tmp;
  std::vector<std::vector<std::byte>> bytes;
  std::vector<LeafInput> leaves;
  for (size_t i = 0; i < s->size(); ++i) bytes.push_back(v.global_bytes(i));
  for (size_t i = 0; i < s->size(); ++i) {
    LeafInput in;
    in.meta = s->leaf(i);
    in.meta.shards.clear();
    in.data = bytes[i];
    leaves.push_back(std::move(in));
  }
  save(tmp / "one.cask", s->treedef(), leaves);
  std::unique_ptr<Reader> file = open_reader(tmp / "one.cask");
  REQUIRE(dynamic_cast<const Archive*>(file.get()));
  CHECK(file->treedef().size() == s->treedef().size());
  check_reader(*file, [&](size_t i) { return bytes[i]; });
  check_arguments_first(*file);
  tc_test::expect_error(ErrorCode::kNotFound, [&] { open_reader(tmp / "missing.cask"); });
}
