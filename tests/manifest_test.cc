// The manifest (src/manifest.{h,cc}): semantic checks of crafted manifests,
// the one- and two-thread parse reporting the same finding, and the 8-byte
// alignment check the FlatBuffers verifier lacks (SPEC.md "Reader checks").
#include "craft.h"
#include "format/manifest.h"
#include "treecask_generated.h"

using namespace treecask;
using tc_test::FlatTree;
using tc_test::Sample;
using tc_test::save_sample;
using tc_test::TempDir;
namespace fs = std::filesystem;

TEST_CASE("a manifest whose byte length disagrees with dtype x shape is corrupt") {
  TempDir dir;
  FlatTree t;
  auto good = save_sample(dir, t);
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

// Large manifests are checked by two threads (src/format/manifest.cc), small ones by
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

TEST_CASE("a manifest [long] vector off 8-byte alignment is corrupt, not undefined behaviour") {
  // The FlatBuffers 2.0 verifier checks only that a vector's 4-byte length
  // prefix is aligned, so it accepts [long] elements on a 4-byte boundary and
  // reading them is undefined behaviour (UBSan in fuzz/manifest_fuzzer.cc).
  // Craft one: append a copy of leaf 0's shape vector whose elements start at
  // 4 mod 8, and point the leaf's shape field at it.
  Sample s;
  tc_test::rewrite_archive(s.path, s.dir / "misaligned.cask", [](tc_test::Crafted& c) {
    auto& buf = c.manifest;
    const fb::Leaf* leaf = fb::GetManifest(buf.data())->leaves()->Get(0);
    const auto* shape = leaf->shape();
    REQUIRE(shape != nullptr);
    // The field: the table starts with a signed offset back to its vtable,
    // whose entry at VT_SHAPE is the field's offset inside the table.
    auto* base = reinterpret_cast<const std::byte*>(buf.data());
    size_t table = reinterpret_cast<const uint8_t*>(leaf) - buf.data();
    size_t vtable = table - static_cast<int32_t>(format::get_u32(base + table));
    size_t field = table + format::get_u16(base + vtable + fb::Leaf::VT_SHAPE);
    size_t old_vec = reinterpret_cast<const uint8_t*>(shape) - buf.data();
    size_t bytes = 4 + 8 * shape->size();
    std::vector<uint8_t> copy(buf.begin() + old_vec, buf.begin() + old_vec + bytes);
    while (buf.size() % 8 != 0) buf.push_back(0);
    size_t new_vec = buf.size();  // length prefix at 0 mod 8, so the int64s start at 4 mod 8
    buf.insert(buf.end(), copy.begin(), copy.end());
    format::put_u32(reinterpret_cast<std::byte*>(buf.data()) + field, static_cast<uint32_t>(new_vec - field));
  });
  auto e = tc_test::expect_error(ErrorCode::kCorruption, [&] { Archive::open(s.dir / "misaligned.cask"); });
  INFO(std::string(e.what()));
  CHECK(e.message().find("8-byte aligned") != std::string::npos);
}

// parse_manifest checks a plain leaf in one pass over its table (fast_leaf in
// src/format/manifest.cc) and sends every other leaf, and every leaf that pass does
// not accept, through the generated FlatBuffers verifier and the full checks.
// The two must agree: on intact manifests of every kind of leaf the format has
// (the golden vectors: raw, LZ4, parts, byte shuffle, shard references, every
// dtype; metadata and logical axes) the same records, and on thousands of
// damaged copies the same verdict, code, key path and message.
TEST_CASE("the one-pass leaf check accepts and fills exactly what the full check does") {
  TempDir dir;
  const fs::path vectors = fs::path(TREECASK_SOURCE_DIR) / "format" / "vectors";
  std::vector<fs::path> sources = {vectors / "v1_0_tree.cask",    vectors / "v1_0_lz4.cask",
                                   vectors / "v1_0_parts.cask",   vectors / "v2_0_shuffle.cask",
                                   vectors / "v4_0_dtypes.cask",  vectors / "v3_0_sharded" / "index.cask"};
  FlatTree t;
  t.add_random("a/w", DType::kFloat32, {4, 8}, 1);
  t.leaves.back().meta.logical_axes = {"embed", "mlp"};
  t.add_random("a/b", DType::kBFloat16, {8}, 2);
  t.leaves.back().meta.metadata = {{"k", "v"}};
  t.add_random("a/i", DType::kInt64, {}, 3);
  t.leaves.back().meta.value_kind = ValueKind::kInt;
  t.save(dir / "meta.cask");
  sources.push_back(dir / "meta.cask");
  tc_test::Sample sample;
  sources.push_back(sample.path);

  struct Verdict {
    std::string what;  // empty when accepted
    std::unique_ptr<Manifest> m;
  };
  auto parse = [](const std::vector<uint8_t>& bytes, bool full) {
    Verdict v;
    try {
      v.m = parse_manifest(std::as_bytes(std::span(bytes)), "m", false, std::nullopt, kParallelManifestBytes, full);
    } catch (const Error& e) {
      v.what = std::string(error_code_name(e.code())) + " at '" + e.key_path() + "': " + e.what();
    }
    return v;
  };
  auto same_records = [](const Manifest& a, const Manifest& b) {
    REQUIRE(a.leaves.size() == b.leaves.size());
    for (size_t i = 0; i < a.leaves.size(); ++i) {
      const LeafRecord &x = a.leaves[i], &y = b.leaves[i];
      CAPTURE(x.key_path);
      CHECK(static_cast<const void*>(x.fb) != nullptr);
      CHECK(x.key_path == y.key_path);
      CHECK(x.byte_length == y.byte_length);
      CHECK(x.chunk_size == y.chunk_size);
      CHECK(x.stored_bytes == y.stored_bytes);
      CHECK(x.num_parts == y.num_parts);
      CHECK(x.num_shards == y.num_shards);
      CHECK(x.codec == y.codec);
      CHECK(x.filter == y.filter);
      CHECK(x.shuffle_bytes == y.shuffle_bytes);
      CHECK(x.dtype == y.dtype);
      CHECK(x.num_chunks() == y.num_chunks());
    }
  };
  std::mt19937 rng(11);
  int rejected = 0, runs = 0;
  for (const auto& src : sources) {
    CAPTURE(src);
    std::vector<uint8_t> man;
    tc_test::rewrite_archive(src, dir / "copy.cask", [&](tc_test::Crafted& c) { man = c.manifest; });
    Verdict fast = parse(man, false), full = parse(man, true);
    REQUIRE(fast.what.empty());
    REQUIRE(full.what.empty());
    same_records(*fast.m, *full.m);
    for (int k = 0; k < 600; ++k) {
      std::vector<uint8_t> bad = man;
      const int edits = 1 + static_cast<int>(rng() % 3);
      for (int j = 0; j < edits; ++j) {
        size_t at = rng() % bad.size();
        switch (rng() % 4) {
          case 0: bad[at] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
          case 1: bad[at] = 0; break;
          case 2: bad[at] = 0xff; break;
          default: bad[at] = static_cast<uint8_t>(rng()); break;
        }
      }
      Verdict f = parse(bad, false), g = parse(bad, true);
      ++runs;
      CHECK(f.what == g.what);
      if (f.what.empty() && g.what.empty()) same_records(*f.m, *g.m);
      rejected += !g.what.empty();
    }
  }
  CHECK(rejected > runs / 4);  // the damage reached the checks
}

// Check 35 (coverage) takes one pass when the chunks come in the writer's
// order and buckets and sorts them otherwise: both must reach the verdict
// SPEC.md "Coverage" gives.
TEST_CASE("coverage: chunks in any order tile their blob; a hole, an overlap or a tail is corrupt") {
  TempDir dir;
  FlatTree t;
  for (int i = 0; i < 4; ++i) t.add_random("k" + std::to_string(i), DType::kFloat32, {64}, i + 1);  // 256 B each
  t.save(dir / "good.cask");
  std::vector<uint8_t> man;
  tc_test::rewrite_archive(dir / "good.cask", dir / "copy.cask", [&](tc_test::Crafted& c) { man = c.manifest; });
  auto chunk = [](std::vector<uint8_t>& m, int leaf) {
    return const_cast<fb::Chunk*>(fb::GetMutableManifest(m.data())->mutable_leaves()->GetMutableObject(leaf)->chunks()->Get(0));
  };
  auto verdict = [](const std::vector<uint8_t>& m) -> std::string {
    try {
      parse_manifest(std::as_bytes(std::span(m)), "m");
      return {};
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::kCorruption);
      return e.what();
    }
  };
  REQUIRE(verdict(man).empty());
  REQUIRE(chunk(man, 0)->blob() == chunk(man, 1)->blob());
  // Leaves 0 and 1 trade places in the blob: still a tiling, out of order.
  auto swapped = man;
  const uint64_t o0 = chunk(swapped, 0)->offset(), o1 = chunk(swapped, 1)->offset();
  chunk(swapped, 0)->mutate_offset(o1);
  chunk(swapped, 1)->mutate_offset(o0);
  CHECK(verdict(swapped).empty());
  // The last leaf moved 64 bytes on runs past the payload (a leaf's own check).
  auto hole = swapped;
  chunk(hole, 3)->mutate_offset(chunk(man, 3)->offset() + 64);
  CHECK(verdict(hole).find("past the end") != std::string::npos);
  auto gap = man;
  fb::GetMutableManifest(gap.data())->mutable_blobs()->GetMutableObject(chunk(gap, 0)->blob())->mutate_payload_length(
      fb::GetManifest(gap.data())->blobs()->Get(chunk(gap, 0)->blob())->payload_length() + 64);
  CHECK(verdict(gap).find("unreferenced bytes at its end") != std::string::npos);
  auto over = man;
  chunk(over, 2)->mutate_offset(chunk(over, 1)->offset());
  CHECK(verdict(over).find("overlap") != std::string::npos);
  // Out of order and with a hole of 128 bytes after the first extent: the
  // bucketed check sorts, then names the hole before the overlap after it.
  auto mid_hole = man;
  chunk(mid_hole, 0)->mutate_offset(chunk(man, 3)->offset());
  chunk(mid_hole, 3)->mutate_offset(chunk(man, 0)->offset());
  chunk(mid_hole, 1)->mutate_offset(chunk(man, 1)->offset() + 128);
  CHECK(verdict(mid_hole).find("has a hole of 128 bytes") != std::string::npos);
}
