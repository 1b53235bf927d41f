// The golden vectors of format/vectors/ must read forever (SPEC.md "Versioning").
#include "../format/vectors/contents.h"
#include "craft.h"
#include "format/format.h"
#include "pages.h"
#include "testutil.h"

#include <cstring>
#include <random>

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
  // README.md). bad_major_3.cask played the first role until 3.0 existed, and
  // is now refused the same way (header 3, manifest 2), as is bad_major_4.cask
  // (header 4 over the 3.0 index) since 4.0 exists; bad_major_5.cask (header
  // 5 over the 4.0 dtypes vector) plays it now.
  static_assert(format::kMajor == 4, "revisit the newer-major vectors");
  tc_test::expect_error(ErrorCode::kCorruption, [] { Archive::open(vectors() / "bad_newer_major.cask"); });
  tc_test::expect_error(ErrorCode::kCorruption, [] { Archive::open(vectors() / "bad_major_3.cask"); });
  tc_test::expect_error(ErrorCode::kCorruption, [] { Archive::open(vectors() / "bad_major_4.cask"); });
  tc_test::expect_error(ErrorCode::kUnsupportedVersion, [] { Archive::open(vectors() / "bad_major_5.cask"); });
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

// The page-size vectors (LMDB pages of 512, 16384 and 65536 bytes; every
// other vector has 4096): their page sizes, their codecs, and rule S11 on a
// copy with blob 0's overflow page header damaged, wherever the file is
// mapped (page_size_test.cc covers more files and every read path).
TEST_CASE("the LMDB page-size vectors: page sizes, and S11 at each") {
  for (const auto& v : golden::all_vectors())
    CHECK(tc_test::page_size_of(tc_test::read_file(vectors() / v.file)) == (v.page_size ? v.page_size : 4096));
  tc_test::TempDir dir;
  for (uint32_t page : {512u, 16384u, 65536u}) {
    CAPTURE(page);
    golden::Vector v = golden::pages_vector(page);
    const auto bytes = tc_test::read_file(vectors() / v.file);
    {
      Archive a = Archive::open(vectors() / v.file);
      CHECK(a.leaf(a.index_of("w")).codec == Codec::kNone);
      CHECK(a.leaf(a.index_of("b")).codec == Codec::kNone);
      CHECK(a.leaf(a.index_of("z")).codec == Codec::kLZ4);
    }
    // Blob 0 holds w from payload offset 0: its header precedes w's bytes.
    const auto w = v.leaves[0].bytes();
    const size_t at = tc_test::find_bytes(bytes, std::span(w).subspan(0, 64));
    REQUIRE(at != SIZE_MAX);
    const size_t head = at - format::kBlobHeaderSize - lmdb::kPageHeaderSize;
    REQUIRE(head % page == 0);
    REQUIRE(format::get_u32(bytes.data() + head + 16 + 8) == 0);  // blob id 0
    for (size_t field : {size_t{0}, size_t{10}, size_t{12}}) {  // mp_pgno + 1, mp_flags 0, mp_pages 0
      CAPTURE(field);
      auto damaged = bytes;
      if (field == 0)
        damaged[head] ^= std::byte{0x01};
      else
        std::memset(damaged.data() + head + field, 0, field == 10 ? 2 : 4);
      auto p = dir / "bad.cask";
      tc_test::write_file(p, damaged);
      for (long shift : {-1L, 0L, 4096L, 12288L, 36864L}) {
        CAPTURE(shift);
        tc_test::MapShift where(shift);
        Archive a = Archive::open(p);
        std::vector<std::byte> out(w.size());
        auto e = tc_test::expect_error(ErrorCode::kCorruption, [&] { a.read(0, out); });
        CHECK(std::string(e.what()).find("LMDB overflow page") != std::string::npos);
        for (size_t i : {size_t{1}, size_t{2}}) {
          auto want = v.leaves[i].bytes();
          std::vector<std::byte> o(want.size());
          a.read(i, o);
          CHECK(tc_test::same(o, want));
        }
      }
    }
  }
}

