#include "manifest.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <unordered_set>

#include "codec.h"
#include "format.h"

namespace treecask {

namespace {

std::string check_string(std::string_view s, size_t max_bytes, bool allow_empty) {
  if (!allow_empty && s.empty()) return "is empty";
  if (s.size() > max_bytes) return "is longer than " + std::to_string(max_bytes) + " bytes";
  if (s.find('\0') != std::string_view::npos) return "contains a NUL byte";
  if (!format::valid_utf8(s)) return "is not valid UTF-8";
  return {};
}

struct Frame {
  size_t node;        // index of the container node
  uint32_t next = 0;  // next child to visit
  size_t path_len;    // components of the path to this node
};

}  // namespace

std::vector<std::string> leaf_key_paths(const TreeDef& def, ErrorCode code,
                                        const std::string& file) {
  if (def.empty()) throw Error(code, file, "", "treedef has no nodes (expected at least a root)");
  if (def.size() > format::kMaxNodes)
    throw Error(code, file, "", "treedef has more than 2^26 nodes");
  std::vector<std::string> paths;
  std::unordered_set<std::string> seen;
  std::vector<std::string> components;  // escaped components of the current path
  std::vector<Frame> stack;
  auto current_path = [&] {
    std::string s;
    for (size_t i = 0; i < components.size(); ++i) {
      if (i) s += '/';
      s += components[i];
    }
    return s;
  };
  size_t i = 0;
  for (;;) {
    if (i >= def.size())
      throw Error(code, file, current_path(), "treedef ends before the tree is complete");
    const TreeNode& n = def[i];
    const size_t idx = i++;
    auto bad = [&](const std::string& what) {
      throw Error(code, file, current_path(),
                  "treedef node " + std::to_string(idx) + ": " + what);
    };
    switch (n.kind) {
      case NodeKind::kLeaf:
      case NodeKind::kNone:
        if (n.arity != 0 || !n.keys.empty()) bad("a leaf or None node has no children");
        if (n.kind == NodeKind::kLeaf) {
          std::string p = current_path();
          if (p.size() > format::kMaxKeyPathBytes) bad("key path longer than 65536 bytes");
          if (!seen.insert(p).second) bad("duplicate key path");
          paths.push_back(std::move(p));
        }
        break;
      case NodeKind::kDict:
      case NodeKind::kNamedTuple:
      case NodeKind::kDataclass:
        if (n.keys.size() != n.arity)
          bad("has " + std::to_string(n.keys.size()) + " keys for " + std::to_string(n.arity) +
              " children");
        for (const auto& k : n.keys)
          if (auto why = check_string(k, format::kMaxKeyBytes, false); !why.empty())
            bad("key '" + k + "' " + why);
        break;
      case NodeKind::kList:
      case NodeKind::kTuple:
        if (!n.keys.empty()) bad("a list or tuple node has no keys");
        break;
      default:
        bad("unknown node kind " + std::to_string(static_cast<int>(n.kind)));
    }
    if (auto why = check_string(n.type_name, format::kMaxKeyBytes, true); !why.empty())
      bad("type name " + why);
    if (n.kind != NodeKind::kLeaf && n.kind != NodeKind::kNone) {
      if (stack.size() >= format::kMaxDepth) bad("tree deeper than 64 levels");
      if (n.arity > def.size()) bad("arity larger than the treedef");
      stack.push_back(Frame{idx, 0, components.size()});
    }
    // Descend into the next child, or climb out of finished containers.
    for (;;) {
      if (stack.empty()) {
        if (i != def.size())
          throw Error(code, file, "",
                      "treedef has " + std::to_string(def.size() - i) +
                          " nodes after the end of the tree");
        return paths;
      }
      Frame& f = stack.back();
      components.resize(f.path_len);
      const TreeNode& parent = def[f.node];
      if (f.next == parent.arity) {
        stack.pop_back();
        continue;
      }
      uint32_t c = f.next++;
      if (parent.kind == NodeKind::kList || parent.kind == NodeKind::kTuple)
        components.push_back(std::to_string(c));
      else
        components.push_back(escape_key(parent.keys[c]));
      break;
    }
  }
}

void check_leaf_meta(const LeafMeta& m, ErrorCode code, const std::string& file) {
  auto bad = [&](const std::string& what) { throw Error(code, file, m.key_path, what); };
  if (!dtype_valid(static_cast<uint8_t>(m.dtype)))
    bad("invalid dtype value " + std::to_string(static_cast<int>(m.dtype)));
  if (m.shape.size() > format::kMaxRank)
    bad("rank " + std::to_string(m.shape.size()) + " exceeds the limit of 64");
  for (int64_t d : m.shape)
    if (d < 0) bad("negative dimension " + std::to_string(d));
  switch (m.value_kind) {
    case ValueKind::kArray: break;
    case ValueKind::kInt:
      if (m.dtype != DType::kInt64 || !m.shape.empty()) bad("an int scalar is stored as int64 with shape []");
      break;
    case ValueKind::kFloat:
      if (m.dtype != DType::kFloat64 || !m.shape.empty()) bad("a float scalar is stored as float64 with shape []");
      break;
    case ValueKind::kBool:
      if (m.dtype != DType::kBool || !m.shape.empty()) bad("a bool scalar is stored as bool with shape []");
      break;
    case ValueKind::kStr:
      if (m.dtype != DType::kUInt8 || m.shape.size() != 1) bad("a str is stored as uint8 with shape [n]");
      break;
    default:
      bad("unknown value kind " + std::to_string(static_cast<int>(m.value_kind)));
  }
  if (!m.logical_axes.empty() && m.logical_axes.size() != m.shape.size())
    bad("has " + std::to_string(m.logical_axes.size()) + " logical axis names for rank " +
        std::to_string(m.shape.size()));
  for (const auto& a : m.logical_axes)
    if (auto why = check_string(a, format::kMaxKeyBytes, true); !why.empty())
      bad("logical axis name " + why);
  if (m.sharding) {
    const Sharding& s = *m.sharding;
    if (s.mesh_axis_names.size() != s.mesh_axis_sizes.size())
      bad("sharding has " + std::to_string(s.mesh_axis_names.size()) + " mesh axis names but " +
          std::to_string(s.mesh_axis_sizes.size()) + " sizes");
    for (const auto& a : s.mesh_axis_names)
      if (auto why = check_string(a, format::kMaxKeyBytes, false); !why.empty())
        bad("mesh axis name " + why);
    for (int64_t sz : s.mesh_axis_sizes)
      if (sz <= 0) bad("mesh axis size " + std::to_string(sz) + " is not positive");
    if (s.spec.size() > m.shape.size())
      bad("PartitionSpec has more entries than the leaf has dimensions");
    for (const auto& dim : s.spec)
      for (const auto& a : dim)
        if (std::find(s.mesh_axis_names.begin(), s.mesh_axis_names.end(), a) ==
            s.mesh_axis_names.end())
          bad("PartitionSpec names mesh axis '" + a + "' that the mesh lacks");
  }
  for (const auto& [k, v] : m.metadata) {
    if (auto why = check_string(k, format::kMaxKeyBytes, false); !why.empty()) bad("metadata key " + why);
    if (auto why = check_string(v, format::kMaxMetadataBytes, true); !why.empty())
      bad("metadata value of '" + k + "' " + why);
  }
}

namespace {
std::string str(const flatbuffers::String* s) { return s ? s->str() : std::string(); }

std::vector<std::string> strings(const flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>* v) {
  std::vector<std::string> out;
  if (v) {
    out.reserve(v->size());
    for (const auto* s : *v) out.push_back(str(s));
  }
  return out;
}

KeyValues key_values(const flatbuffers::Vector<flatbuffers::Offset<fb::KeyValue>>* v) {
  KeyValues out;
  if (v)
    for (const auto* kv : *v) out.emplace_back(str(kv->key()), str(kv->value()));
  return out;
}

void free_aligned(uint8_t* p) { std::free(p); }

// The FlatBuffers 2.0 verifier checks the alignment of a vector's length
// prefix but not that 8-byte elements ([long], [Chunk]) are 8-byte aligned;
// reading a misaligned one is undefined behaviour. The buffer itself is
// 64-byte aligned, so the absolute address decides. (Found by fuzzing.)
template <typename V>
bool elements_aligned(const V* v) {
  return !v || v->size() == 0 || reinterpret_cast<uintptr_t>(v->Data()) % 8 == 0;
}
}  // namespace

LeafMeta leaf_meta_of(const fb::Leaf& leaf) {
  LeafMeta m;
  m.key_path = str(leaf.key_path());
  m.value_kind = static_cast<ValueKind>(leaf.value_kind());
  m.dtype = static_cast<DType>(leaf.dtype());
  if (leaf.shape()) m.shape.assign(leaf.shape()->begin(), leaf.shape()->end());
  m.logical_axes = strings(leaf.logical_axes());
  if (const auto* s = leaf.sharding()) {
    Sharding sh;
    sh.mesh_axis_names = strings(s->mesh_axis_names());
    if (s->mesh_axis_sizes()) sh.mesh_axis_sizes.assign(s->mesh_axis_sizes()->begin(), s->mesh_axis_sizes()->end());
    if (s->spec())
      for (const auto* axes : *s->spec()) sh.spec.push_back(axes ? strings(axes->names()) : std::vector<std::string>{});
    m.sharding = std::move(sh);
  }
  m.metadata = key_values(leaf.metadata());
  return m;
}

std::unique_ptr<Manifest> parse_manifest(std::span<const std::byte> bytes, const std::string& file) {
  auto corrupt = [&](const std::string& key, const std::string& what) {
    return Error(ErrorCode::kCorruption, file, key, what);
  };
  if (bytes.size() > format::kMaxManifestBytes)
    throw corrupt("", "manifest larger than 256 MiB");
  auto m = std::make_unique<Manifest>();
  size_t cap = format::align_up(std::max<size_t>(bytes.size(), 1), 64);
  m->buffer = {static_cast<uint8_t*>(std::aligned_alloc(64, cap)), free_aligned};
  if (!m->buffer) throw Error(ErrorCode::kIo, file, "", "out of memory for the manifest");
  std::memcpy(m->buffer.get(), bytes.data(), bytes.size());
  m->size = bytes.size();

  flatbuffers::Verifier::Options opts;
  opts.max_depth = 16;         // the schema nests at most 5 tables deep
  opts.max_tables = 1u << 27;  // bounded by the 256 MiB manifest anyway
  opts.check_alignment = true;
  flatbuffers::Verifier verifier(m->buffer.get(), m->size, opts);
  if (!fb::VerifyManifestBuffer(verifier))
    throw corrupt("", "manifest fails the FlatBuffers verifier (or lacks identifier TCMF)");
  const fb::Manifest* root = fb::GetManifest(m->buffer.get());
  m->root = root;

  // Treedef.
  const auto* nodes = root->nodes();
  if (!nodes || nodes->size() == 0) throw corrupt("", "manifest has no treedef nodes");
  if (nodes->size() > format::kMaxNodes) throw corrupt("", "treedef has more than 2^26 nodes");
  m->treedef.reserve(nodes->size());
  for (const auto* n : *nodes) {
    TreeNode t;
    t.kind = static_cast<NodeKind>(n->kind());
    t.arity = n->arity();
    t.type_name = str(n->type_name());
    t.keys = strings(n->keys());
    m->treedef.push_back(std::move(t));
  }
  m->key_paths = leaf_key_paths(m->treedef, ErrorCode::kCorruption, file);
  m->metadata = key_values(root->metadata());
  for (const auto& [k, v] : m->metadata)
    if (!format::valid_utf8(k) || !format::valid_utf8(v))
      throw corrupt("", "archive metadata is not valid UTF-8");
  m->library_version = str(root->library_version());

  // Blobs.
  const auto* blobs = root->blobs();
  if (blobs) {
    m->blob_payload.reserve(blobs->size());
    for (const auto* b : *blobs) m->blob_payload.push_back(b->payload_length());
  }
  for (uint64_t len : m->blob_payload)
    if (len > format::kMaxBlobValue - format::kBlobHeaderSize)
      throw corrupt("", "blob payload length exceeds the 2 GiB value limit");

  // Leaves.
  const auto* leaves = root->leaves();
  size_t n_leaves = leaves ? leaves->size() : 0;
  if (n_leaves != m->key_paths.size())
    throw corrupt("", "manifest has " + std::to_string(n_leaves) + " leaves but the treedef has " +
                          std::to_string(m->key_paths.size()));
  if (n_leaves > format::kMaxLeaves) throw corrupt("", "more than 2^24 leaves");
  struct Extent {
    uint32_t blob;
    uint64_t begin, end;
  };
  std::vector<Extent> extents;
  m->leaves.resize(n_leaves);
  m->by_path.reserve(n_leaves);
  for (size_t li = 0; li < n_leaves; ++li) {
    const fb::Leaf* leaf = leaves->Get(static_cast<flatbuffers::uoffset_t>(li));
    const std::string& path = m->key_paths[li];
    auto bad = [&](const std::string& what) { return corrupt(path, what); };
    if (!elements_aligned(leaf->shape()) || !elements_aligned(leaf->chunks()) ||
        (leaf->sharding() && !elements_aligned(leaf->sharding()->mesh_axis_sizes())))
      throw bad("a vector of 8-byte elements is not 8-byte aligned");
    if (leaf->key_path()->string_view() != path)
      throw bad("leaf " + std::to_string(li) + " has key path '" + leaf->key_path()->str() +
                "' but the treedef gives '" + path + "'");
    if (!dtype_valid(static_cast<uint8_t>(leaf->dtype())))
      throw bad("invalid dtype value " + std::to_string(static_cast<int>(leaf->dtype())));
    LeafMeta meta = leaf_meta_of(*leaf);
    check_leaf_meta(meta, ErrorCode::kCorruption, file);
    uint64_t expect;
    try {
      expect = byte_length_for(meta.dtype, meta.shape);
    } catch (const Error& e) {
      throw bad(e.message());
    }
    LeafRecord& r = m->leaves[li];
    r.fb = leaf;
    r.dtype = meta.dtype;
    r.byte_length = leaf->byte_length();
    if (r.byte_length != expect)
      throw bad("byte length " + std::to_string(r.byte_length) + " does not match " +
                std::string(dtype_name(meta.dtype)) + " x shape (" + std::to_string(expect) +
                " bytes)");
    uint8_t codec = static_cast<uint8_t>(leaf->codec());
    if (codec > 1) throw bad("unknown codec " + std::to_string(codec));
    r.codec = static_cast<Codec>(codec);
    r.chunk_size = leaf->chunk_size();
    r.chunks = leaf->chunks();
    uint64_t n_chunks = r.chunks ? r.chunks->size() : 0;
    if (r.byte_length == 0) {
      if (n_chunks != 0) throw bad("an empty leaf has chunks");
    } else {
      if (r.chunk_size < format::kMinChunkSize || r.chunk_size > format::kMaxChunkSize ||
          r.chunk_size % 64 != 0)
        throw bad("chunk size " + std::to_string(r.chunk_size) +
                  " is not a multiple of 64 in [4096, 64 MiB]");
      uint64_t want = (r.byte_length + r.chunk_size - 1) / r.chunk_size;
      if (n_chunks != want)
        throw bad("has " + std::to_string(n_chunks) + " chunks, expected " + std::to_string(want));
    }
    uint32_t prev_blob = UINT32_MAX;
    uint64_t prev_end = 0;
    for (uint64_t ci = 0; ci < n_chunks; ++ci) {
      const fb::Chunk* c = r.chunks->Get(static_cast<flatbuffers::uoffset_t>(ci));
      uint64_t raw = std::min(r.chunk_size, r.byte_length - ci * r.chunk_size);
      std::string at = "chunk " + std::to_string(ci) + ": ";
      if (c->blob() >= m->blob_payload.size()) throw bad(at + "names a blob that does not exist");
      if (c->flags() & ~format::kChunkFlagsMask) throw bad(at + "reserved flag bits are set");
      bool stored_raw = r.codec == Codec::kNone || (c->flags() & format::kChunkStoredRaw);
      if (r.codec == Codec::kNone && c->flags() != 0) throw bad(at + "flags set on a raw leaf");
      if (stored_raw) {
        if (c->stored_size() != raw)
          throw bad(at + "stored size " + std::to_string(c->stored_size()) + " != raw size " +
                    std::to_string(raw));
      } else if (c->stored_size() == 0 ||
                 c->stored_size() > codec::lz4_bound(raw)) {
        throw bad(at + "LZ4 stored size " + std::to_string(c->stored_size()) + " out of range");
      }
      uint64_t payload = m->blob_payload[c->blob()];
      if (c->offset() > payload || c->stored_size() > payload - c->offset())
        throw bad(at + "extends past the end of blob " + std::to_string(c->blob()));
      bool new_part = c->blob() != prev_blob;
      if (new_part) {
        if (c->offset() % format::kAlignment != 0)
          throw bad(at + "a part does not start 64-byte aligned");
        ++r.num_parts;
      } else if (r.codec == Codec::kNone && c->offset() != prev_end) {
        throw bad(at + "raw chunks of one part are not contiguous");
      }
      prev_blob = c->blob();
      prev_end = c->offset() + c->stored_size();
      r.stored_bytes += c->stored_size();
      extents.push_back({c->blob(), c->offset(), prev_end});
    }
    auto [it, inserted] = m->by_path.emplace(std::string_view(m->key_paths[li]), uint32_t(li));
    (void)it;
    if (!inserted) throw bad("duplicate key path");
  }

  // Coverage: chunks tile each blob with no overlap; gaps are padding < 64 bytes.
  std::sort(extents.begin(), extents.end(), [](const Extent& a, const Extent& b) {
    return a.blob != b.blob ? a.blob < b.blob : a.begin < b.begin;
  });
  size_t e = 0;
  for (uint32_t b = 0; b < m->blob_payload.size(); ++b) {
    uint64_t pos = 0;
    bool any = false;
    for (; e < extents.size() && extents[e].blob == b; ++e) {
      const Extent& x = extents[e];
      if (x.begin < pos) throw corrupt("", "chunks overlap in blob " + std::to_string(b));
      if (x.begin - pos >= format::kAlignment)
        throw corrupt("", "blob " + std::to_string(b) + " has a hole of " +
                              std::to_string(x.begin - pos) + " bytes");
      pos = x.end;
      any = true;
    }
    if (!any && m->blob_payload[b] != 0) throw corrupt("", "blob " + std::to_string(b) + " holds no chunk");
    if (m->blob_payload[b] - pos >= format::kAlignment)
      throw corrupt("", "blob " + std::to_string(b) + " has unreferenced bytes at its end");
  }
  return m;
}

}  // namespace treecask
