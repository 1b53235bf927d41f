// Archive: validate, map, index; serve views and copies (SPEC.md "Reader checks").
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

slice::Plan Archive::Impl::slice_plan(size_t li, const Archive::SliceRequest& q) const {
  const LeafRecord& r = rec(li);
  const auto* fshape = r.fb->shape();
  const size_t rank = fshape ? fshape->size() : 0;
  auto dim = [](size_t d) { return "dimension " + std::to_string(d) + ": "; };
  if (q.start.size() != rank || q.stop.size() != rank)
    throw arg_error(li, "slice has " + std::to_string(q.start.size()) + " start and " +
                            std::to_string(q.stop.size()) + " stop indices, the leaf has rank " +
                            std::to_string(rank));
  if (!q.out_byte_strides.empty() && q.out_byte_strides.size() != rank)
    throw arg_error(li, "out_byte_strides has " + std::to_string(q.out_byte_strides.size()) +
                            " entries, the leaf has rank " + std::to_string(rank));
  std::vector<uint64_t> shape(rank), n(rank);
  uint64_t count = 1;
  for (size_t d = 0; d < rank; ++d) {
    int64_t ext = fshape->Get(static_cast<flatbuffers::uoffset_t>(d));
    if (q.start[d] < 0 || q.start[d] > q.stop[d] || q.stop[d] > ext)
      throw arg_error(li, dim(d) + "slice [" + std::to_string(q.start[d]) + ", " +
                              std::to_string(q.stop[d]) + ") is outside [0, " + std::to_string(ext) + "]");
    shape[d] = static_cast<uint64_t>(ext);
    n[d] = static_cast<uint64_t>(q.stop[d] - q.start[d]);
    count *= n[d];  // <= the leaf's element count, checked at open
  }
  const bool packed = dtype_packed(r.dtype);
  const uint64_t elem = packed ? 1 : static_cast<uint64_t>(dtype_bits(r.dtype)) / 8;  // out bytes
  // Destination strides, their span and where element 0 lies in it.
  std::vector<int64_t> dst(rank);
  __int128 o_min = 0, o_max = 0;
  if (q.out_byte_strides.empty()) {
    int64_t st = static_cast<int64_t>(elem);
    for (size_t d = rank; d-- > 0;) {
      dst[d] = st;
      st *= static_cast<int64_t>(n[d]);
    }
    if (q.out.size() != count * elem)
      throw Error(ErrorCode::kShapeMismatch, file, key(li),
                  "output buffer has " + std::to_string(q.out.size()) + " bytes, the slice needs " +
                      std::to_string(count * elem));
  } else {
    for (size_t d = 0; d < rank; ++d) {
      dst[d] = q.out_byte_strides[d];
      if (dst[d] == 0 && n[d] > 1)
        throw arg_error(li, dim(d) + "a destination stride of 0 would write " + std::to_string(n[d]) +
                                " elements to one place");
      if (n[d] == 0) continue;
      __int128 span = static_cast<__int128>(n[d] - 1) * dst[d];
      (span < 0 ? o_min : o_max) += span;
    }
    __int128 need = count == 0 ? 0 : o_max - o_min + elem;
    if (need > static_cast<__int128>(q.out.size()))
      throw Error(ErrorCode::kShapeMismatch, file, key(li),
                  "output buffer has " + std::to_string(q.out.size()) +
                      " bytes, the strides address " + std::to_string(static_cast<uint64_t>(need)));
  }
  slice::Plan p;
  if (count == 0) return p;
  // Source strides in units (bytes, or elements when unpacking a sub-byte dtype).
  uint64_t unit_elem = packed ? 1 : elem;
  std::vector<uint64_t> src(rank);
  uint64_t st = unit_elem;
  for (size_t d = rank; d-- > 0;) {
    src[d] = st;
    st *= shape[d];
  }
  for (size_t d = 0; d < rank; ++d) {
    p.base += static_cast<uint64_t>(q.start[d]) * src[d];
    slice::push_dim(p, n[d], src[d], dst[d]);
  }
  slice::push_dim(p, unit_elem, 1, 1);  // the bytes of one element (one nibble when unpacking)
  slice::canonicalize(p);
  p.origin = q.out.data() - static_cast<int64_t>(o_min);
  p.unpack = packed;
  if (packed) p.bits = static_cast<unsigned>(dtype_bits(r.dtype));
  return p;
}

