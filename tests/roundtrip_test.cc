// Save then open: every dtype and rank, trees, scalars, codecs, metadata.
#include <algorithm>
#include <map>

#include "testutil.h"

using namespace treecask;
using tc_test::FlatTree;
using tc_test::TempDir;

namespace {
std::vector<std::byte> read_all(const Archive& a, size_t i) {
  std::vector<std::byte> out(a.leaf(i).byte_length);
  a.read(i, out);
  return out;
}
}  // namespace

TEST_CASE("every dtype and rank round trips with every compression mode") {
  TempDir dir;
  const std::vector<std::vector<int64_t>> shapes{{}, {0}, {7}, {3, 0, 2}, {5, 3, 2}, {1, 1, 1, 1, 9}};
  for (Compression mode : {Compression::kNone, Compression::kLZ4, Compression::kAuto}) {
    FlatTree t;
    uint32_t seed = 1;
    for (int v = 1; v <= kMaxDType; ++v)
      for (size_t s = 0; s < shapes.size(); ++s)
        t.add_random(std::string(dtype_name(DType(v))) + "/" + std::to_string(s), DType(v), shapes[s], seed++);
    SaveOptions opt;
    opt.compression = mode;
    auto path = dir / ("all" + std::to_string(int(mode)) + ".cask");
    t.save(path, opt);
    Archive a = Archive::open(path);
    REQUIRE(a.size() == t.keys.size());
    CHECK(a.format_major() == 4);  // it holds the dtypes of format 4.0
    CHECK(a.verify().empty());
    for (size_t i = 0; i < a.size(); ++i) {
      LeafInfo info = a.leaf(i);
      INFO(info.key_path);
      CHECK(info.key_path == escape_key(t.keys[i]));
      CHECK(info.dtype == t.leaves[i].meta.dtype);
      CHECK(info.shape == t.leaves[i].meta.shape);
      CHECK(info.byte_length == t.data[i].size());
      CHECK(tc_test::same(read_all(a, i), t.data[i]));
      if (info.codec == Codec::kNone) CHECK(tc_test::same(a.view(i), t.data[i]));
      if (mode == Compression::kNone) CHECK(info.codec == Codec::kNone);
    }
  }
}

