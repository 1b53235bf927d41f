// SHA-256 through OpenSSL's EVP interface (the sign layer's one hash; see
// bundle.h), over memory or over a byte range of an open file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "sign/bundle.h"

namespace treecask::sig {

// An incremental SHA-256. Throws std::bad_alloc when OpenSSL cannot
// allocate its context.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(std::span<const std::byte> bytes);
  Digest finish();

 private:
  void* ctx_;  // EVP_MD_CTX
};

Digest sha256(std::span<const std::byte> bytes);

// Bytes pread() and hashed at a time: small enough to be hashed from L2.
inline constexpr size_t kHashPiece = size_t{256} << 10;

// The SHA-256 of the bytes [offset, offset + n) of the file open as `fd`,
// read with pread() in kHashPiece pieces into a buffer of the calling
// thread. Throws Error(kIo, shown) when the read fails, Error(kSignature,
// shown) when the file ends before offset + n (it is shorter than signed).
Digest sha256_of_file_range(int fd, uint64_t offset, uint64_t n, const std::string& shown);

}  // namespace treecask::sig
