// The manifest in memory: structural rules shared by writer and reader, and
// the verified, indexed form the reader serves from (SPEC.md "Manifest",
// "Reader checks").
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "treecask/error.h"
#include "treecask/types.h"
#include "treecask_generated.h"

namespace treecask {

// Checks a treedef (node kinds, arity, keys, depth, that it is exactly one
// tree) and returns the canonical key path of every leaf in pre-order. Key
// components must be non-empty valid UTF-8 without NUL of at most
// kMaxKeyBytes, distinct within their node, and key paths unique. Violations
// throw Error(`code`) naming `file` and the key path reached.
std::vector<std::string> leaf_key_paths(const TreeDef& treedef, ErrorCode code,
                                        const std::string& file);

// Rejects a leaf description SPEC.md forbids (dtype, rank, value kind,
// logical axes, sharding, metadata strings). Throws Error(`code`).
void check_leaf_meta(const LeafMeta& meta, ErrorCode code, const std::string& file);

// Rejects archive-level metadata SPEC.md forbids. Throws Error(`code`).
void check_archive_metadata(const KeyValues& metadata, ErrorCode code, const std::string& file);

// SPEC.md "Sharded checkpoints" R8, first half: every entry of an index's
// shard_files is a plain file name (R4's rule), none twice. Returns the names
// sorted (views into `files`). Throws Error(`code`) naming `file`.
std::vector<std::string_view> bound_shard_files(std::span<const ShardFile> files, ErrorCode code,
                                                const std::string& file);
// R8, second half: when `bound` (sorted, from bound_shard_files) is not empty,
// the file `ref_file` that a ShardRef of leaf `key_path` names is in it.
// Throws Error(`code`) naming `file` and the key path.
void check_shard_bound(const std::vector<std::string_view>& bound, std::string_view ref_file,
                       std::string_view key_path, ErrorCode code, const std::string& file);

// One leaf as parse_manifest checked it. No default member initialisers: the
// array of them is not zero-filled when a manifest is parsed (at 10,000 leaves
// that was 720 KB written before any leaf was checked); parse_manifest writes
// every field of every record it returns. `LeafRecord{}` is all zeros.
struct LeafRecord {
  const fb::Leaf* fb;
  std::string_view key_path;  // into the manifest buffer
  uint64_t byte_length;
  uint64_t chunk_size;
  uint64_t stored_bytes;
  uint32_t num_parts;
  uint32_t num_shards;  // format 3.0: > 0 when the bytes live in other files (no chunks)
  Codec codec;          // zero: Codec::kNone
  Filter filter;        // zero: Filter::kNone
  uint8_t shuffle_bytes;  // element size a byte-shuffled leaf is shuffled by; else 0
  DType dtype;
  const flatbuffers::Vector<const fb::Chunk*>* chunks;
  uint32_t num_chunks() const { return chunks ? chunks->size() : 0; }
};

// An allocator whose value-less construct() default-initialises: a vector of
// LeafRecord resized by it is not zero-filled.
template <class T>
struct DefaultInitAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  DefaultInitAllocator() = default;
  template <class U>
  DefaultInitAllocator(const DefaultInitAllocator<U>&) noexcept {}
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

struct Manifest {
  std::unique_ptr<uint8_t[], void (*)(uint8_t*)> buffer{nullptr, nullptr};  // aligned copy, or null
  const uint8_t* data = nullptr;  // the verified FlatBuffer (buffer, or borrowed bytes)
  size_t size = 0;
  const fb::Manifest* root = nullptr;
  KeyValues metadata;
  std::string library_version;
  std::vector<LeafRecord, DefaultInitAllocator<LeafRecord>> leaves;
  std::vector<uint64_t> blob_payload;  // payload length per blob id
  std::vector<ShardFile> shard_files;  // format x.1: the shard files an index binds, as stored

  // Leaf index by canonical key path (open addressing over XXH3 of the path).
  std::optional<uint32_t> find(std::string_view key_path) const;
  // The treedef as public types, built on first use.
  const TreeDef& treedef() const;

