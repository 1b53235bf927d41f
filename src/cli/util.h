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

// True when `def` is a dict of leaves only: export and the Hugging Face layout
// name tensors by the dict's keys verbatim (else by key paths).
bool is_flat_dict(const TreeDef& def);

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

// Copies the raw bytes of leaf `index` to `sink` in order, in pieces of at
// most ~64 MiB (whole chunks), each read with Archive::read_bytes (all cores,
// only the chunks of that piece). `sink` is called with each piece (a
// std::span<const std::byte>, valid only during the call). Checksums are
// verified as the archive was opened to (OpenOptions).
// Throws what Archive::read_bytes throws.
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
  constexpr uint64_t kBatchBytes = uint64_t{64} << 20;
  const uint64_t chunk = std::max<uint64_t>(info.chunk_size, 1);
  const uint64_t batch = std::min(info.byte_length, std::max<uint64_t>(kBatchBytes / chunk, 1) * chunk);
  std::vector<std::byte> buffer(batch);
  for (uint64_t at = 0; at < info.byte_length; at += batch) {
    std::span<std::byte> out(buffer.data(), std::min(batch, info.byte_length - at));
    archive.read_bytes(index, at, out);
    sink(std::span<const std::byte>(out));
  }
}

}  // namespace treecask::cli