namespace {
// The address of file offset 0 in the file mapping that holds `addr`: the
// start of the entry of /proc/self/maps whose range contains `addr`, minus
// that entry's file offset. Returns nullptr and sets `why` when
// /proc/self/maps cannot be read or lists no file mapping there.
const std::byte* mapping_base_of(const void* addr, std::string* why) {
  const auto a = reinterpret_cast<uintptr_t>(addr);
  int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *why = std::string("cannot open /proc/self/maps: ") + std::strerror(errno);
    return nullptr;
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  // Lines "start-end perms offset major:minor inode [path]", in increasing
  // address order; numbers hexadecimal except the inode.
  std::string buf;
  char chunk[16384];
  for (bool eof = false; !eof;) {
    ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *why = std::string("cannot read /proc/self/maps: ") + std::strerror(errno);
      return nullptr;
    }
    eof = n == 0;
    buf.append(chunk, static_cast<size_t>(n));
    size_t from = 0;
    for (size_t nl; (nl = buf.find('\n', from)) != std::string::npos; from = nl + 1) {
      buf[nl] = '\0';
      unsigned long long lo, hi, off, inode;
      if (std::sscanf(buf.c_str() + from, "%llx-%llx %*s %llx %*x:%*x %llu", &lo, &hi, &off, &inode) != 4) {
        *why = "cannot parse /proc/self/maps";
        return nullptr;
      }
      if (a < lo) {  // past `addr`: nothing maps it
        eof = true;
        break;
      }
      if (a >= hi) continue;
      if (inode == 0 || off > lo) {
        *why = "/proc/self/maps shows no file mapped at the header record";
        return nullptr;
      }
      return reinterpret_cast<const std::byte*>(static_cast<uintptr_t>(lo - off));
    }
    buf.erase(0, from);
  }
  *why = "/proc/self/maps lists no mapping at the header record";
  return nullptr;
}

// Where file offset 0 lies in LMDB's map, found from `hdr`, the header
// record (a value LMDB returned into the map), and confirmed by reading the
// record's 32 bytes with pread() at the file offset it implies. mmap places
// a map of offset 0 on an OS page boundary, so when the file's pages are no
// larger than the OS page the map starts on a page boundary and
// lmdb::map_base_of finds the page holding the record; otherwise (or if that
// is not confirmed) the mapping that /proc/self/maps lists at `hdr` gives the
// base. Returns nullptr and sets `why` and `code` (kIo: the base cannot be
// found; kCorruption: the map does not hold the bytes pread() reads) when
// neither gives a confirmed base.
const std::byte* find_map_base(std::span<const std::byte> hdr, const lmdb::MetaInfo& meta, int fd,
                               uint64_t file_size, std::string* why, ErrorCode* code) {
  const long os_page = ::sysconf(_SC_PAGESIZE);
  auto confirmed = [&](const std::byte* base) {
    const auto at = reinterpret_cast<uintptr_t>(hdr.data()), b = reinterpret_cast<uintptr_t>(base);
    if (!base || b > at || (os_page > 0 && b % static_cast<uintptr_t>(os_page) != 0)) return false;
    const uint64_t off = at - b;
    std::byte check[format::kHeaderSize];
    return hdr.size() == sizeof check && file_size >= sizeof check && off <= file_size - sizeof check &&
           ::pread(fd, check, sizeof check, static_cast<off_t>(off)) == static_cast<ssize_t>(sizeof check) &&
           std::memcmp(check, hdr.data(), sizeof check) == 0;
  };
  if (os_page > 0 && meta.page_size <= static_cast<uint64_t>(os_page)) {
    if (const std::byte* base = lmdb::map_base_of(hdr.data(), meta.page_size, meta.last_page); confirmed(base))
      return base;
  }
  const std::byte* base = mapping_base_of(hdr.data(), why);
  if (!base) {
    *code = ErrorCode::kIo;
    return nullptr;
  }
  if (confirmed(base)) return base;
  *code = ErrorCode::kCorruption;
  *why = "the map does not hold the header record where /proc/self/maps places file offset 0";
  return nullptr;
}

// LMDB's page header (PAGEHDRSZ): an overflow value starts this far into its first page.
constexpr uint64_t kOverflowPageHeader = lmdb::kOverflowDataOffset;

