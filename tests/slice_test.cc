// Archive::read_slice / read_slices / read_bytes against a naive reference
// gather, over random shapes and boxes, every codec path (raw, LZ4, LZ4 with
// the shuffle filter, several parts), strided and negative-stride
// destinations, packed int4; plus damage and argument errors.
#include <doctest/doctest.h>

#include <cstring>
#include <random>

#include "craft.h"
#include "read/slice.h"
#include "testutil.h"
#include "treecask/treecask.h"

using namespace treecask;
using tc_test::FlatTree;
using tc_test::TempDir;

namespace {

// The bytes of element `e` (C-order index) of a leaf: `elem` bytes, or for
// int4/uint4 (elem 0) the nibble unpacked to one byte.
void element(std::span<const std::byte> leaf, uint64_t e, uint64_t elem, std::byte* out) {
  if (elem == 0) {
    uint8_t b = static_cast<uint8_t>(leaf[e / 2]);
    *out = std::byte((e & 1) ? (b >> 4) : (b & 0x0F));
    return;
  }
  std::memcpy(out, leaf.data() + e * elem, elem);
}

// Reference: the box [start, stop) of `leaf` gathered into a buffer with
// byte strides `strides` (origin at `origin` bytes into a buffer of `size`).
std::vector<std::byte> gather(std::span<const std::byte> leaf, const std::vector<int64_t>& shape,
                              uint64_t elem, const std::vector<int64_t>& start,
                              const std::vector<int64_t>& stop, const std::vector<int64_t>& strides,
                              int64_t origin, size_t size, std::byte fill) {
  std::vector<std::byte> out(size, fill);
  size_t rank = shape.size();
  std::vector<int64_t> i(start);
  for (size_t d = 0; d < rank; ++d)
    if (start[d] == stop[d]) return out;
  uint64_t out_elem = elem ? elem : 1;
  for (;;) {
    uint64_t e = 0;
    int64_t o = origin;
    for (size_t d = 0; d < rank; ++d) {
      e = e * static_cast<uint64_t>(shape[d]) + static_cast<uint64_t>(i[d]);
      o += (i[d] - start[d]) * strides[d];
    }
    std::byte tmp[16];
    element(leaf, e, elem, tmp);
    std::memcpy(out.data() + o, tmp, out_elem);
    size_t d = rank;
    while (d > 0) {
      --d;
      if (++i[d] < stop[d]) break;
      i[d] = start[d];
      if (d == 0) return out;
    }
    if (rank == 0) return out;
  }
}

struct Case {
  DType dtype;
  std::vector<int64_t> shape;
};

}  // namespace

