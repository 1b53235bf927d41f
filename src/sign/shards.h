// The signed ranges of one file and their verification: the shard table a
// statement gives a file, the per-archive guard that hashes the shards a
// read touches (each once per process: a process-wide cache of verified
// shards, thread-safe), and a Source that hands out only verified bytes.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "sign/bundle.h"
#include "treecask/signing.h"
#include "treecask/source.h"

namespace treecask::sig {

// The signed ranges of one file, in file order: shard k is the bytes
// [start[k], start[k + 1]) with digest[k]; start.back() is the file's
// signed length. File serialization: one range, the whole file.
struct ShardTable {
  std::string file;        // the file, as errors name it
  std::string resource;    // its path in the statement ("." for a file model)
  bool shards = false;     // shard serialization (resources named resource:start:end)
  std::vector<uint64_t> start;  // size() == digest.size() + 1
  std::vector<Digest> digest;
  uint64_t size() const { return start.back(); }
  size_t count() const { return digest.size(); }
  // The shard holding byte `off` (REQUIRES off < size()).
  size_t shard_of(uint64_t off) const;
  // "[a, b) (resource 'x:a:b')", for errors.
  std::string describe(size_t k) const;
};

// The last component of a path or URL (a URL's query and fragment dropped;
// a relative path made absolute against the working directory, "." and ".."
// resolved lexically), and the one before it ("" at the root): a model's
// name, and the directory a file of it sits in.
std::pair<std::string, std::string> name_and_parent(const std::string& file);

// Where `file` (a local path or a URL, shown as `shown`) sits in the model
// the statement signs: "." when the statement signs one file (its subject
// must be the file's name), else the file's name inside the signed
// directory (its subject must be that directory's name). Throws
// Error(kSignature, shown) naming the subject when it is another model.
std::string resource_of(const Statement& st, const std::string& file, const std::string& shown);

// The shard table of resource `resource` (resource_of) for a file of
// `file_size` bytes. Checks that the statement's ranges for it tile
// [0, file_size) exactly: sorted by start (model_signing compares sets, so
// their order in the statement is free), none missing, none overlapping,
// each shard_size bytes but the last, and the last ending at the file's end
// (a file appended to or truncated after signing is refused). Throws
// Error(kSignature, shown) naming the first range that does not fit.
ShardTable shard_table(const Statement& st, const std::string& resource, uint64_t file_size, const std::string& shown);

// A local file's identity for the process-wide cache of verified shards:
// device, inode, size and modification time (ns). A file rewritten in place
// keeps its inode but changes its mtime: its shards are hashed again.
struct FileId {
  uint64_t dev = 0, ino = 0, size = 0;
  int64_t mtime_ns = 0;
};
FileId file_id(int fd);

// Hashes the shards of `table` that reads touch, before their bytes are
// used. Reads bytes with `read` (fd: pread from a local file, whose FileId
// keys the process-wide cache). Every shard is hashed at most once per guard
// (state: unverified, being hashed, verified; a thread that needs a shard
// another is hashing waits for it), and, for a local file, once per process
// (the cache); a shard that does not match is never marked, so every read of
// it fails. Thread-safe.
class ShardGuard {
 public:
  // Dups `fd`. `use_cache` false: hash every shard once more whatever the
  // process-wide cache says (a full verify), still filling it.
  ShardGuard(ShardTable table, int fd, bool use_cache = true);
  ~ShardGuard();
  ShardGuard(const ShardGuard&) = delete;
  ShardGuard& operator=(const ShardGuard&) = delete;

