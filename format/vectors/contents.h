// What the golden vectors of format/vectors/ hold. Shared by the generator
// (generate.cc) and the reader test (tests/golden_test.cc): a vector is never
// regenerated to make a test pass (SPEC.md "Versioning").
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "treecask/treecask.h"

namespace golden {

// Deterministic bytes: byte i of leaf `leaf` (splitmix64 of both).
inline uint8_t byte_at(uint32_t leaf, uint64_t i) {
  uint64_t z = (uint64_t(leaf) << 40) + i + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return uint8_t(z ^ (z >> 31));
}
// Compressible bytes: runs of small values.
inline uint8_t run_byte(uint32_t leaf, uint64_t i) { return uint8_t((i / 61 + leaf) % 7); }

// Smooth numbers (format 2.0 vectors): element k is (k % 997) * 0.25 in the
// leaf's dtype (float32, float64, complex128 with imaginary part 0, bfloat16
// as the top half of the float32), or k % 97 for int64. Exact in IEEE
// arithmetic, so every machine computes the same bytes.
inline void smooth_bytes(treecask::DType d, std::vector<std::byte>& out) {
  using treecask::DType;
  auto put = [&](uint64_t at, const void* p, size_t n) { std::memcpy(out.data() + at, p, n); };
  for (uint64_t k = 0, at = 0; at < out.size(); ++k) {
    float f = float(k % 997) * 0.25f;
    double g = double(k % 997) * 0.25;
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    uint16_t top = uint16_t(bits >> 16);
    int64_t n = int64_t(k % 97);
    double c[2] = {g, 0.0};
    switch (d) {
      case DType::kFloat32: put(at, &f, 4), at += 4; break;
      case DType::kBFloat16: put(at, &top, 2), at += 2; break;
      case DType::kFloat64: put(at, &g, 8), at += 8; break;
      case DType::kInt64: put(at, &n, 8), at += 8; break;
      case DType::kComplex128: put(at, c, 16), at += 16; break;
      default: out[at] = std::byte(k % 5), at += 1; break;
    }
  }
}

struct Leaf {
  treecask::LeafMeta meta;
  bool compressible = false;
  bool smooth = false;
  std::vector<std::byte> bytes() const {
    uint64_t n = treecask::byte_length_for(meta.dtype, meta.shape);
    std::vector<std::byte> out(n);
    if (smooth) {
      smooth_bytes(meta.dtype, out);
      return out;
    }
    uint32_t id = 0;
    for (char c : meta.key_path) id = id * 31 + uint8_t(c);
    for (uint64_t i = 0; i < n; ++i) out[i] = std::byte(compressible ? run_byte(id, i) : byte_at(id, i));
    if (meta.dtype == treecask::DType::kBool)
      for (auto& b : out) b &= std::byte{1};
    if (meta.value_kind == treecask::ValueKind::kStr) {
      const char* text = "hello, world";  // 12 bytes, the leaf's shape
      for (uint64_t i = 0; i < n; ++i) out[i] = std::byte(text[i % 12]);
    }
    return out;
  }
};

struct Vector {
  std::string file;
  uint16_t major = 1;  // format version it is written in (minor 0)
  treecask::TreeDef treedef;
  std::vector<Leaf> leaves;  // key_path filled in: the path the treedef gives
  treecask::SaveOptions options;
};

// v1.0 "tree": every node kind, every dtype, scalars, logical axes, sharding,
// metadata; raw leaves.
inline Vector tree_vector() {
  using namespace treecask;
  Vector v;
  v.file = "v1_0_tree.cask";
  v.options.compression = Compression::kNone;
  v.options.metadata = {{"purpose", "golden vector"}, {"ünïcode", "✓"}};
  auto node = [&](NodeKind k, uint32_t n, std::vector<std::string> keys = {}, std::string t = {}) {
    v.treedef.push_back(TreeNode{k, n, std::move(t), std::move(keys)});
  };
  // {"dtypes": {<19 dtype names>}, "nested": [ (leaf, None), NamedTuple(a), Dataclass(w) ],
  //  "scalars": {"int", "float", "bool", "str"}, "empty": leaf of shape [0, 3]}
  node(NodeKind::kDict, 4, {"dtypes", "nested", "scalars", "empty"});
  std::vector<std::string> names;
  for (int d = 1; d <= 19; ++d) names.emplace_back(dtype_name(DType(d)));
  node(NodeKind::kDict, 19, names);
  for (int d = 1; d <= 19; ++d) {
    node(NodeKind::kLeaf, 0);
    Leaf l;
    l.meta.key_path = "dtypes/" + names[d - 1];
    l.meta.dtype = DType(d);
    l.meta.shape = {3, 5};
    v.leaves.push_back(l);
  }
  node(NodeKind::kList, 3);
  node(NodeKind::kTuple, 2);
  node(NodeKind::kLeaf, 0);
  {
    Leaf l;
    l.meta.key_path = "nested/0/0";
    l.meta.dtype = DType::kFloat32;
    l.meta.shape = {4, 8};
    l.meta.logical_axes = {"batch", ""};
    v.leaves.push_back(l);
  }
  node(NodeKind::kNone, 0);
  node(NodeKind::kNamedTuple, 1, {"count"}, "optax.ScaleByAdamState");
  node(NodeKind::kLeaf, 0);
  {
    Leaf l;
    l.meta.key_path = "nested/1/count";
    l.meta.dtype = DType::kInt32;
    v.leaves.push_back(l);
  }
  node(NodeKind::kDataclass, 1, {"value"}, "flax.core.meta.Partitioned");
  node(NodeKind::kLeaf, 0);
  {
    Leaf l;
    l.meta.key_path = "nested/2/value";
    l.meta.dtype = DType::kBFloat16;
    l.meta.shape = {8, 4};
    l.meta.sharding = Sharding{{"data", "model"}, {2, 4}, {{"data"}, {"model"}}};
    l.meta.metadata = {{"note", "sharded"}};
    v.leaves.push_back(l);
  }
  node(NodeKind::kDict, 4, {"int", "float", "bool", "str"});
  const std::pair<ValueKind, DType> scalars[] = {{ValueKind::kInt, DType::kInt64},
                                                 {ValueKind::kFloat, DType::kFloat64},
                                                 {ValueKind::kBool, DType::kBool},
                                                 {ValueKind::kStr, DType::kUInt8}};
  const char* skeys[] = {"int", "float", "bool", "str"};
  for (int i = 0; i < 4; ++i) {
    node(NodeKind::kLeaf, 0);
    Leaf l;
    l.meta.key_path = std::string("scalars/") + skeys[i];
    l.meta.value_kind = scalars[i].first;
    l.meta.dtype = scalars[i].second;
    if (scalars[i].first == ValueKind::kStr) l.meta.shape = {12};
    v.leaves.push_back(l);
  }
  node(NodeKind::kLeaf, 0);
  {
    Leaf l;
    l.meta.key_path = "empty";
    l.meta.dtype = DType::kFloat32;
    l.meta.shape = {0, 3};
    v.leaves.push_back(l);
  }
  return v;
}

// v1.0 "lz4": LZ4 leaves over many 4 KiB chunks, one of incompressible bytes
// (chunks stored raw inside an LZ4 leaf), one small packed LZ4 leaf.
inline Vector lz4_vector() {
  using namespace treecask;
  Vector v;
  v.file = "v1_0_lz4.cask";
  v.options.compression = Compression::kLZ4;
  v.options.chunk_size = 4096;
  v.treedef = flat_dict_treedef({"runs", "noise", "small"});
  Leaf a, b, c;
  a.meta.key_path = "runs";
  a.meta.dtype = DType::kInt16;
  a.meta.shape = {1000, 40};
  a.compressible = true;
  b.meta.key_path = "noise";
  b.meta.dtype = DType::kFloat32;
  b.meta.shape = {5000};
  c.meta.key_path = "small";
  c.meta.dtype = DType::kUInt8;
  c.meta.shape = {700};
  c.compressible = true;
  v.leaves = {a, b, c};
  return v;
}

// v1.0 "parts": a raw leaf stored in several parts (max_part_bytes 8 KiB).
inline Vector parts_vector() {
  using namespace treecask;
  Vector v;
  v.file = "v1_0_parts.cask";
  v.options.compression = Compression::kNone;
  v.options.chunk_size = 4096;
  v.options.max_part_bytes = 8192;
  v.treedef = flat_dict_treedef({"w"});
  Leaf a;
  a.meta.key_path = "w";
  a.meta.dtype = DType::kFloat64;
  a.meta.shape = {3000, 3};  // 72000 bytes (> 64 KiB, so not packed): 9 parts
  v.leaves = {a};
  return v;
}

// v2.0 "shuffle": the byte-shuffle filter (SaveOptions::shuffle) before LZ4
// over 4 KiB chunks, on 2-, 4-, 8- and 16-byte elements; a leaf of random
// float32 whose chunks are stored raw after the shuffle (flag bit 0: the
// stored bytes are the shuffled bytes); a packed (small) shuffled leaf; and
// a uint8 LZ4 leaf, which has no filter (1-byte elements).
inline Vector shuffle_vector() {
  using namespace treecask;
  Vector v;
  v.file = "v2_0_shuffle.cask";
  v.major = 2;
  v.options.compression = Compression::kLZ4;
  v.options.shuffle = true;
  v.options.chunk_size = 4096;
  v.treedef = flat_dict_treedef({"bf16", "f32", "f64", "c128", "i64", "noise", "u8"});
  auto leaf = [](const char* key, DType d, std::vector<int64_t> shape, bool smooth) {
    Leaf l;
    l.meta.key_path = key;
    l.meta.dtype = d;
    l.meta.shape = std::move(shape);
    l.smooth = smooth;
    l.compressible = !smooth;
    return l;
  };
  v.leaves = {leaf("bf16", DType::kBFloat16, {300, 64}, true), leaf("f32", DType::kFloat32, {20000}, true),
              leaf("f64", DType::kFloat64, {2500}, true),     leaf("c128", DType::kComplex128, {40}, true),
              leaf("i64", DType::kInt64, {3, 700}, true),     leaf("noise", DType::kFloat32, {17000}, false),
              leaf("u8", DType::kUInt8, {9000}, false)};
  v.leaves[5].compressible = false;  // random bytes: every chunk stored raw
  return v;
}

inline std::vector<Vector> all_vectors() {
  return {tree_vector(), lz4_vector(), parts_vector(), shuffle_vector()};
}

// ---- Format 3.0: a sharded checkpoint directory --------------------------------
//
// v3_0_sharded/ as two processes of a jax.distributed job write it (SPEC.md
// "Sharded checkpoints"): `params/w` int32[6, 8] sharded over a 2x2 mesh
// (x, y) with spec [x], [y], its four boxes split between process_0.cask and
// process_1.cask; `params/b` float32[5] (replicated: one copy, in
// process_0.cask) and the int scalar `step`, also in process_0.cask. Shard
// file keys follow the Python writer's convention "<key path>@<b0>:<e0>,...".
struct ShardedVector {
  std::string dir = "v3_0_sharded";
  treecask::TreeDef treedef;                 // of the index
  std::vector<treecask::LeafMeta> leaves;    // global leaves, with ShardRefs
  // Global bytes of leaf i (Leaf{meta}.bytes() of its global description).
  std::vector<std::byte> global_bytes(size_t i) const { return Leaf{leaves[i]}.bytes(); }
};

// "<key path>@<b0>:<e0>,<b1>:<e1>": the shard file's dict key of one box.
inline std::string shard_key(const std::string& key_path, const std::vector<int64_t>& b,
                             const std::vector<int64_t>& e) {
  std::string s = key_path + "@";
  for (size_t d = 0; d < b.size(); ++d) s += (d ? "," : "") + std::to_string(b[d]) + ":" + std::to_string(e[d]);
  return s;
}

inline ShardedVector sharded_vector() {
  using namespace treecask;
  ShardedVector v;
  v.treedef = {TreeNode{NodeKind::kDict, 2, "", {"params", "step"}},
               TreeNode{NodeKind::kDict, 2, "", {"w", "b"}},
               TreeNode{NodeKind::kLeaf, 0, "", {}},
               TreeNode{NodeKind::kLeaf, 0, "", {}},
               TreeNode{NodeKind::kLeaf, 0, "", {}}};
  auto ref = [](const std::string& file, const std::string& kp, std::vector<int64_t> b, std::vector<int64_t> e) {
    return ShardRef{file, escape_key(shard_key(kp, b, e)), b, e};
  };
  LeafMeta w;
  w.key_path = "params/w";
  w.dtype = DType::kInt32;
  w.shape = {6, 8};
  w.logical_axes = {"embed", "mlp"};
  w.sharding = Sharding{{"x", "y"}, {2, 2}, {{"x"}, {"y"}}};
  w.shards = {ref("process_0.cask", "params/w", {0, 0}, {3, 4}), ref("process_1.cask", "params/w", {0, 4}, {3, 8}),
              ref("process_0.cask", "params/w", {3, 0}, {6, 4}), ref("process_1.cask", "params/w", {3, 4}, {6, 8})};
  LeafMeta b;
  b.key_path = "params/b";
  b.dtype = DType::kFloat32;
  b.shape = {5};
  b.sharding = Sharding{{"x", "y"}, {2, 2}, {}};
  b.metadata = {{"note", "replicated"}};
  b.shards = {ref("process_0.cask", "params/b", {0}, {5})};
  LeafMeta step;
  step.key_path = "step";
  step.value_kind = ValueKind::kInt;
  step.dtype = DType::kInt64;
  step.shards = {ref("process_0.cask", "step", {}, {})};
  v.leaves = {w, b, step};
  return v;
}

// The C-order bytes of box [b, e) of a C-order array of `shape` with
// `item`-byte elements.
inline std::vector<std::byte> box_bytes(const std::vector<std::byte>& all, const std::vector<int64_t>& shape,
                                        const std::vector<int64_t>& b, const std::vector<int64_t>& e,
                                        size_t item) {
  std::vector<std::byte> out;
  if (shape.empty()) return all;
  std::vector<int64_t> idx(b);
  while (true) {
    int64_t off = 0;
    for (size_t d = 0; d < shape.size(); ++d) off = off * shape[d] + idx[d];
    const std::byte* p = all.data() + off * int64_t(item);
    out.insert(out.end(), p, p + item);
    size_t d = shape.size();
    while (d-- > 0) {
      if (++idx[d] < e[d]) break;
      idx[d] = b[d];
      if (d == 0) return out;
    }
  }
}

}  // namespace golden
