#include "format/format.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t, for Xxh3Stream
#include <xxhash.h>

#include "treecask/treecask.h"

namespace treecask::format {

// The public version constants (treecask.h) are the format's own, never a copy.
static_assert(treecask::kFormatMajor == kMajor && treecask::kFormatMinor == kMinor,
              "treecask.h's kFormatMajor/kFormatMinor must equal format.h's kMajor/kMinor");

void encode_header(const Header& h, std::byte out[kHeaderSize]) {
  std::memcpy(out, kMagic.data(), 8);
  put_u16(out + 8, h.major);
  put_u16(out + 10, h.minor);
  put_u32(out + 12, h.flags);
  put_u64(out + 16, h.manifest_length);
  put_u64(out + 24, h.manifest_checksum);
}

bool decode_header(std::span<const std::byte> in, Header* h) {
  if (in.size() < 12 || std::memcmp(in.data(), kMagic.data(), 8) != 0) return false;
  h->major = get_u16(in.data() + 8);
  h->minor = get_u16(in.data() + 10);
  if (in.size() < kHeaderSize) return true;
  h->flags = get_u32(in.data() + 12);
  h->manifest_length = get_u64(in.data() + 16);
  h->manifest_checksum = get_u64(in.data() + 24);
  return true;
}

void encode_blob_header(const BlobHeader& h, std::byte out[kBlobHeaderSize]) {
  std::memset(out, 0, kBlobHeaderSize);
  std::memcpy(out, kBlobMagic.data(), 8);
  put_u32(out + 8, h.blob_id);
  put_u64(out + 16, h.payload_length);
}

std::string decode_blob_header(const std::byte (&in)[kBlobHeaderSize], uint64_t value_size,
                               BlobHeader* h) {
  if (value_size < kBlobHeaderSize) return "blob value shorter than its 48-byte header";
  if (std::memcmp(in, kBlobMagic.data(), 8) != 0) return "bad blob magic";
  h->blob_id = get_u32(in + 8);
  if (get_u32(in + 12) != 0) return "reserved blob header bytes are not zero";
  h->payload_length = get_u64(in + 16);
  for (size_t i = 24; i < kBlobHeaderSize; ++i)
    if (in[i] != std::byte{0}) return "reserved blob header bytes are not zero";
  if (h->payload_length > value_size - kBlobHeaderSize)
    return "blob payload length exceeds the stored value";
  return {};
}

static_assert(sizeof(XXH3_state_t) <= 576 && alignof(XXH3_state_t) <= 64, "Xxh3Stream::state_ too small");

namespace {
void xxh3_generic_reset(void* state, uint64_t seed) {
  XXH3_64bits_reset_withSeed(static_cast<XXH3_state_t*>(state), seed);
}
void xxh3_generic_update(void* state, const void* data, size_t size) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state), data, size);
}
uint64_t xxh3_generic_digest(const void* state) {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state));
}
uint64_t xxh3_generic(const void* data, size_t size, uint64_t seed) {
  return XXH3_64bits_withSeed(data, size, seed);
}
struct Xxh3Impl {
  uint64_t (*oneshot)(const void*, size_t, uint64_t);
  void (*reset)(void*, uint64_t);
  void (*update)(void*, const void*, size_t);
  uint64_t (*digest)(const void*);
};
}  // namespace

#if defined(__x86_64__) && defined(TREECASK_HAVE_AVX2_TU)
uint64_t xxh3_avx2(const void* data, size_t size, uint64_t seed);  // xxh3_avx2.cc
void xxh3_avx2_reset(void* state, uint64_t seed);
void xxh3_avx2_update(void* state, const void* data, size_t size);
uint64_t xxh3_avx2_digest(const void* state);
namespace {
const Xxh3Impl kXxh3 = __builtin_cpu_supports("avx2")
                           ? Xxh3Impl{xxh3_avx2, xxh3_avx2_reset, xxh3_avx2_update, xxh3_avx2_digest}
                           : Xxh3Impl{xxh3_generic, xxh3_generic_reset, xxh3_generic_update, xxh3_generic_digest};
}  // namespace
#else
namespace {
const Xxh3Impl kXxh3{xxh3_generic, xxh3_generic_reset, xxh3_generic_update, xxh3_generic_digest};
}  // namespace
#endif

uint64_t xxh3(std::span<const std::byte> bytes, uint64_t seed) {
  return kXxh3.oneshot(bytes.data(), bytes.size(), seed);
}
// The state is zeroed before the reset: XXH3_64bits_reset_withSeed reads the
// state's old seed and external-secret fields and skips deriving the seeded
// secret when they say it is already there (xxhash.h: a state placed on the
// stack needs XXH3_INITSTATE or a memset before a seeded reset). Left as the
// stack happened to be, a stream whose memory held its own seed hashed with
// a stale secret: a spurious checksum mismatch on the first chunk a reader's
// frame hashed.
Xxh3Stream::Xxh3Stream(uint64_t seed) {
  std::memset(state_, 0, sizeof state_);
  kXxh3.reset(state_, seed);
}
void Xxh3Stream::update(std::span<const std::byte> bytes) { kXxh3.update(state_, bytes.data(), bytes.size()); }
uint64_t Xxh3Stream::digest() const { return kXxh3.digest(state_); }

bool valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    unsigned char c = p[i];
    if (c < 0x80) { ++i; continue; }
    size_t len;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; }
    else return false;
    if (i + len > n) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000))
      return false;
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

}  // namespace treecask::format
