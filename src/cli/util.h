// Small pieces the `treecask` tool's commands share: a terminal progress bar
// and the formatting of sizes, shapes, times and text. (Input maps and atomic
// output files are treecask_interop's: src/interop/files.h.)
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "treecask/treecask.h"

namespace treecask::cli {

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

// "[384,1536]"; "[]" for a scalar.
std::string format_shape(std::span<const int64_t> shape);
// "90868224 (86.7 MiB)"; small values without the parenthesis.
std::string format_bytes(uint64_t bytes);
// ISO 8601 UTC with nanoseconds, e.g. "2025-11-22T10:41:00.123456789Z".
std::string format_unix_ns(int64_t unix_ns);
// The text with control characters and backslashes escaped as in JSON
// (\n, \t, \u0001...), for one-line human output. Other bytes pass through.
std::string escape_for_terminal(std::string_view text);

// Throws Error(kNotAnArchive) naming a step to open when `file` is a local
// directory that is no sharded checkpoint (no index.cask) but holds
// CheckpointManager steps (step_<digits>.cask): "a checkpoint manager
// directory: name a step, e.g. DIR/step_00000005.cask" (the latest step).
// Does nothing otherwise; the commands' own open reports every other case.
void refuse_manager_directory(const std::string& file);

}  // namespace treecask::cli
