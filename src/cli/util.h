// Small pieces the `treecask` tool's commands share: a read-only file map, an
// atomically committed output file, a terminal progress bar and formatting.
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

namespace treecask::cli {

// A whole file mapped read-only (MAP_SHARED, PROT_READ). Move-only; the bytes
// stay valid until the MappedFile is destroyed. An empty file gives an empty span.
class MappedFile {
 public:
  // Throws Error(kNotFound) if `path` does not exist, Error(kIo) if it cannot be
  // opened or mapped or is not a regular file.
  static MappedFile open(const std::filesystem::path& path);

  MappedFile() = default;  // maps nothing
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }
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
class OutputFile {
 public:
  // Throws Error(kAlreadyExists) if `path` exists and !overwrite, Error(kIo) if
  // the temporary file cannot be created.
  OutputFile(const std::filesystem::path& path, bool overwrite);
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  ~OutputFile();

  // Appends `bytes`. Throws Error(kIo) (e.g. ENOSPC).
  void write(std::span<const std::byte> bytes);
  void write(std::string_view text) {
    write(std::as_bytes(std::span<const char>(text.data(), text.size())));
  }
  uint64_t bytes_written() const noexcept { return written_; }
  // fsyncs, renames onto the final path (refusing one that appeared meanwhile
  // unless overwrite: Error(kAlreadyExists)) and fsyncs the directory.
  // Throws Error(kIo), also when the directory cannot be fsynced.
  void commit();

 private:
  std::string path_;
  std::string tmp_path_;
  bool overwrite_;
  int fd_ = -1;
  uint64_t written_ = 0;
  bool committed_ = false;
};

// A one-line progress bar on stdout, drawn only when stdout is a terminal;
// otherwise every call does nothing. The line is erased on destruction.
class Progress {
 public:
  Progress(std::string label, uint64_t total_bytes);
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  ~Progress();
  void update(uint64_t done_bytes);
  // Erases the bar (if drawn) so that normal output can follow; idempotent.
  void finish();
  // True when drawing (stdout is a terminal).
  bool enabled() const noexcept { return enabled_; }

 private:
  std::string label_;
  uint64_t total_;
  bool enabled_;
  bool drawn_ = false;
  int last_permille_ = -1;
  int64_t last_draw_ns_ = 0;
};

// Copies the raw bytes of leaf `index` to `sink` in order, in pieces: zero-copy
// views for a raw leaf; bounded row batches (at most ~64 MiB) for an LZ4 leaf
// where rows are whole bytes, else one buffer of the whole leaf. `sink` is called
// with each piece (a std::span<const std::byte>, valid only during the call).
// Checksums are verified as the archive was opened to (OpenOptions).
// Throws what Archive::view_parts/read/read_rows throw.
template <typename Sink>
void for_each_leaf_piece(const Archive& archive, size_t index, Sink&& sink);

// "[384,1536]"; "[]" for a scalar.
std::string format_shape(std::span<const int64_t> shape);
// "90868224 (86.7 MiB)"; small values without the parenthesis.
std::string format_bytes(uint64_t bytes);
// ISO 8601 UTC with nanoseconds, e.g. "2025-11-22T10:41:00.123456789Z".
std::string format_unix_ns(int64_t unix_ns);
// The text with control characters and backslashes escaped as in JSON
// (\n, \t, \u0001...), for one-line human output. Other bytes pass through.
std::string escape_for_terminal(std::string_view text);

// ---------------------------------------------------------------------------

template <typename Sink>
void for_each_leaf_piece(const Archive& archive, size_t index, Sink&& sink) {
  const LeafInfo info = archive.leaf(index);
  if (info.byte_length == 0) return;
  if (info.codec == Codec::kNone) {
    for (std::span<const std::byte> part : archive.view_parts(index)) sink(part);
    return;
  }
  constexpr uint64_t kBatchBytes = uint64_t{64} << 20;
  const bool whole_rows = !info.shape.empty() && info.shape[0] > 0 &&
                          info.byte_length % static_cast<uint64_t>(info.shape[0]) == 0 &&
                          dtype_bits(info.dtype) % 8 == 0;
  if (!whole_rows || info.byte_length <= kBatchBytes) {
    std::vector<std::byte> buffer(info.byte_length);
    archive.read(index, buffer);
    sink(std::span<const std::byte>(buffer));
    return;
  }
  const int64_t rows = info.shape[0];
  const uint64_t row_bytes = info.byte_length / static_cast<uint64_t>(rows);
  const int64_t batch = static_cast<int64_t>(std::max<uint64_t>(1, kBatchBytes / row_bytes));
  std::vector<std::byte> buffer(static_cast<size_t>(batch) * row_bytes);
  for (int64_t begin = 0; begin < rows; begin += batch) {
    const int64_t end = std::min(rows, begin + batch);
    std::span<std::byte> out(buffer.data(), static_cast<size_t>(end - begin) * row_bytes);
    archive.read_rows(index, begin, end, out);
    sink(std::span<const std::byte>(out));
  }
}

}  // namespace treecask::cli
