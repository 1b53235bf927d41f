// Fuzz target: whole archive files. The input is written to an in-memory
// file, opened with Archive::open, listed, and every leaf read through every
// API with and without verification. Property: a typed treecask::Error or
// success, never a crash, a sanitizer report or a hang.
#include <cstddef>
#include <cstdint>
#include <span>

#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tc_fuzz::MemFile file;
  file.write(std::as_bytes(std::span(data, size)));
  tc_fuzz::exercise(file.path(), nullptr);
  return 0;
}
