// Files the conversions read and write: a read-only map of an input file, an
// output file committed atomically, and the streaming of one leaf.
// Part of the treecask_interop library (src/interop/CMakeLists.txt), which
// the `treecask` tool and the Python extension link.
// Every failure is a treecask::Error naming the file concerned.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "treecask/treecask.h"

namespace treecask::interop {

// A whole file mapped read-only (MAP_SHARED, PROT_READ). Move-only; the bytes
// stay valid until the MappedFile is destroyed or assigned to. An empty file
// gives an empty span. The file must not be truncated while it is mapped (a
// read past the new end raises SIGBUS): inputs are files the caller does not
// change meanwhile.
class MappedFile {
 public:
  // Throws Error(kNotFound) if `path` (or a directory on the way) does not
  // exist; Error(kIo) if it cannot be opened, is not a regular file, or cannot
  // be mapped.
  static MappedFile open(const std::filesystem::path& path);

  MappedFile() = default;  // maps nothing
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  // The file's bytes, owned by this object (see the class comment).
  std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }
  // The path given to open().
  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

// An output file written to treecask::temporary_path(path) in the same directory
// and published onto `path` by commit() after fsync (treecask::publish: the
// commit path save() uses, SPEC.md "Atomic commit"), so `path` is either
// untouched or complete.
// Destroying an uncommitted OutputFile removes the temporary file.
// Not thread-safe: one writer.
class OutputFile {
 public:
  // Throws Error(kAlreadyExists) if `path` exists and !overwrite, Error(kIo) if
  // the temporary file cannot be created.
  OutputFile(const std::filesystem::path& path, bool overwrite);
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  ~OutputFile();

  // Appends `bytes` to the temporary file. Throws Error(kIo) (e.g. ENOSPC).
  void write(std::span<const std::byte> bytes);
  void write(std::string_view text) {
    write(std::as_bytes(std::span<const char>(text.data(), text.size())));
  }
  // Bytes appended so far.
  uint64_t bytes_written() const noexcept { return written_; }
  // fsyncs, renames onto the final path (refusing one that appeared meanwhile
  // unless overwrite: Error(kAlreadyExists)) and fsyncs the directory.
  // Throws Error(kIo), also when the directory cannot be fsynced.
  // REQUIRES: commit() not called before.
  void commit();

 private:
  std::string path_;
  std::string tmp_path_;
  bool overwrite_;
  int fd_ = -1;
  uint64_t written_ = 0;
  bool committed_ = false;
};

// Hands the bytes of leaf `index` of `reader`, exactly LeafInfo::byte_length
// of them as Reader::read gives them (C order; sub-byte dtypes packed), to
// `sink` in order, in one or more pieces (each a std::span<const std::byte>,
// valid only during its call); none for an empty leaf. An Archive: pieces of
// at most ~64 MiB (whole chunks), each read with Archive::read_bytes (all
// cores, only the chunks of that piece). Any other Reader (a ShardedArchive):
// the whole leaf at once, with Reader::read, so peak memory is the leaf's
// size. Checksums are verified as the reader was opened to (OpenOptions).
// Throws what those reads throw (kChecksumMismatch, kCorruption, kIo) and
// what `sink` throws.
template <typename Sink>
void for_each_leaf_piece(const Reader& reader, size_t index, Sink&& sink);

// ---------------------------------------------------------------------------

template <typename Sink>
void for_each_leaf_piece(const Reader& reader, size_t index, Sink&& sink) {
  const LeafInfo info = reader.leaf(index);
  if (info.byte_length == 0) return;
  const auto* archive = dynamic_cast<const Archive*>(&reader);
  if (!archive) {
    std::vector<std::byte> whole(info.byte_length);
    reader.read(index, whole);
    sink(std::span<const std::byte>(whole));
    return;
  }
  constexpr uint64_t kBatchBytes = uint64_t{64} << 20;
  const uint64_t chunk = std::max<uint64_t>(info.chunk_size, 1);
  const uint64_t batch = std::min(info.byte_length, std::max<uint64_t>(kBatchBytes / chunk, 1) * chunk);
  std::vector<std::byte> buffer(batch);
  for (uint64_t at = 0; at < info.byte_length; at += batch) {
    std::span<std::byte> out(buffer.data(), std::min(batch, info.byte_length - at));
    archive->read_bytes(index, at, out);
    sink(std::span<const std::byte>(out));
  }
}

}  // namespace treecask::interop