// The first page of the overflow run that holds `value` (an LMDB value at
// `base` + its offset: page header, then the value), when the structure walk
// bounded one there; else nullopt (no map base, an in-page value, or no walk).
std::optional<uint64_t> overflow_run_of(const std::byte* base, std::span<const std::byte> value,
                                        const lmdb::MetaInfo& meta, const lmdb::StructureStats& structure) {
  if (!base) return std::nullopt;
  const uint64_t off = static_cast<uint64_t>(value.data() - base);
  if (off < kOverflowPageHeader || (off - kOverflowPageHeader) % meta.page_size != 0) return std::nullopt;
  const uint64_t pg = (off - kOverflowPageHeader) / meta.page_size;
  if (!structure.starts_overflow_run(pg)) return std::nullopt;
  return pg;
}

[[noreturn]] void open_fail(ErrorCode code, const std::string& file, const std::string& what) {
  throw Error(code, file, "", what);
}
}  // namespace

void Archive::Impl::check_blob(uint32_t id, size_t li) const {
  const BlobSite& site = blob_site[id];
  const std::byte* value = blob_data[id] - format::kBlobHeaderSize;
  auto bad = [&](const std::string& what) {
    return Error(ErrorCode::kCorruption, file, key(li), "blob " + std::to_string(id) + ": " + what);
  };
  // The overflow page header (16 bytes) and the blob header after it, in one
  // read when the value starts an overflow run; else the blob header alone.
  std::byte head[kOverflowPageHeader + format::kBlobHeaderSize];
  const bool run = site.overflow_page != UINT64_MAX;
  const size_t skip = run ? 0 : kOverflowPageHeader;  // bytes of `head` not read
  const std::byte* from = value - (run ? kOverflowPageHeader : 0);
  const size_t n = sizeof head - skip;
  bool got = false;
  if (map_base && fd >= 0) {
    const uint64_t off = static_cast<uint64_t>(from - map_base);
    got = off <= file_size && n <= file_size - off &&
          ::pread(fd, head + skip, n, static_cast<off_t>(off)) == static_cast<ssize_t>(n);
  }
  if (!got) std::memcpy(head + skip, from, n);  // no pread() (no map base): through the map
  if (run) {
    if (std::string why = lmdb::check_overflow_head(std::span(head, kOverflowPageHeader), site.overflow_page,
                                                    site.value_size, page_size, last_page);
        !why.empty())
      throw bad("LMDB overflow page " + std::to_string(site.overflow_page) + " " + why);
  }
  format::BlobHeader bh;
  const auto& blob_head = *reinterpret_cast<const std::byte(*)[format::kBlobHeaderSize]>(head + kOverflowPageHeader);
  if (std::string why = format::decode_blob_header(blob_head, site.value_size, &bh); !why.empty()) throw bad(why);
  if (bh.blob_id != id || bh.payload_length != manifest->blob_payload[id])
    throw bad("header does not match the manifest");
  blob_checked[id].store(1, std::memory_order_release);
}

Archive Archive::open(const std::filesystem::path& path, const OpenOptions& options) {
  return open_at(AT_FDCWD, path, path.string(), options);
}

