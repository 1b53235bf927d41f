// Writing an archive: one call, atomic, one file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <span>

#include "treecask/error.h"
#include "treecask/types.h"

namespace treecask {

// How the writer encodes a leaf (SPEC.md "Codecs").
enum class Compression : uint8_t {
  kAuto = 0,  // LZ4 where it pays: samples of the leaf are compressed and the
              // leaf is kept raw (zero-copy readable) when LZ4 saves < 10%
  kNone = 1,  // always raw
  kLZ4 = 2,   // always LZ4; a chunk LZ4 cannot shrink is stored raw
};
// "auto", "none", "lz4" (the CLI's --compression and the Python package's
// compression= values); "invalid" for any other value.
TREECASK_API std::string_view compression_name(Compression compression) noexcept;

// One leaf to save: what it is, and its bytes in caller memory (C order,
// little-endian, byte_length_for(dtype, shape) bytes). The writer reads
// `data` while save() runs and never keeps a second full copy of it.
struct LeafInput {
  LeafMeta meta;                     // meta.key_path may be left empty; if set it
                                     // must equal the path the treedef gives
  std::span<const std::byte> data;
  std::optional<Compression> compression;  // overrides SaveOptions::compression
};

struct SaveOptions {
  Compression compression = Compression::kAuto;
  // Byte-shuffle (SPEC.md "Filters") each chunk of every LZ4-coded leaf whose
  // dtype has 2, 4, 8 or 16 bytes per element before compressing it, as Blosc
  // does: bf16/fp32 weights then compress where plain LZ4 gains ~nothing.
  // Opt-in because an archive with a filter is format 2.0, which 1.x readers
  // refuse (kUnsupportedVersion); without one, save() writes format 1.0.
  // With kAuto the probe compresses shuffled samples.
  bool shuffle = false;
  // Raw bytes per chunk, the unit of checksums, compression and partial reads.
  // A multiple of 64 in [4096, 64 MiB] (SPEC.md "Limits").
  uint64_t chunk_size = uint64_t{1} << 20;
  // Largest raw leaf piece stored as one LMDB value, i.e. one zero-copy part
  // (SPEC.md "Large leaves"), rounded down to a multiple of chunk_size; in
  // [chunk_size, 1 GiB] so that no value approaches LMDB's 2 GiB write limit.
  uint64_t max_part_bytes = uint64_t{1} << 30;
  unsigned threads = 0;     // compression/hashing threads; 0 = all cores
  bool overwrite = false;   // replace an existing file at `path` (else the
                            // final rename refuses to replace one atomically)
  bool durable = true;      // fsync the file and its directory before returning
  KeyValues metadata;       // archive-level user key-values
  // Only for the index of a sharded checkpoint (leaves with shard references):
  // the shard files it binds, one entry per file that any ShardRef names (no
  // other, no duplicate; plain file names), each with the fingerprint of the
  // file as written (Archive::manifest_fingerprint). Non-empty: the archive
  // is format 3.1 (4.1 with a format 4.0 dtype) and every reader refuses a
  // shard file that does not match (SPEC.md "Sharded checkpoints", R8, R9).
  // Empty: an unbound index, as format 3.0 wrote it. Checked before anything
  // is written (kInvalidArgument).
  std::vector<ShardFile> shard_files;
  // Called from the saving thread with (bytes done, bytes total) of leaf data.
  std::function<void(uint64_t, uint64_t)> progress;
};

struct SaveStats {
  uint64_t file_bytes = 0;    // size of the archive file
  uint64_t raw_bytes = 0;     // sum of leaf byte lengths
  uint64_t stored_bytes = 0;  // sum of stored chunk sizes
  uint32_t num_leaves = 0;
  uint32_t num_blobs = 0;
};

// Saves `leaves` with structure `treedef` as one archive file at `path`.
//
// REQUIRES: treedef has exactly leaves.size() leaf nodes; leaf i is the i-th
// leaf node in pre-order. Every input is checked before anything is written:
// valid dtype, dims >= 0, data.size() == byte_length_for(dtype, shape), keys
// non-empty valid UTF-8 without NUL, no duplicate key paths, depth and rank
// within SPEC.md "Limits", known Compression values, options in range, the
// shard files of an index (R8); a violation throws Error(kInvalidArgument)
// naming the key path. One limit is known only once the leaves are encoded:
// a manifest over 256 MiB (e.g. millions of chunks) throws kInvalidArgument
// after the temporary file was written, which is then removed; `path` is
// untouched either way.
//
// Atomicity (SPEC.md "Atomic commit"): the archive is built in a temporary
// file "<path>.tmp.<host>.<pid>.<random>" in the same directory and renamed onto
// `path` only when complete (after fsync when durable). Until then `path` is
// untouched; a crash leaves at most the temporary file, which the next save
// to `path` removes once its process is gone. No "-lock" file is created.
//
// Throws Error(kAlreadyExists) if `path` exists and !options.overwrite;
// Error(kIo) when the OS refuses (ENOSPC...), leaving any previous file as it was.
// Thread-safety: concurrent saves to different paths are independent.
TREECASK_API SaveStats save(const std::filesystem::path& path, const TreeDef& treedef,
                            std::span<const LeafInput> leaves,
                            const SaveOptions& options = {});

// ---- asynchronous save --------------------------------------------------------
//
// Starts save(path, treedef, leaves, options) on a background thread and
// returns its future; SaveStats or the Error comes from future.get().
//
// Leaf bytes: for every leaf i with borrowed[i] == false (every leaf when
// `borrowed` is empty, the default) the bytes are copied into one fresh
// 64-byte-aligned buffer before save_async returns (a snapshot, on
// options.threads threads), so the caller may modify or free its memory as
// soon as the call returns; the buffer is freed when the save ends, before the
// future becomes ready. For a leaf with borrowed[i] == true nothing is copied:
// the caller keeps leaves[i].data alive and unchanged until the future is
// ready. Peak extra memory is the sum of the copied leaves' byte lengths plus
// what save() itself uses. With `pool` the snapshot buffer comes from and goes
// back to the pool (SnapshotPool below) instead of the OS.
//
// What is copied into the returned task: `path`, `treedef`, each LeafInput's
// metadata and `options` (options.progress is called from the background
// thread). Errors: every Error save() would throw (kInvalidArgument,
// kAlreadyExists, kIo...) is delivered by future.get(); save_async itself
// throws only Error(kInvalidArgument) when borrowed is neither empty nor of
// leaves.size() entries, std::bad_alloc when the snapshot cannot be
// allocated, and std::system_error when no thread can be started.
//
// The future is a std::async one: destroying it (or letting it go out of
// scope) without get() waits for the save to finish, so no save outlives the
// future that owns it. Thread-safety: as save(); concurrent save_async calls
// to different paths are independent.
class SnapshotPool;

TREECASK_API std::future<SaveStats> save_async(const std::filesystem::path& path,
                                               const TreeDef& treedef,
                                               std::span<const LeafInput> leaves,
                                               const SaveOptions& options = {},
                                               std::span<const bool> borrowed = {},
                                               SnapshotPool* pool = nullptr);

// Snapshot memory kept between save_async calls. Copying into memory that is
// already mapped and faulted in is several times faster than into fresh
// memory (no page fault per page), so a loop that saves every N steps blocks
// less. With a pool, save_async takes its snapshot buffer from the pool when
// the buffer held there is large enough (else frees it and maps a new one),
// and the buffer goes back to the pool instead of to the OS when the save ends.
// The pool holds at most one buffer: between saves, as much memory as the
// largest snapshot (held_bytes()). Pass the same pool to consecutive saves.
// Thread-safe; a pool destroyed while a save uses its buffer frees that
// buffer when the save ends.
class TREECASK_API SnapshotPool {
 public:
  SnapshotPool();
  ~SnapshotPool();
  SnapshotPool(const SnapshotPool&) = delete;
  SnapshotPool& operator=(const SnapshotPool&) = delete;
  uint64_t held_bytes() const;  // bytes of the idle buffer the pool holds now (0: none)
  void clear();                 // frees the idle buffer now

  struct Impl;  // private
 private:
  std::shared_ptr<Impl> impl_;
  friend std::future<SaveStats> save_async(const std::filesystem::path&, const TreeDef&,
                                           std::span<const LeafInput>, const SaveOptions&,
                                           std::span<const bool>, SnapshotPool*);
};

}  // namespace treecask
