// The safetensors file format (https://github.com/huggingface/safetensors):
// an 8-byte little-endian header length N, N bytes of UTF-8 JSON
// {"__metadata__": {str: str}, name: {"dtype", "shape", "data_offsets"}...},
// then the tensor bytes. Offsets are relative to the first byte after the header.
// The header reader and writer of the treecask_interop library; convert.h
// holds the imports and exports built on them.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "treecask/types.h"

namespace treecask::interop {

// Header size limit of the reference implementation (tensor.rs MAX_HEADER_SIZE),
// in bytes: the largest N a reader accepts and a writer may produce.
inline constexpr uint64_t kSafetensorsMaxHeader = 100'000'000;

// One tensor entry of a header.
struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // data_offsets, relative to the data section
  uint64_t end = 0;
};

// A parsed header (parse_safetensors).
struct SafetensorsHeader {
  bool has_metadata = false;  // "__metadata__" present (and not null)
  KeyValues metadata;         // in the order of the JSON text
  std::vector<SafetensorsTensor> tensors;  // sorted by data_offsets (ties: JSON order)
  uint64_t data_start = 0;    // 8 + N: file offset of the data section
};

// Parses and validates the whole file in `file` as the reference
// implementation does (safetensors tensor.rs: read_metadata + validate):
// the file holds at least 8 bytes; N <= 100,000,000 and 8 + N <= file size;
// the header is UTF-8 JSON that starts with '{'; __metadata__ maps strings to
// strings; each tensor has a known dtype, a shape of non-negative integers and
// data_offsets [begin, end]; sorted by offsets, the tensors tile the data
// section exactly: the first begins at 0, each begins where the previous ends
// (no overlap, no hole), end - begin equals the byte size that dtype and shape
// imply (checked arithmetic), and the last ends at the end of the file.
// Stricter than the reference: duplicate JSON keys are refused (it keeps one
// silently). Unknown fields inside a tensor entry are ignored, as it does.
// Throws Error(kCorruption, path, tensor name or "", "safetensors: ...") for
// any violation: the file is damaged or is not a safetensors file (an unknown
// dtype, a sub-byte tensor, F4 / F6_*, whose elements do not fill whole bytes,
// which the reference refuses too, included). Every safetensors 0.8 dtype
// has a treecask equivalent; the bytes of F4 / F6_* tensors are kept as stored.
// The result holds no pointer into `file`.
SafetensorsHeader parse_safetensors(std::span<const std::byte> file, const std::string& path);

// The safetensors dtype name for `dtype` ("F32", "BF16", "F8_E4M3", "F4"...),
// or std::nullopt when safetensors has none (complex128, int2, uint2, int4,
// uint4, float8_e3m4, float8_e4m3, float8_e4m3b11fnuz).
std::optional<std::string_view> safetensors_dtype(DType dtype) noexcept;

// Why safetensors cannot hold a leaf of `dtype` and `shape` ("" when it can):
// no safetensors dtype, or a sub-byte leaf whose elements do not fill whole
// bytes (safetensors sizes a tensor as elements x bits / 8 exactly).
std::string safetensors_refusal(DType dtype, std::span<const int64_t> shape);

// The 8-byte length and the header JSON as the reference writer produces
// them: compact JSON, "__metadata__" first when `has_metadata`, tensors in the
// given order with keys dtype, shape, data_offsets, then spaces to a multiple
// of 8 bytes. Checks nothing else (unique names, the size limit: the caller's).
// Throws nlohmann::json::type_error for a name or metadata that is not valid
// UTF-8. REQUIRES: every tensor's dtype has a safetensors name.
std::string safetensors_header(bool has_metadata, const KeyValues& metadata,
                               std::span<const SafetensorsTensor> tensors);

}  // namespace treecask::interop