Archive Archive::open_at(int dir_fd, const std::filesystem::path& path, const std::string& shown,
                         const OpenOptions& options) {
  auto impl = std::make_shared<Impl>();
  impl->file = shown;
  impl->options = options;
  const std::string& file = impl->file;

  int fd = ::openat(dir_fd, path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) open_fail(ErrorCode::kNotFound, file, "no such file");
    open_fail(ErrorCode::kIo, file, std::string("cannot open: ") + std::strerror(errno));
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (fstat(fd, &st) != 0) open_fail(ErrorCode::kIo, file, "fstat failed");
  if (!S_ISREG(st.st_mode)) open_fail(ErrorCode::kNotAnArchive, file, "not a regular file");
  impl->file_size = static_cast<uint64_t>(st.st_size);

  // 1. LMDB meta pages, before LMDB sees the file.
  lmdb::MetaInfo meta;
  bool not_lmdb = false;
  if (std::string why = lmdb::check_meta_pages(fd, impl->file_size, &meta, &not_lmdb); !why.empty())
    open_fail(not_lmdb ? ErrorCode::kNotAnArchive : ErrorCode::kCorruption, file,
              not_lmdb ? "not a treecask archive (" + why + ")" : why);

  // 1b. Every LMDB page the reads below can reach, still before LMDB sees the file.
  lmdb::StructureStats structure;  // with the first page of every overflow run (its header: check_blob)
  if (options.validate_structure) {
    bool other_lmdb = false;
    if (std::string why = lmdb::check_structure(fd, impl->file_size, meta, &structure, &other_lmdb,
                                                /*read_overflow_heads=*/false);
        !why.empty())
      open_fail(other_lmdb ? ErrorCode::kNotAnArchive : ErrorCode::kCorruption, file,
                other_lmdb ? "not a treecask archive (" + why + ")" : why);
  }

  // 2. Map the very inode we checked (the path may be replaced meanwhile).
  impl->env.create(file);
  MDB_env* env = impl->env.get();
  lmdb::check(mdb_env_set_maxdbs(env, 2), file, "mdb_env_set_maxdbs");
  lmdb::check(mdb_env_set_mapsize(env, impl->file_size), file, "mdb_env_set_mapsize");
  std::string fd_path = "/proc/self/fd/" + std::to_string(fd);
  int rc = mdb_env_open(env, fd_path.c_str(), MDB_RDONLY | MDB_NOSUBDIR | MDB_NOLOCK, 0);
  if (rc == MDB_INVALID) open_fail(ErrorCode::kNotAnArchive, file, "not an LMDB file");
  if (rc == MDB_VERSION_MISMATCH) open_fail(ErrorCode::kCorruption, file, "LMDB version mismatch");
  if (rc != 0) lmdb::fail(rc, file, "mdb_env_open", ErrorCode::kCorruption);
  lmdb::check(mdb_txn_begin(env, nullptr, MDB_RDONLY, &impl->txn), file, "mdb_txn_begin",
              ErrorCode::kCorruption);
  MDB_txn* txn = impl->txn;
  MDB_dbi meta_dbi, blob_dbi;
  rc = mdb_dbi_open(txn, format::kMetaDb, 0, &meta_dbi);
  if (rc == MDB_NOTFOUND) open_fail(ErrorCode::kNotAnArchive, file, "LMDB file without treecask databases");
  if (rc != 0) lmdb::fail(rc, file, "mdb_dbi_open(meta)", ErrorCode::kCorruption);
  rc = mdb_dbi_open(txn, format::kBlobDb, 0, &blob_dbi);
  if (rc == MDB_NOTFOUND) open_fail(ErrorCode::kNotAnArchive, file, "LMDB file without treecask databases");
  if (rc != 0) lmdb::fail(rc, file, "mdb_dbi_open(blobs)", ErrorCode::kCorruption);

  auto get = [&](MDB_dbi dbi, std::span<const std::byte> key, const char* what) {
    MDB_val k{key.size(), const_cast<std::byte*>(key.data())}, v;
    int r = mdb_get(txn, dbi, &k, &v);
    if (r == MDB_NOTFOUND) return std::span<const std::byte>();
    if (r != 0) lmdb::fail(r, file, what, ErrorCode::kCorruption);
    return std::span<const std::byte>(static_cast<const std::byte*>(v.mv_data), v.mv_size);
  };

  // 3. Header record: magic, version, manifest length and checksum.
  auto hdr = get(meta_dbi, std::as_bytes(std::span(format::kHeaderKey)), "mdb_get(header)");
  if (hdr.empty()) open_fail(ErrorCode::kNotAnArchive, file, "no treecask header record");
  if (!format::decode_header(hdr, &impl->header))
    open_fail(ErrorCode::kNotAnArchive, file, "header record lacks the TREECASK magic");
  const auto& h = impl->header;
  if (h.major > format::kMajor)
    open_fail(ErrorCode::kUnsupportedVersion, file,
              "format version " + std::to_string(h.major) + "." + std::to_string(h.minor) +
                  " is newer than this library reads (" + std::to_string(format::kMajor) + ".x); "
                  "upgrade treecask");
  if (h.major < 1) open_fail(ErrorCode::kCorruption, file, "format major version 0 does not exist");
  if (hdr.size() != format::kHeaderSize)
    open_fail(ErrorCode::kCorruption, file,
              "header record is " + std::to_string(hdr.size()) + " bytes, expected 32");
  if (h.flags != 0) open_fail(ErrorCode::kCorruption, file, "reserved header flags are set");
  auto man = get(meta_dbi, std::as_bytes(std::span(format::kManifestKey)), "mdb_get(manifest)");
  if (man.size() != h.manifest_length)
    open_fail(ErrorCode::kCorruption, file,
              "manifest is " + std::to_string(man.size()) + " bytes, header says " +
                  std::to_string(h.manifest_length));
  // The map base locates the LMDB overflow page headers of S11 (and lets
  // reads copy with pread()). Without it those headers cannot be checked: an
  // open that must check them fails instead.
  std::string no_base;
  ErrorCode no_base_code = ErrorCode::kIo;
  impl->map_base = find_map_base(hdr, meta, fd, impl->file_size, &no_base, &no_base_code);
  if (!impl->map_base && options.validate_structure)
    open_fail(no_base_code, file,
              "cannot locate LMDB's map of the file, so its overflow page headers cannot be checked "
              "(SPEC.md S11): " + no_base);
  // A manifest in an LMDB overflow run: the run's first page header (S11),
  // which the structure walk bounded but did not read, before its bytes are used.
  if (auto pg = overflow_run_of(impl->map_base, man, meta, structure)) {
    std::byte head[kOverflowPageHeader];
    if (::pread(fd, head, sizeof head, static_cast<off_t>(*pg * meta.page_size)) != static_cast<ssize_t>(sizeof head))
      open_fail(ErrorCode::kCorruption, file, "manifest: short read of LMDB overflow page " + std::to_string(*pg));
    if (std::string why = lmdb::check_overflow_head(head, *pg, man.size(), meta.page_size, meta.last_page);
        !why.empty())
      open_fail(ErrorCode::kCorruption, file, "manifest: LMDB overflow page " + std::to_string(*pg) + " " + why);
  }

  // 4. Manifest: checksum, FlatBuffers verifier and every semantic invariant.
  impl->manifest = parse_manifest(man, file, /*borrow=*/true, h.manifest_checksum);
  const Manifest& m = *impl->manifest;
  if (m.root->format_major() != h.major)
    open_fail(ErrorCode::kCorruption, file, "manifest and header disagree on the format major version");

  // 5. Blobs: count, headers, lengths, alignment.
  MDB_stat bst;
  lmdb::check(mdb_stat(txn, blob_dbi, &bst), file, "mdb_stat(blobs)", ErrorCode::kCorruption);
  if (bst.ms_entries != m.blob_payload.size())
    open_fail(ErrorCode::kCorruption, file,
              "blob database has " + std::to_string(bst.ms_entries) + " entries, manifest lists " +
                  std::to_string(m.blob_payload.size()));
  impl->page_size = meta.page_size;
  impl->last_page = meta.last_page;
  const size_t n_blobs = m.blob_payload.size();
  impl->blob_data.resize(n_blobs);
  impl->blob_site.resize(n_blobs);
  impl->blob_checked.reset(new std::atomic<uint8_t>[n_blobs]);
  for (uint32_t id = 0; id < n_blobs; ++id) {
    impl->blob_checked[id].store(0, std::memory_order_relaxed);
    std::byte key[4];
    format::put_blob_key(key, id);
    auto v = get(blob_dbi, key, "mdb_get(blob)");
    if (v.data() == nullptr) open_fail(ErrorCode::kCorruption, file, "blob " + std::to_string(id) + ": missing");
    // Sizes and alignment come from the manifest and the LMDB node, so they
    // are checked here without reading the value; its header is checked at
    // the blob's first use (check_blob).
    if (v.size() < format::kBlobHeaderSize)
      open_fail(ErrorCode::kCorruption, file,
                "blob " + std::to_string(id) + ": value shorter than its 48-byte header");
    if (m.blob_payload[id] > v.size() - format::kBlobHeaderSize)
      open_fail(ErrorCode::kCorruption, file,
                "blob " + std::to_string(id) + ": blob payload length exceeds the stored value");
    const std::byte* data = v.data() + format::kBlobHeaderSize;
    if (reinterpret_cast<uintptr_t>(data) % format::kAlignment != 0)
      open_fail(ErrorCode::kCorruption, file,
                "blob " + std::to_string(id) + ": payload is not 64-byte aligned in the map");
    impl->blob_data[id] = data;
    Impl::BlobSite& site = impl->blob_site[id];
    site.value_size = v.size();
    site.overflow_page = overflow_run_of(impl->map_base, v, meta, structure).value_or(UINT64_MAX);
  }
  impl->fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  return Archive(std::move(impl));
}

