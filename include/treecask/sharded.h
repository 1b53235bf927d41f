// Reading a sharded checkpoint: a directory that many processes wrote
// together (format 3.0; 3.1 binds the shard files, SPEC.md "Sharded checkpoints").
//
//   <dir>/index.cask      the treedef and, per leaf, the global shape, dtype,
//                         sharding, logical axes, metadata and ShardRefs
//   <dir>/<file>.cask     ordinary archives (format 1.0/2.0) whose leaves are
//                         the boxes the ShardRefs name (the Python writer
//                         names them process_<k>.cask)
//
// ShardedArchive presents the global arrays: a read of a whole leaf or of any
// hyperslab intersects the request with the saved boxes and reads, from each
// shard file, only the part of each box that lies in the request, straight
// into the caller's buffer (strided destination).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "treecask/archive.h"
#include "treecask/error.h"
#include "treecask/reader.h"
#include "treecask/types.h"

namespace treecask {

// File name of the index archive inside a sharded checkpoint directory.
inline constexpr std::string_view kShardedIndexName = "index.cask";

// A sharded checkpoint directory open for reading: a Reader (reader.h) whose
// leaves are the global arrays; the methods marked override are that
// interface's, with the contract stated here. A handle: copies share one
// state (the index and every shard file, kept open). All const methods are
// safe to call from many threads at once.
class TREECASK_API ShardedArchive final : public Reader {
 public:
  // True when `path` is a directory holding an index.cask (what open() takes),
  // or a URL (is_url) ending in '/': a checkpoint in a store is named by its
  // "directory" URL with the slash (docs/remote.md), asked nothing of the
  // store. Never throws.
  static bool is_sharded(const std::filesystem::path& path) noexcept;

  // Opens <dir>/index.cask and every file its ShardRefs name, each with
  // Archive::open(options) (same checks), all through one handle of the
  // directory (openat), so that a checkpoint replaced meanwhile by a commit
  // with overwrite is never mixed with its successor: when a file vanishes
  // because the directory was swapped, the open starts over on the new one
  // (at most kOpenAttempts times). Then SPEC.md "Sharded checkpoints" R9:
  // when the index binds its shard files (format 3.1), each file's manifest
  // length and XXH3 equal those the index recorded; R6: every ShardRef names
  // a leaf of its file whose dtype is the leaf's and whose shape is the box's
  // (stop - start), a leaf with bytes (no shard references of its own); R7:
  // the boxes of each leaf tile its global shape exactly (no overlap; the
  // index reader already checked that they lie inside it and that their
  // element counts add up). An index of format 3.0 binds nothing:
  // a shard file of another save with the same boxes is not detected there.
  // Cost: the manifests plus O(boxes^2) per leaf, no tensor bytes.
  // Throws Error: kNotFound (no directory / index.cask / shard file),
  // kNotAnArchive, kUnsupportedVersion, kCorruption (a shard file that is not
  // the one the index was committed with, naming the file, both fingerprints
  // and both save ids; a ShardRef that names no leaf, a wrong dtype or shape,
  // overlapping boxes; the message names the shard file and the leaf), kIo.
  // A `dir` that is a URL (is_url, remote.h) opens the objects
  // <dir>/index.cask and <dir>/<file> with open_url(), as the overload below.
  static ShardedArchive open(const std::filesystem::path& dir, const OpenOptions& options = {});

  // Opens a checkpoint whose files are objects of a store: `open_object(name)`
  // gives the Source of "index.cask" and of each shard file the index names
  // (Archive::open(Source) each, `threads` at a time: one round trip per
  // file; the manifests only, no tensor bytes). The checks and errors of the
  // overload above, each naming the object; `shown` is path(). A store has
  // no directory to swap, so there is no retry: a checkpoint overwritten
  // meanwhile fails the R9 binding check (kCorruption) instead of mixing.
  static ShardedArchive open(const SourceOpener& open_object, const std::string& shown,
                             const OpenOptions& options = {}, unsigned threads = 16);
  static constexpr int kOpenAttempts = 4;

  // Opens the sharded checkpoint whose index is `index`, an archive already
  // open from a local file: the shard files its ShardRefs name are opened
  // with `options` in the directory that holds it (path()'s parent), through
  // one directory handle, and every check of open() runs against this very
  // index (R5-R7, R9; not whatever index.cask the directory holds now, so an
  // index copied or renamed beside its shard files is checked against them).
  // What Archive::verify() of an index and `treecask verify DIR/index.cask`
  // run. path() is the directory. Throws what open() throws (kNotFound
  // naming a missing shard file, kCorruption naming a shard file of another
  // save or the index for overlapping boxes, ...), and kUnsupported for an
  // index read through a Source (open the checkpoint's directory URL, ending
  // in '/', instead).
  static ShardedArchive open_index(const Archive& index, const OpenOptions& options = {});

  // True when `archive` is the index of a sharded checkpoint: a leaf of it
  // has shard references (format 3.0 or later), so its leaves' bytes are in
  // other files. Cost: one LeafInfo per leaf of a format 3.x or later archive
  // until the first such leaf; nothing for older ones. Throws only
  // std::bad_alloc.
  static bool is_index(const Archive& archive);

