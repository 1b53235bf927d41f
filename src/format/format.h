// Every on-disk constant, limit and byte-order codec of the format (1.0 to
// 4.1), in one place (format/SPEC.md is the normative text; section names in comments).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "util/coding.h"

namespace treecask::format {

// LMDB stores its pages in host byte order; the format (every version) is
// defined for little-endian 64-bit hosts only (SPEC.md "Byte order").
static_assert(std::endian::native == std::endian::little, "the treecask format needs a little-endian host");
static_assert(sizeof(void*) == 8, "the treecask format needs a 64-bit host");

// ---- Versioning (SPEC.md "Versioning") ----
// kMajor.kMinor is the highest version this library reads and writes. A
// writer writes the lowest version that holds the archive: 1.0 unless a leaf
// has a filter (2.0) or shard references (3.0) or a dtype of format 4.0
// (4.0), so that older readers keep reading every archive they can; minor
// kBindMinor when the index binds its shard files (Manifest.shard_files).
inline constexpr uint16_t kMajor = 4;
inline constexpr uint16_t kMinor = 1;
inline constexpr uint16_t kBindMinor = 1;    // the first minor (of majors >= 3) with Manifest.shard_files
inline constexpr uint16_t kFilterMajor = 2;  // the first major with Leaf.filter
inline constexpr uint16_t kShardMajor = 3;   // the first major with Leaf.shards
inline constexpr uint16_t kDTypeMajor = 4;   // the first major with DType values 20-30
inline constexpr uint16_t kBaseMajor = 1;

// ---- LMDB layout (SPEC.md "Databases") ----
inline constexpr const char* kMetaDb = "treecask.meta";
inline constexpr const char* kBlobDb = "treecask.blobs";
inline constexpr std::string_view kHeaderKey = "header";
inline constexpr std::string_view kManifestKey = "manifest";

// ---- Header record (SPEC.md "Header record") ----
inline constexpr std::string_view kMagic = "TREECASK";  // 8 bytes
inline constexpr size_t kHeaderSize = 32;
struct Header {
  uint16_t major = kMajor;
  uint16_t minor = kMinor;
  uint32_t flags = 0;
  uint64_t manifest_length = 0;
  uint64_t manifest_checksum = 0;  // XXH3-64, seed 0
};

// ---- Blob values (SPEC.md "Blobs") ----
inline constexpr std::string_view kBlobMagic{"TCBLOB\0\0", 8};
inline constexpr size_t kBlobHeaderSize = 48;
inline constexpr size_t kAlignment = 64;  // payload and every leaf start
struct BlobHeader {
  uint32_t blob_id = 0;
  uint64_t payload_length = 0;
};

// ---- Chunks (SPEC.md "Chunks and checksums") ----
inline constexpr uint32_t kChunkStoredRaw = 1;  // flags bit 0
inline constexpr uint32_t kChunkFlagsMask = kChunkStoredRaw;
inline uint64_t chunk_seed(uint64_t leaf_index, uint64_t chunk_index) {
  return (leaf_index << 32) | (chunk_index & 0xffffffffu);
}

// ---- Limits (SPEC.md "Limits") ----
inline constexpr size_t kMaxDepth = 64;                    // treedef nesting
inline constexpr size_t kMaxRank = 64;                     // dims per leaf
inline constexpr size_t kMaxKeyBytes = 4096;               // one key component
inline constexpr size_t kMaxKeyPathBytes = 65536;          // canonical key path
inline constexpr uint64_t kMaxManifestBytes = 256ull << 20;
inline constexpr uint64_t kMaxLeaves = 1ull << 24;
inline constexpr uint64_t kMaxNodes = 1ull << 26;
inline constexpr uint64_t kMaxBlobValue = 1ull << 31;      // bytes of one LMDB value
inline constexpr uint64_t kMinChunkSize = 4096;
inline constexpr uint64_t kMaxChunkSize = 64ull << 20;
inline constexpr uint64_t kMaxChunksPerLeaf = 1ull << 32;
inline constexpr size_t kMaxMetadataBytes = 16u << 20;     // one key or value

// ---- Writer policy (not format rules; SPEC.md "Writer policy") ----
inline constexpr uint64_t kRawPartBytes = 1ull << 30;      // raw part ≤ 1 GiB
inline constexpr uint64_t kLz4PartBytes = 64ull << 20;     // LZ4 part ≤ 64 MiB raw
inline constexpr uint64_t kPackLeafBytes = 64ull << 10;    // pack leaves ≤ 64 KiB
inline constexpr uint64_t kPackBlobBytes = 4ull << 20;     // pack blobs ≤ 4 MiB
inline constexpr double kAutoMinSaving = 0.10;             // auto: LZ4 must save ≥ 10%

// ---- Little-endian coding (util/coding.h, the only place bytes are assembled) ----
using coding::get_u16, coding::get_u32, coding::get_u64, coding::put_u16, coding::put_u32, coding::put_u64;
// Blob ids are keyed big-endian so that LMDB's byte order is numeric order.
inline void put_blob_key(std::byte* p, uint32_t id) {
  for (int i = 0; i < 4; ++i) p[i] = std::byte(id >> (8 * (3 - i)));
}

void encode_header(const Header& h, std::byte out[kHeaderSize]);
// Returns false if the magic is wrong (not an archive). Fills the version
// from any record of at least 12 bytes; the caller checks the version before
// the length, so a future major version may lengthen the record.
bool decode_header(std::span<const std::byte> in, Header* h);
void encode_blob_header(const BlobHeader& h, std::byte out[kBlobHeaderSize]);
// Decodes the first kBlobHeaderSize bytes of a blob value of `value_size`
// bytes. Returns an empty string when valid, else what is wrong.
std::string decode_blob_header(const std::byte (&in)[kBlobHeaderSize], uint64_t value_size,
                               BlobHeader* h);

uint64_t xxh3(std::span<const std::byte> bytes, uint64_t seed);

// XXH3-64 of bytes given in pieces: the digest equals xxh3() of their
// concatenation. Lets a reader hash each piece of a chunk while it is still
// in cache, right after copying it.
class Xxh3Stream {
 public:
  explicit Xxh3Stream(uint64_t seed);
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;
  void update(std::span<const std::byte> bytes);
  uint64_t digest() const;

 private:
  alignas(64) unsigned char state_[576];  // an XXH3_state_t (size checked in format.cc)
};

// True if `s` is valid UTF-8 (no overlongs, no surrogates, <= U+10FFFF).
bool valid_utf8(std::string_view s);

inline uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

}  // namespace treecask::format
