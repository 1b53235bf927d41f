// Checkpoint: what an export reads, one archive file (treecask::Archive) or a
// sharded checkpoint directory (treecask::ShardedArchive, SPEC.md "Sharded
// checkpoints"), presented as one list of whole leaves, so that each export
// routine is written once for both.
// Part of the treecask_interop library (src/interop/CMakeLists.txt).
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "treecask/treecask.h"

namespace treecask::interop {

class Checkpoint {
 public:
  // Opens `path`: a directory holding index.cask (ShardedArchive::is_sharded)
  // with ShardedArchive::open, anything else with Archive::open, both with
  // `options`. Cost: the manifests, no tensor bytes.
  // Throws what those throw: Error(kNotFound), kNotAnArchive,
  // kUnsupportedVersion, kCorruption, kIo.
  static Checkpoint open(const std::string& path, const OpenOptions& options = {});

  // An archive or sharded checkpoint the caller opened. The Checkpoint shares
  // it (Archive and ShardedArchive are handles): either may outlive the other.
  Checkpoint(Archive archive) : archive_(std::move(archive)) {}                // NOLINT: implicit
  Checkpoint(ShardedArchive archive) : archive_(std::move(archive)) {}         // NOLINT: implicit

  // True for a sharded checkpoint directory.
  bool sharded() const noexcept { return std::holds_alternative<ShardedArchive>(archive_); }
  // The archive file, or the directory of a sharded checkpoint (as opened).
  const std::string& path() const noexcept;
  // The shard file names of a sharded checkpoint (sorted; ShardedArchive::files),
  // empty for one archive file.
  std::vector<std::string> shard_files() const;

  // Number of leaves; leaf `index`'s description (for a sharded checkpoint the
  // global array's: ShardedArchive::leaf). leaf() throws Error(kInvalidArgument)
  // when index >= size().
  size_t size() const noexcept;
  LeafInfo leaf(size_t index) const;
  // The treedef and archive-level metadata (of index.cask for a sharded
  // checkpoint). Valid while this Checkpoint (or a copy) lives.
  const TreeDef& treedef() const noexcept;
  const KeyValues& metadata() const noexcept;

  // Hands the bytes of leaf `index`, exactly LeafInfo::byte_length of them as
  // Archive::read gives them (C order; sub-byte dtypes packed), to `sink` in
  // order, in one or more pieces (each valid only during its call); none for
  // an empty leaf. One archive file: pieces of at most ~64 MiB
  // (for_each_leaf_piece). A sharded checkpoint: the whole global array at
  // once, assembled from its boxes (ShardedArchive::read), so peak memory is
  // the leaf's size. Checksums are verified as the archive was opened to.
  // Throws Error(kChecksumMismatch), kCorruption, kIo; what `sink` throws.
  void read_leaf(size_t index, const std::function<void(std::span<const std::byte>)>& sink) const;

 private:
  std::variant<Archive, ShardedArchive> archive_;
};

// True when `def` is one dict whose children are all leaves (what
// treecask::flat_dict_treedef builds and every import writes). The exports
// name tensors by such a dict's keys verbatim, else by key paths.
bool is_flat_dict(const TreeDef& def);

}  // namespace treecask::interop
