// The checksum and the chunk codec (src/format/format.h xxh3, src/format/codec.h): the
// known answers of SPEC.md "Test vectors".
#include "format/codec.h"
#include "format/format.h"
#include "testutil.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t's layout, to plant a stale state
#include <xxhash.h>

#include <cstddef>
#include <new>

using namespace treecask;

// SPEC.md "Test vectors": the known answers an implementer checks against.
TEST_CASE("checksum and codec known answers from SPEC.md, whole and in pieces") {
  namespace f = treecask::format;
  CHECK(f::xxh3({}, 0) == 0x2d06800538d394c2ull);
  std::string abc = "abc";
  CHECK(f::xxh3(std::as_bytes(std::span(abc)), 0) == 0x78af5f94892f3950ull);
  CHECK(f::chunk_seed(1, 2) == 0x0000000100000002ull);
  std::vector<std::byte> zeros(4096);
  CHECK(f::xxh3(zeros, f::chunk_seed(1, 2)) == 0x7f16dacb1ea9662dull);
  CHECK(treecask::codec::lz4_bound(4096) == 4128);
  CHECK(treecask::codec::lz4_bound(1048576) == 1052704);

  // Xxh3Stream: any split of the bytes gives the one-shot digest.
  auto data = tc_test::random_bytes(3 << 20, 7);
  for (size_t piece : {size_t(1), size_t(63), size_t(4096), size_t(128 << 10), size_t(1 << 20), data.size()}) {
    CAPTURE(piece);
    for (size_t len : {size_t(0), size_t(17), size_t(240), size_t(1000), size_t(1 << 20) + 3, data.size()}) {
      if (piece == 1 && len > 4096) continue;
      auto bytes = std::span(data).first(len);
      f::Xxh3Stream s(0x1234);
      for (size_t at = 0; at < len; at += piece) s.update(bytes.subspan(at, std::min(piece, len - at)));
      CHECK(s.digest() == f::xxh3(bytes, 0x1234));
    }
  }
}

// A stream's memory may hold anything when it is made (a reader's stack frame
// that an earlier stream used): here, its own seed in the seed field and a
// null external secret, the state a finished stream with that seed leaves,
// but junk where the derived secret was. XXH3_64bits_reset_withSeed trusts
// those two fields unless the state was zeroed first (xxhash.h,
// XXH3_INITSTATE), so without the constructor's memset the digest came from
// the junk: a spurious kChecksumMismatch on valid chunks (archive_test.cc has
// the end-to-end case).
TEST_CASE("Xxh3Stream gives the one-shot digest whatever its memory held before") {
  namespace f = treecask::format;
  static_assert(offsetof(XXH3_state_t, extSecret) + sizeof(void*) <= sizeof(f::Xxh3Stream));
  auto data = tc_test::random_bytes(10000, 3);
  for (uint64_t seed : {f::chunk_seed(0, 1), f::chunk_seed(2, 0), f::chunk_seed(7, 12345)}) {
    for (int junk : {0x00, 0x5a, 0xff}) {
      CAPTURE(seed);
      CAPTURE(junk);
      alignas(f::Xxh3Stream) unsigned char mem[sizeof(f::Xxh3Stream)];
      std::memset(mem, junk, sizeof mem);
      const void* null_secret = nullptr;
      std::memcpy(mem + offsetof(XXH3_state_t, seed), &seed, sizeof seed);
      std::memcpy(mem + offsetof(XXH3_state_t, extSecret), &null_secret, sizeof null_secret);
      auto* s = new (mem) f::Xxh3Stream(seed);
      s->update(std::span(data).first(4000));
      s->update(std::span(data).subspan(4000));
      CHECK(s->digest() == f::xxh3(data, seed));
      s->~Xxh3Stream();
    }
  }
}
