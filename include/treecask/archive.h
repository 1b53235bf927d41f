// Reading an archive: a read-only memory map, zero-copy views, partial reads.
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

#include "treecask/error.h"
#include "treecask/reader.h"
#include "treecask/signing.h"
#include "treecask/source.h"
#include "treecask/types.h"

namespace treecask {

struct OpenOptions {
  // Default for reads that pass Verify::kDefault: check each chunk's XXH3
  // before its bytes are returned. Turn off for trusted files on hot paths.
  bool verify_checksums = true;
  // Before LMDB maps the file, walk every B-tree page its reads can reach
  // (page headers, node bounds, key order, overflow runs, no cycles; SPEC.md
  // "Reader checks"), so that a damaged or hostile file is an Error, never a
  // crash. Costs one pread per index page (not per tensor byte; the first page
  // of each blob's overflow run is read at the blob's first use). Turn off only
  // for files you trust, e.g. ones this process just wrote.
  bool validate_structure = true;
  // Set: a signed open (signing.h; docs/signing.md). The open checks the
  // bundle's envelope once (DSSE + ECDSA with the public key) and finds this
  // file in its statement (a file model named as this file, or this file's
  // name in a signed directory named as its directory), then hands out and
  // trusts only bytes whose signed ranges it has hashed: the open hashes the
  // shards holding the LMDB meta pages, the B-tree pages, the header record
  // and the manifest in one pass on all cores before it returns, having
  // opened the file meanwhile as an unsigned open does (validate_structure is
  // forced on: the walk, safe on any bytes, checks and finds those pages
  // before LMDB sees them), and reports a mismatch before any other error;
  // each read, view, verify() and fetch hashes the shards
  // covering the bytes it uses before using them (a read of S bytes hashes at
  // most S + 2 shards), each shard once per process (cached by file identity:
  // device, inode, size, mtime); zero-copy views only after. With file
  // serialization the open hashes the whole file once. Over a Source, every
  // fetch is widened to whole shards, hashed as it arrives, and not cached.
  // A mismatch throws Error(kSignature) naming the file, the leaf (for a
  // read) and the byte range; a signature that does not verify, is for
  // another file, or does not cover the file's exact length throws
  // kSignature at open.
  std::optional<SignatureCheck> signature;
};

// An open archive. Copies share one mapping; the map stays alive while any
// copy does, and every span returned points into it and is valid as long as
// some copy of the Archive lives. All const methods are safe to call from
// many threads at once. Many processes may open the same file: they share one
// copy of its pages in the page cache.
//
// Every method that takes a leaf index throws Error(kInvalidArgument) when
// the index is not below size(). Out of memory is std::bad_alloc, as
// error.h says. Archive is a Reader (reader.h): the methods marked override
// are that interface's, with the contract stated here.
class TREECASK_API Archive final : public Reader {
 public:
  // Maps `path` read-only (works on read-only files and directories; takes no
  // lock and writes nothing). Checks the LMDB meta pages against the file
  // length, the LMDB B-tree structure (unless options.validate_structure is
  // false), the header record, the manifest checksum, the FlatBuffers verifier
  // and every manifest invariant of SPEC.md "Reader checks" before returning.
  // Cost is proportional to the manifest, not to the tensor bytes: no blob is
  // read here. A blob's own header (and its LMDB overflow page header) is
  // checked before the first use of any of its bytes (SPEC.md "Before a
  // blob's first use"), so an archive whose only damage is a blob header
  // opens, and every view, read or verify() that needs that blob throws
  // kCorruption naming the leaf.
  // Throws Error: kNotFound, kNotAnArchive, kUnsupportedVersion (newer major
  // version), kCorruption (truncated file, bad manifest), kChecksumMismatch
  // (the manifest does not match the header's XXH3), kUnsupported (a dtype
  // value of a later format), kIo.
  // A `path` that is a URL (is_url, remote.h: s3://, gs://, http(s)://)
  // opens the object with open_url() and the default RemoteOptions; a
  // scheme treecask does not serve throws kUnsupported naming it (never
  // taken for a local path).
  static Archive open(const std::filesystem::path& path, const OpenOptions& options = {});

