// Archive::Impl: an open archive's state (the map, the verified manifest,
// the blob sites) and the read engine every read of read/archive.cc runs on
// (chunk checks, decoding, copies, slice plans). Private to the read layer:
// read/archive_open.cc fills it for a local file, read/remote_open.cc for a
// Source, read/archive.cc serves reads from it.
//
// One engine serves both: every byte a read needs is copied out with
// fetch() (pread() from the file, or a range read of the Source), and the
// chunks a read needs are visited with for_chunks(), which for a Source
// first fetches them in coalesced, concurrent ranges (SPEC.md "Remote
// reading").
#pragma once

#include "treecask/archive.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <condition_variable>
#include <algorithm>
#include <optional>
#include <vector>

#include "format/codec.h"
#include "format/format.h"
#include "lmdb/check.h"
#include "lmdb/env.h"
#include "lmdb/layout.h"
#include "format/manifest.h"
#include "util/parallel.h"
#include "read/slice.h"
#include "sign/shards.h"
#include "treecask/source.h"
#include "treecask/treecask.h"

namespace treecask {

struct Archive::Impl {
  std::string file;
  uint64_t file_size = 0;
  OpenOptions options;
  format::Header header;
  lmdb::Env env;
  MDB_txn* txn = nullptr;  // held for the Archive's life: keeps every blob pointer valid
  std::unique_ptr<Manifest> manifest;
  std::vector<const std::byte*> blob_data;  // payload start per blob id
  // File offset 0 in the map (find_map_base): locates LMDB's overflow page
  // headers for S11 and lets copies use pread(). Null only when structure
  // validation is off and the base was not found (copies then go through
  // the map, and S11, not required then, is not checked).
  const std::byte* map_base = nullptr;
  int fd = -1;                              // the mapped inode, for bulk pread()
  // A remote archive (Archive::open(Source)): every byte comes from
  // `source`. There is no map then: map_base is the start of an address
  // range reserved (PROT_NONE, never touched) to keep the engine's
  // arithmetic in one form, so blob_data[b] - map_base is a file offset;
  // `manifest_bytes` owns the manifest the parsed Manifest borrows.
  std::shared_ptr<const Source> source;
  void* reserved = nullptr;
  size_t reserved_bytes = 0;
  std::vector<std::byte> manifest_bytes;
  // Each blob's header (and, with structure validation, its LMDB overflow
  // page header) is checked before the first use of the blob's bytes, not
  // at open (SPEC.md "Before a blob's first use", step 38): an open reads no
  // page per blob. 1 once checked; a failed check is not remembered, so every
  // use of a bad blob fails.
  struct BlobSite {
    uint64_t value_size = 0;                 // the LMDB value: 48-byte header + payload + padding
    uint64_t overflow_page = UINT64_MAX;     // first page of its overflow run, when the structure check saw one
  };
  std::vector<BlobSite> blob_site;
  std::unique_ptr<std::atomic<uint8_t>[]> blob_checked;
  uint64_t page_size = 0, last_page = 0;
  // A signed open of a local file (OpenOptions::signature): the shards of
  // the file that reads must hash before they use bytes (sign/shards.h).
  // Null for an unsigned open, and for a remote one, whose source verifies
  // every byte it fetches (sig::verified_source).
  std::shared_ptr<const sig::ShardGuard> guard;
  // Ensures the signed shards covering the file's bytes [off, off + n) are
  // verified (no-op unsigned), on up to `threads` threads; a mismatch names
  // leaf `li` when it is not SIZE_MAX.
  void ensure_signed(uint64_t off, uint64_t n, size_t li = SIZE_MAX, unsigned threads = 1) const {
    const std::pair<uint64_t, uint64_t> one{off, n};
    ensure_signed(std::span(&one, 1), li, threads);
  }
  // The same for several ranges ({offset, length}), hashed in one pass.
  void ensure_signed(std::span<const std::pair<uint64_t, uint64_t>> ranges, size_t li, unsigned threads) const {
    if (!guard) return;
    try {
      guard->ensure_ranges(ranges, threads);
    } catch (const Error& e) {
      if (li == SIZE_MAX || e.code() != ErrorCode::kSignature) throw;
      throw Error(e.code(), file, key(li), e.message());
    }
  }