  std::vector<uint32_t> slots;  // leaf index + 1; 0 = empty
  mutable std::once_flag treedef_once;
  mutable TreeDef treedef_cache;
};

// ---- Encoding (the writer's half; parse_manifest below is the reader's) ----

// One chunk as the writer stored it (SPEC.md "Chunks and checksums"): blob id,
// flags (kChunkStoredRaw), byte offset in the blob's payload, stored bytes,
// and XXH3-64 of the stored bytes seeded with chunk_seed(leaf, chunk).
struct ChunkOut {
  uint32_t blob = 0;
  uint32_t flags = 0;
  uint64_t offset = 0;
  uint64_t stored = 0;
  uint64_t checksum = 0;
};

// How the writer stored one leaf: its codec, its filter and its chunks.
struct LeafOut {
  Codec codec = Codec::kNone;
  uint8_t shuffle_bytes = 0;  // byte shuffle by this element size before LZ4; 0 = no filter
  std::vector<ChunkOut> chunks;
};

// One leaf for build_manifest: its description and the bytes it was given
// (0 for an empty leaf and for one with shard references).
struct EncodeLeaf {
  const LeafMeta* meta;
  uint64_t data_bytes;
};

// The archive-level fields build_manifest records.
struct EncodeArchive {
  uint16_t major = 0, minor = 0;  // the format version (SPEC.md "Versioning")
  uint64_t chunk_size = 0;        // raw bytes per chunk of every leaf with bytes
  KeyValues metadata;             // archive metadata, in order
  std::vector<ShardFile> shard_files;  // an index's bound shard files (format x.1)
};

// Encodes the manifest FlatBuffer (schema/treecask.fbs, SPEC.md "Manifest")
// of an archive of format archive.major.minor: the treedef's nodes, one Leaf
// per input (key path paths[i], the meta of leaves[i], the codec, filter and
// chunks of out[i], chunk size archive.chunk_size), one Blob per entry of
// `payloads` (payload bytes by blob id), the archive metadata and shard
// files, this library's version and the current time. REQUIRES: everything
// already checked by save() (the inputs follow SPEC.md; paths, leaves and out
// have one entry per leaf). Returns the finished buffer (identifier TCMF);
// parse_manifest accepts it.
std::vector<uint8_t> build_manifest(const TreeDef& def, std::span<const EncodeLeaf> leaves,
                                    const std::vector<std::string>& paths, const std::vector<LeafOut>& out,
                                    const std::vector<uint64_t>& payloads, const EncodeArchive& archive);

// ---- Decoding ----

// Checks `bytes` as SPEC.md "Reader checks" 17-35 say: when `checksum` is
// given, XXH3-64 (seed 0) of the bytes against it (kChecksumMismatch, which
// takes precedence over every other finding); the FlatBuffers verifier; every
// semantic rule; and builds the key-path index. With `borrow`, bytes that are
// 8-byte aligned are used in place and must outlive the Manifest; otherwise
// they are copied into an aligned buffer. Cost: linear in the manifest, with
// no allocation per leaf. Throws Error(kCorruption)
// naming `file` and the leaf where there is one; std::bad_alloc as is.
//
// Manifests of `parallel_from` bytes or more are checked by the calling thread
// and one WorkQueue helper thread (parallel.h) together (tests and the fuzzer lower it to compare
// the two paths): starting a thread costs 50-100 us on a VM, more than the
// checks of a small manifest.
//
// A leaf without logical axes, sharding, metadata or shard references is
// verified and checked in one pass over its table; any other leaf, and any
// leaf that pass does not accept, goes through the generated FlatBuffers
// verifier and the full checks, which decide and name the finding.
// `full_leaf_check` sends every leaf that way (tests and the fuzzer compare
// the two).
inline constexpr size_t kParallelManifestBytes = size_t{256} << 10;
std::unique_ptr<Manifest> parse_manifest(std::span<const std::byte> bytes, const std::string& file,
                                         bool borrow = false, std::optional<uint64_t> checksum = std::nullopt,
                                         size_t parallel_from = kParallelManifestBytes,
                                         bool full_leaf_check = false);

// Reads FlatBuffers strings into the public types.
LeafMeta leaf_meta_of(const fb::Leaf& leaf);

}  // namespace treecask
