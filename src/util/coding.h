// Little-endian integer coding: the only place treecask assembles integers
// from bytes or bytes from integers (the format's records, SPEC.md "Byte
// order", and LMDB's page headers, which this host wrote little-endian).
// Never a memcpy of a struct.
#pragma once

#include <cstddef>
#include <cstdint>

namespace treecask::coding {

inline void put_u16(std::byte* p, uint16_t v) {
  for (int i = 0; i < 2; ++i) p[i] = std::byte(v >> (8 * i));
}
inline void put_u32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = std::byte(v >> (8 * i));
}
inline void put_u64(std::byte* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = std::byte(v >> (8 * i));
}
inline uint16_t get_u16(const std::byte* p) {
  return uint16_t(uint16_t(p[0]) | uint16_t(p[1]) << 8);
}
inline uint32_t get_u32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(p[i]) << (8 * i);
  return v;
}
inline uint64_t get_u64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

}  // namespace treecask::coding
