// Archive::Impl: an open archive's state (the map, the verified manifest,
// the blob sites) and the read engine every read of read/archive.cc runs on
// (chunk checks, decoding, copies, slice plans). Private to the read layer:
// read/archive_open.cc fills it, read/archive.cc serves reads from it.
#pragma once

#include "treecask/archive.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
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

  ~Impl() {
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
    if (blob_checked[b].load(std::memory_order_acquire) == 0) check_blob(b, li);
    return {blob_data[b] + c->offset(), c->stored_size()};
  }
  // The checks of blob `id` that open leaves to its first use: its LMDB
  // overflow page header when the structure check saw the run (check_structure's
  // rule, lmdb::check_overflow_head; with structure validation the map base
  // is known, so every blob value in an overflow run is checked) and its
  // 48-byte header (magic, id, reserved bytes, payload length = the
  // manifest's). Read with pread(), so a check maps no page (through the map
  // when there is no map base). Throws Error(kCorruption) naming the file and
  // leaf `li`, whose read needed the blob.
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
  void copy_out(std::span<const std::byte> src, std::byte* out) const {
    uint64_t off = static_cast<uint64_t>(src.data() - map_base);
    size_t done = 0;
    while (map_base && fd >= 0 && done < src.size()) {
      ssize_t n = ::pread(fd, out + done, src.size() - done, static_cast<off_t>(off + done));
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    if (done < src.size()) std::memcpy(out + done, src.data() + done, src.size() - done);
  }
  // Reusable per-thread buffers for decode_chunk and the partial reads; each
  // grows to the largest size asked and is freed with the Scratch.
  struct Scratch {
    struct Buf {
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
    Buf chunk, stored, shuffled;
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
      for (uint64_t at = 0; at < raw; at += kReadPiece) {
        uint64_t n = std::min(kReadPiece, raw - at);
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
    // One Scratch per thread, made at its first chunk and reused for the next.
    std::vector<std::unique_ptr<Scratch>> scratch(std::max(nthreads, 1u));
    parallel_for(nchunks, nthreads, [&](size_t k, unsigned worker) {
      if (!scratch[worker]) scratch[worker] = std::make_unique<Scratch>();
      chunk_to_plans(li, c0 + k, plans, upb, verify, *scratch[worker]);
    });
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
    size_t hits = 0;
    const slice::Plan* only = nullptr;
    slice::Cursor at;
    for (const slice::Plan& p : plans) {
      if (p.empty() || ce <= p.base || cb >= p.end) continue;
      slice::Cursor c = slice::first_run_after(p, cb);
      if (c.done || c.src >= ce) continue;
      if (++hits == 1) {
        only = &p;
        at = std::move(c);
      }
    }
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
    std::byte* buf = scratch.chunk.get(std::min<uint64_t>(kReadPiece, raw));
    format::Xxh3Stream hash(format::chunk_seed(li, ci));
    for (uint64_t at = 0; at < raw; at += kReadPiece) {
      uint64_t n = std::min(kReadPiece, raw - at);
      copy_out(src.subspan(at, n), buf);
      if (verify) hash.update({buf, n});
      scatter(buf, cb + at * upb, cb + (at + n) * upb);
    }
    if (verify) expect_checksum(li, ci, c, hash.digest());
  }
};

}  // namespace treecask
