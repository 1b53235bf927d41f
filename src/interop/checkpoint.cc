#include "checkpoint.h"

#include <algorithm>

#include "files.h"

namespace treecask::interop {

Checkpoint Checkpoint::open(const std::string& path, const OpenOptions& options) {
  if (ShardedArchive::is_sharded(path)) return Checkpoint(ShardedArchive::open(path, options));
  return Checkpoint(Archive::open(path, options));
}

const std::string& Checkpoint::path() const noexcept {
  return std::visit([](const auto& a) -> const std::string& { return a.path(); }, archive_);
}

std::vector<std::string> Checkpoint::shard_files() const {
  if (const auto* s = std::get_if<ShardedArchive>(&archive_)) return s->files();
  return {};
}

size_t Checkpoint::size() const noexcept {
  return std::visit([](const auto& a) { return a.size(); }, archive_);
}

LeafInfo Checkpoint::leaf(size_t index) const {
  return std::visit([&](const auto& a) { return a.leaf(index); }, archive_);
}

const TreeDef& Checkpoint::treedef() const noexcept {
  if (const auto* s = std::get_if<ShardedArchive>(&archive_)) return s->index().treedef();
  return std::get<Archive>(archive_).treedef();
}

const KeyValues& Checkpoint::metadata() const noexcept {
  if (const auto* s = std::get_if<ShardedArchive>(&archive_)) return s->index().metadata();
  return std::get<Archive>(archive_).metadata();
}

void Checkpoint::read_leaf(size_t index,
                           const std::function<void(std::span<const std::byte>)>& sink) const {
  if (const auto* a = std::get_if<Archive>(&archive_)) {
    for_each_leaf_piece(*a, index, sink);
    return;
  }
  const ShardedArchive& s = std::get<ShardedArchive>(archive_);
  const uint64_t n = s.leaf(index).byte_length;
  if (n == 0) return;
  std::vector<std::byte> buffer(n);
  s.read(index, buffer);
  sink(std::span<const std::byte>(buffer));
}

bool is_flat_dict(const TreeDef& def) {
  if (def.empty() || def[0].kind != NodeKind::kDict || def.size() != def[0].arity + 1) return false;
  return std::all_of(def.begin() + 1, def.end(),
                     [](const TreeNode& n) { return n.kind == NodeKind::kLeaf; });
}

}  // namespace treecask::interop