TEST_CASE("read_slice equals a naive gather for random boxes, codecs and destinations") {
  TempDir dir;
  std::mt19937 rng(1234);
  const DType dtypes[] = {DType::kUInt8, DType::kInt16, DType::kFloat32, DType::kFloat64,
                          DType::kComplex128, DType::kInt4, DType::kUInt4, DType::kBool};
  int file_no = 0;
  for (int round = 0; round < 24; ++round) {
    FlatTree t;
    std::vector<Case> cases;
    for (DType dt : dtypes) {
      size_t rank = rng() % 5;
      std::vector<int64_t> shape;
      for (size_t d = 0; d < rank; ++d) shape.push_back(1 + rng() % (d == 0 ? 40 : 13));
      if (rng() % 8 == 0 && rank > 0) shape[rng() % rank] = 0;
      uint64_t n = byte_length_for(dt, shape);
      std::vector<std::byte> bytes =
          rng() % 2 ? tc_test::random_bytes(n, rng()) : tc_test::compressible_bytes(n, rng());
      if (dt == DType::kBool)
        for (auto& b : bytes) b = std::byte(static_cast<uint8_t>(b) & 1);
      if ((dt == DType::kInt4 || dt == DType::kUInt4) && n > 0) {
        // The padding nibble of an odd element count is zero (SPEC.md).
        uint64_t count = 1;
        for (auto s : shape) count *= static_cast<uint64_t>(s);
        if (count % 2) bytes.back() = std::byte(static_cast<uint8_t>(bytes.back()) & 0x0F);
      }
      t.add("leaf" + std::to_string(cases.size()), dt, shape, std::move(bytes));
      cases.push_back({dt, shape});
    }
    SaveOptions opt;
    opt.chunk_size = 4096;
    opt.compression = round % 3 == 0 ? Compression::kNone : Compression::kLZ4;
    opt.shuffle = round % 3 == 2;
    if (round % 4 == 1) opt.max_part_bytes = 2 * 4096;
    auto path = dir / ("r" + std::to_string(file_no++) + ".cask");
    t.save(path, opt);
    Archive a = Archive::open(path);
    for (size_t li = 0; li < cases.size(); ++li) {
      const auto& shape = cases[li].shape;
      int bits = dtype_bits(cases[li].dtype);
      uint64_t elem = bits < 8 ? 0 : static_cast<uint64_t>(bits) / 8;
      uint64_t out_elem = elem ? elem : 1;
      std::span<const std::byte> leaf(t.data[li]);
      REQUIRE(a.leaf(li).shape == shape);
      for (int trial = 0; trial < 6; ++trial) {
        size_t rank = shape.size();
        std::vector<int64_t> start(rank), stop(rank), n(rank);
        uint64_t count = 1;
        for (size_t d = 0; d < rank; ++d) {
          int64_t x = rng() % (shape[d] + 1), y = rng() % (shape[d] + 1);
          if (trial == 0) x = 0, y = shape[d];  // the whole leaf
          start[d] = std::min(x, y);
          stop[d] = std::max(x, y);
          n[d] = stop[d] - start[d];
          count *= static_cast<uint64_t>(n[d]);
        }
        INFO("round " << round << " leaf " << li << " dtype " << dtype_name(cases[li].dtype)
                      << " trial " << trial);
        // C-contiguous.
        std::vector<int64_t> cstr(rank);
        int64_t st = static_cast<int64_t>(out_elem);
        for (size_t d = rank; d-- > 0;) cstr[d] = st, st *= n[d];
        std::vector<std::byte> out(count * out_elem, std::byte{0xAB});
        a.read_slice(li, start, stop, out, {}, Verify::kYes, trial % 2 ? 3 : 0);
        CHECK(tc_test::same(out, gather(leaf, shape, elem, start, stop, cstr, 0, out.size(), std::byte{0})));
        // A strided destination: padded, permuted, some strides negative.
        if (count == 0 || rank == 0) continue;
        std::vector<size_t> perm(rank);
        for (size_t d = 0; d < rank; ++d) perm[d] = d;
        std::shuffle(perm.begin(), perm.end(), rng);
        std::vector<int64_t> sstr(rank);
        int64_t s2 = static_cast<int64_t>(out_elem) + (rng() % 2) * 3;
        for (size_t k = rank; k-- > 0;) {
          size_t d = perm[k];
          sstr[d] = s2;
          s2 *= n[d] + static_cast<int64_t>(rng() % 2);
        }
        int64_t o_min = 0, o_max = 0;
        for (size_t d = 0; d < rank; ++d) {
          if (rng() % 3 == 0) sstr[d] = -sstr[d];
          (sstr[d] < 0 ? o_min : o_max) += (n[d] - 1) * sstr[d];
        }
        size_t size = static_cast<size_t>(o_max - o_min) + out_elem + 5;
        std::vector<std::byte> sout(size, std::byte{0xCD});
        a.read_slice(li, start, stop, sout, sstr, Verify::kDefault, trial % 2 ? 2 : 0);
        CHECK(tc_test::same(sout, gather(leaf, shape, elem, start, stop, sstr, -o_min, size, std::byte{0xCD})));
      }
      // Byte ranges.
      for (int trial = 0; trial < 4 && !leaf.empty(); ++trial) {
        uint64_t x = rng() % (leaf.size() + 1), y = rng() % (leaf.size() + 1);
        std::vector<std::byte> out(std::max(x, y) - std::min(x, y));
        a.read_bytes(li, std::min(x, y), out);
        CHECK(tc_test::same(out, leaf.subspan(std::min(x, y), out.size())));
      }
    }
  }
}