TEST_CASE("the v3.0 vector: a sharded checkpoint directory, whole leaves and hyperslabs across boxes") {
  golden::ShardedVector v = golden::sharded_vector();
  fs::path dir = vectors() / v.dir;
  REQUIRE(ShardedArchive::is_sharded(dir));
  CHECK_FALSE(ShardedArchive::is_sharded(vectors() / "v1_0_tree.cask"));
  ShardedArchive s = ShardedArchive::open(dir);
  CHECK(s.index().format_major() == 3);
  CHECK(s.index().metadata() == KeyValues{{"treecask.processes", "2"}});
  CHECK(s.files() == std::vector<std::string>{"process_0.cask", "process_1.cask"});
  for (const auto& f : s.files()) CHECK(s.file(f).format_major() == 1);  // shard files stay 1.0
  CHECK(s.verify().empty());
  REQUIRE(s.size() == v.leaves.size());
  for (size_t i = 0; i < v.leaves.size(); ++i) {
    const auto& want = v.leaves[i];
    LeafInfo got = s.leaf(i);
    INFO(want.key_path);
    CHECK(got.key_path == want.key_path);
    CHECK(got.dtype == want.dtype);
    CHECK(got.shape == want.shape);
    CHECK(got.value_kind == want.value_kind);
    CHECK(got.logical_axes == want.logical_axes);
    CHECK(got.sharding == want.sharding);
    CHECK(got.metadata == want.metadata);
    CHECK(got.shards == want.shards);
    CHECK(got.num_chunks == 0);
    auto bytes = v.global_bytes(i);
    std::vector<std::byte> out(got.byte_length);
    s.read(i, out);
    CHECK(tc_test::same(out, bytes));
    // The index alone does not hold the bytes.
    tc_test::expect_error(ErrorCode::kUnsupported, [&] { s.index().read(i, out); });
  }
  // A hyperslab across all four boxes of params/w, C-contiguous and strided.
  size_t w = s.index().index_of("params/w");
  auto all = v.global_bytes(w);
  std::vector<int64_t> b{1, 2}, e{5, 7};
  auto want = golden::box_bytes(all, {6, 8}, b, e, 4);
  std::vector<std::byte> out(want.size());
  s.read_slice(w, b, e, out);
  CHECK(tc_test::same(out, want));
  // Into the middle of a 6 x 10 int32 buffer (row stride 40 bytes) at (1, 3).
  std::vector<std::byte> big(6 * 10 * 4, std::byte{0});
  std::vector<int64_t> strides{40, 4};
  s.read_slice(w, b, e, std::span(big).subspan(1 * 40 + 3 * 4), strides);
  for (int64_t r = 0; r < 4; ++r)
    CHECK(std::memcmp(big.data() + (1 + r) * 40 + 3 * 4, want.data() + r * 5 * 4, 5 * 4) == 0);
  CHECK(big[0] == std::byte{0});
  tc_test::expect_error(ErrorCode::kInvalidArgument, [&] {
    std::vector<int64_t> bb{0, 0}, ee{7, 8};
    std::vector<std::byte> o(7 * 8 * 4);
    s.read_slice(w, bb, ee, o);
  });
  tc_test::expect_error(ErrorCode::kShapeMismatch, [&] {
    std::vector<std::byte> o(3);
    s.read_slice(w, b, e, o);
  });
}

TEST_CASE("a sharded checkpoint whose shard file lacks a box, or is missing, does not open") {
  golden::ShardedVector v = golden::sharded_vector();
  tc_test::TempDir tmp;
  fs::path dir = tmp / "ckpt";
  fs::copy(vectors() / v.dir, dir);
  fs::remove(dir / "process_1.cask");
  tc_test::expect_error(ErrorCode::kNotFound, [&] { ShardedArchive::open(dir); });
  // process_0.cask standing in for process_1.cask: the boxes it should hold are not there.
  fs::copy_file(dir / "process_0.cask", dir / "process_1.cask");
  auto e = tc_test::expect_error(ErrorCode::kCorruption, [&] { ShardedArchive::open(dir); });
  CHECK(e.key_path() == "params/w");
}

