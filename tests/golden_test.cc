// The golden vectors of format/vectors/ must read forever (SPEC.md "Versioning").
#include "../format/vectors/contents.h"
#include "format.h"
#include "testutil.h"

using namespace treecask;
namespace fs = std::filesystem;

static fs::path vectors() { return fs::path(TREECASK_SOURCE_DIR) / "format" / "vectors"; }

TEST_CASE("every golden vector reads back exactly what its description says") {
  for (const auto& v : golden::all_vectors()) {
    INFO(v.file);
    Archive a = Archive::open(vectors() / v.file);
    CHECK(a.format_major() == v.major);
    CHECK(a.format_minor() == 0);
    CHECK(a.metadata() == v.options.metadata);
    CHECK(a.verify().empty());
    REQUIRE(a.treedef().size() == v.treedef.size());
    for (size_t i = 0; i < v.treedef.size(); ++i) {
      CHECK(a.treedef()[i].kind == v.treedef[i].kind);
      CHECK(a.treedef()[i].keys == v.treedef[i].keys);
      CHECK(a.treedef()[i].type_name == v.treedef[i].type_name);
    }
    REQUIRE(a.size() == v.leaves.size());
    for (size_t i = 0; i < v.leaves.size(); ++i) {
      const auto& want = v.leaves[i].meta;
      LeafInfo got = a.leaf(i);
      INFO(want.key_path);
      CHECK(got.key_path == want.key_path);
      CHECK(got.dtype == want.dtype);
      CHECK(got.shape == want.shape);
      CHECK(got.value_kind == want.value_kind);
      CHECK(got.logical_axes == want.logical_axes);
      CHECK(got.sharding == want.sharding);
      CHECK(got.metadata == want.metadata);
      auto bytes = v.leaves[i].bytes();
      std::vector<std::byte> out(got.byte_length);
      a.read(i, out);
      CHECK(tc_test::same(out, bytes));
      if (got.codec == Codec::kNone && got.num_parts <= 1) CHECK(tc_test::same(a.view(i), bytes));
    }
  }
  Archive parts = Archive::open(vectors() / "v1_0_parts.cask");
  CHECK(parts.leaf(0).num_parts == 9);
  Archive lz4 = Archive::open(vectors() / "v1_0_lz4.cask");
  CHECK(lz4.leaf(0).codec == Codec::kLZ4);
  CHECK(lz4.leaf(0).stored_bytes < lz4.leaf(0).byte_length / 4);
}

TEST_CASE("the v2.0 vector: byte-shuffled leaves, whole, by rows, and their chunks") {
  Archive a = Archive::open(vectors() / "v2_0_shuffle.cask");
  golden::Vector v = golden::shuffle_vector();
  for (size_t i = 0; i < v.leaves.size(); ++i) {
    LeafInfo info = a.leaf(i);
    INFO(info.key_path);
    CHECK(info.codec == Codec::kLZ4);
    CHECK(info.filter == (info.dtype == DType::kUInt8 ? Filter::kNone : Filter::kByteShuffle));
    // Rows across chunk boundaries come back unshuffled.
    auto bytes = v.leaves[i].bytes();
    int64_t rows = info.shape[0];
    uint64_t row_bytes = bytes.size() / uint64_t(rows);
    int64_t b = rows / 3, e = rows - rows / 4;
    std::vector<std::byte> out((e - b) * row_bytes);
    a.read_rows(i, b, e, out);
    CHECK(tc_test::same(out, std::span(bytes).subspan(b * row_bytes, out.size())));
  }
  // Smooth bf16 compresses ~4x once shuffled; random float32 not at all, so
  // its chunks are stored raw, as shuffled bytes.
  CHECK(a.leaf(a.index_of("bf16")).stored_bytes * 3 < a.leaf(a.index_of("bf16")).byte_length);
  LeafInfo noise = a.leaf(a.index_of("noise"));
  CHECK(noise.stored_bytes == noise.byte_length);
}

TEST_CASE("the must-fail golden vectors fail with their documented error") {
  // Header major 2 over a 1.0 manifest: "newer than supported" for the 1.x
  // readers it was written for; since 2.0 exists, a 2.x reader reads the
  // header and then refuses the manifest's disagreeing major (format/vectors/
  // README.md). bad_major_3.cask now plays the first role.
  static_assert(format::kMajor == 2, "revisit the newer-major vectors");
  tc_test::expect_error(ErrorCode::kCorruption, [] { Archive::open(vectors() / "bad_newer_major.cask"); });
  tc_test::expect_error(ErrorCode::kUnsupportedVersion, [] { Archive::open(vectors() / "bad_major_3.cask"); });
  tc_test::expect_error(ErrorCode::kCorruption, [] { Archive::open(vectors() / "bad_truncated.cask"); });
  Archive a = Archive::open(vectors() / "bad_blob_checksum.cask");
  auto e = tc_test::expect_error(ErrorCode::kChecksumMismatch, [&] {
    size_t i = a.index_of("nested/0/0");
    std::vector<std::byte> out(a.leaf(i).byte_length);
    a.read(i, out);
  });
  CHECK(e.key_path() == "nested/0/0");
  auto errors = a.verify();
  REQUIRE(errors.size() == 1);
  CHECK(errors[0].key_path() == "nested/0/0");
}
