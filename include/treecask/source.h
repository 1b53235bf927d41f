// Where an archive's bytes come from when they are not a local file: a
// range-read source (an object in S3, GCS or behind an HTTP server, or a
// server's own client). Archive::open(Source) runs every check a local open
// runs (SPEC.md "Reader checks") on bytes read through it, and every read
// checks each chunk's XXH3 as a local read does: a source never needs to
// vouch for its bytes (SPEC.md "Remote reading").
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "treecask/error.h"

namespace treecask {

// One range of a read: the object's bytes [offset, offset + out.size()) go
// to `out`.
struct ReadRange {
  uint64_t offset = 0;
  std::span<std::byte> out;
};

// A read-only object of fixed size, read by byte ranges. Implement it to
// serve archives from your own storage client; treecask ships an HTTP(S) and
// S3 source on libcurl (open_url, remote.h).
//
// Contract (what the reader relies on):
//  - size() is the object's length in bytes, fixed for the source's life.
//    A source that can tell (an ETag, a GCS generation) pins the object
//    version it saw first and fails a later read of another version with
//    Error(kCorruption) naming the URL: an archive never mixes two objects.
//  - read() fills every range completely or throws. It may run the ranges
//    concurrently and in any order, and is called from several threads at
//    once. Ranges passed by the reader lie inside [0, size()).
//  - Errors are treecask::Error naming name(): kNotFound (no such object or
//    bucket), kIo (network, server error after retries, access denied),
//    kCorruption (the object changed, or the server answered with other
//    bytes than those asked for). Never print a secret in a message.
class TREECASK_API Source {
 public:
  virtual ~Source() = default;
  // The object's name for errors and Archive::path(): its URL or path.
  virtual const std::string& name() const noexcept = 0;
  // The object's length in bytes.
  virtual uint64_t size() const noexcept = 0;
  // Reads every range (see the contract above).
  virtual void read(std::span<const ReadRange> ranges) const = 0;
  // How many ranges are worth having in flight at once: the reader fetches
  // up to this many chunks in parallel. 1 for a source that serialises.
  virtual unsigned concurrency() const noexcept { return 16; }
};

// Opens the object `name` of a multi-process checkpoint ("index.cask", or a
// shard file the index names) in the store that holds it: what
// ShardedArchive::open takes to read a checkpoint from a store.
using SourceOpener = std::function<std::shared_ptr<const Source>(const std::string& name)>;

}  // namespace treecask