TEST_CASE("read_slices feeds many boxes from one pass, large reads on several threads") {
  TempDir dir;
  FlatTree t;
  const int64_t rows = 1024, cols = 2048;  // 8 MiB of float32: the threaded path
  t.add_random("w", DType::kFloat32, {rows, cols}, 7);
  for (Compression c : {Compression::kNone, Compression::kLZ4}) {
    SaveOptions opt;
    opt.compression = c;
    opt.chunk_size = 64 << 10;
    auto path = dir / (c == Compression::kNone ? "raw.cask" : "lz4.cask");
    t.save(path, opt);
    Archive a = Archive::open(path);
    // A (4, 2) mesh of boxes, like P("x", "y"), plus a column block.
    std::vector<std::vector<int64_t>> starts, stops;
    for (int64_t x = 0; x < 4; ++x)
      for (int64_t y = 0; y < 2; ++y) {
        starts.push_back({x * rows / 4, y * cols / 2});
        stops.push_back({(x + 1) * rows / 4, (y + 1) * cols / 2});
      }
    starts.push_back({0, 100});
    stops.push_back({rows, 612});
    std::vector<std::vector<std::byte>> outs;
    std::vector<Archive::SliceRequest> reqs;
    for (size_t k = 0; k < starts.size(); ++k) {
      outs.emplace_back((stops[k][0] - starts[k][0]) * (stops[k][1] - starts[k][1]) * 4);
      reqs.push_back({starts[k], stops[k], outs.back(), {}});
    }
    a.read_slices(0, reqs, Verify::kYes, 0);
    for (size_t k = 0; k < starts.size(); ++k) {
      std::vector<int64_t> cstr{(stops[k][1] - starts[k][1]) * 4, 4};
      CHECK(tc_test::same(outs[k], gather(t.data[0], {rows, cols}, 4, starts[k], stops[k], cstr, 0,
                                          outs[k].size(), std::byte{0})));
    }
    // read_rows is now read_bytes of the rows.
    std::vector<std::byte> r(3 * cols * 4);
    a.read_rows(0, 500, 503, r);
    CHECK(tc_test::same(r, std::span(t.data[0]).subspan(500 * cols * 4, r.size())));
  }
}

TEST_CASE("a damaged chunk fails only the reads that touch it") {
  TempDir dir;
  FlatTree t;
  const int64_t rows = 64, cols = 256;  // 64 KiB of float32: 16 chunks of 4 KiB, 4 rows each
  t.add_random("w", DType::kFloat32, {rows, cols}, 9);
  SaveOptions opt;
  opt.compression = Compression::kNone;
  opt.chunk_size = 4096;
  auto path = dir / "d.cask";
  t.save(path, opt);
  auto bytes = tc_test::read_file(path);
  // Damage chunk 5 (rows 20..23).
  std::span<const std::byte> chunk5 = std::span(t.data[0]).subspan(5 * 4096, 64);
  size_t at = tc_test::find_bytes(bytes, chunk5);
  REQUIRE(at != SIZE_MAX);
  bytes[at + 100] ^= std::byte{0x01};
  tc_test::write_file(path, bytes);
  Archive a = Archive::open(path);
  std::vector<std::byte> out(4 * 10 * 4);
  std::vector<int64_t> start{20, 3}, stop{24, 13};
  auto e = tc_test::expect_error(ErrorCode::kChecksumMismatch, [&] { a.read_slice(0, start, stop, out); });
  CHECK(e.key_path() == "w");
  CHECK(e.file() == path.string());
  std::vector<int64_t> start2{24, 3}, stop2{28, 13};
  a.read_slice(0, start2, stop2, out);  // chunk 6 only
  std::vector<int64_t> cstr{40, 4};
  CHECK(tc_test::same(out, gather(t.data[0], {rows, cols}, 4, start2, stop2, cstr, 0, out.size(), std::byte{0})));
  a.read_slice(0, start, stop, out, {}, Verify::kNo);  // unverified reads still return bytes
  std::vector<std::byte> br(4096);
  tc_test::expect_error(ErrorCode::kChecksumMismatch, [&] { a.read_bytes(0, 5 * 4096 + 4000, br); });
  a.read_bytes(0, 6 * 4096, br);
}

