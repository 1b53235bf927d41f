#include "format/manifest.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <unordered_set>

#include "format/format.h"
#include "format/manifest_rules.h"
#include "treecask/treecask.h"

namespace treecask {

using namespace manifest_rules;

// ---- the encoder (the writer's half of this file) ----

std::vector<uint8_t> build_manifest(const TreeDef& def, std::span<const EncodeLeaf> leaves,
                                    const std::vector<std::string>& paths, const std::vector<LeafOut>& out,
                                    const std::vector<uint64_t>& payloads, const EncodeArchive& archive) {
  flatbuffers::FlatBufferBuilder b(1024 + leaves.size() * 256);
  std::vector<flatbuffers::Offset<fb::Node>> nodes;
  nodes.reserve(def.size());
  for (const auto& n : def) {
    auto tn = n.type_name.empty() ? 0 : b.CreateString(n.type_name);
    auto keys = n.keys.empty() ? 0 : b.CreateVectorOfStrings(n.keys);
    fb::NodeBuilder nb(b);
    nb.add_kind(static_cast<fb::NodeKind>(n.kind));
    nb.add_arity(n.arity);
    if (!tn.IsNull()) nb.add_type_name(tn);
    if (!keys.IsNull()) nb.add_keys(keys);
    nodes.push_back(nb.Finish());
  }
  std::vector<flatbuffers::Offset<fb::Leaf>> lv;
  lv.reserve(leaves.size());
  for (size_t i = 0; i < leaves.size(); ++i) {
    const LeafMeta& m = *leaves[i].meta;
    auto kp = b.CreateString(paths[i]);
    auto shape = b.CreateVector(m.shape);
    std::vector<fb::Chunk> cs;
    cs.reserve(out[i].chunks.size());
    for (const auto& c : out[i].chunks) cs.emplace_back(c.blob, c.flags, c.offset, c.stored, c.checksum);
    auto chunks = b.CreateVectorOfStructs(cs);
    auto axes = m.logical_axes.empty() ? 0 : b.CreateVectorOfStrings(m.logical_axes);
    flatbuffers::Offset<fb::Sharding> sh = 0;
    if (m.sharding) {
      std::vector<flatbuffers::Offset<fb::Axes>> spec;
      for (const auto& d : m.sharding->spec) spec.push_back(fb::CreateAxes(b, b.CreateVectorOfStrings(d)));
      sh = fb::CreateSharding(b, b.CreateVectorOfStrings(m.sharding->mesh_axis_names),
                              b.CreateVector(m.sharding->mesh_axis_sizes), b.CreateVector(spec));
    }
    auto md = m.metadata.empty() ? 0 : build_kv(b, m.metadata);
    flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fb::ShardRef>>> refs = 0;
    uint64_t byte_length = leaves[i].data_bytes;
    if (!m.shards.empty()) {
      std::vector<flatbuffers::Offset<fb::ShardRef>> rv;
      rv.reserve(m.shards.size());
      for (const auto& r : m.shards)
        rv.push_back(fb::CreateShardRef(b, b.CreateString(r.file), b.CreateString(r.key_path),
                                        b.CreateVector(r.start), b.CreateVector(r.stop)));
      refs = b.CreateVector(rv);
      byte_length = byte_length_for(m.dtype, m.shape);
    }
    fb::LeafBuilder leaf(b);
    leaf.add_key_path(kp);
    leaf.add_value_kind(static_cast<fb::ValueKind>(m.value_kind));
    leaf.add_dtype(static_cast<fb::DType>(m.dtype));
    leaf.add_shape(shape);
    leaf.add_byte_length(byte_length);
    leaf.add_codec(static_cast<fb::Codec>(out[i].codec));
    leaf.add_chunk_size(leaves[i].data_bytes == 0 ? 0 : archive.chunk_size);
    leaf.add_chunks(chunks);
    if (!axes.IsNull()) leaf.add_logical_axes(axes);
    if (!sh.IsNull()) leaf.add_sharding(sh);
    if (!md.IsNull()) leaf.add_metadata(md);
    if (out[i].shuffle_bytes) leaf.add_filter(fb::Filter::ByteShuffle);
    if (!refs.IsNull()) leaf.add_shards(refs);
    lv.push_back(leaf.Finish());
  }
  std::vector<flatbuffers::Offset<fb::Blob>> bv;
  for (uint64_t p : payloads) bv.push_back(fb::CreateBlob(b, p));
  auto created = std::chrono::duration_cast<std::chrono::nanoseconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fb::ShardFile>>> bound = 0;
  if (!archive.shard_files.empty()) {
    std::vector<flatbuffers::Offset<fb::ShardFile>> fv;
    for (const auto& f : archive.shard_files)
      fv.push_back(fb::CreateShardFile(b, b.CreateString(f.file), f.manifest_length, f.manifest_checksum));
    bound = b.CreateVector(fv);
  }
  auto root = fb::CreateManifest(b, archive.major, archive.minor, b.CreateString(library_version()), created,
                                 build_kv(b, archive.metadata), b.CreateVector(nodes), b.CreateVector(lv),
                                 b.CreateVector(bv), bound);
  fb::FinishManifestBuffer(b, root);
  return {b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize()};
}

std::vector<std::string> leaf_key_paths(const TreeDef& def, ErrorCode code, const std::string& file) {
  std::vector<std::string> paths;
  std::unordered_set<std::string_view> seen;
  walk_treedef(DefNodes{def, {}}, code, file, [&](size_t, const std::string& p) { paths.push_back(p); });
  for (const auto& p : paths)
    if (!seen.insert(p).second) throw Error(code, file, p, "duplicate key path");
  return paths;
}

void check_leaf_meta(const LeafMeta& m, ErrorCode code, const std::string& file) {
  check_leaf(MetaLeaf{m}, code, file, m.key_path);
}

void check_archive_metadata(const KeyValues& metadata, ErrorCode code, const std::string& file) {
  check_metadata_entries(metadata, code, file);
}

std::vector<std::string_view> bound_shard_files(std::span<const ShardFile> files, ErrorCode code,
                                                const std::string& file) {
  std::vector<std::string_view> names;
  names.reserve(files.size());
  for (const ShardFile& f : files) {
    if (auto why = shard_file_name_problem(f.file); !why.empty())
      throw Error(code, file, "", "shard_files: " + why);
    names.push_back(f.file);
  }
  std::sort(names.begin(), names.end());
  if (auto d = std::adjacent_find(names.begin(), names.end()); d != names.end())
    throw Error(code, file, "", "shard_files lists '" + std::string(*d) + "' twice");
  return names;
}

void check_shard_bound(const std::vector<std::string_view>& bound, std::string_view ref_file,
                       std::string_view key_path, ErrorCode code, const std::string& file) {
  if (!bound.empty() && !std::binary_search(bound.begin(), bound.end(), ref_file))
    throw Error(code, file, std::string(key_path),
                "shard file '" + std::string(ref_file) + "' is not among the shard files the index binds");
}

LeafMeta leaf_meta_of(const fb::Leaf& leaf) {
  LeafMeta m;
  m.key_path = std::string(sv(leaf.key_path()));
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
  if (const auto* refs = leaf.shards())
    for (const auto* ref : *refs) {
      ShardRef sr{std::string(sv(ref->file())), std::string(sv(ref->key_path())), {}, {}};
      if (ref->start()) sr.start.assign(ref->start()->begin(), ref->start()->end());
      if (ref->stop()) sr.stop.assign(ref->stop()->begin(), ref->stop()->end());
      m.shards.push_back(std::move(sr));
    }
  return m;
}

std::optional<uint32_t> Manifest::find(std::string_view key_path) const {
  if (slots.empty()) return std::nullopt;
  size_t mask = slots.size() - 1;
  for (size_t s = hash_path(key_path) & mask;; s = (s + 1) & mask) {
    uint32_t v = slots[s];
    if (v == 0) return std::nullopt;
    if (leaves[v - 1].key_path == key_path) return v - 1;
  }
}

const TreeDef& Manifest::treedef() const {
  std::call_once(treedef_once, [&] {
    const auto& nodes = *root->nodes();
    treedef_cache.reserve(nodes.size());
    for (const auto* n : nodes)
      treedef_cache.push_back(TreeNode{static_cast<NodeKind>(n->kind()), n->arity(),
                                       std::string(sv(n->type_name())), strings(n->keys())});
  });
  return treedef_cache;
}

}  // namespace treecask
