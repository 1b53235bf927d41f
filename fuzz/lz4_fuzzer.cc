// Fuzz target: the LZ4 chunk codec the reader and writer share (src/format/codec.h).
// Input: 3 bytes of declared raw size (little-endian, at most 1 MiB here),
// then the stored block. Properties: decoding never reads or writes outside
// its buffers, and succeeds only with exactly the declared size; whatever
// decodes re-encodes and decodes to the same bytes; the input itself round
// trips through compress/decompress.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "format/codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace treecask;
  auto input = std::as_bytes(std::span(data, size));
  auto round_trip = [](std::span<const std::byte> raw) {
    std::vector<std::byte> packed(codec::lz4_bound(raw.size()) + 1);
    bool stored_raw = false;
    uint64_t n = codec::lz4_compress(raw, packed.data(), &stored_raw);
    if (stored_raw) {
      if (n != raw.size()) __builtin_trap();
      return;
    }
    if (n == 0 || n >= raw.size()) __builtin_trap();
    std::vector<std::byte> back(raw.size());
    if (!codec::lz4_decode(std::span(packed).first(n), back)) __builtin_trap();
    if (!raw.empty() && std::memcmp(back.data(), raw.data(), raw.size()) != 0) __builtin_trap();
    // One byte less room than declared must fail, never overrun.
    if (!raw.empty()) {
      std::vector<std::byte> small(raw.size() - 1);
      if (codec::lz4_decode(std::span(packed).first(n), small)) __builtin_trap();
    }
  };
  round_trip(input);
  if (size < 3) return 0;
  size_t declared = (size_t{data[0]} | size_t{data[1]} << 8 | size_t{data[2]} << 16) & ((1u << 20) - 1);
  auto block = input.subspan(3);
  // Exactly `declared` bytes of room, in their own allocation so that the
  // address sanitizer sees any write past them.
  std::vector<std::byte> out(declared);
  if (codec::lz4_decode(block, out)) round_trip(out);
  return 0;
}