  const std::string& path() const noexcept override;  // the directory
  const Archive& index() const noexcept;              // the index archive (treedef, metadata, leaf infos)
  size_t size() const noexcept override;              // number of leaves
  // The index's description of leaf `index`: global shape, dtype, sharding,
  // logical axes, metadata and its ShardRefs (LeafInfo::shards). byte_length
  // is the global array's; stored_bytes the sum over its boxes in the shard
  // files. Throws kInvalidArgument when index >= size().
  LeafInfo leaf(size_t index) const override;
  // The index archive's treedef, metadata, find() and subtree() (Archive's
  // contracts): a checkpoint's structure and key paths are its index's.
  const TreeDef& treedef() const noexcept override;
  const KeyValues& metadata() const noexcept override;
  std::optional<size_t> find(std::string_view key_path) const noexcept override;
  std::vector<size_t> subtree(std::string_view prefix) const override;
  // Shard file names (sorted) and the open archive of one of them
  // (kNotFound for a name the index does not use).
  std::vector<std::string> files() const;
  const Archive& file(std::string_view name) const;

  // Copies the whole global array of leaf `index` into `out` (C order,
  // exactly byte_length bytes, else kShapeMismatch): the bytes as a
  // single-file archive stores them, as Archive::read gives them, so
  // sub-byte dtypes (int4, uint4, ...) come packed (SPEC.md "Dtypes"). A
  // packed leaf saved in several boxes is read unpacked into a temporary of
  // one byte per element, then packed into `out`.
  // `threads` as read_slice's; the Reader overload (three arguments) passes 0.
  void read(size_t index, std::span<std::byte> out, Verify verify, unsigned threads) const;
  void read(size_t index, std::span<std::byte> out, Verify verify = Verify::kDefault) const override;

  // Copies many whole leaves, outs[k] receiving leaf indices[k]: every
  // index and output size checked (Reader's "arguments before bytes"), then
  // one read() per leaf, in order, each with `threads`. Throws as
  // Reader::read_many.
  void read_many(std::span<const size_t> indices, std::span<const std::span<std::byte>> outs,
                 Verify verify = Verify::kDefault, unsigned threads = 0) const override;

  // Copies the hyperslab [start, stop) of the global array (one entry per
  // dimension, 0 <= start[d] <= stop[d] <= shape[d]; both empty for a 0-d
  // leaf) into `out`, as Archive::read_slice writes a box: one element per
  // element size, and sub-byte dtypes (int4, uint4, ...) unpacked to one
  // byte per element, the value in the low bits and the other bits zero (the
  // ml_dtypes layout), whatever boxes the request crosses and wherever they
  // start. With empty `out_byte_strides` the slice is written C-contiguous
  // and out.size() must equal element count x element bytes; otherwise element
  // (i_0, ..., i_{r-1}) of the slice goes to byte sum(i_d * out_byte_strides[d])
  // of `out` (non-negative strides, every element inside `out`). Only the
  // parts of the saved boxes that intersect the request are read, each from
  // its shard file with Archive::read_slice semantics (only the chunks that
  // hold it, checksums verified per `verify`).
  // Throws kInvalidArgument (bad ranges or strides), kShapeMismatch (out too
  // small / wrong size), kChecksumMismatch, kCorruption.
  void read_slice(size_t index, std::span<const int64_t> start, std::span<const int64_t> stop,
                  std::span<std::byte> out, std::span<const int64_t> out_byte_strides = {},
                  Verify verify = Verify::kDefault, unsigned threads = 0) const override;

  // Several hyperslabs of leaf `index`: every box's arguments checked
  // (Reader's "arguments before bytes"), then each box read as read_slice()
  // reads it, in order (the boxes may overlap in the leaf, their outputs must
  // not). Throws as read_slice().
  void read_slices(size_t index, std::span<const SliceRequest> boxes, Verify verify = Verify::kDefault,
                   unsigned threads = 0) const override;

  // Checks every chunk of every shard file (Archive::verify of each, errors
  // naming the shard file) -- the tiling of every leaf, and that each box is
  // a leaf with bytes of its own (no shard file is itself an index), were
  // checked at open.
  // `progress` gets (raw bytes checked, raw bytes in all files).
  std::vector<Error> verify(const std::function<void(uint64_t, uint64_t)>& progress = {}) const override;

  struct Impl;

 private:
  // Opens the index and the shard files it names with `at(name)`, `threads`
  // files at a time, and runs the checks open() lists; `shown` names the
  // checkpoint in errors and path().
  static std::shared_ptr<const Impl> open_once(const std::string& shown,
                                               const std::function<Archive(const std::string&)>& at,
                                               unsigned threads);
  explicit ShardedArchive(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Opens `path` as whatever it names: a sharded checkpoint directory (or a
// URL ending in '/') when ShardedArchive::is_sharded(path), with
// ShardedArchive::open, anything else with Archive::open, both with
// `options`. Cost: the manifests, no tensor bytes. The caller owns the result.
// Throws what those throw: Error(kNotFound), kNotAnArchive,
// kUnsupportedVersion, kCorruption, kChecksumMismatch, kUnsupported, kIo.
TREECASK_API std::unique_ptr<Reader> open_reader(const std::filesystem::path& path,
                                                 const OpenOptions& options = {});

}  // namespace treecask
