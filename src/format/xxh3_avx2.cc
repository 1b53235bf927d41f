// XXH3-64 compiled for AVX2 (this file alone is built with -mavx2 on x86-64).
// format::xxh3() dispatches here at run time when the CPU has AVX2: the
// result is identical to the scalar/SSE2 code (XXH3 is defined bit-exactly),
// only ~3x faster than the distribution's SSE2 build of libxxhash.
#if defined(__x86_64__) && defined(__AVX2__)
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>

#include <cstddef>
#include <cstdint>

namespace treecask::format {
uint64_t xxh3_avx2(const void* data, size_t size, uint64_t seed) {
  return XXH3_64bits_withSeed(data, size, seed);
}
void xxh3_avx2_reset(void* state, uint64_t seed) {
  XXH3_64bits_reset_withSeed(static_cast<XXH3_state_t*>(state), seed);
}
void xxh3_avx2_update(void* state, const void* data, size_t size) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state), data, size);
}
uint64_t xxh3_avx2_digest(const void* state) {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state));
}
}  // namespace treecask::format
#endif