  // Opens an archive read by range from `source` (source.h): the checks
  // above, every one, on bytes read through it (options.validate_structure
  // is ignored: the B-tree walk is how a remote open finds the values). The
  // first read asks for the object's first kOpenHeadBytes and last
  // kOpenTailBytes in one Source::read call (source.h), which on a file of
  // this version holds the meta pages, the B-tree pages and the manifest:
  // one round trip (SPEC.md "Remote reading"); B-tree pages outside them
  // are fetched level by level. No blob is read. The archive keeps those
  // bytes and `source`, and reads leaf bytes through it: view(),
  // view_parts() throw kUnsupported and view_many() gives no view (there is
  // no map); every read fetches the chunks it needs that the open's bytes
  // do not hold, coalesced and concurrent (Source::concurrency()), each
  // checked against its XXH3 as a local read is. Throws what open(path)
  // throws (naming source->name()), and what the source throws (kIo,
  // kNotFound, kCorruption for an object that changed).
  static Archive open(std::shared_ptr<const Source> source, const OpenOptions& options = {});

  // The source of a remote archive, nullptr for a local file.
  const Source* source() const noexcept;

  const std::string& path() const noexcept override;
  uint64_t file_size() const noexcept;
  uint16_t format_major() const noexcept;
  uint16_t format_minor() const noexcept;
  const std::string& library_version() const noexcept;  // of the writer
  int64_t created_unix_ns() const noexcept;
  const KeyValues& metadata() const noexcept override;  // archive-level
  const TreeDef& treedef() const noexcept override;
  // This file's fingerprint for the index of a sharded checkpoint (format
  // 3.1, SPEC.md "Sharded checkpoints" R8/R9): `file` is the last component
  // of path(), the numbers are the header record's manifest_length (bytes)
  // and manifest_checksum (XXH3-64, seed 0), verified at open.
  ShardFile manifest_fingerprint() const;
  // The shard files this archive binds, when it is the index of a sharded
  // checkpoint written as format 3.1 or later (SaveOptions::shard_files; R8
  // checked at open); empty for every other archive, an index of format 3.0
  // included (unbound: ShardedArchive then checks dtypes and shapes only).
  const std::vector<ShardFile>& shard_files() const noexcept;

  size_t size() const noexcept override;  // number of leaves
  // What the manifest says about leaf `index`. Throws kInvalidArgument when
  // index >= size().
  LeafInfo leaf(size_t index) const override;
  std::optional<size_t> find(std::string_view key_path) const noexcept override;
  // Like find(), but throws Error(kKeyNotFound) naming the key path.
  size_t index_of(std::string_view key_path) const;
  // Indices of the leaves at or under `prefix` (whole components only:
  // "enc" does not select "encoder/w"); "" selects every leaf.
  // Throws Error(kKeyNotFound) if none.
  std::vector<size_t> subtree(std::string_view prefix) const override;

  // Zero-copy read-only view of a raw (Codec::kNone) leaf stored in one part.
  // The first byte is 64-byte aligned (SPEC.md "Alignment"); a 0-byte leaf
  // gives an empty span. Verifies every chunk when asked (touching every byte).
  // Throws kUnsupported for an LZ4 leaf or one stored in several parts (use
  // view_parts() or read()), kChecksumMismatch, kCorruption.
  std::span<const std::byte> view(size_t index, Verify verify = Verify::kDefault) const;
  // The zero-copy parts of a raw leaf, in order; their concatenation is the leaf.
  std::vector<std::span<const std::byte>> view_parts(size_t index,
                                                     Verify verify = Verify::kDefault) const;