TEST_CASE("a nested tree with every node kind, unicode keys and scalars round trips") {
  TempDir dir;
  // {"params": {"énc/oder": [w, (b, None)]}, "opt": NamedTuple(count, mu), "step": 7, "name": "run-α"}
  TreeDef def;
  auto node = [&](NodeKind k, uint32_t arity, std::vector<std::string> keys = {}, std::string type = {}) {
    def.push_back(TreeNode{k, arity, std::move(type), std::move(keys)});
  };
  node(NodeKind::kDict, 4, {"params", "opt", "step", "name"});
  node(NodeKind::kDict, 1, {"énc/oder"});
  node(NodeKind::kList, 2);
  node(NodeKind::kLeaf, 0);                     // w
  node(NodeKind::kTuple, 2);
  node(NodeKind::kLeaf, 0);                     // b
  node(NodeKind::kNone, 0);
  node(NodeKind::kNamedTuple, 2, {"count", "mu"}, "optax.ScaleByAdamState");
  node(NodeKind::kLeaf, 0);                     // count
  node(NodeKind::kDataclass, 1, {"kernel"}, "flax.linen.Partitioned");
  node(NodeKind::kLeaf, 0);                     // mu.kernel
  node(NodeKind::kLeaf, 0);                     // step (int)
  node(NodeKind::kLeaf, 0);                     // name (str)

  auto w = tc_test::random_bytes(4 * 8 * 16, 1);
  auto b = tc_test::random_bytes(4 * 16, 2);
  int32_t count = 42;
  auto mu = tc_test::random_bytes(2 * 8 * 16, 3);
  int64_t step = 7;
  std::string name = "run-α";
  std::vector<LeafInput> in(6);
  in[0].meta = {"", ValueKind::kArray, DType::kFloat32, {8, 16}, {"embed", "mlp"}, std::nullopt, {}};
  in[0].data = std::as_bytes(std::span(w));
  in[1].meta.dtype = DType::kFloat32;
  in[1].meta.shape = {16};
  in[1].data = std::as_bytes(std::span(b));
  in[2].meta.dtype = DType::kInt32;
  in[2].data = std::as_bytes(std::span(&count, 1));
  in[3].meta.dtype = DType::kBFloat16;
  in[3].meta.shape = {8, 16};
  in[3].meta.sharding = Sharding{{"data", "model"}, {4, 2}, {{}, {"model"}}};
  in[3].meta.metadata = {{"flax.names", "[\"embed\", \"mlp\"]"}};
  in[3].data = std::as_bytes(std::span(mu));
  in[4].meta.value_kind = ValueKind::kInt;
  in[4].meta.dtype = DType::kInt64;
  in[4].data = std::as_bytes(std::span(&step, 1));
  in[5].meta.value_kind = ValueKind::kStr;
  in[5].meta.dtype = DType::kUInt8;
  in[5].meta.shape = {int64_t(name.size())};
  in[5].data = std::as_bytes(std::span(name));

  SaveOptions opt;
  opt.metadata = {{"model", "tiny"}, {"ünïcode", "ok"}};
  auto path = dir / "tree.cask";
  SaveStats stats = save(path, def, in, opt);
  CHECK(stats.num_leaves == 6);
  Archive a = Archive::open(path);
  CHECK(a.metadata() == opt.metadata);
  REQUIRE(a.treedef().size() == def.size());
  for (size_t i = 0; i < def.size(); ++i) {
    CHECK(a.treedef()[i].kind == def[i].kind);
    CHECK(a.treedef()[i].arity == def[i].arity);
    CHECK(a.treedef()[i].keys == def[i].keys);
    CHECK(a.treedef()[i].type_name == def[i].type_name);
  }
  std::vector<std::string> want{"params/énc~1oder/0", "params/énc~1oder/1/0", "opt/count",
                                "opt/mu/kernel", "step", "name"};
  for (size_t i = 0; i < want.size(); ++i) {
    CHECK(a.leaf(i).key_path == want[i]);
    CHECK(a.index_of(want[i]) == i);
  }
  CHECK(a.leaf(0).logical_axes == std::vector<std::string>{"embed", "mlp"});
  CHECK(a.leaf(3).sharding == in[3].meta.sharding);
  CHECK(a.leaf(3).metadata == in[3].meta.metadata);
  CHECK(a.leaf(4).value_kind == ValueKind::kInt);
  CHECK(a.leaf(5).value_kind == ValueKind::kStr);
  auto s = a.view(5);
  CHECK(std::string(reinterpret_cast<const char*>(s.data()), s.size()) == name);
  int64_t got_step;
  a.read(4, std::as_writable_bytes(std::span(&got_step, 1)));
  CHECK(got_step == 7);
  CHECK(a.subtree("params") == std::vector<size_t>{0, 1});
  CHECK(a.subtree("params/énc~1oder/1") == std::vector<size_t>{1});
  CHECK(a.subtree("").size() == 6);
  tc_test::expect_error(ErrorCode::kKeyNotFound, [&] { a.subtree("param"); });
  tc_test::expect_error(ErrorCode::kKeyNotFound, [&] { a.index_of("params/nope"); });
}

TEST_CASE("a tree that is a single leaf has the empty key path") {
  TempDir dir;
  TreeDef def{TreeNode{}};
  auto bytes = tc_test::random_bytes(64, 9);
  LeafInput in;
  in.meta.dtype = DType::kUInt8;
  in.meta.shape = {64};
  in.data = std::as_bytes(std::span(bytes));
  save(dir / "one.cask", def, std::span(&in, 1));
  Archive a = Archive::open(dir / "one.cask");
  CHECK(a.leaf(0).key_path == "");
  CHECK(tc_test::same(a.view(a.index_of("")), bytes));
}

