// The structural rules of the manifest, shared by its encoder
// (format/manifest.cc) and its decoder (format/manifest_parse.cc): one set of
// rules over two representations (the public types a writer is given, the
// FlatBuffer a reader is given), string and metadata checks, the treedef walk
// and small FlatBuffers helpers. Private to the format layer.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "format/format.h"
#include "format/manifest.h"

namespace treecask::manifest_rules {

using FbStrings = flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>;
using FbKeyValues = flatbuffers::Vector<flatbuffers::Offset<fb::KeyValue>>;

inline std::string check_string(std::string_view s, size_t max_bytes, bool allow_empty) {
  if (!allow_empty && s.empty()) return "is empty";
  if (s.size() > max_bytes) return "is longer than " + std::to_string(max_bytes) + " bytes";
  // Fast path: printable-range ASCII (no NUL, no byte >= 0x80) is valid.
  bool ascii = true;
  for (char c : s) ascii &= (static_cast<unsigned char>(c) - 1u) < 0x7fu;
  if (ascii) return {};
  if (s.find('\0') != std::string_view::npos) return "contains a NUL byte";
  if (!format::valid_utf8(s)) return "is not valid UTF-8";
  return {};
}

// SPEC.md "Sharded checkpoints" R4: a shard file is a plain name in the
// directory of the index. Returns why not, or "".
inline std::string shard_file_name_problem(std::string_view f) {
  if (auto why = check_string(f, format::kMaxKeyBytes, false); !why.empty()) return "file name " + why;
  if (f.find('/') != std::string_view::npos || f == "." || f == "..")
    return "file name '" + std::string(f) + "' is not a plain name in the same directory";
  return "";
}

inline std::string_view sv(const flatbuffers::String* s) { return s ? s->string_view() : std::string_view(); }

// ---- one set of rules, two representations ----------------------------------
// The writer checks the public types (TreeDef, LeafMeta); the reader checks the
// FlatBuffer in place without allocating. Both go through the templates below,
// so a rule is written once.

// A node, read once: kind, arity, type name and number of keys.
struct NodeInfo {
  uint8_t kind;
  uint32_t arity;
  std::string_view type_name;
  size_t num_keys;
};

// SPEC.md "Treedef" rules that concern one node on its own: a known kind; a
// leaf or None has no children and no keys; a dict, named tuple or dataclass
// has one valid key per child (distinct, when `distinct` is given); a list or
// tuple has no keys; a valid type name. Returns what is wrong, or "".
template <class KeyAt>
std::string node_problem(const NodeInfo& node, KeyAt&& key_at, std::unordered_set<std::string_view>* distinct) {
  const auto kind = static_cast<NodeKind>(node.kind);
  switch (kind) {
    case NodeKind::kLeaf:
    case NodeKind::kNone:
      if (node.arity != 0 || node.num_keys != 0) return "a leaf or None node has no children";
      break;
    case NodeKind::kDict:
    case NodeKind::kNamedTuple:
    case NodeKind::kDataclass:
      if (node.num_keys != node.arity)
        return "has " + std::to_string(node.num_keys) + " keys for " + std::to_string(node.arity) + " children";
      if (distinct) distinct->clear();
      for (size_t c = 0; c < node.num_keys; ++c) {
        std::string_view k = key_at(c);
        if (auto why = check_string(k, format::kMaxKeyBytes, false); !why.empty())
          return "key '" + std::string(k) + "' " + why;
        if (distinct && !distinct->insert(k).second) return "duplicate key '" + std::string(k) + "'";
      }
      break;
    case NodeKind::kList:
    case NodeKind::kTuple:
      if (node.num_keys != 0) return "a list or tuple node has no keys";
      break;
    default:
      return "unknown node kind " + std::to_string(static_cast<int>(kind));
  }
  if (!node.type_name.empty())
    if (auto why = check_string(node.type_name, format::kMaxKeyBytes, true); !why.empty()) return "type name " + why;
  return {};
}

struct DefNodes {  // TreeDef, checked node by node as the walk reaches it
  const TreeDef& d;
  mutable std::unordered_set<std::string_view> distinct;
  size_t size() const { return d.size(); }
  NodeInfo info(size_t i) const {
    return {static_cast<uint8_t>(d[i].kind), d[i].arity, d[i].type_name, d[i].keys.size()};
  }
  std::string_view key(size_t i, size_t c) const { return d[i].keys[c]; }
  std::string problem(size_t i, const NodeInfo& node) const {
    return node_problem(node, [&](size_t c) { return key(i, c); }, &distinct);
  }
};

// The manifest's nodes as the walk needs them, read from the FlatBuffer once
// (in parse_manifest's parallel pass, which also ran node_problem on each).
struct CompactNode {
  const FbStrings* keys;
  uint32_t arity;
  uint8_t kind;
};

struct FbNodes {
  const std::vector<CompactNode>& v;
  size_t bad_node;            // the first node with a problem, or SIZE_MAX
  const std::string& bad_why;  // its problem
  size_t size() const { return v.size(); }
  NodeInfo info(size_t i) const { return {v[i].kind, v[i].arity, {}, v[i].keys ? v[i].keys->size() : 0u}; }
  std::string_view key(size_t i, size_t c) const {
    return sv(v[i].keys->Get(static_cast<flatbuffers::uoffset_t>(c)));
  }
  std::string problem(size_t i, const NodeInfo&) const { return i == bad_node ? bad_why : std::string(); }
};

inline void append_escaped(std::string& out, std::string_view component) {
  bool plain = true;
  for (char c : component) plain &= (c != '~') & (c != '/');
  if (plain) {
    out += component;
    return;
  }
  out += escape_key(component);
}

// Walks a treedef in pre-order, checking its structure, and calls
// on_leaf(leaf_index, key_path) for each leaf. `path` is one reused buffer.
template <class Nodes, class OnLeaf>
void walk_treedef(const Nodes& nodes, ErrorCode code, const std::string& file, OnLeaf&& on_leaf) {
  if (nodes.size() == 0) throw Error(code, file, "", "treedef has no nodes (expected at least a root)");
  if (nodes.size() > format::kMaxNodes) throw Error(code, file, "", "treedef has more than 2^26 nodes");
  struct Frame {
    size_t node;
    uint32_t next;
    uint32_t arity;
    bool indexed;  // list or tuple: children are named by their index
    size_t path_len;
  };
  std::vector<Frame> stack;
  std::string path;
  size_t leaves = 0;
  for (size_t i = 0;;) {
    if (i >= nodes.size()) throw Error(code, file, path, "treedef ends before the tree is complete");
    const size_t idx = i++;
    auto bad = [&](const std::string& what) {
      throw Error(code, file, path, "treedef node " + std::to_string(idx) + ": " + what);
    };
    const NodeInfo node = nodes.info(idx);
    if (auto why = nodes.problem(idx, node); !why.empty()) bad(why);
    const auto kind = static_cast<NodeKind>(node.kind);
    if (kind == NodeKind::kLeaf) {
      if (path.size() > format::kMaxKeyPathBytes) bad("key path longer than 65536 bytes");
      on_leaf(leaves++, path);
    } else if (kind != NodeKind::kNone) {
      if (stack.size() >= format::kMaxDepth) bad("tree deeper than 64 levels");
      if (node.arity > nodes.size()) bad("arity larger than the treedef");
      stack.push_back(Frame{idx, 0, node.arity, kind == NodeKind::kList || kind == NodeKind::kTuple, path.size()});
    }
    // Descend into the next child, or climb out of finished containers.
    for (;;) {
      if (stack.empty()) {
        if (i != nodes.size())
          throw Error(code, file, "",
                      "treedef has " + std::to_string(nodes.size() - i) + " nodes after the end of the tree");
        return;
      }
      Frame& f = stack.back();
      path.resize(f.path_len);
      if (f.next == f.arity) {
        stack.pop_back();
        continue;
      }
      uint32_t c = f.next++;
      if (stack.size() > 1) path += '/';
      if (f.indexed)
        path += std::to_string(c);
      else
        append_escaped(path, nodes.key(f.node, c));
      break;
    }
  }
}

struct MetaLeaf {  // LeafMeta
  const LeafMeta& m;
  uint8_t value_kind() const { return static_cast<uint8_t>(m.value_kind); }
  uint8_t dtype() const { return static_cast<uint8_t>(m.dtype); }
  std::span<const int64_t> shape() const { return m.shape; }
  size_t num_axes() const { return m.logical_axes.size(); }
  std::string_view axis(size_t i) const { return m.logical_axes[i]; }
  bool has_sharding() const { return m.sharding.has_value(); }
  size_t num_mesh_names() const { return m.sharding->mesh_axis_names.size(); }
  std::string_view mesh_name(size_t i) const { return m.sharding->mesh_axis_names[i]; }
  std::span<const int64_t> mesh_sizes() const { return m.sharding->mesh_axis_sizes; }
  size_t spec_dims() const { return m.sharding->spec.size(); }
  size_t spec_axes(size_t d) const { return m.sharding->spec[d].size(); }
  std::string_view spec_axis(size_t d, size_t a) const { return m.sharding->spec[d][a]; }
  size_t num_meta() const { return m.metadata.size(); }
  std::string_view meta_key(size_t i) const { return m.metadata[i].first; }
  std::string_view meta_value(size_t i) const { return m.metadata[i].second; }
  size_t num_shards() const { return m.shards.size(); }
  std::string_view shard_file(size_t i) const { return m.shards[i].file; }
  std::string_view shard_key(size_t i) const { return m.shards[i].key_path; }
  std::span<const int64_t> shard_start(size_t i) const { return m.shards[i].start; }
  std::span<const int64_t> shard_stop(size_t i) const { return m.shards[i].stop; }
};

template <typename T>
std::span<const T> span_of(const flatbuffers::Vector<T>* v) {
  return v ? std::span<const T>(v->data(), v->size()) : std::span<const T>();
}

struct FbLeaf {  // fb::Leaf, in place
  const fb::Leaf& l;
  static uint32_t n(const FbStrings* v) { return v ? v->size() : 0; }
  static std::string_view at(const FbStrings* v, size_t i) {
    return sv(v->Get(static_cast<flatbuffers::uoffset_t>(i)));
  }
  const fb::Sharding& sh() const { return *l.sharding(); }
  const fb::Axes* dim(size_t d) const {
    return sh().spec()->Get(static_cast<flatbuffers::uoffset_t>(d));
  }
  uint8_t value_kind() const { return static_cast<uint8_t>(l.value_kind()); }
  uint8_t dtype() const { return static_cast<uint8_t>(l.dtype()); }
  std::span<const int64_t> shape() const { return span_of(l.shape()); }
  size_t num_axes() const { return n(l.logical_axes()); }
  std::string_view axis(size_t i) const { return at(l.logical_axes(), i); }
  bool has_sharding() const { return l.sharding() != nullptr; }
  size_t num_mesh_names() const { return n(sh().mesh_axis_names()); }
  std::string_view mesh_name(size_t i) const { return at(sh().mesh_axis_names(), i); }
  std::span<const int64_t> mesh_sizes() const { return span_of(sh().mesh_axis_sizes()); }
  size_t spec_dims() const { return sh().spec() ? sh().spec()->size() : 0; }
  size_t spec_axes(size_t d) const { return dim(d) ? n(dim(d)->names()) : 0; }
  std::string_view spec_axis(size_t d, size_t a) const { return at(dim(d)->names(), a); }
  size_t num_meta() const { return l.metadata() ? l.metadata()->size() : 0; }
  const fb::KeyValue* kv(size_t i) const {
    return l.metadata()->Get(static_cast<flatbuffers::uoffset_t>(i));
  }
  std::string_view meta_key(size_t i) const { return sv(kv(i)->key()); }
  std::string_view meta_value(size_t i) const { return sv(kv(i)->value()); }
  const fb::ShardRef* ref(size_t i) const { return l.shards()->Get(static_cast<flatbuffers::uoffset_t>(i)); }
  size_t num_shards() const { return l.shards() ? l.shards()->size() : 0; }
  std::string_view shard_file(size_t i) const { return sv(ref(i)->file()); }
  std::string_view shard_key(size_t i) const { return sv(ref(i)->key_path()); }
  std::span<const int64_t> shard_start(size_t i) const { return span_of(ref(i)->start()); }
  std::span<const int64_t> shard_stop(size_t i) const { return span_of(ref(i)->stop()); }
};

template <class L>
void check_leaf(const L& m, ErrorCode code, const std::string& file, std::string_view key_path) {
  auto bad = [&](const std::string& what) { throw Error(code, file, std::string(key_path), what); };
  const uint8_t dtype = m.dtype();
  // A dtype code above the known ones is a later format's (SPEC.md "Dtypes"):
  // the reader refuses the file as unsupported, naming the leaf, rather than
  // as damaged. 0 is never valid.
  if (dtype > kMaxDType && code == ErrorCode::kCorruption)
    throw Error(ErrorCode::kUnsupported, file, std::string(key_path),
                "dtype code " + std::to_string(dtype) + " is not one this treecask " +
                    TREECASK_VERSION_STRING + " knows (1-" + std::to_string(kMaxDType) +
                    "); a newer treecask may read it");
  if (!dtype_valid(dtype)) bad("invalid dtype value " + std::to_string(dtype));
  auto shape = m.shape();
  if (shape.size() > format::kMaxRank)
    bad("rank " + std::to_string(shape.size()) + " exceeds the limit of 64");
  for (int64_t d : shape)
    if (d < 0) bad("negative dimension " + std::to_string(d));
  const auto d = static_cast<DType>(dtype);
  switch (static_cast<ValueKind>(m.value_kind())) {
    case ValueKind::kArray: break;
    case ValueKind::kInt:
      if (d != DType::kInt64 || !shape.empty()) bad("an int scalar is stored as int64 with shape []");
      break;
    case ValueKind::kFloat:
      if (d != DType::kFloat64 || !shape.empty()) bad("a float scalar is stored as float64 with shape []");
      break;
    case ValueKind::kBool:
      if (d != DType::kBool || !shape.empty()) bad("a bool scalar is stored as bool with shape []");
      break;
    case ValueKind::kStr:
      if (d != DType::kUInt8 || shape.size() != 1) bad("a str is stored as uint8 with shape [n]");
      break;
    default:
      bad("unknown value kind " + std::to_string(m.value_kind()));
  }
  if (m.num_axes() != 0 && m.num_axes() != shape.size())
    bad("has " + std::to_string(m.num_axes()) + " logical axis names for rank " + std::to_string(shape.size()));
  for (size_t i = 0; i < m.num_axes(); ++i)
    if (auto why = check_string(m.axis(i), format::kMaxKeyBytes, true); !why.empty())
      bad("logical axis name " + why);
  if (m.has_sharding()) {
    auto sizes = m.mesh_sizes();
    if (m.num_mesh_names() != sizes.size())
      bad("sharding has " + std::to_string(m.num_mesh_names()) + " mesh axis names but " +
          std::to_string(sizes.size()) + " sizes");
    for (size_t i = 0; i < m.num_mesh_names(); ++i)
      if (auto why = check_string(m.mesh_name(i), format::kMaxKeyBytes, false); !why.empty())
        bad("mesh axis name " + why);
    for (int64_t sz : sizes)
      if (sz <= 0) bad("mesh axis size " + std::to_string(sz) + " is not positive");
    if (m.spec_dims() > shape.size()) bad("PartitionSpec has more entries than the leaf has dimensions");
    for (size_t dim = 0; dim < m.spec_dims(); ++dim)
      for (size_t a = 0; a < m.spec_axes(dim); ++a) {
        std::string_view axis = m.spec_axis(dim, a);
        bool known = false;
        for (size_t i = 0; i < m.num_mesh_names() && !known; ++i) known = m.mesh_name(i) == axis;
        // An empty mesh means "mesh unknown" (Flax Partitioned without a
        // mesh): the spec's axis names are then free.
        if (!known && m.num_mesh_names() != 0)
          bad("PartitionSpec names mesh axis '" + std::string(axis) + "' that the mesh lacks");
      }
  }
  for (size_t i = 0; i < m.num_meta(); ++i) {
    if (auto why = check_string(m.meta_key(i), format::kMaxKeyBytes, false); !why.empty())
      bad("metadata key " + why);
    if (auto why = check_string(m.meta_value(i), format::kMaxMetadataBytes, true); !why.empty())
      bad("metadata value of '" + std::string(m.meta_key(i)) + "' " + why);
  }
  // Shard references (format 3.0, SPEC.md "Sharded checkpoints"): each box
  // inside the shape, and the boxes' element counts summing to the leaf's.
  if (m.num_shards() != 0) {
    unsigned __int128 total = 0, want = 1;
    for (int64_t dim : shape) want *= static_cast<uint64_t>(dim);
    for (size_t i = 0; i < m.num_shards(); ++i) {
      std::string at = "shard " + std::to_string(i) + ": ";
      if (auto why = shard_file_name_problem(m.shard_file(i)); !why.empty()) bad(at + why);
      if (auto why = check_string(m.shard_key(i), format::kMaxKeyPathBytes, true); !why.empty())
        bad(at + "key path " + why);
      auto b = m.shard_start(i), e = m.shard_stop(i);
      if (b.size() != shape.size() || e.size() != shape.size())
        bad(at + "start/stop have " + std::to_string(b.size()) + "/" + std::to_string(e.size()) +
            " entries for rank " + std::to_string(shape.size()));
      unsigned __int128 vol = 1;
      for (size_t dim = 0; dim < shape.size(); ++dim) {
        if (b[dim] < 0 || b[dim] > e[dim] || e[dim] > shape[dim])
          bad(at + "box [" + std::to_string(b[dim]) + ", " + std::to_string(e[dim]) + ") of dimension " +
              std::to_string(dim) + " is not inside [0, " + std::to_string(shape[dim]) + ")");
        vol *= static_cast<uint64_t>(e[dim] - b[dim]);
      }
      total += vol;
      if (total > want) break;
    }
    if (total != want)
      bad("its shard boxes hold " + std::string(total > want ? "more" : "fewer") +
          " elements than its shape (they must tile it exactly)");
  }
}

// Archive metadata: the same string rules as leaf metadata.
template <class KV>
void check_metadata_entries(const KV& kvs, ErrorCode code, const std::string& file) {
  for (const auto& [k, v] : kvs) {
    if (auto why = check_string(k, format::kMaxKeyBytes, false); !why.empty())
      throw Error(code, file, "", "archive metadata key " + why);
    if (auto why = check_string(v, format::kMaxMetadataBytes, true); !why.empty())
      throw Error(code, file, "", "archive metadata value of '" + std::string(k) + "' " + why);
  }
}

inline std::vector<std::string> strings(const FbStrings* v) {
  std::vector<std::string> out;
  if (v) {
    out.reserve(v->size());
    for (const auto* s : *v) out.emplace_back(sv(s));
  }
  return out;
}

inline KeyValues key_values(const FbKeyValues* v) {
  KeyValues out;
  if (v)
    for (const auto* kv : *v) out.emplace_back(sv(kv->key()), sv(kv->value()));
  return out;
}

inline void free_aligned(uint8_t* p) { std::free(p); }

// The FlatBuffers 2.0 verifier checks the alignment of a vector's length
// prefix but not that 8-byte elements ([long], [Chunk]) are 8-byte aligned;
// reading a misaligned one is undefined behaviour. The buffer itself is
// 8-byte aligned, so the absolute address decides. (Found by fuzzing.)
template <typename V>
bool elements_aligned(const V* v) {
  return !v || v->size() == 0 || reinterpret_cast<uintptr_t>(v->Data()) % 8 == 0;
}

inline uint64_t hash_path(std::string_view p) { return format::xxh3(std::as_bytes(std::span(p)), 0); }

inline flatbuffers::Offset<FbKeyValues> build_kv(flatbuffers::FlatBufferBuilder& b, const KeyValues& kvs) {
  std::vector<flatbuffers::Offset<fb::KeyValue>> v;
  for (const auto& [k, val] : kvs)
    v.push_back(fb::CreateKeyValue(b, b.CreateString(k), b.CreateString(val)));
  return b.CreateVector(v);
}

}  // namespace treecask::manifest_rules