TEST_CASE("read_slice and read_bytes check their arguments before reading") {
  TempDir dir;
  FlatTree t;
  t.add_random("m", DType::kFloat32, {6, 5}, 3);
  t.add_random("s", DType::kInt64, {}, 4);
  t.save(dir / "a.cask");
  Archive a = Archive::open(dir / "a.cask");
  std::vector<std::byte> out(6 * 5 * 4);
  using V = std::vector<int64_t>;
  auto slice = [&](V start, V stop, std::span<std::byte> o, V strides = {}) {
    a.read_slice(0, start, stop, o, strides);
  };
  auto e = tc_test::expect_error(ErrorCode::kInvalidArgument, [&] { slice({0, 0}, {7, 5}, out); });
  CHECK(std::string(e.what()).find("dimension 0") != std::string::npos);
  CHECK(e.key_path() == "m");
  tc_test::expect_error(ErrorCode::kInvalidArgument, [&] { slice({0, 3}, {6, 2}, out); });
  tc_test::expect_error(ErrorCode::kInvalidArgument, [&] { slice({-1, 0}, {6, 5}, out); });
  tc_test::expect_error(ErrorCode::kInvalidArgument, [&] { slice({0}, {6}, out); });
  tc_test::expect_error(ErrorCode::kShapeMismatch, [&] { slice({0, 0}, {6, 4}, out); });
  tc_test::expect_error(ErrorCode::kShapeMismatch,
                        [&] { slice({0, 0}, {6, 5}, std::span(out).first(100), {20, 4}); });
  tc_test::expect_error(ErrorCode::kInvalidArgument, [&] { slice({0, 0}, {6, 5}, out, {0, 4}); });
  tc_test::expect_error(ErrorCode::kInvalidArgument, [&] { slice({0, 0}, {6, 5}, out, {20}); });
  tc_test::expect_error(ErrorCode::kInvalidArgument,
                        [&] { a.read_slice(7, V{}, V{}, std::span(out).first(8)); });
  // A 0-d leaf takes empty start/stop; an empty box writes nothing.
  std::vector<std::byte> one(8);
  a.read_slice(1, V{}, V{}, one);
  CHECK(tc_test::same(one, t.data[1]));
  slice({2, 2}, {2, 5}, std::span(out).first(0));
  tc_test::expect_error(ErrorCode::kInvalidArgument, [&] { a.read_bytes(0, 100, std::span(out).first(21)); });
  tc_test::expect_error(ErrorCode::kInvalidArgument, [&] { a.read_bytes(0, 121, std::span(out).first(0)); });
  a.read_bytes(0, 120, std::span(out).first(0));
}

namespace {

// Element `e` of a packed sub-byte leaf (SPEC.md "Dtypes": element k at bit
// k * bits of the little-endian bit stream), as one byte.
uint8_t sub_byte(std::span<const std::byte> leaf, uint64_t e, unsigned bits) {
  uint64_t bit = e * bits;
  unsigned v = static_cast<uint8_t>(leaf[bit / 8]);
  if (bit % 8 + bits > 8) v |= unsigned(static_cast<uint8_t>(leaf[bit / 8 + 1])) << 8;
  return static_cast<uint8_t>((v >> (bit % 8)) & ((1u << bits) - 1));
}

// Packs one-byte elements into `bits`-bit elements, padding bits zero.
std::vector<std::byte> pack_bits(const std::vector<uint8_t>& elems, unsigned bits) {
  std::vector<std::byte> out((elems.size() * bits + 7) / 8);
  for (uint64_t k = 0; k < elems.size(); ++k) {
    uint64_t bit = k * bits;
    unsigned v = elems[k] & ((1u << bits) - 1);
    out[bit / 8] |= std::byte((v << (bit % 8)) & 0xFF);
    if (bit % 8 + bits > 8) out[bit / 8 + 1] |= std::byte(v >> (8 - bit % 8));
  }
  return out;
}

// C-order element indices of the box [start, stop) of `shape`.
std::vector<uint64_t> box_elements(const std::vector<int64_t>& shape, const std::vector<int64_t>& start,
                                   const std::vector<int64_t>& stop) {
  std::vector<uint64_t> out;
  for (size_t d = 0; d < shape.size(); ++d)
    if (start[d] == stop[d]) return out;
  std::vector<int64_t> i(start);
  for (;;) {
    uint64_t e = 0;
    for (size_t d = 0; d < shape.size(); ++d) e = e * uint64_t(shape[d]) + uint64_t(i[d]);
    out.push_back(e);
    size_t d = shape.size();
    for (;;) {
      if (d == 0) return out;
      --d;
      if (++i[d] < stop[d]) break;
      i[d] = start[d];
    }
  }
}

}  // namespace

