// The NumPy .npy format (versions 1.0, 2.0 and 3.0), as far as the tool needs
// it: the header of a C-order little-endian array of a plain numeric dtype.
// https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "treecask/types.h"

namespace treecask::interop {

// NumPy's array-protocol descr for `dtype` as np.save writes it ("<f4", "|b1",
// "<c16"...), or std::nullopt for the dtypes NumPy has no builtin for
// (bfloat16, float8_*, int4, uint4).
std::optional<std::string_view> npy_descr(DType dtype) noexcept;

// The complete .npy header (magic, version, length, dict, space padding and
// '\n') for an array of `descr` and `shape` in C order: version 1.0 when the
// header fits a 16-bit length, else 2.0; the data that follows starts at a
// multiple of 64 bytes, as np.save does.
std::string npy_header(std::string_view descr, std::span<const int64_t> shape);

struct NpyArray {
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;
  std::span<const std::byte> data;  // points into the bytes given to parse_npy
};

// Parses a whole .npy file held in `bytes` and checks that the data that
// follows the header is exactly byte_length_for(dtype, shape) bytes.
// Accepts versions 1.0/2.0/3.0, descr with '<' or '|' byte order of kinds
// b1, i1-i8, u1-u8, f2-f8, c8-c16, and fortran_order True only for arrays of
// at most one dimension larger than 1 (where it is the same layout).
// Throws Error(kCorruption, file, key, ...) for damage: bad magic, a
// truncated header, a header dict that is not the literal np.save writes
// (syntax, missing or extra keys, a bad shape), data that is not exactly the
// size the header implies. Throws Error(kInvalidArgument, file, key, ...) for a
// valid array it does not take: another format version, big-endian,
// structured or object dtype, Fortran order over several dimensions.
NpyArray parse_npy(std::span<const std::byte> bytes, const std::string& file,
                   const std::string& key);

}  // namespace treecask::interop