  // The open steps both opens share (read/archive_open.cc; SPEC.md "Reader
  // checks" 3-5), on what each found in the file's two databases. Each
  // throws Error naming the file.
  // Steps 1 and 1b: the LMDB meta pages (fills `meta`, page_size and
  // last_page) and, when `structure` is given, the B-tree walk (fills it).
  void check_container(const lmdb::FileReader& in, lmdb::MetaInfo* meta, lmdb::StructureStats* structure);
  // Step 3: the header record (empty: none).
  void take_header(std::span<const std::byte> hdr);
  // Step 4: the manifest's length, checksum, verifier and invariants; the
  // Manifest borrows `man`, which must outlive the Impl.
  void take_manifest(std::span<const std::byte> man);
  // Step 5: blob `id`'s LMDB value (a null span: absent) as addresses in the
  // map (blob_data - map_base is its file offset), and the first page of its
  // overflow run when the structure walk bounded one (else UINT64_MAX).
  struct BlobValue {
    std::span<const std::byte> value;
    uint64_t overflow_page = UINT64_MAX;
  };
  void take_blobs(uint64_t entries, const std::function<BlobValue(uint32_t)>& value_of);

  ~Impl() {
    if (reserved) ::munmap(reserved, reserved_bytes);
    if (fd >= 0) ::close(fd);
    if (txn) mdb_txn_abort(txn);
    env.close();
  }