const std::string& Archive::path() const noexcept { return impl_->file; }
uint64_t Archive::file_size() const noexcept { return impl_->file_size; }
uint16_t Archive::format_major() const noexcept { return impl_->header.major; }
uint16_t Archive::format_minor() const noexcept { return impl_->header.minor; }
const std::string& Archive::library_version() const noexcept { return impl_->manifest->library_version; }
int64_t Archive::created_unix_ns() const noexcept { return impl_->manifest->root->created_unix_ns(); }
const KeyValues& Archive::metadata() const noexcept { return impl_->manifest->metadata; }
const TreeDef& Archive::treedef() const noexcept { return impl_->manifest->treedef(); }
ShardFile Archive::manifest_fingerprint() const {
  return {std::filesystem::path(impl_->file).filename().string(), impl_->header.manifest_length,
          impl_->header.manifest_checksum};
}
const std::vector<ShardFile>& Archive::shard_files() const noexcept { return impl_->manifest->shard_files; }
size_t Archive::size() const noexcept { return impl_->manifest->leaves.size(); }

LeafInfo Archive::leaf(size_t index) const {
  const LeafRecord& r = impl_->rec(index);
  LeafInfo info;
  static_cast<LeafMeta&>(info) = leaf_meta_of(*r.fb);
  info.index = index;
  info.byte_length = r.byte_length;
  info.stored_bytes = r.stored_bytes;
  info.codec = r.codec;
  info.filter = r.filter;
  info.chunk_size = r.chunk_size;
  info.num_chunks = r.num_chunks();
  info.num_parts = r.num_parts;
  return info;
}

