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

// Returned by Source::size() before the source has learned the object's
// length (see Source).
inline constexpr uint64_t kUnknownSize = UINT64_MAX;

// The reader's first read of a source (Archive::open(Source)): the object's
// first kOpenHeadBytes and last kOpenTailBytes, in one read() call, so one
// round trip. In a file of this writer they hold everything an open reads
// (SPEC.md "Remote reading", writer rule). The reader keeps those bytes for
// the archive's life (its one cache of the object): a later read inside them
// costs no request, and a read that runs into them fetches only the rest.
inline constexpr uint64_t kOpenHeadBytes = uint64_t{256} << 10;
inline constexpr uint64_t kOpenTailBytes = uint64_t{4} << 20;

// One range of a read: the object's bytes [offset, offset + out.size()) go
// to `out`. With `from_end` (only in a first read, see Source) the range
// counts from the object's end: its last out.size() bytes, `offset` 0.
struct ReadRange {
  uint64_t offset = 0;
  std::span<std::byte> out;
  bool from_end = false;
};

// A read-only object of fixed size, read by byte ranges. Implement it to
// serve archives from your own storage client (two members matter: size()
// and read(); treecask ships an HTTP(S) and S3 source on libcurl: open_url,
// remote.h). A source needs no cache: the reader keeps the bytes its open
// read, and a read asks only for bytes it has not been given.
//
// Contract (what the reader relies on):
//  - size() is the object's length in bytes, fixed for the source's life.
//    A source that learns it from its first response (an HTTP object:
//    Content-Range) returns kUnknownSize until its first read() returns.
//    A source that can tell (an ETag, a GCS generation) pins the object
//    version it saw first and fails a later read of another version with
//    Error(kCorruption) naming the URL: an archive never mixes two objects.
//  - Archive::open starts with one call for the object's first
//    kOpenHeadBytes and last kOpenTailBytes. When size() is known, they
//    come as ordinary ranges (clipped to the object, never overlapping).
//    When it is kUnknownSize, they come as {0, head} and a from_end range,
//    either of which may be longer than the object: the source then writes
//    only the bytes the object has, at the start of `out` ([offset, size)
//    for the first, the last min(out.size(), size) bytes for the second),
//    both of one version, and size() is known when read() returns. That
//    call is then the source's first and no other runs until it returns
//    (REQUIRES: a source of unknown size is not opened by two threads at
//    once).
//  - read() fills every range completely or throws. It may run the ranges
//    concurrently and in any order, and is called from several threads at
//    once. Ranges passed by the reader (after the first read) lie inside
//    [0, size()), in increasing order of offset, and never overlap. Ranges
//    that touch (one ends where the next begins) are one stretch of the
//    object split over several buffers (a blob's header and the chunks
//    after it, chunks bound for different arrays). A source should fetch
//    such a stretch with one request (the built-in sources do): that keeps
//    a full load at about one request per 8 MiB.
//  - Errors are treecask::Error naming name(): kNotFound (no such object or
//    bucket), kIo (network, server error after retries, access denied),
//    kCorruption (the object changed, or the server answered with other
//    bytes than those asked for). Never print a secret in a message.
class TREECASK_API Source {
 public:
  virtual ~Source() = default;
  // The object's name for errors and Archive::path(): its URL or path.
  virtual const std::string& name() const noexcept = 0;
  // The object's length in bytes, or kUnknownSize before the first read of
  // a source that learns it then.
  virtual uint64_t size() const noexcept = 0;
  // Reads every range (see the contract above).
  virtual void read(std::span<const ReadRange> ranges) const = 0;
  // How many ranges are worth having in flight at once: the reader fetches
  // up to this many stretches in parallel. 1 for a source that serialises.
  virtual unsigned concurrency() const noexcept { return 16; }
};

// Opens the object `name` of a multi-process checkpoint ("index.cask", or a
// shard file the index names) in the store that holds it: what
// ShardedArchive::open takes to read a checkpoint from a store.
using SourceOpener = std::function<std::shared_ptr<const Source>(const std::string& name)>;

}  // namespace treecask