  bool want_verify(Verify v) const {
    return v == Verify::kYes || (v == Verify::kDefault && options.verify_checksums);
  }
  const LeafRecord& rec(size_t i) const {
    if (i >= manifest->leaves.size())
      throw Error(ErrorCode::kInvalidArgument, file, "",
                  "leaf index " + std::to_string(i) + " out of range (archive has " +
                      std::to_string(manifest->leaves.size()) + " leaves)");
    return manifest->leaves[i];
  }
  std::string key(size_t i) const { return std::string(manifest->leaves[i].key_path); }
  // rec(i) for a read of leaf i's bytes: a leaf of a sharded checkpoint's
  // index (format 3.0) has none here; ShardedArchive reads it.
  const LeafRecord& data_rec(size_t i) const {
    const LeafRecord& r = rec(i);
    if (r.num_shards != 0)
      throw Error(ErrorCode::kUnsupported, file, key(i),
                  "the leaf's bytes are in the shard files of a sharded checkpoint; open its "
                  "directory with ShardedArchive (SPEC.md \"Sharded checkpoints\")");
    return r;
  }
  uint64_t raw_size(const LeafRecord& r, uint64_t ci) const {
    return std::min(r.chunk_size, r.byte_length - ci * r.chunk_size);
  }
  // The stored bytes of chunk `c` of leaf `li`, once its blob's header is
  // checked (check_blob; throws what it throws).
  std::span<const std::byte> stored(size_t li, const fb::Chunk* c) const {
    const uint32_t b = c->blob();
    const std::byte* at = blob_data[b] + c->offset();
    const bool unchecked = blob_checked[b].load(std::memory_order_acquire) == 0;
    if (guard) ensure_signed(static_cast<uint64_t>(at - map_base), c->stored_size(), li);  // headers: check_blob
    if (unchecked) check_blob(b, li);
    return {at, c->stored_size()};
  }
  // The checks of blob `id` that open leaves to its first use: its LMDB
  // overflow page header when the structure check saw the run (check_structure's
  // rule, lmdb::check_overflow_head; with structure validation the map base
  // is known, so every blob value in an overflow run is checked) and its
  // 48-byte header (magic, id, reserved bytes, payload length = the
  // manifest's). Read with pread(), so a check maps no page (through the map
  // when there is no map base). Throws Error(kCorruption) naming the file and
  // leaf `li`, whose read needed the blob; in a signed archive, when the
  // headers' shard does not match, Error(kSignature) instead (that shard is
  // hashed only then: the headers gate the check and are never handed out).
  void check_blob(uint32_t id, size_t li) const;
  // Throws kChecksumMismatch unless `digest` is chunk `ci`'s stored checksum.
  void expect_checksum(size_t li, uint64_t ci, const fb::Chunk* c, uint64_t digest) const {
    if (digest != c->checksum())
      throw Error(ErrorCode::kChecksumMismatch, file, key(li),
                  "chunk " + std::to_string(ci) + " does not match its XXH3 checksum");
  }
  void check_chunk(size_t li, uint64_t ci) const {
    const fb::Chunk* c = rec(li).chunks->Get(static_cast<flatbuffers::uoffset_t>(ci));
    expect_checksum(li, ci, c, format::xxh3(stored(li, c), format::chunk_seed(li, ci)));
  }
  // True when the chunk's stored bytes are its raw bytes: a None leaf, or a
  // chunk stored raw in an LZ4 leaf without a filter.
  bool chunk_is_raw(const LeafRecord& r, const fb::Chunk* c) const {
    return r.codec == Codec::kNone || ((c->flags() & format::kChunkStoredRaw) && r.shuffle_bytes == 0);
  }
  // Copies mapped bytes to `out` with pread() from the same inode: a bulk copy
  // out of the page cache costs no page faults on a fresh mapping (the mapped
  // path faults every 4 KiB page; llama.cpp #9244). Falls back to memcpy.
  // Bytes copied, then hashed, at a time: small enough to be hashed from L2,
  // large enough that the pread() calls cost little (512 KiB read one 4 MiB
  // leaf ~6% faster than 128 KiB on this VM, full loads alike; docs/performance.md).
  static constexpr uint64_t kReadPiece = 512 << 10;
  // Bytes copied (and hashed) at a time from one chunk: a remote chunk is
  // fetched whole (one range, not one request per 512 KiB).
  uint64_t read_piece() const { return source ? UINT64_MAX : kReadPiece; }
  void copy_out(std::span<const std::byte> src, std::byte* out) const {
    if (source) return fetch(static_cast<uint64_t>(src.data() - map_base), out, src.size());
    uint64_t off = static_cast<uint64_t>(src.data() - map_base);
    size_t done = 0;
    while (map_base && fd >= 0 && done < src.size()) {
      ssize_t n = ::pread(fd, out + done, src.size() - done, static_cast<off_t>(off + done));
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    if (done < src.size()) std::memcpy(out + done, src.data() + done, src.size() - done);
  }
  // A reusable buffer, not zeroed: grows to the largest size asked, freed
  // with its owner.
  struct Buffer {
    std::unique_ptr<std::byte[]> p;
    size_t cap = 0;
    std::byte* get(size_t n) {
      if (cap < n) {
        p.reset(new std::byte[n]);
        cap = n;
      }
      return p.get();
    }
  };

  // ---- The bytes of a remote archive ----
  // The open's first read (Archive::open(Source)): the object's first
  // kOpenHeadBytes, [0, open_head.size()), and its last kOpenTailBytes,
  // [tail_start, file_size) (source.h), never overlapping, kept for the
  // archive's life: the one cache of a remote archive. Every other byte is
  // fetched when a read needs it, once per read.
  std::vector<std::byte> open_head, open_tail;
  uint64_t tail_start = 0;

  // Copies the part of the file's bytes [off, off + n) that the open's
  // bytes hold to `out`, and narrows the range (off, out, n together) to
  // the rest: nothing, or one stretch between them (they are a prefix and a
  // suffix of the file).
  void copy_held(uint64_t& off, std::byte*& out, size_t& n) const {
    if (off < open_head.size()) {
      const size_t k = static_cast<size_t>(std::min<uint64_t>(n, open_head.size() - off));
      std::memcpy(out, open_head.data() + off, k);
      off += k;
      out += k;
      n -= k;
    }
    if (n > 0 && off + n > tail_start) {
      const uint64_t from = std::max(off, tail_start);
      const size_t k = static_cast<size_t>(off + n - from);
      std::memcpy(out + (from - off), open_tail.data() + (from - tail_start), k);
      n -= k;
    }
  }

  // A stretch of the file fetched by the calling thread: for_chunks sets
  // the pieces of the group it fetched (sorted by start, never
  // overlapping) while it visits that group's chunks, and fetch() serves
  // reads inside one piece from memory.
  struct Piece {
    uint64_t start = 0;
    std::span<const std::byte> bytes;
  };
  struct Window {
    const Impl* owner = nullptr;
    std::span<const Piece> pieces;
  };
  static inline thread_local const Window* t_window = nullptr;

  // Copies the file's bytes [off, off + n) of a remote archive to `out`:
  // what the open's bytes hold from them, the rest from the calling
  // thread's window when one piece holds it (no copy when it was fetched in
  // place, at `out`), else with one range read of the source (throws what
  // Source::read throws).
  void fetch(uint64_t off, std::byte* out, size_t n) const {
    copy_held(off, out, n);
    if (n == 0) return;
    if (const Window* w = t_window; w && w->owner == this) {
      auto it = std::upper_bound(w->pieces.begin(), w->pieces.end(), off,
                                 [](uint64_t o, const Piece& p) { return o < p.start; });
      if (it != w->pieces.begin()) {
        const Piece& p = *--it;
        if (off - p.start <= p.bytes.size() && n <= p.bytes.size() - (off - p.start)) {
          const std::byte* at = p.bytes.data() + (off - p.start);
          if (at != out) std::memcpy(out, at, n);
          return;
        }
      }
    }
    ReadRange r{off, {out, n}};
    source->read(std::span<const ReadRange>(&r, 1));
  }

  // One chunk a read needs.
  struct ChunkJob {
    size_t leaf;
    uint64_t chunk;
  };
  const fb::Chunk* chunk_of(const ChunkJob& j) const {
    return rec(j.leaf).chunks->Get(static_cast<flatbuffers::uoffset_t>(j.chunk));
  }
  // Where chunk `ci` of leaf `li` starts in the file (no check of its blob).
  uint64_t chunk_offset(size_t li, uint64_t ci) const {
    const fb::Chunk* c = rec(li).chunks->Get(static_cast<flatbuffers::uoffset_t>(ci));
    return static_cast<uint64_t>(blob_data[c->blob()] - map_base) + c->offset();
  }
  // Remote reads fetch the chunks they need in groups (read/fetch.cc): the
  // chunks outside the open's bytes in file order, merged while the gap to
  // the next is at most kFetchGap bytes, the group's chunks hold at most
  // kFetchGroup bytes and it spans at most kFetchSpan (a larger chunk is a
  // group of its own). A group is one stretch of the file, passed to
  // Source::read as touching ranges: runs of raw chunks bound for
  // consecutive bytes of the caller's memory (`in_place`; a run of at least
  // kInPlaceMin bytes) land there, everything else (other chunks, the gaps,
  // blob headers) in a buffer of its worker. A group whose first blob's
  // header is unchecked starts at that header when it lies at most
  // kFetchHeadReach bytes before it (and after the previous group), else
  // fetches it as a range of its own in the same call; every other blob's
  // header lies inside the group that holds the blob's first chunk, so no
  // byte is fetched twice. That group checks the headers it fetched as soon
  // as its bytes arrive (SPEC.md step 38), and a group holding later chunks
  // of such a blob waits for that check before it uses them. Memory: one
  // buffered group per worker (at most kFetchSpan + kFetchHeadReach), at
  // most Source::concurrency() workers.
  static constexpr uint64_t kFetchGroup = uint64_t{8} << 20;
  static constexpr uint64_t kFetchSpan = uint64_t{9} << 20;
  static constexpr uint64_t kFetchGap = uint64_t{64} << 10;
  static constexpr uint64_t kFetchHeadReach = uint64_t{256} << 10;
  static constexpr uint64_t kInPlaceMin = uint64_t{256} << 10;

  // The groups of one for_chunks call on a remote archive (plan_fetch).
  struct FetchPlan {
    struct Group {
      size_t first = 0, last = 0;            // its jobs: order[first, last)
      uint64_t start = 0, end = 0;           // the stretch fetched: between the open's bytes
      uint64_t head = UINT64_MAX, head_end = 0;  // a blob header fetched as a range of its own
      std::vector<std::pair<uint32_t, size_t>> owns;  // (blob, a leaf of it): headers it checks
      std::vector<size_t> waits;             // the groups that check its other blobs' headers
    };
    std::vector<size_t> order;        // jobs to fetch, in file order
    std::vector<size_t> held;         // jobs wholly inside the open's bytes
    std::vector<size_t> held_waits;   // the groups that check their blobs' headers
    std::vector<uint64_t> at;         // per job: where its stored bytes start in the file
    std::vector<std::byte*> dst;      // per job: where it is fetched in place, or nullptr
    std::vector<Group> groups;        // in file order
  };
  FetchPlan plan_fetch(std::span<const ChunkJob> jobs,
                       const std::function<std::byte*(const ChunkJob&)>& in_place) const;
  // Fetches group `g` with one Source::read call (buffered bytes in `buf`)
  // and returns its pieces in `pieces`. Throws what the source throws,
  // naming the leaf of the group's first chunk.
  void fetch_group(std::span<const ChunkJob> jobs, const FetchPlan& plan, size_t g, Buffer& buf,
                   std::vector<Piece>& pieces) const;

  // Calls fn(job, worker) once for every job. A local archive runs them on
  // up to `threads` threads (parallel_for); a remote one fetches them in
  // groups (plan_fetch), up to Source::concurrency() at once, and visits
  // each group's chunks on the thread that fetched it with the group as its
  // window, so every fetch() of those chunks is served from memory; jobs
  // inside the open's bytes are visited by one worker (the last item),
  // fetching nothing.
  // `in_place`, when given, says where a job's stored bytes may be fetched
  // as they are (the destination of a raw chunk), or nullptr. A source
  // error is rethrown naming the leaf of the group's first chunk.
  template <typename Fn>
  void for_chunks(std::span<const ChunkJob> jobs, unsigned threads, Fn&& fn,
                  const std::function<std::byte*(const ChunkJob&)>& in_place = {}) const {
    if (!source) {
      parallel_for(jobs.size(), threads, [&](size_t j, unsigned w) { fn(jobs[j], w); });
      return;
    }
    const FetchPlan plan = plan_fetch(jobs, in_place);
    const size_t items = plan.groups.size() + (plan.held.empty() ? 0 : 1);
    const unsigned n = static_cast<unsigned>(std::min<size_t>(std::max(source->concurrency(), 1u), items));
    std::vector<Buffer> bufs(std::max(n, 1u));
    std::vector<std::vector<Piece>> pieces(bufs.size());
    // Which items have fetched and checked their blob headers; `aborted`
    // once one failed.
    std::mutex mu;
    std::condition_variable cv;
    std::vector<char> ready(items, 0);
    bool aborted = false;
    parallel_for(items, n, [&](size_t g, unsigned w) {
      // Says "ready" once the group has checked its headers, and "aborted"
      // when an item is left by an exception (at any point): an item claimed
      // after a failure is skipped, so its waiters must not wait for it.
      struct Signal {
        std::mutex& mu;
        std::condition_variable& cv;
        char& ready;
        bool& aborted;
        int exceptions = std::uncaught_exceptions();
        void fire(bool failed) {
          {
            std::lock_guard lock(mu);
            ready = 1;
            aborted = aborted || failed;
          }
          cv.notify_all();
        }
        ~Signal() { fire(std::uncaught_exceptions() > exceptions); }
      } signal{mu, cv, ready[g], aborted};
      if (g == plan.groups.size()) {
        std::unique_lock lock(mu);
        for (size_t o : plan.held_waits) cv.wait(lock, [&] { return ready[o] != 0 || aborted; });
        if (aborted) return;  // the call fails with another group's error
        lock.unlock();
        for (size_t j : plan.held) fn(jobs[j], w);
        return;
      }
      const FetchPlan::Group& grp = plan.groups[g];
      fetch_group(jobs, plan, g, bufs[w], pieces[w]);
      Window win{this, pieces[w]};
      t_window = &win;
      struct Reset {
        ~Reset() { t_window = nullptr; }
      } reset;
      for (auto [blob, leaf] : grp.owns) {
        if (blob_checked[blob].load(std::memory_order_acquire) != 0) continue;
        try {
          check_blob(blob, leaf);
        } catch (const Error&) {  // thrown again at the blob's use, naming the leaf that uses it
        }
      }
      signal.fire(false);
      if (!grp.waits.empty()) {
        std::unique_lock lock(mu);
        for (size_t o : grp.waits) cv.wait(lock, [&] { return ready[o] != 0 || aborted; });
        if (aborted) return;  // the call fails with another group's error
      }
      for (size_t k = grp.first; k < grp.last; ++k) fn(jobs[plan.order[k]], w);
    });
  }
  // Workers for_chunks may number for `threads` (local) or the source.
  unsigned chunk_workers(unsigned threads) const {
    return std::max(source ? source->concurrency() : threads, 1u);
  }
  // Where blob `id`'s check_blob bytes start: its LMDB overflow page header
  // when the structure walk saw the run, else its 48-byte header.
  uint64_t blob_head_offset(uint32_t id) const {
    const uint64_t value = static_cast<uint64_t>(blob_data[id] - map_base) - format::kBlobHeaderSize;
    return blob_site[id].overflow_page != UINT64_MAX ? value - lmdb::kOverflowDataOffset : value;
  }
  // The bytes check_blob reads for blob `id`: {blob_head_offset, length}.
  std::pair<uint64_t, uint64_t> blob_head_range(uint32_t id) const {
    const bool run = blob_site[id].overflow_page != UINT64_MAX;
    return {blob_head_offset(id), format::kBlobHeaderSize + (run ? lmdb::kOverflowDataOffset : 0)};
  }

  // Reusable per-thread buffers for decode_chunk and the partial reads; each
  // grows to the largest size asked and is freed with the Scratch.
  struct Scratch {
    Buffer chunk, stored, shuffled;
  };
  // Writes the raw bytes of chunk `ci` to `out` (raw_size bytes), checking the
  // checksum of exactly the bytes delivered when `verify`. Temporary buffers
  // come from `scratch` when given, else are allocated for the call.
  void decode_chunk(size_t li, uint64_t ci, std::byte* out, bool verify, Scratch* scratch = nullptr) const {
    const LeafRecord& r = rec(li);
    const fb::Chunk* c = r.chunks->Get(static_cast<flatbuffers::uoffset_t>(ci));
    auto src = stored(li, c);
    uint64_t raw = raw_size(r, ci);
    if (chunk_is_raw(r, c)) {
      if (!verify) return copy_out(src, out);
      // Copy and hash piece by piece, each piece hashed while still in cache:
      // hashing a whole 1 MiB chunk after copying it reads it back from L3.
      format::Xxh3Stream hash(format::chunk_seed(li, ci));
      for (uint64_t at = 0; at < raw; at += read_piece()) {
        uint64_t n = std::min(read_piece(), raw - at);
        copy_out(src.subspan(at, n), out + at);
        hash.update({out + at, n});
      }
      return expect_checksum(li, ci, c, hash.digest());
    }
    // The stored bytes are copied out with pread() first, as raw chunks are:
    // a full load then maps no page of the file, so resident memory grows by
    // the output alone, and the bytes hashed are the bytes decoded.
    std::unique_ptr<std::byte[]> stored_copy;
    std::byte* stored_at = scratch ? scratch->stored.get(src.size())
                                   : (stored_copy.reset(new std::byte[src.size()]), stored_copy.get());
    copy_out(src, stored_at);
    std::span<const std::byte> in(stored_at, src.size());
    if (verify) expect_checksum(li, ci, c, format::xxh3(in, format::chunk_seed(li, ci)));
    // An LZ4 block is decoded (into a scratch buffer when byte-shuffled); a
    // chunk here with flag bit 0 holds the shuffled bytes themselves. A
    // shuffled chunk is then unshuffled into `out` (SPEC.md "Filters").
    std::unique_ptr<std::byte[]> decoded;
    std::span<const std::byte> filtered = in;
    if (!(c->flags() & format::kChunkStoredRaw)) {
      std::byte* dst = out;
      if (r.shuffle_bytes && scratch) {
        dst = scratch->shuffled.get(raw);
      } else if (r.shuffle_bytes) {
        decoded.reset(new std::byte[raw]);
        dst = decoded.get();
      }
      if (!codec::lz4_decode(in, {dst, raw}))
        throw Error(ErrorCode::kCorruption, file, key(li),
                    "chunk " + std::to_string(ci) + " does not decode to its declared " +
                        std::to_string(raw) + " bytes");
      filtered = {dst, raw};
    }
    if (r.shuffle_bytes) codec::unshuffle(filtered, out, r.shuffle_bytes);
  }

  // A view of a remote archive's leaf: there is no map to point into.
  Error no_view(size_t li) const {
    return Error(ErrorCode::kUnsupported, file, key(li),
                 "a remote archive has no zero-copy view (no local map); use read()");
  }
  Error arg_error(size_t li, const std::string& what) const {
    return Error(ErrorCode::kInvalidArgument, file, key(li), what);
  }

  // The plan of one read_slice box of leaf `li`, after checking it.
  slice::Plan slice_plan(size_t li, const Archive::SliceRequest& q) const;

  // Runs `plans` (boxes of leaf `li`; units are elements of 2 or 4 bits when
  // they unpack; 6-bit plans go through run_wide_plans):
  // every chunk that some plan needs is decoded once, by one thread, and its
  // pieces copied to every plan. See Archive::read_slices for `threads`.
  void run_plans(size_t li, std::span<const slice::Plan> plans, bool verify, unsigned threads) const {
    const LeafRecord& r = rec(li);
    uint64_t upb = 1;  // source units per byte
    uint64_t lo = UINT64_MAX, hi = 0;
    for (const slice::Plan& p : plans) {
      if (p.empty()) continue;
      upb = p.unpack ? 8 / p.bits : 1;
      lo = std::min(lo, p.base);
      hi = std::max(hi, p.end);
    }
    if (lo >= hi) return;
    const uint64_t cs = r.chunk_size * upb;  // units per chunk
    const uint64_t c0 = lo / cs, c1 = (hi - 1) / cs;
    const uint64_t nchunks = c1 - c0 + 1;
    unsigned nthreads = threads ? threads
                                : (nchunks * r.chunk_size >= (uint64_t{8} << 20) ? resolve_threads(0) : 1);
    nthreads = static_cast<unsigned>(std::min<uint64_t>(nthreads, nchunks));
    // A remote read fetches only the chunks some plan needs; a local one
    // lets chunk_to_plans skip the others.
    std::vector<ChunkJob> jobs;
    jobs.reserve(nchunks);
    for (uint64_t ci = c0; ci <= c1; ++ci)
      if (!source || plans_hit(li, ci, plans, upb, nullptr, nullptr) != 0) jobs.push_back({li, ci});
    // One Scratch per worker, made at its first chunk and reused for the next.
    std::vector<std::unique_ptr<Scratch>> scratch(chunk_workers(nthreads));
    for_chunks(jobs, nthreads, [&](const ChunkJob& job, unsigned worker) {
      if (!scratch[worker]) scratch[worker] = std::make_unique<Scratch>();
      chunk_to_plans(li, job.chunk, plans, upb, verify, *scratch[worker]);
    });
  }

  // How many of `plans` need bytes of chunk `ci` (units per byte `upb`);
  // when exactly one does, `only` and `at` (when given) receive it and its
  // first run in the chunk.
  size_t plans_hit(size_t li, uint64_t ci, std::span<const slice::Plan> plans, uint64_t upb,
                   const slice::Plan** only, slice::Cursor* at) const {
    const LeafRecord& r = rec(li);
    const uint64_t cb = ci * r.chunk_size * upb, ce = cb + raw_size(r, ci) * upb;
    size_t hits = 0;
    for (const slice::Plan& p : plans) {
      if (p.empty() || ce <= p.base || cb >= p.end) continue;
      slice::Cursor c = slice::first_run_after(p, cb);
      if (c.done || c.src >= ce) continue;
      if (++hits == 1 && only) {
        *only = &p;
        *at = std::move(c);
      }
    }
    return hits;
  }

  // Runs plans of a 6-bit dtype (float6_*), whose elements may straddle a
  // chunk boundary: the bytes spanning every plan are read once (read_bytes'
  // path: only the chunks holding them, each checksummed) into a temporary,
  // then the elements are unpacked from it. Costs a temporary of that span.
  void run_wide_plans(size_t li, std::span<const slice::Plan> plans, bool verify, unsigned threads) const {
    uint64_t lo = UINT64_MAX, hi = 0;
    unsigned bits = 8;
    for (const slice::Plan& p : plans) {
      if (p.empty()) continue;
      bits = p.bits;
      lo = std::min(lo, p.base);
      hi = std::max(hi, p.end);
    }
    if (lo >= hi) return;
    const uint64_t b0 = lo * bits / 8, b1 = (hi * bits + 7) / 8;
    std::vector<std::byte> tmp(b1 - b0);
    slice::Plan bp;
    bp.base = b0;
    slice::push_dim(bp, tmp.size(), 1, 1);
    slice::canonicalize(bp);
    bp.origin = tmp.data();
    run_plans(li, std::span<const slice::Plan>(&bp, 1), verify, threads);
    for (const slice::Plan& p : plans) {
      const int64_t step = p.d.back();
      slice::for_each_piece(p, p.base, p.end, [&](uint64_t src, int64_t dst, uint64_t x, uint64_t y) {
        slice::unpack(tmp.data(), (src + x) * bits - b0 * 8, y - x, bits,
                      p.origin + dst + static_cast<int64_t>(x) * step, step);
      });
    }
  }

  void chunk_to_plans(size_t li, uint64_t ci, std::span<const slice::Plan> plans, uint64_t upb,
                      bool verify, Scratch& scratch) const {
    const LeafRecord& r = rec(li);
    const uint64_t raw = raw_size(r, ci);
    const uint64_t cb = ci * r.chunk_size * upb, ce = cb + raw * upb;
    // Which plans need this chunk; when exactly one does, through one run
    // covering the whole chunk, the chunk is decoded straight into place.
    const slice::Plan* only = nullptr;
    slice::Cursor at;
    const size_t hits = plans_hit(li, ci, plans, upb, &only, &at);
    if (hits == 0) return;
    if (hits == 1 && !only->unpack && at.src <= cb && at.src + only->run() >= ce)
      return decode_chunk(li, ci, only->origin + at.dst + static_cast<int64_t>(cb - at.src), verify, &scratch);
    // Copies units [a, b) of the leaf, held at `data`, to every plan.
    auto scatter = [&](const std::byte* data, uint64_t a, uint64_t b) {
      for (const slice::Plan& p : plans) {
        if (!p.unpack) {
          slice::for_each_piece(p, a, b, [&](uint64_t src, int64_t dst, uint64_t x, uint64_t y) {
            std::memcpy(p.origin + dst + static_cast<int64_t>(x), data + (src + x - a), y - x);
          });
          continue;
        }
        // `a` is a multiple of upb (a chunk or piece starts on a byte), so
        // unit u - a sits at the same bit offset in its byte as unit u.
        const int64_t step = p.d.back();
        slice::for_each_piece(p, a, b, [&](uint64_t src, int64_t dst, uint64_t x, uint64_t y) {
          slice::unpack(data, (src + x - a) * p.bits, y - x, p.bits,
                        p.origin + dst + static_cast<int64_t>(x) * step, step);
        });
      }
    };
    const fb::Chunk* c = r.chunks->Get(static_cast<flatbuffers::uoffset_t>(ci));
    if (!chunk_is_raw(r, c)) {
      std::byte* data = scratch.chunk.get(raw);
      decode_chunk(li, ci, data, verify, &scratch);
      return scatter(data, cb, ce);
    }
    // A raw chunk goes piece by piece through a cache-sized buffer: copied out
    // of the page cache, hashed and scattered while the piece is in cache.
    // The checksum is compared once the whole chunk is hashed, as
    // decode_chunk does for a raw chunk copied straight into place.
    auto src = stored(li, c);
    std::byte* buf = scratch.chunk.get(std::min<uint64_t>(read_piece(), raw));
    format::Xxh3Stream hash(format::chunk_seed(li, ci));
    for (uint64_t at = 0; at < raw; at += read_piece()) {
      uint64_t n = std::min(read_piece(), raw - at);
      copy_out(src.subspan(at, n), buf);
      if (verify) hash.update({buf, n});
      scatter(buf, cb + at * upb, cb + (at + n) * upb);
    }
    if (verify) expect_checksum(li, ci, c, hash.digest());
  }
};

}  // namespace treecask