TEST_CASE("pack_elements and slice::unpack follow the spec's bit order and invert each other") {
  // Every length 0..70 (whole groups of 2, 4 or 3 bytes, and a tail) and
  // every start offset 0..5, for 2, 4 and 6 bits, against the bit-by-bit
  // reference above; the high bits of each input byte are ignored.
  std::mt19937 rng(5);
  for (DType dt : {DType::kInt2, DType::kUInt4, DType::kFloat6E3M2FN}) {
    const unsigned bits = static_cast<unsigned>(dtype_bits(dt));
    for (size_t n = 0; n <= 70; ++n) {
      std::vector<uint8_t> elems(n);
      for (auto& e : elems) e = static_cast<uint8_t>(rng());
      std::vector<std::byte> packed(byte_length_for(dt, std::vector<int64_t>{int64_t(n)}), std::byte{0xAA});
      pack_elements(dt, std::as_bytes(std::span(elems)), packed);
      CHECK(packed == pack_bits(elems, bits));
      for (uint64_t first = 0; first <= std::min<uint64_t>(n, 5); ++first) {
        std::vector<uint8_t> got(n - first, 0xFF), strided(2 * (n - first), 0xEE);
        slice::unpack(packed.data(), first * bits, n - first, bits, reinterpret_cast<std::byte*>(got.data()), 1);
        slice::unpack(packed.data(), first * bits, n - first, bits, reinterpret_cast<std::byte*>(strided.data()), 2);
        for (uint64_t k = first; k < n; ++k) {
          CHECK(got[k - first] == (elems[k] & ((1u << bits) - 1)));
          CHECK(strided[2 * (k - first)] == got[k - first]);
          CHECK(strided[2 * (k - first) + 1] == 0xEE);  // the gaps of a strided output are untouched
        }
      }
    }
  }
  std::vector<std::byte> out(2);
  std::vector<uint8_t> three(3);
  tc_test::expect_error(ErrorCode::kInvalidArgument,  // int8 is not packed
                        [&] { pack_elements(DType::kInt8, std::as_bytes(std::span(three)), out); });
  tc_test::expect_error(ErrorCode::kInvalidArgument,  // 3 int2 elements fit one byte, not two
                        [&] { pack_elements(DType::kInt2, std::as_bytes(std::span(three)), out); });
}