  // Zero-copy views of many leaves at once, each leaf's chunks checksummed
  // once when asked (the whole-tree load without a copy). out[k] is
  // view(indices[k]) for a raw leaf stored in one part (a 0-byte leaf: an
  // empty span), and std::nullopt for a leaf that has no zero-copy view (LZ4,
  // several parts): read those with read(). The chunks of all viewed leaves
  // are shared among `threads` threads (0 = all cores), hashed through the
  // map. Mapped pages are page cache: resident memory grows by no private page.
  // The spans are valid while this Archive lives, as view()'s. Throws
  // kInvalidArgument (index out of range), kUnsupported (a leaf of a sharded
  // checkpoint's index), kCorruption (a one-part leaf whose chunks are not
  // contiguous), kChecksumMismatch naming the first damaged leaf found.
  std::vector<std::optional<std::span<const std::byte>>> view_many(
      std::span<const size_t> indices, Verify verify = Verify::kDefault, unsigned threads = 0) const;

  // Copies (decompressing where needed) the whole leaf into `out`.
  // REQUIRES out.size() == byte_length, else Error(kShapeMismatch).
  // Threads: a leaf of 8 MiB or more is read by
  // std::thread::hardware_concurrency() threads (its chunks shared among the
  // calling thread and helpers started for the call); a smaller one by the
  // calling thread alone. read_many() takes a thread count.
  // Throws kInvalidArgument (index), kShapeMismatch, kUnsupported (a leaf of a
  // sharded checkpoint's index), kChecksumMismatch, kCorruption (a damaged
  // blob header or LZ4 block), each naming the file and the key path.
  void read(size_t index, std::span<std::byte> out, Verify verify = Verify::kDefault) const override;

  // Copies many leaves at once: outs[k] receives leaf indices[k] (each
  // exactly byte_length bytes, else kShapeMismatch). The chunks of all leaves
  // are shared among `threads` threads (0 = all cores), copied with pread()
  // from the page cache and checksummed in the same pass: the full-load path.
  // Every index and output size is checked before any leaf is read (Reader's
  // "arguments before bytes", reader.h). Throws as read(), for the first
  // damaged leaf found.
  void read_many(std::span<const size_t> indices, std::span<const std::span<std::byte>> outs,
                 Verify verify = Verify::kDefault, unsigned threads = 0) const override;

  // Copies rows [row_begin, row_end) along axis 0 into `out`, touching and
  // decompressing only the chunks those rows lie in (read_bytes of the rows'
  // bytes; packed sub-byte dtypes stay packed). REQUIRES rank >= 1,
  // 0 <= row_begin <= row_end <= shape[0], a row of whole bytes, and
  // out.size() == (row_end - row_begin) * row bytes. Throws kInvalidArgument,
  // kShapeMismatch, kChecksumMismatch, kCorruption.
  void read_rows(size_t index, int64_t row_begin, int64_t row_end, std::span<std::byte> out,
                 Verify verify = Verify::kDefault) const;

  // ---- Partial reads: N-d slices and byte ranges (SPEC.md "Per read") ----
  //
  // These touch, copy and decompress only the chunks that hold the requested
  // bytes, verify each such chunk's XXH3 (whole chunk, when verifying, as every
  // read does) before using its bytes, and write straight into the caller's
  // buffer. Chunks wholly inside one contiguous piece of the destination are
  // decoded in place. Any other raw chunk passes through a scratch buffer of
  // at most 512 KiB, piece by piece (copied, hashed and scattered while in
  // cache; its checksum compared once the whole chunk is hashed); any other
  // LZ4 chunk is decoded into a chunk-sized scratch buffer, which also holds
  // its stored bytes and, when byte-shuffled, one more chunk. Scratch buffers
  // come from a free list of the call: at most one in use per thread.
  //
  // Threads: the chunks are shared among the calling thread and up to
  // `threads` - 1 threads started for the call; `threads` 0 means
  // std::thread::hardware_concurrency() when the chunks touched hold >= 8 MiB
  // and the calling thread alone otherwise. Each chunk is decoded by one
  // thread, once, whatever the number of boxes it feeds.