  // Ensures every shard covering [off, off + n) is verified, hashing the
  // others on up to `threads` threads (0 = all cores; under 512 KiB of
  // shards, or one shard, hashed by the caller). Throws Error(kSignature) naming the
  // file, the byte range and the resource of the first shard that does not
  // match, or a range past the signed length; kIo.
  void ensure(uint64_t off, uint64_t n, unsigned threads = 1) const;
  // ensure() for each of `ranges` ({offset, length} pairs) at once: the
  // shards they need, each once, hashed together on up to `threads` threads
  // (0 = all cores) when they add up to 512 KiB or more, else by the caller
  // (which hashes first the shards no other thread is hashing, then waits
  // for those: threads ensuring the same ranges share the work).
  void ensure_ranges(std::span<const std::pair<uint64_t, uint64_t>> ranges, unsigned threads = 0) const;
  // Every shard (a full verify).
  void ensure_all(unsigned threads) const { ensure(0, table_.size(), threads); }
  // Verifies shard k (as ensure does for each shard it needs).
  void verify_shard(size_t k) const;
  // From now on, hash shards through `base`, a read-only map of the whole
  // file (the reader's, once LMDB has mapped it; it must outlive the guard's
  // use): no copy, and the pages a read then uses are already mapped.
  // Before it, shards are read with pread.
  void use_map(const std::byte* base) const { map_.store(base, std::memory_order_release); }
  const ShardTable& table() const { return table_; }
  // Shards hashed by this guard so far (for tests of the cost rule).
  uint64_t hashed() const { return hashed_.load(std::memory_order_relaxed); }

 private:
  // verify_shard(k); when another thread is hashing shard k and `wait` is
  // false, returns false at once instead of waiting for it.
  bool hash_shard(size_t k, bool wait) const;

  ShardTable table_;
  bool use_cache_ = true;
  int fd_ = -1;
  FileId id_;
  std::unique_ptr<std::atomic<uint8_t>[]> state_;  // 0 unverified, 1 being hashed, 2 verified
  mutable std::atomic<uint64_t> hashed_{0};
  mutable std::atomic<const std::byte*> map_{nullptr};
};

// The signature's side of a signed local open (Archive::open with
// OpenOptions::signature; docs/signing.md "What is verified when"), shared
// by the opening thread and one helper thread: the bundle's check (envelope,
// statement, this file's shard table: check_bundle, resource_of,
// shard_table), then the shards under the ranges the open trusts, hashed.
// Each step is taken by whichever thread gets to it first, so a helper that
// starts late (waking an idle core can take a millisecond) only takes what
// is left, and the opening thread never waits for it to start.
class SignedOpen {
 public:
  using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;  // {offset, length}

  // Starts the helper thread on the check of `check` for `file` (shown as
  // `shown`), `size` bytes open as `fd` (which must stay open until finish()
  // returns).
  SignedOpen(const SignatureCheck& check, std::string shown, uint64_t size, int fd);
  // finish()'s end if it was not called: the helper stops touching the file.
  ~SignedOpen();
  SignedOpen(const SignedOpen&) = delete;
  SignedOpen& operator=(const SignedOpen&) = delete;

  // The ranges the open trusts (the pages it read, the values it uses), for
  // the helper to hash once the shard table stands. Called at most once.
  void trust(Ranges ranges);
  // The reader's map of the whole file: shards are hashed through it from
  // now on (ShardGuard::use_map). It must outlive finish().
  void use_map(const std::byte* base);
  // Checks the bundle here unless the helper has, then hashes the shards
  // under the trusted ranges beside the helper, and returns the guard for
  // the reads that follow. Throws the bundle's Error(kSignature) first, then
  // the first shard that does not match (Error(kSignature)). When it returns
  // or throws, the helper no longer touches the file or the map.
  std::shared_ptr<const ShardGuard> finish();

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// Shards hashed by every ShardGuard of the process so far (the cost rule's
// tests: a read of S bytes hashes at most S + 2 shards).
uint64_t shards_hashed();

// A Source that serves only verified bytes of `inner`: every read is widened
// to the whole shards covering it, those are fetched (one stretch per run of
// touching ranges, in one inner read call), hashed and compared, and only
// then copied out. Nothing is kept: a later read of the same bytes fetches
// and hashes them again (a remote object's bytes cannot be trusted to stay
// as they were). size() is the signed length; the inner object must have
// that length (checked at the first read: Error(kSignature) otherwise).
// Costs per read of S bytes at most S + 2 shards fetched and hashed per
// stretch.
std::shared_ptr<const Source> verified_source(std::shared_ptr<const Source> inner, ShardTable table);

}  // namespace treecask::sig