TEST_CASE("the writer checks shard references (SPEC.md rules R1-R4) before writing anything") {
  golden::ShardedVector v = golden::sharded_vector();
  tc_test::TempDir tmp;
  auto attempt = [&](const std::function<void(std::vector<LeafInput>&)>& edit) {
    std::vector<LeafInput> idx;
    for (const auto& m : v.leaves) idx.push_back({m, {}, std::nullopt});
    edit(idx);
    return tc_test::expect_error(ErrorCode::kInvalidArgument, [&] { save(tmp / "index.cask", v.treedef, idx); });
  };
  std::vector<std::byte> bytes(6 * 8 * 4);
  CHECK(attempt([&](auto& idx) { idx[0].data = bytes; }).key_path() == "params/w");        // data and shards
  CHECK(attempt([](auto& idx) { idx[0].meta.shards[1].stop[1] = 9; }).key_path() == "params/w");   // outside
  CHECK(attempt([](auto& idx) { idx[0].meta.shards.pop_back(); }).key_path() == "params/w");  // do not tile
  CHECK(attempt([](auto& idx) { idx[1].meta.shards[0].file = "../x.cask"; }).key_path() == "params/b");
  CHECK(attempt([](auto& idx) { idx[2].meta.shards[0].start = {0}; }).key_path() == "step");  // rank
  CHECK_FALSE(fs::exists(tmp / "index.cask"));
  // Valid: written as 3.0, and a file without shard references stays 1.0.
  std::vector<LeafInput> idx;
  for (const auto& m : v.leaves) idx.push_back({m, {}, std::nullopt});
  save(tmp / "index.cask", v.treedef, idx);
  CHECK(Archive::open(tmp / "index.cask").format_major() == 3);
  CHECK(Archive::open(vectors() / v.dir / "process_0.cask").format_major() == 1);
}

TEST_CASE("the v4.0 vector: every dtype of format 4.0, sub-byte slices across chunks") {
  Archive a = Archive::open(vectors() / "v4_0_dtypes.cask");
  golden::Vector v = golden::dtypes_vector();
  CHECK(a.format_major() == 4);
  for (int d = kFirstDTypeOf4; d <= kMaxDType; ++d) {
    size_t i = a.index_of(dtype_name(DType(d)));
    CHECK(a.leaf(i).dtype == DType(d));
  }
  CHECK(dtype_from_name("float6_e3m2fn") == DType::kFloat6E3M2FN);
  CHECK(dtype_bits(DType::kInt2) == 2);
  CHECK(dtype_bits(DType::kFloat6E2M3FN) == 6);
  CHECK(dtype_bits(DType::kFloat8E8M0FNU) == 8);
  CHECK(a.leaf(a.index_of("f6_big")).byte_length == 6825);
  CHECK(a.leaf(a.index_of("f6_big")).num_chunks == 2);
  // Element k of a packed leaf: bits [k * bits, (k + 1) * bits) of the
  // little-endian bit stream (SPEC.md "Dtypes").
  auto element = [](const std::vector<std::byte>& b, uint64_t k, unsigned bits) {
    uint64_t bit = k * bits;
    unsigned x = uint8_t(b[bit / 8]);
    if (bit % 8 + bits > 8) x |= unsigned(uint8_t(b[bit / 8 + 1])) << 8;
    return uint8_t((x >> (bit % 8)) & ((1u << bits) - 1));
  };
  std::mt19937 rng(4);
  for (size_t i = 0; i < v.leaves.size(); ++i) {
    const auto& m = v.leaves[i].meta;
    const unsigned bits = unsigned(dtype_bits(m.dtype));
    const uint64_t item = bits < 8 ? 1 : bits / 8;
    auto bytes = v.leaves[i].bytes();
    INFO(m.key_path);
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<int64_t> start(2), stop(2);
      for (size_t d = 0; d < 2; ++d) {
        int64_t x = rng() % (m.shape[d] + 1), y = rng() % (m.shape[d] + 1);
        if (trial == 0) x = 0, y = m.shape[d];
        start[d] = std::min(x, y);
        stop[d] = std::max(x, y);
      }
      const int64_t rows = stop[0] - start[0], cols = stop[1] - start[1];
      std::vector<std::byte> out(uint64_t(rows * cols) * item), want(out.size());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          uint64_t k = uint64_t((start[0] + r) * m.shape[1] + start[1] + c);
          uint64_t o = uint64_t(r * cols + c) * item;
          if (bits < 8) want[o] = std::byte(element(bytes, k, bits));
          else std::memcpy(want.data() + o, bytes.data() + k * item, item);
        }
      a.read_slice(a.index_of(m.key_path), start, stop, out, {}, Verify::kYes);
      CHECK(tc_test::same(out, want));
    }
  }
  // Rows of a packed leaf that are not whole bytes: read_slice, not read_rows.
  std::vector<std::byte> row(65);
  tc_test::expect_error(ErrorCode::kInvalidArgument, [&] { a.read_rows(a.index_of("i2_big"), 0, 1, row); });
}