std::optional<size_t> Archive::find(std::string_view key_path) const noexcept {
  return impl_->manifest->find(key_path);
}

size_t Archive::index_of(std::string_view key_path) const {
  if (auto i = find(key_path)) return *i;
  throw Error(ErrorCode::kKeyNotFound, impl_->file, std::string(key_path), "no leaf with this key path");
}

std::vector<size_t> Archive::subtree(std::string_view prefix) const {
  std::vector<size_t> out;
  const auto& leaves = impl_->manifest->leaves;
  for (size_t i = 0; i < leaves.size(); ++i) {
    std::string_view p = leaves[i].key_path;
    if (prefix.empty() || p == prefix ||
        (p.size() > prefix.size() && p.substr(0, prefix.size()) == prefix && p[prefix.size()] == '/'))
      out.push_back(i);
  }
  if (out.empty())
    throw Error(ErrorCode::kKeyNotFound, impl_->file, std::string(prefix), "no leaf at or under this key path");
  return out;
}

std::vector<std::span<const std::byte>> Archive::view_parts(size_t index, Verify verify) const {
  const Impl& im = *impl_;
  const LeafRecord& r = im.data_rec(index);
  if (r.codec != Codec::kNone)
    throw Error(ErrorCode::kUnsupported, im.file, im.key(index),
                "an LZ4 leaf has no zero-copy view; use read()");
  bool check = im.want_verify(verify);
  std::vector<std::span<const std::byte>> parts;
  for (uint32_t ci = 0; ci < r.num_chunks(); ++ci) {
    const fb::Chunk* c = r.chunks->Get(ci);
    if (check) im.check_chunk(index, ci);
    auto s = im.stored(index, c);
    if (!parts.empty() && parts.back().data() + parts.back().size() == s.data())
      parts.back() = {parts.back().data(), parts.back().size() + s.size()};
    else
      parts.push_back(s);
  }
  return parts;
}

std::span<const std::byte> Archive::view(size_t index, Verify verify) const {
  const Impl& im = *impl_;
  const LeafRecord& r = im.data_rec(index);
  if (r.byte_length == 0) {
    alignas(64) static const std::byte kEmpty[64] = {};
    if (r.codec != Codec::kNone)
      throw Error(ErrorCode::kUnsupported, im.file, im.key(index), "an LZ4 leaf has no zero-copy view");
    return {kEmpty, 0};
  }
  if (r.codec == Codec::kNone && r.num_parts > 1)
    throw Error(ErrorCode::kUnsupported, im.file, im.key(index),
                "leaf is stored in " + std::to_string(r.num_parts) +
                    " parts (SPEC.md \"Large leaves\"); use view_parts() or read()");
  auto parts = view_parts(index, verify);
  return parts.front();
}

