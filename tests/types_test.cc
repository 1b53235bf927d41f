#include "testutil.h"

using namespace treecask;

TEST_CASE("dtype names round trip and sizes follow the spec") {
  for (int v = 1; v <= kMaxDType; ++v) {
    auto d = static_cast<DType>(v);
    auto name = dtype_name(d);
    REQUIRE(dtype_from_name(name).has_value());
    CHECK(*dtype_from_name(name) == d);
  }
  CHECK(dtype_name(static_cast<DType>(0)) == "invalid");
  CHECK(dtype_name(static_cast<DType>(kMaxDType + 1)) == "invalid");
  CHECK_FALSE(dtype_valid(kMaxDType + 1));
  // Format 4.0 dtypes: names as ml_dtypes spells them, bits per element.
  CHECK(dtype_name(DType::kFloat4E2M1FN) == "float4_e2m1fn");
  CHECK(dtype_name(DType::kFloat8E8M0FNU) == "float8_e8m0fnu");
  CHECK(dtype_name(DType::kFloat8E4M3B11FNUZ) == "float8_e4m3b11fnuz");
  CHECK(dtype_bits(DType::kFloat6E3M2FN) == 6);
  CHECK(dtype_bits(DType::kUInt2) == 2);
  CHECK(dtype_packed(DType::kFloat4E2M1FN));
  CHECK_FALSE(dtype_packed(DType::kFloat8E4M3));
  CHECK(byte_length_for(DType::kFloat6E2M3FN, std::vector<int64_t>{5}) == 4);  // 30 bits
  CHECK(byte_length_for(DType::kInt2, std::vector<int64_t>{2, 3}) == 2);       // 12 bits
  CHECK(shuffle_element_bytes(DType::kFloat8E5M2FNUZ) == 0);
  CHECK(dtype_bits(DType::kBFloat16) == 16);
  CHECK(dtype_bits(DType::kComplex128) == 128);
  CHECK(dtype_bits(DType::kInt4) == 4);
  CHECK(byte_length_for(DType::kFloat32, std::vector<int64_t>{3, 4}) == 48);
  CHECK(byte_length_for(DType::kInt4, std::vector<int64_t>{3}) == 2);  // packed, rounded up
  CHECK(byte_length_for(DType::kFloat64, std::vector<int64_t>{}) == 8);  // 0-d
  CHECK(byte_length_for(DType::kFloat64, std::vector<int64_t>{0, 5}) == 0);
  tc_test::expect_error(ErrorCode::kInvalidArgument,
                        [] { byte_length_for(DType::kFloat32, std::vector<int64_t>{-1}); });
  tc_test::expect_error(ErrorCode::kInvalidArgument, [] {
    byte_length_for(DType::kFloat64, std::vector<int64_t>{1ll << 31, 1ll << 31});
  });
}

TEST_CASE("key paths escape '/' and '~' as RFC 6901 does") {
  std::vector<std::string> parts{"params", "a/b", "c~d", "0"};
  std::string p = join_key_path(parts);
  CHECK(p == "params/a~1b/c~0d/0");
  CHECK(split_key_path(p) == parts);
  CHECK(split_key_path("").empty());
  tc_test::expect_error(ErrorCode::kInvalidArgument, [] { split_key_path("a~2"); });
}

TEST_CASE("errors name the file, the key path and the code") {
  Error e(ErrorCode::kChecksumMismatch, "/tmp/x.cask", "params/w", "chunk 3 is bad");
  CHECK(std::string(e.what()) == "/tmp/x.cask: params/w: checksum mismatch: chunk 3 is bad");
  CHECK(e.file() == "/tmp/x.cask");
  CHECK(e.key_path() == "params/w");
}

TEST_CASE("find_subtree locates a subtree's nodes and leaves by key path components") {
  // {"a": [x, {"b": y, "c": None}], "d": z}: leaves x, y, z (0, 1, 2).
  auto node = [](NodeKind k, uint32_t arity, std::vector<std::string> keys = {}) {
    TreeNode n;
    n.kind = k;
    n.arity = arity;
    n.keys = std::move(keys);
    return n;
  };
  TreeDef def = {node(NodeKind::kDict, 2, {"a", "d"}), node(NodeKind::kList, 2), node(NodeKind::kLeaf, 0),
                 node(NodeKind::kDict, 2, {"b", "c"}), node(NodeKind::kLeaf, 0), node(NodeKind::kNone, 0),
                 node(NodeKind::kLeaf, 0)};
  auto at = [&](std::vector<std::string> c) { return find_subtree(def, c); };
  auto all = at({});
  REQUIRE(all);
  CHECK((all->node_begin == 0 && all->node_end == 7 && all->leaf_begin == 0 && all->leaf_count == 3));
  auto a1 = at({"a", "1"});
  REQUIRE(a1);
  CHECK((a1->node_begin == 3 && a1->node_end == 6 && a1->leaf_begin == 1 && a1->leaf_count == 1));
  auto d = at({"d"});
  REQUIRE(d);
  CHECK((d->node_begin == 6 && d->node_end == 7 && d->leaf_begin == 2 && d->leaf_count == 1));
  auto c = at({"a", "1", "c"});
  REQUIRE(c);
  CHECK((c->leaf_count == 0 && c->node_end == c->node_begin + 1));
  CHECK(!at({"x"}));
  CHECK(!at({"a", "2"}));
  CHECK(!at({"d", "0"}));  // below a leaf
  CHECK(!find_subtree(TreeDef{}, std::vector<std::string>{}));
}
