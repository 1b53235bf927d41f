// treecask: single-file checkpoint archives (LMDB + FlatBuffers manifest).
// Include this header for the whole public API.
#pragma once

#include "treecask/archive.h"
#include "treecask/error.h"
#include "treecask/types.h"
#include "treecask/writer.h"

namespace treecask {

// Library version, e.g. "0.1.0" (independent of the format version).
TREECASK_API const char* library_version() noexcept;
// Highest format version this library writes and reads (SPEC.md "Versioning").
inline constexpr uint16_t kFormatMajor = 1;
inline constexpr uint16_t kFormatMinor = 0;

}  // namespace treecask