std::vector<std::optional<std::span<const std::byte>>> Archive::view_many(std::span<const size_t> indices,
                                                                          Verify verify,
                                                                          unsigned threads) const {
  const Impl& im = *impl_;
  std::vector<std::optional<std::span<const std::byte>>> out(indices.size());
  struct Job {
    size_t leaf;
    uint32_t chunk;
  };
  std::vector<Job> jobs;
  const bool check = im.want_verify(verify);
  for (size_t k = 0; k < indices.size(); ++k) {
    const LeafRecord& r = im.data_rec(indices[k]);
    if (r.codec != Codec::kNone || r.num_parts > 1) continue;  // no view: the caller reads it
    if (r.byte_length == 0) {
      out[k] = view(indices[k], Verify::kNo);
      continue;
    }
    // One raw part: its chunks are contiguous (checked at open), so the leaf
    // runs from its first chunk's first byte to its last chunk's last byte.
    const auto first = im.stored(indices[k], r.chunks->Get(0));
    const auto last = im.stored(indices[k], r.chunks->Get(r.num_chunks() - 1));
    out[k] = std::span<const std::byte>(first.data(), static_cast<size_t>(last.data() + last.size() - first.data()));
    if (out[k]->size() != r.byte_length)
      throw Error(ErrorCode::kCorruption, im.file, im.key(indices[k]),
                  "the chunks of a one-part leaf are not contiguous");
    if (check)
      for (uint32_t ci = 0; ci < r.num_chunks(); ++ci) jobs.push_back({indices[k], ci});
  }
  if (jobs.empty()) return out;
  parallel_for(jobs.size(), resolve_threads(threads), [&](size_t j) {
    const fb::Chunk* c = im.rec(jobs[j].leaf).chunks->Get(jobs[j].chunk);
    auto s = im.stored(jobs[j].leaf, c);
    // Hashed through the map: each page fault maps a run of pages already in
    // the page cache (fault-around). MADV_POPULATE_READ on each chunk first
    // was measured slower (docs/performance.md, "Serving paths").
    im.expect_checksum(jobs[j].leaf, jobs[j].chunk, c,
                       format::xxh3(s, format::chunk_seed(jobs[j].leaf, jobs[j].chunk)));
  });
  return out;
}

void Archive::read(size_t index, std::span<std::byte> out, Verify verify) const {
  const Impl& im = *impl_;
  const LeafRecord& r = im.data_rec(index);
  if (out.size() != r.byte_length)
    throw Error(ErrorCode::kShapeMismatch, im.file, im.key(index),
                "output buffer has " + std::to_string(out.size()) + " bytes, leaf has " +
                    std::to_string(r.byte_length));
  bool check = im.want_verify(verify);
  unsigned threads = r.byte_length >= (8u << 20) ? resolve_threads(0) : 1;
  parallel_for(r.num_chunks(), threads, [&](size_t ci) {
    im.decode_chunk(index, ci, out.data() + ci * r.chunk_size, check);
  });
}

void Archive::read_many(std::span<const size_t> indices, std::span<const std::span<std::byte>> outs,
                        Verify verify, unsigned threads) const {
  const Impl& im = *impl_;
  if (indices.size() != outs.size())
    throw Error(ErrorCode::kInvalidArgument, im.file, "", "read_many needs one output per index");
  struct Job {
    size_t leaf;
    uint32_t chunk;
    std::byte* out;
  };
  std::vector<Job> jobs;
  for (size_t k = 0; k < indices.size(); ++k) {
    const LeafRecord& r = im.data_rec(indices[k]);
    if (outs[k].size() != r.byte_length)
      throw Error(ErrorCode::kShapeMismatch, im.file, im.key(indices[k]),
                  "output buffer has " + std::to_string(outs[k].size()) + " bytes, leaf has " +
                      std::to_string(r.byte_length));
    for (uint32_t ci = 0; ci < r.num_chunks(); ++ci)
      jobs.push_back({indices[k], ci, outs[k].data() + uint64_t(ci) * r.chunk_size});
  }
  bool check = im.want_verify(verify);
  parallel_for(jobs.size(), resolve_threads(threads),
               [&](size_t j) { im.decode_chunk(jobs[j].leaf, jobs[j].chunk, jobs[j].out, check); });
}

