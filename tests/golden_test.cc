// The golden vectors of format/vectors/ must read forever (SPEC.md "Versioning").
#include "../format/vectors/contents.h"
#include "testutil.h"

using namespace treecask;
namespace fs = std::filesystem;

static fs::path vectors() { return fs::path(TREECASK_SOURCE_DIR) / "format" / "vectors"; }

TEST_CASE("every v1.0 golden vector reads back exactly what its description says") {
  for (const auto& v : golden::all_vectors()) {
    INFO(v.file);
    Archive a = Archive::open(vectors() / v.file);
    CHECK(a.format_major() == 1);
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

TEST_CASE("the must-fail golden vectors fail with their documented error") {
  tc_test::expect_error(ErrorCode::kUnsupportedVersion,
                        [] { Archive::open(vectors() / "bad_newer_major.cask"); });
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