TEST_CASE("a sharded sub-byte leaf reads any hyperslab across its boxes, strided too") {
  // Sharded sub-byte leaves (int4, uint4, int2, float6, float4) of odd shapes, cut into boxes of odd sizes at
  // odd offsets (a grid, as a mesh shards them) in two shard files; every
  // read_slice is compared with the global array's elements, one per byte,
  // and read() with the packed bytes a single-file save stores.
  TempDir dir;
  std::mt19937 rng(99);
  const DType dtypes[] = {DType::kInt4, DType::kUInt4, DType::kInt2, DType::kFloat6E2M3FN, DType::kFloat4E2M1FN};
  for (int round = 0; round < 15; ++round) {
    const DType dt = dtypes[round % 5];
    const unsigned bits = static_cast<unsigned>(dtype_bits(dt));
    const size_t rank = 1 + rng() % 3;
    std::vector<int64_t> shape(rank);
    for (auto& s : shape) s = 1 + rng() % 13;
    uint64_t count = 1;
    for (auto s : shape) count *= uint64_t(s);
    std::vector<uint8_t> elems(count);
    for (auto& v : elems) v = static_cast<uint8_t>(rng() & ((1u << bits) - 1));
    const std::vector<std::byte> global = pack_bits(elems, bits);
    // Cuts per dimension: 1 to 3 boxes of random (often odd) sizes.
    std::vector<std::vector<int64_t>> cuts(rank);
    for (size_t d = 0; d < rank; ++d) {
      cuts[d] = {0};
      for (int k = 0; k < 2; ++k)
        if (shape[d] > 1 && rng() % 2) cuts[d].push_back(1 + rng() % (shape[d] - 1));
      cuts[d].push_back(shape[d]);
      std::sort(cuts[d].begin(), cuts[d].end());
      cuts[d].erase(std::unique(cuts[d].begin(), cuts[d].end()), cuts[d].end());
    }
    auto step = dir / ("step" + std::to_string(round));
    std::filesystem::create_directories(step);
    LeafMeta global_meta;
    global_meta.key_path = "w";
    global_meta.dtype = dt;
    global_meta.shape = shape;
    FlatTree files[2];
    std::vector<int64_t> idx(rank, 0);
    for (size_t b = 0;; ++b) {
      ShardRef r;
      r.file = "process_" + std::to_string(b % 2) + ".cask";
      r.key_path = "w@" + std::to_string(b);
      std::vector<int64_t> bshape(rank);
      for (size_t d = 0; d < rank; ++d) {
        r.start.push_back(cuts[d][idx[d]]);
        r.stop.push_back(cuts[d][idx[d] + 1]);
        bshape[d] = r.stop.back() - r.start.back();
      }
      std::vector<uint8_t> be;
      for (uint64_t e : box_elements(shape, r.start, r.stop)) be.push_back(elems[e]);
      files[b % 2].add(r.key_path, dt, bshape, pack_bits(be, bits));
      global_meta.shards.push_back(r);
      size_t d = rank;
      while (d > 0 && ++idx[d - 1] + 1 >= int64_t(cuts[d - 1].size())) idx[--d] = 0;
      if (d == 0) break;
    }
    SaveOptions opt;
    opt.chunk_size = 4096;
    opt.compression = round % 3 == 0 ? Compression::kLZ4 : Compression::kNone;
    for (int f = 0; f < 2; ++f)
      if (!files[f].keys.empty()) files[f].save(step / ("process_" + std::to_string(f) + ".cask"), opt);
    std::vector<LeafInput> idx_in{{global_meta, {}, std::nullopt}};
    save(step / "index.cask", flat_dict_treedef({"w"}), idx_in);
    ShardedArchive s = ShardedArchive::open(step);
    INFO("round " << round << " dtype " << dtype_name(dt) << " boxes " << global_meta.shards.size());
    // Whole leaf: packed, as a single-file archive stores it.
    std::vector<std::byte> whole(global.size(), std::byte{0xEE});
    s.read(0, whole);
    CHECK(tc_test::same(whole, global));
    for (int trial = 0; trial < 12; ++trial) {
      std::vector<int64_t> start(rank), stop(rank), n(rank);
      uint64_t c = 1;
      for (size_t d = 0; d < rank; ++d) {
        int64_t x = rng() % (shape[d] + 1), y = rng() % (shape[d] + 1);
        if (trial == 0) x = 0, y = shape[d];
        start[d] = std::min(x, y);
        stop[d] = std::max(x, y);
        n[d] = stop[d] - start[d];
        c *= uint64_t(n[d]);
      }
      auto want = box_elements(shape, start, stop);
      std::vector<std::byte> out(c, std::byte{0xAB});
      s.read_slice(0, start, stop, out, {}, Verify::kYes);
      bool ok = true;
      for (size_t k = 0; k < want.size(); ++k) ok &= static_cast<uint8_t>(out[k]) == elems[want[k]];
      CHECK(ok);
      // A strided destination: every other byte of a padded buffer, innermost
      // dimension padded by one element.
      if (c == 0) continue;
      std::vector<int64_t> str(rank);
      int64_t st = 2;
      for (size_t d = rank; d-- > 0;) str[d] = st, st *= n[d] + 1;
      std::vector<std::byte> sout(size_t(st) + 4, std::byte{0xCD});
      s.read_slice(0, start, stop, sout, str);
      std::vector<std::byte> expect(sout.size(), std::byte{0xCD});
      std::vector<int64_t> i(start);
      for (size_t k = 0; k < want.size(); ++k) {
        int64_t o = 0;
        for (size_t d = 0; d < rank; ++d) o += (i[d] - start[d]) * str[d];
        expect[size_t(o)] = std::byte(elems[want[k]]);
        for (size_t d = rank; d-- > 0;) {
          if (++i[d] < stop[d]) break;
          i[d] = start[d];
        }
      }
      CHECK(tc_test::same(sout, expect));
    }
    // Wrong sizes are refused before anything is read.
    std::vector<std::byte> small(count > 0 ? count - 1 : 0);  // one byte per element is needed
    if (count > 1) {
      tc_test::expect_error(ErrorCode::kShapeMismatch, [&] {
        s.read_slice(0, std::vector<int64_t>(rank, 0), shape, small);
      });
    }
  }
}