TEST_CASE("compression: auto keeps random bytes raw and compresses redundant ones") {
  TempDir dir;
  FlatTree t;
  t.add("random", DType::kFloat32, {1 << 18}, tc_test::random_bytes(1 << 20, 5));
  t.add("zeros", DType::kInt32, {1 << 18}, std::vector<std::byte>(1 << 20));
  t.add("runs", DType::kUInt8, {3 << 20}, tc_test::compressible_bytes(3 << 20, 6));
  t.add("small_zeros", DType::kInt8, {1000}, std::vector<std::byte>(1000));
  auto stats = t.save(dir / "auto.cask");
  Archive a = Archive::open(dir / "auto.cask");
  CHECK(a.leaf(0).codec == Codec::kNone);
  CHECK(a.leaf(1).codec == Codec::kLZ4);
  CHECK(a.leaf(2).codec == Codec::kLZ4);
  CHECK(a.leaf(3).codec == Codec::kLZ4);
  CHECK(a.leaf(1).stored_bytes < (1 << 20) / 50);
  CHECK(stats.stored_bytes < stats.raw_bytes / 2);
  for (size_t i = 0; i < a.size(); ++i) CHECK(tc_test::same(read_all(a, i), t.data[i]));
  tc_test::expect_error(ErrorCode::kUnsupported, [&] { a.view(1); });

  SaveOptions lz4;
  lz4.compression = Compression::kLZ4;
  t.save(dir / "lz4.cask", lz4);
  Archive b = Archive::open(dir / "lz4.cask");
  CHECK(b.leaf(0).codec == Codec::kLZ4);  // chunks stored raw inside: flag bit 0
  CHECK(b.leaf(0).stored_bytes == b.leaf(0).byte_length);
  CHECK(tc_test::same(read_all(b, 0), t.data[0]));
  CHECK(b.verify().empty());
}

TEST_CASE("row-range reads match the full read across chunk boundaries") {
  TempDir dir;
  FlatTree t;
  // 1000 rows of 3 x 7 float32 = 84 bytes per row; 4 KiB chunks split rows.
  t.add_random("raw", DType::kFloat32, {1000, 3, 7}, 11);
  t.add("lz4", DType::kInt16, {5000, 10}, tc_test::compressible_bytes(5000 * 20, 12));
  t.add_random("i4", DType::kInt4, {64, 6}, 13);
  SaveOptions opt;
  opt.chunk_size = 4096;
  t.save(dir / "rows.cask", opt);
  Archive a = Archive::open(dir / "rows.cask");
  CHECK(a.leaf(0).codec == Codec::kNone);
  CHECK(a.leaf(1).codec == Codec::kLZ4);
  CHECK(a.leaf(0).num_chunks > 10);
  for (size_t i = 0; i < 3; ++i) {
    auto full = read_all(a, i);
    int64_t rows = a.leaf(i).shape[0];
    uint64_t row_bytes = full.size() / rows;
    for (auto [r0, r1] : std::vector<std::pair<int64_t, int64_t>>{
             {0, 1}, {0, rows}, {48, 49}, {48, 147}, {rows - 1, rows}, {7, 7}, {rows / 2, rows}}) {
      if (r1 > rows) continue;
      std::vector<std::byte> out((r1 - r0) * row_bytes);
      a.read_rows(i, r0, r1, out);
      CHECK(tc_test::same(out, std::span(full).subspan(r0 * row_bytes, out.size())));
    }
    std::vector<std::byte> tiny(1);
    tc_test::expect_error(ErrorCode::kInvalidArgument, [&] { a.read_rows(i, 0, rows + 1, tiny); });
    tc_test::expect_error(ErrorCode::kShapeMismatch, [&] { a.read_rows(i, 0, 2, tiny); });
  }
}

TEST_CASE("a leaf larger than max_part_bytes is stored in parts, each zero-copy") {
  TempDir dir;
  FlatTree t;
  t.add_random("big", DType::kFloat32, {3 * 4096 + 100}, 21);  // ~48 KiB + 400
  t.add_random("huge", DType::kUInt8, {300000}, 22);
  SaveOptions opt;
  opt.chunk_size = 4096;
  opt.max_part_bytes = 4 * 4096;
  opt.compression = Compression::kNone;
  t.save(dir / "parts.cask", opt);
  Archive a = Archive::open(dir / "parts.cask");
  CHECK(a.leaf(1).num_parts == (300000 + 16383) / 16384);
  tc_test::expect_error(ErrorCode::kUnsupported, [&] { a.view(1); });
  auto parts = a.view_parts(1);
  REQUIRE(parts.size() == a.leaf(1).num_parts);
  std::vector<std::byte> joined;
  for (auto p : parts) {
    CHECK(reinterpret_cast<uintptr_t>(p.data()) % 64 == 0);
    joined.insert(joined.end(), p.begin(), p.end());
  }
  CHECK(tc_test::same(joined, t.data[1]));
  CHECK(tc_test::same(read_all(a, 1), t.data[1]));
  std::vector<std::byte> rows(1000);
  a.read_rows(1, 16000, 17000, rows);  // crosses a part boundary at 16384
  CHECK(tc_test::same(rows, std::span(t.data[1]).subspan(16000, 1000)));
}