void Archive::read_rows(size_t index, int64_t row_begin, int64_t row_end, std::span<std::byte> out,
                        Verify verify) const {
  const Impl& im = *impl_;
  const LeafRecord& r = im.data_rec(index);
  const auto* shape = r.fb->shape();
  auto bad = [&](ErrorCode code, const std::string& what) { return Error(code, im.file, im.key(index), what); };
  if (!shape || shape->size() == 0) throw bad(ErrorCode::kInvalidArgument, "a 0-d leaf has no rows");
  int64_t rows = shape->Get(0);
  if (row_begin < 0 || row_begin > row_end || row_end > rows)
    throw bad(ErrorCode::kInvalidArgument, "row range [" + std::to_string(row_begin) + ", " +
                                               std::to_string(row_end) + ") is outside [0, " +
                                               std::to_string(rows) + ")");
  uint64_t row_elems = 1;
  for (uint32_t d = 1; d < shape->size(); ++d) row_elems *= static_cast<uint64_t>(shape->Get(d));
  uint64_t row_bits = row_elems * dtype_bits(r.dtype);
  if (row_bits % 8 != 0)
    throw bad(ErrorCode::kInvalidArgument, "a row of this " + std::string(dtype_name(r.dtype)) +
                                               " leaf is not a whole number of bytes (use read_slice)");
  uint64_t row_bytes = row_bits / 8;
  uint64_t b0 = static_cast<uint64_t>(row_begin) * row_bytes;
  uint64_t b1 = static_cast<uint64_t>(row_end) * row_bytes;
  if (out.size() != b1 - b0)
    throw bad(ErrorCode::kShapeMismatch, "output buffer has " + std::to_string(out.size()) +
                                             " bytes, the rows need " + std::to_string(b1 - b0));
  read_bytes(index, b0, out, verify);
}

void Archive::read_slices(size_t index, std::span<const SliceRequest> boxes, Verify verify,
                          unsigned threads) const {
  const Impl& im = *impl_;
  im.data_rec(index);
  std::vector<slice::Plan> plans;
  plans.reserve(boxes.size());
  for (const SliceRequest& q : boxes) plans.push_back(im.slice_plan(index, q));
  const int bits = dtype_bits(im.rec(index).dtype);
  if (bits < 8 && 8 % bits != 0)
    return im.run_wide_plans(index, plans, im.want_verify(verify), threads);
  im.run_plans(index, plans, im.want_verify(verify), threads);
}

void Archive::read_slice(size_t index, std::span<const int64_t> start, std::span<const int64_t> stop,
                         std::span<std::byte> out, std::span<const int64_t> out_byte_strides,
                         Verify verify, unsigned threads) const {
  SliceRequest q{start, stop, out, out_byte_strides};
  read_slices(index, std::span<const SliceRequest>(&q, 1), verify, threads);
}

void Archive::read_bytes(size_t index, uint64_t offset, std::span<std::byte> out, Verify verify) const {
  const Impl& im = *impl_;
  const LeafRecord& r = im.data_rec(index);
  if (offset > r.byte_length || out.size() > r.byte_length - offset)
    throw im.arg_error(index, "byte range [" + std::to_string(offset) + ", " +
                                  std::to_string(offset + out.size()) + ") is outside the leaf's " +
                                  std::to_string(r.byte_length) + " bytes");
  if (out.empty()) return;
  slice::Plan p;
  p.base = offset;
  slice::push_dim(p, out.size(), 1, 1);
  slice::canonicalize(p);
  p.origin = out.data();
  im.run_plans(index, std::span<const slice::Plan>(&p, 1), im.want_verify(verify), 0);
}

std::vector<Error> Archive::verify(const std::function<void(uint64_t, uint64_t)>& progress) const {
  const Impl& im = *impl_;
  std::vector<Error> errors;
  std::vector<std::byte> scratch;
  uint64_t total = 0, done = 0;
  if (progress)
    for (const auto& r : im.manifest->leaves) total += r.byte_length;
  for (size_t li = 0; li < size(); ++li) {
    const LeafRecord& r = im.rec(li);
    try {
      for (uint32_t ci = 0; ci < r.num_chunks(); ++ci) {
        const fb::Chunk* c = r.chunks->Get(ci);
        if (im.chunk_is_raw(r, c)) {
          im.check_chunk(li, ci);
        } else {
          scratch.resize(im.raw_size(r, ci));
          im.decode_chunk(li, ci, scratch.data(), true);
        }
      }
    } catch (const Error& e) {
      errors.push_back(e);
    }
    if (progress) {
      done += r.byte_length;
      progress(done, total);
    }
  }
  if (progress && size() == 0) progress(0, 0);
  return errors;
}

}  // namespace treecask
