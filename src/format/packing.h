// Packed sub-byte elements (SPEC.md "Dtypes"): 2-, 4- and 6-bit elements as
// a little-endian bit stream, unpacked to one byte per element (ml_dtypes'
// layout) and packed back. Used by the reads (read/slice.h) and by
// pack_elements (types.h).
#pragma once

#include <cstddef>
#include <cstdint>

namespace treecask::packing {

// A group is the fewest elements that fill whole bytes: 4 of 2 bits or 2 of
// 4 bits in one byte, 4 of 6 bits in three. Whole groups go a group at a
// time (the loops below unroll and vectorise); the rest bit by bit.

inline unsigned group_elements(unsigned bits) { return bits == 6 ? 4 : 8 / bits; }

// Unpacks `groups` whole groups from `in` to one byte per element at `out`.
template <unsigned Bits>
void unpack_groups(const uint8_t* in, uint64_t groups, uint8_t* out) {
  constexpr unsigned kPer = Bits == 6 ? 4 : 8 / Bits, kBytes = Bits * kPer / 8, kMask = (1u << Bits) - 1;
  for (uint64_t g = 0; g < groups; ++g, in += kBytes, out += kPer) {
    uint32_t v = 0;
    for (unsigned b = 0; b < kBytes; ++b) v |= uint32_t{in[b]} << (8 * b);
    for (unsigned k = 0; k < kPer; ++k) out[k] = static_cast<uint8_t>((v >> (k * Bits)) & kMask);
  }
}

// Packs `groups` whole groups of one-byte elements (their low Bits bits) from
// `in` into `out`.
template <unsigned Bits>
void pack_groups(const uint8_t* in, uint64_t groups, uint8_t* out) {
  constexpr unsigned kPer = Bits == 6 ? 4 : 8 / Bits, kBytes = Bits * kPer / 8, kMask = (1u << Bits) - 1;
  for (uint64_t g = 0; g < groups; ++g, in += kPer, out += kBytes) {
    uint32_t v = 0;
    for (unsigned k = 0; k < kPer; ++k) v |= (in[k] & kMask) << (k * Bits);
    for (unsigned b = 0; b < kBytes; ++b) out[b] = static_cast<uint8_t>(v >> (8 * b));
  }
}

// Writes `count` packed elements of `bits` bits (2, 4 or 6), the first at
// bit offset `bit` of `data`, one byte each to out, out + step, ...: the
// value in the low `bits` bits, the other bits zero (ml_dtypes' layout).
// Reads only the bytes that hold those elements. A contiguous output (step
// 1) goes a group at a time from the first byte boundary on;
// pack_elements (types.h) is its inverse.
inline void unpack(const std::byte* data, uint64_t bit, uint64_t count, unsigned bits, std::byte* out,
                   int64_t step) {
  const unsigned mask = (1u << bits) - 1;
  auto one = [&] {  // the element at `bit`, which may straddle two bytes (6 bits)
    const uint64_t k = bit >> 3;
    const unsigned sh = static_cast<unsigned>(bit & 7);
    unsigned v = static_cast<uint8_t>(data[k]);
    if (sh + bits > 8) v |= static_cast<unsigned>(static_cast<uint8_t>(data[k + 1])) << 8;
    *out = static_cast<std::byte>((v >> sh) & mask);
    out += step;
    bit += bits;
    --count;
  };
  if (step == 1 && (bits == 2 || bits == 4 || bits == 6)) {
    while (count && (bit & 7)) one();
    const unsigned per = group_elements(bits);
    const uint64_t groups = count / per;
    const auto* in = reinterpret_cast<const uint8_t*>(data) + (bit >> 3);
    auto* o = reinterpret_cast<uint8_t*>(out);
    if (bits == 2) unpack_groups<2>(in, groups, o);
    else if (bits == 4) unpack_groups<4>(in, groups, o);
    else unpack_groups<6>(in, groups, o);
    bit += groups * per * bits;
    out += groups * per;
    count -= groups * per;
  }
  while (count) one();
}

}  // namespace treecask::packing
