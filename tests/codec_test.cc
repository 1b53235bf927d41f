// The checksum and the chunk codec (src/format.h xxh3, src/codec.h): the
// known answers of SPEC.md "Test vectors".
#include "codec.h"
#include "format.h"
#include "testutil.h"

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
