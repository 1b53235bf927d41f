// LZ4 block coding of one chunk (SPEC.md "Codecs") and the byte-shuffle
// filter (SPEC.md "Filters"), shared by the writer, the reader and the
// manifest checks so that every caller uses the same bounds-checked calls.
#pragma once

#include <lz4.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <span>

namespace treecask::codec {

// Largest LZ4 block `raw` bytes can compress to (LZ4_compressBound), or 0
// when `raw` exceeds LZ4_MAX_INPUT_SIZE. Chunks are at most 64 MiB.
inline uint64_t lz4_bound(uint64_t raw) {
  if (raw > static_cast<uint64_t>(LZ4_MAX_INPUT_SIZE)) return 0;
  return static_cast<uint64_t>(LZ4_compressBound(static_cast<int>(raw)));
}

// Compresses `src` into `dst`, which holds lz4_bound(src.size()) bytes.
// Returns the stored size; sets *raw when LZ4 cannot shrink the chunk, and
// then the caller stores `src` itself (dst holds nothing useful).
inline uint64_t lz4_compress(std::span<const std::byte> src, std::byte* dst, bool* raw) {
  uint64_t cap = lz4_bound(src.size());
  int n = cap == 0 ? 0
                   : LZ4_compress_default(reinterpret_cast<const char*>(src.data()),
                                          reinterpret_cast<char*>(dst), static_cast<int>(src.size()),
                                          static_cast<int>(cap));
  *raw = n <= 0 || static_cast<uint64_t>(n) >= src.size();
  return *raw ? src.size() : static_cast<uint64_t>(n);
}

// Decodes the LZ4 block `src` into exactly dst.size() bytes. Returns false
// when `src` is not a valid block that decodes to exactly that many bytes.
// Never reads outside `src` nor writes outside `dst`, whatever `src` holds
// (LZ4_decompress_safe with the declared size as capacity).
inline bool lz4_decode(std::span<const std::byte> src, std::span<std::byte> dst) {
  if (src.empty() || src.size() > static_cast<size_t>(INT_MAX) ||
      dst.size() > static_cast<size_t>(INT_MAX))
    return false;
  int n = LZ4_decompress_safe(reinterpret_cast<const char*>(src.data()),
                              reinterpret_cast<char*>(dst.data()), static_cast<int>(src.size()),
                              static_cast<int>(dst.size()));
  return n >= 0 && static_cast<size_t>(n) == dst.size();
}

namespace detail {
template <unsigned E, bool Forward>
void transpose(const std::byte* in, std::byte* out, size_t n) {
  // Forward: out[j * n + i] = in[i * E + j]; else the inverse. E is a
  // compile-time constant, so the inner loop unrolls into E stores.
  for (size_t i = 0; i < n; ++i)
    for (unsigned j = 0; j < E; ++j) {
      if constexpr (Forward)
        out[j * n + i] = in[i * E + j];
      else
        out[i * E + j] = in[j * n + i];
    }
}
template <bool Forward>
inline void transpose(std::span<const std::byte> in, std::byte* out, unsigned elem_bytes) {
  size_t n = in.size() / elem_bytes;
  switch (elem_bytes) {
    case 2: return transpose<2, Forward>(in.data(), out, n);
    case 4: return transpose<4, Forward>(in.data(), out, n);
    case 8: return transpose<8, Forward>(in.data(), out, n);
    case 16: return transpose<16, Forward>(in.data(), out, n);
  }
}
}  // namespace detail

// Byte shuffle of one chunk's raw bytes (SPEC.md "Filters"): with n =
// in.size() / elem_bytes elements, out[j * n + i] = in[i * elem_bytes + j].
// REQUIRES: elem_bytes in {2, 4, 8, 16}; in.size() a multiple of it; `out`
// holds in.size() bytes and does not overlap `in`.
inline void shuffle(std::span<const std::byte> in, std::byte* out, unsigned elem_bytes) {
  detail::transpose<true>(in, out, elem_bytes);
}
// The inverse: out[i * elem_bytes + j] = in[j * n + i]. Same requirements.
inline void unshuffle(std::span<const std::byte> in, std::byte* out, unsigned elem_bytes) {
  detail::transpose<false>(in, out, elem_bytes);
}

}  // namespace treecask::codec
