// Reading a checkpoint, whatever holds it: the read API that Archive (one
// archive file or object, archive.h) and ShardedArchive (a sharded checkpoint
// directory, sharded.h) share, so that code which only reads (an export, a
// binding) is written once for both. open_reader() (sharded.h) opens either.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "treecask/error.h"
#include "treecask/export.h"
#include "treecask/types.h"

namespace treecask {

// Whether a read checks each chunk's XXH3 before its bytes are used:
// kDefault follows OpenOptions::verify_checksums of the open.
enum class Verify : uint8_t { kDefault, kYes, kNo };

// What the manifest says about one leaf.
struct LeafInfo : LeafMeta {
  size_t index = 0;            // position in pre-order
  uint64_t byte_length = 0;    // raw bytes
  uint64_t stored_bytes = 0;   // bytes in the file (compressed where LZ4)
  Codec codec = Codec::kNone;
  Filter filter = Filter::kNone;  // applied to each chunk before its codec (format 2.0)
  uint64_t chunk_size = 0;     // raw bytes per chunk
  uint32_t num_chunks = 0;
  uint32_t num_parts = 0;      // zero-copy pieces of a raw leaf (SPEC.md "Large leaves")
  // Whether view() serves this leaf: raw, stored in at most one part, in a
  // local archive (a remote one has no map), and not a leaf of a sharded
  // checkpoint's index (its bytes are in other files).
  bool has_view = false;

  // Whether the leaf can be handed out as an array that views the map, no
  // copy made: view() serves it (has_view) and its elements are whole bytes,
  // so the view's bytes are the array's memory. A packed sub-byte dtype
  // (dtype_packed: several elements per byte in the file) is held one element
  // per byte in memory (NumPy with ml_dtypes), so its leaves are unpacked
  // into fresh arrays instead (read_slice). The one rule for the Python
  // package's LeafInfo.zero_copy, Archive[key] and load(copy=False).
  bool zero_copy() const noexcept { return has_view && !dtype_packed(dtype); }
};

// One box of a leaf for read_slices(): elements start[d] <= i_d < stop[d]
// (int64, C order, one entry per dimension; a 0-d leaf takes empty spans).
// Element (i_0, ..., i_r-1) of the box, counted from start, is written at
// out.data() + sum_d (i_d - start[d]) * out_byte_strides[d] - o_min, where
// o_min is the least value of that sum over the box (0 unless a stride is
// negative): `out` is the smallest span holding every element, as for a
// NumPy view. Empty strides mean C-contiguous. The spans are borrowed for
// the call only.
struct SliceRequest {
  std::span<const int64_t> start;
  std::span<const int64_t> stop;
  std::span<std::byte> out;
  std::span<const int64_t> out_byte_strides;
};

// An open checkpoint's facts and reads, implemented by Archive and
// ShardedArchive (both final): code that only reads takes a `const Reader&`
// and serves both.
//
// Leaves are numbered 0..size()-1 in the treedef's pre-order; a leaf's bytes
// are its C-order elements as SPEC.md "Dtypes" stores them. For a
// ShardedArchive every leaf is the global array, assembled from the boxes its
// shard files hold; its treedef, metadata and key lookups are its index
// archive's.
//
// Thread-safety: every method is const and safe to call from many threads at
// once. Ownership: the references returned (path(), treedef(), metadata())
// point into the open checkpoint and stay valid while this object or a copy
// of it (Archive and ShardedArchive are handles sharing one state) lives;
// the spans a read takes are borrowed for the call only.
//
// Errors, for every method that takes a leaf index: Error(kInvalidArgument)
// when the index is not below size(). Reads throw kShapeMismatch for an
// output of the wrong size, kChecksumMismatch (a chunk's XXH3, when
// verifying), kCorruption (a damaged blob or LZ4 block), kIo and kNotFound
// (a remote object that failed or vanished), each naming the file and the
// leaf's key path. Out of memory is std::bad_alloc (error.h). Each
// implementation's header lists the errors its methods add (e.g.
// Archive::read's kUnsupported for a leaf of a sharded checkpoint's index
// opened as a plain archive).
//
// Arguments before bytes: a read checks all its arguments -- for read_many
// and read_slices those of every leaf or box of the call, not only the
// first -- before it reads or writes any byte, so an argument error
// (kInvalidArgument, kShapeMismatch, an implementation's kUnsupported)
// leaves every output untouched. Only the read errors (kChecksumMismatch,
// kCorruption, kIo, kNotFound) leave outputs partly written: the failing
// one, and for read_many / read_slices any other of the call.
//
// Cost: one virtual call per method call; a read does its chunk work inside
// the implementation, so a read through a Reader costs what the same read on
// the concrete class costs.
class TREECASK_API Reader {
 public:
  using SliceRequest = treecask::SliceRequest;

