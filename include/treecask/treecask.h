// treecask: single-file checkpoint archives (LMDB + FlatBuffers manifest).
// Include this header for the whole public API.
#pragma once

#include "treecask/reader.h"
#include "treecask/archive.h"
#include "treecask/sharded.h"
#include "treecask/signing.h"
#include "treecask/remote.h"
#include "treecask/error.h"
#include "treecask/types.h"
#include "treecask/commit.h"
#include "treecask/writer.h"

namespace treecask {

// Library version, e.g. "0.2.0" (independent of the format version).
TREECASK_API const char* library_version() noexcept;
// Highest format version this library reads and writes (SPEC.md
// "Versioning"). It reads every x.y with x <= kFormatMajor. It writes the
// lowest version that holds the archive: 1.0, or 2.0 when a leaf has a filter
// (SaveOptions::shuffle), or 3.0 when a leaf has shard references (the index
// of a sharded checkpoint, include/treecask/sharded.h), or 4.0 when a leaf has
// a dtype of format 4.0 (DType values 20-30), so that older readers keep
// reading the rest; minor 1 (3.1, 4.1) for an index that binds its shard
// files (SaveOptions::shard_files). Equal to the format's own constants (src/format/format.h
// kMajor/kMinor; a static_assert in src/format/format.cc keeps them so).
inline constexpr uint16_t kFormatMajor = 4;
inline constexpr uint16_t kFormatMinor = 1;

}  // namespace treecask