namespace {
// Float-like bytes whose high byte planes repeat: what the byte shuffle is for.
std::vector<std::byte> plane_bytes(size_t n, unsigned elem, uint32_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937 rng(seed);
  for (size_t i = 0; i < n; ++i) v[i] = (i % elem == elem - 1) ? std::byte(0x3f) : std::byte(rng());
  return v;
}
}  // namespace

TEST_CASE("byte shuffle: every dtype and codec mode round trips; only LZ4 leaves of 2-16 byte elements get it") {
  TempDir dir;
  for (Compression mode : {Compression::kNone, Compression::kLZ4, Compression::kAuto}) {
    CAPTURE(int(mode));
    FlatTree t;
    uint32_t seed = 1;
    // The 4.0 dtypes would make the file 4.0; none has 2-16 byte elements.
    for (int v = 1; v < kFirstDTypeOf4; ++v) {
      DType d = DType(v);
      unsigned elem = std::max(1u, shuffle_element_bytes(d));
      for (std::vector<int64_t> shape : {std::vector<int64_t>{}, {0}, {13}, {3000, 7}, {40000}}) {
        uint64_t n = byte_length_for(d, shape);
        t.add(std::string(dtype_name(d)) + "/" + std::to_string(shape.empty() ? -1 : shape[0]), d, shape,
              plane_bytes(n, elem, seed++));
      }
    }
    SaveOptions opt;
    opt.compression = mode;
    opt.shuffle = true;
    opt.chunk_size = 8192;  // many chunks, and short last chunks
    auto path = dir / ("shuffle" + std::to_string(int(mode)) + ".cask");
    t.save(path, opt);
    Archive a = Archive::open(path);
    CHECK(a.format_major() == (mode == Compression::kNone ? 1 : 2));
    CHECK(a.verify().empty());
    std::vector<size_t> all(a.size());
    std::vector<std::vector<std::byte>> bulk(a.size());
    std::vector<std::span<std::byte>> outs;
    for (size_t i = 0; i < a.size(); ++i) {
      all[i] = i;
      bulk[i].resize(a.leaf(i).byte_length);
      outs.emplace_back(bulk[i]);
    }
    a.read_many(all, outs);
    for (size_t i = 0; i < a.size(); ++i) {
      LeafInfo info = a.leaf(i);
      INFO(info.key_path);
      bool eligible = info.codec == Codec::kLZ4 && shuffle_element_bytes(info.dtype) != 0;
      CHECK(info.filter == (eligible ? Filter::kByteShuffle : Filter::kNone));
      if (mode == Compression::kLZ4 && shuffle_element_bytes(info.dtype) != 0 && info.byte_length > 0)
        CHECK(info.filter == Filter::kByteShuffle);
      CHECK(tc_test::same(read_all(a, i), t.data[i]));
      CHECK(tc_test::same(bulk[i], t.data[i]));
      if (info.shape.size() == 2 && dtype_bits(info.dtype) >= 8) {
        uint64_t row = info.byte_length / info.shape[0];
        std::vector<std::byte> rows(row * 1001);
        a.read_rows(i, 1234, 2235, rows);
        CHECK(tc_test::same(rows, std::span(t.data[i]).subspan(1234 * row, rows.size())));
      }
    }
  }
}

TEST_CASE("byte shuffle makes float weights with a repeated exponent byte compress") {
  TempDir dir;
  FlatTree t;
  t.add("w", DType::kFloat32, {1 << 18}, plane_bytes(1 << 20, 4, 3));
  SaveOptions opt;
  opt.compression = Compression::kLZ4;
  auto plain = dir / "plain.cask", shuffled = dir / "shuffled.cask";
  t.save(plain, opt);
  opt.shuffle = true;
  t.save(shuffled, opt);
  uint64_t p = Archive::open(plain).leaf(0).stored_bytes, s = Archive::open(shuffled).leaf(0).stored_bytes;
  CHECK(p > (1u << 20) * 95 / 100);  // LZ4 alone: the repeated byte is never adjacent to itself
  CHECK(s < (1u << 20) * 80 / 100);  // shuffled: one plane of 0x3f is one long run
}