  virtual ~Reader();

  // The file (Archive) or directory (ShardedArchive) as opened, URLs as given.
  virtual const std::string& path() const noexcept = 0;
  // Number of leaves.
  virtual size_t size() const noexcept = 0;
  // What the manifest says about leaf `index` (for a ShardedArchive the
  // global array: shape, dtype, sharding, its ShardRefs; stored_bytes summed
  // over its boxes). Throws kInvalidArgument when index >= size().
  virtual LeafInfo leaf(size_t index) const = 0;
  // The pytree structure (SPEC.md "Treedef") and the archive-level metadata.
  virtual const TreeDef& treedef() const noexcept = 0;
  virtual const KeyValues& metadata() const noexcept = 0;
  // The index of the leaf at canonical key path `key_path` (SPEC.md "Key
  // paths"), or std::nullopt when there is none.
  virtual std::optional<size_t> find(std::string_view key_path) const noexcept = 0;
  // Indices of the leaves at or under `prefix` (whole components only:
  // "enc" does not select "encoder/w"), ascending; "" selects every leaf.
  // Throws Error(kKeyNotFound) if none.
  virtual std::vector<size_t> subtree(std::string_view prefix) const = 0;

  // Copies the whole leaf into `out`: exactly byte_length bytes (else
  // kShapeMismatch), the bytes as stored after decoding (sub-byte dtypes
  // packed, SPEC.md "Dtypes").
  virtual void read(size_t index, std::span<std::byte> out, Verify verify = Verify::kDefault) const = 0;
  // Copies many leaves: outs[k] receives leaf indices[k] as read() gives it.
  // `threads`: 0 = all cores. Throws kInvalidArgument when the two spans
  // differ in length or an index is not below size(), kShapeMismatch when
  // an outs[k] is not exactly leaf indices[k]'s byte_length (all checked
  // before any leaf is read), and the read errors above for a failing leaf.
  virtual void read_many(std::span<const size_t> indices, std::span<const std::span<std::byte>> outs,
                         Verify verify = Verify::kDefault, unsigned threads = 0) const = 0;
  // Copies the box [start, stop) of leaf `index` into `out` (layout: see
  // SliceRequest): elements as stored, except the packed sub-byte dtypes,
  // unpacked to one byte per element (the value in the low bits, the others
  // zero). REQUIRES start.size() == stop.size() == rank, 0 <= start[d] <=
  // stop[d] <= shape[d]; with empty strides out.size() == element count x
  // element bytes; with strides (non-negative, Archive also takes negative
  // ones; 0 only on a dimension of at most one element) every element
  // inside `out`. Throws kInvalidArgument (index, range,
  // rank, strides), kShapeMismatch (out size), both before anything is
  // written, and the read errors above. `threads`: 0 = all cores for large
  // reads.
  virtual void read_slice(size_t index, std::span<const int64_t> start, std::span<const int64_t> stop,
                          std::span<std::byte> out, std::span<const int64_t> out_byte_strides = {},
                          Verify verify = Verify::kDefault, unsigned threads = 0) const = 0;
  // read_slice() of several boxes of one leaf: the boxes may overlap in the
  // leaf, their outputs must not. Throws as read_slice(); every box's
  // arguments are checked before any box is read.
  virtual void read_slices(size_t index, std::span<const SliceRequest> boxes,
                           Verify verify = Verify::kDefault, unsigned threads = 0) const = 0;

  // Checks every chunk of every leaf (of every shard file): its checksum and,
  // for LZ4 chunks, decoding to exactly the declared size. Returns one Error
  // per damaged leaf (empty: intact); throws only what opening could not
  // foresee (kIo of a remote read, std::bad_alloc). `progress`, when set, is
  // called from the calling thread with (raw bytes checked so far, raw bytes
  // in all).
  virtual std::vector<Error> verify(const std::function<void(uint64_t, uint64_t)>& progress = {}) const = 0;

 protected:
  // Copied and assigned only as part of an Archive or ShardedArchive.
  Reader() = default;
  Reader(const Reader&) = default;
  Reader(Reader&&) = default;
  Reader& operator=(const Reader&) = default;
  Reader& operator=(Reader&&) = default;
};

}  // namespace treecask