  // Copies the box [start, stop) of leaf `index` into `out` (layout: see
  // SliceRequest). Elements are written as the file stores them (SPEC.md
  // "Dtypes"), except the packed sub-byte dtypes (dtype_packed: int2, uint2,
  // int4, uint4, float4_e2m1fn, float6_*), which are unpacked to one byte per
  // element, the value in the low dtype_bits bits and the other bits zero (the
  // ml_dtypes layout), so that every box of a packed leaf can be read;
  // pack_elements (types.h) packs them back.
  // REQUIRES: start.size() == stop.size() == rank; 0 <= start[d] <= stop[d] <=
  // shape[d]; out_byte_strides empty or of size rank, no stride 0 along a
  // dimension of extent > 1, and no two elements at the same address (else
  // which value lands is unspecified); with empty strides out.size() ==
  // element count * element bytes (1 for a packed dtype), with strides out.size()
  // >= the span the strides address.
  // Throws kInvalidArgument (bad index, rank, range or strides: the message
  // names the dimension), kShapeMismatch (out size), kChecksumMismatch,
  // kCorruption (an LZ4 chunk that does not decode to its size). Every error
  // names the file and the leaf's key path; the arguments are checked before
  // anything is written (Reader's "arguments before bytes", reader.h).
  void read_slice(size_t index, std::span<const int64_t> start, std::span<const int64_t> stop,
                  std::span<std::byte> out, std::span<const int64_t> out_byte_strides = {},
                  Verify verify = Verify::kDefault, unsigned threads = 0) const override;

  // Like read_slice for several boxes of one leaf at once (e.g. every shard
  // of a sharded restore): every argument is checked first, then each chunk
  // any box needs is decoded and checksummed once, and scattered to every box
  // it feeds. The boxes may overlap in the leaf; their outputs must not.
  void read_slices(size_t index, std::span<const SliceRequest> boxes,
                   Verify verify = Verify::kDefault, unsigned threads = 0) const override;

  // Copies raw leaf bytes [offset, offset + out.size()) into `out`: the bytes
  // as stored after decoding (sub-byte dtypes stay packed, SPEC.md
  // "Dtypes"), touching only the chunks that hold them. REQUIRES offset +
  // out.size() <= byte_length, else kInvalidArgument. Threads as above.
  // Throws kInvalidArgument, kChecksumMismatch, kCorruption.
  void read_bytes(size_t index, uint64_t offset, std::span<std::byte> out,
                  Verify verify = Verify::kDefault) const;

  // Checks every chunk of every leaf: its checksum and, for LZ4 chunks,
  // decoding to exactly the declared size. Returns one Error per damaged leaf
  // (empty: intact). `progress`, when set, is called after each leaf with
  // (raw bytes checked so far, raw bytes in all), from the calling thread; the
  // last call reports (total, total), (0, 0) for an archive without leaves.
  // The index of a sharded checkpoint (ShardedArchive::is_index) holds no
  // leaf bytes: its verify() is ShardedArchive::open_index(*this).verify(),
  // the checkpoint with the shard files beside it (a missing one, one of
  // another save, overlapping boxes: thrown as that open throws them; a
  // damaged chunk: an Error naming its shard file), progress over their bytes.
  // A signed local archive (OpenOptions::signature): every signed byte too,
  // in one pass on all cores, shard by shard, each shard's chunks checked
  // after it is hashed; a shard that does not match is an Error(kSignature)
  // of each leaf with a chunk ending in it, else one naming no leaf, after
  // the leaves' (docs/signing.md "What is verified when").
  std::vector<Error> verify(const std::function<void(uint64_t, uint64_t)>& progress = {}) const override;

  struct Impl;

 private:
  friend class ShardedArchive;
  // open() of `name` relative to the directory open as `dir_fd` (openat;
  // AT_FDCWD: the working directory), reported as `shown` in errors and
  // path(): ShardedArchive opens every file of a checkpoint through one
  // directory handle, so a directory replaced meanwhile cannot mix two.
  static Archive open_at(int dir_fd, const std::filesystem::path& name, const std::string& shown,
                         const OpenOptions& options);
  explicit Archive(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace treecask
