// save(): plan, write blobs straight into a pre-allocated LMDB map, write the
// manifest (encoded by build_manifest, manifest.cc), commit, truncate, fsync,
// rename (SPEC.md "Atomic commit").
#include "treecask/writer.h"
#include "treecask/remote.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>

#include "format/codec.h"
#include "format/format.h"
#include "lmdb/env.h"
#include "lmdb/layout.h"
#include "format/manifest.h"
#include "util/parallel.h"
#include "treecask/commit.h"
#include "treecask/treecask.h"

namespace treecask {

namespace {

using format::align_up;

// Format version of an archive: the lowest that holds it (SPEC.md "Versioning").
uint16_t format_major_of(const std::vector<LeafOut>& out, std::span<const LeafInput> leaves) {
  for (const auto& l : leaves)
    if (static_cast<uint8_t>(l.meta.dtype) >= kFirstDTypeOf4) return format::kDTypeMajor;
  for (const auto& l : leaves)
    if (!l.meta.shards.empty()) return format::kShardMajor;
  for (const auto& lo : out)
    if (lo.shuffle_bytes) return format::kFilterMajor;
  return format::kBaseMajor;
}

// The bytes LZ4 sees for one chunk: `src` itself, or its byte shuffle in
// `scratch` (SPEC.md "Filters").
std::span<const std::byte> filtered(std::span<const std::byte> src, unsigned shuffle_bytes,
                                    std::unique_ptr<std::byte[]>& scratch) {
  if (!shuffle_bytes) return src;
  scratch.reset(new std::byte[src.size()]);
  codec::shuffle(src, scratch.get(), shuffle_bytes);
  return {scratch.get(), src.size()};
}

[[noreturn]] void io_error(const std::string& file, const std::string& what) {
  throw Error(ErrorCode::kIo, file, "", what + ": " + std::strerror(errno));
}

using codec::lz4_bound;

// Auto mode: LZ4 only if it saves at least 10% on up to three 64 KiB samples
// (byte-shuffled first when the leaf will be).
bool lz4_pays(std::span<const std::byte> data, unsigned shuffle_bytes) {
  constexpr uint64_t kSample = 64 << 10;
  std::vector<std::byte> tmp(lz4_bound(kSample));
  std::unique_ptr<std::byte[]> scratch;
  uint64_t raw = 0, packed = 0;
  uint64_t n = data.size();
  uint64_t mid = shuffle_bytes ? n / 2 - n / 2 % shuffle_bytes : n / 2;  // on an element boundary
  uint64_t starts[3] = {0, mid, n > kSample ? n - kSample : 0};
  int samples = n <= 3 * kSample ? 1 : 3;
  for (int s = 0; s < samples; ++s) {
    auto piece = filtered(data.subspan(samples == 1 ? 0 : starts[s], std::min(kSample, n)), shuffle_bytes, scratch);
    bool is_raw;
    packed += codec::lz4_compress(piece, tmp.data(), &is_raw);
    raw += piece.size();
  }
  return static_cast<double>(packed) <= (1.0 - format::kAutoMinSaving) * static_cast<double>(raw);
}

class BlobWriter {
 public:
  BlobWriter(MDB_txn* txn, MDB_dbi dbi, uint32_t page_size, uint64_t map_size, int fd, bool writeback,
             const std::string& file)
      : txn_(txn), dbi_(dbi), page_size_(page_size), map_size_(map_size), fd_(fd), writeback_(writeback),
        file_(file) {}

  // Copies `n` bytes from caller memory to `dst` (inside a reserved payload).
  // With pwrite() the kernel copies straight into the page cache: no page
  // fault per 4 KiB page of the map, as a memcpy into a fresh shared mapping
  // would take. The map and the page cache are the same pages, so LMDB sees
  // the bytes. Falls back to memcpy if the map base is unknown. Thread-safe;
  // one pwrite() at a time: ext4 serialises buffered writes to one file on
  // its inode lock, where a second writer would only spin (callers hash
  // meanwhile; docs/performance.md, "Serving paths", third pass).
  void copy(std::byte* dst, const std::byte* src, size_t n) const {
    size_t done = 0;
    if (map_base_) {
      std::lock_guard<std::mutex> one_at_a_time(pwrite_mutex_);
      auto off = static_cast<off_t>(dst - map_base_);
      while (done < n) {
        ssize_t w = ::pwrite(fd_, src + done, n - done, off + static_cast<off_t>(done));
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) io_error(file_, "pwrite into the temporary file");
        if (w == 0) break;
        done += static_cast<size_t>(w);
      }
    }
    if (done < n) std::memcpy(dst + done, src + done, n - done);
  }

  // For a durable save, starts writeback of `n` bytes just copied to `dst`
  // (sync_file_range SYNC_FILE_RANGE_WRITE, once per chunk): the disk writes
  // while the next chunks are copied, and the final msync + fsync wait only
  // for the tail. Only a hint: a failure shows up in the fsync that follows.
  void start_writeback(const std::byte* dst, size_t n) const {
    if (writeback_ && map_base_ && n > 0)
      (void)::sync_file_range(fd_, static_cast<off_t>(dst - map_base_), static_cast<off_t>(n), SYNC_FILE_RANGE_WRITE);
  }

  // Lays out the blob database's B-tree before any blob (SPEC.md "Remote
  // reading", writer rule): a placeholder value of 8 bytes for each of
  // blob ids [0, bound), stored in order, so that LMDB allocates every leaf
  // and branch page of the tree first, right after the meta pages. Each
  // reserve() then replaces its placeholder in place (a node of the same
  // size: the page neither moves nor splits), and finish() deletes the
  // placeholders no blob took. A reader fetching the file's first pages
  // gets the whole tree. `bound` must be at least the number of blobs the
  // save stores (else the later ones are inserted as LMDB places them).
  void lay_out_tree(uint64_t bound) {
    const uint64_t placeholder = 0;
    for (uint64_t id = 0; id < bound; ++id) {
      std::byte key[4];
      format::put_blob_key(key, static_cast<uint32_t>(id));
      MDB_val k{4, key}, v{sizeof placeholder, const_cast<uint64_t*>(&placeholder)};
      lmdb::check(mdb_put(txn_, dbi_, &k, &v, MDB_APPEND), file_, "mdb_put(blob placeholder)");
    }
    placeholders_ = bound;
  }
  // Deletes the placeholders of lay_out_tree that no blob replaced.
  void finish() {
    for (uint64_t id = next_id_; id < placeholders_; ++id) {
      std::byte key[4];
      format::put_blob_key(key, static_cast<uint32_t>(id));
      MDB_val k{4, key};
      lmdb::check(mdb_del(txn_, dbi_, &k, nullptr), file_, "mdb_del(blob placeholder)");
    }
  }

  // Reserves the next blob with `payload` bytes and returns a pointer to the
  // payload inside the map (64-byte aligned).
  std::byte* reserve(uint64_t payload, uint32_t* id) {
    *id = next_id_++;
    uint64_t value_len = std::max<uint64_t>(format::kBlobHeaderSize + payload, page_size_);
    if (value_len > format::kMaxBlobValue)
      throw Error(ErrorCode::kInvalidArgument, file_, "", "blob larger than 2 GiB");
    std::byte key[4];
    format::put_blob_key(key, *id);
    MDB_val k{4, key}, v{value_len, nullptr};
    // Over its placeholder (lay_out_tree), else appended.
    const unsigned flags = *id < placeholders_ ? MDB_RESERVE : MDB_RESERVE | MDB_APPEND;
    lmdb::check(mdb_put(txn_, dbi_, &k, &v, flags), file_, "mdb_put(blob)");
    auto* base = static_cast<std::byte*>(v.mv_data);
    // A blob value (at least a page long) is an overflow value: it starts
    // kOverflowDataOffset bytes into a page (SPEC.md "LMDB container").
    if (!map_base_ && reinterpret_cast<uintptr_t>(base - lmdb::kOverflowDataOffset) % page_size_ == 0) {
      map_base_ = lmdb::map_base_of(base, page_size_);
      advise_map();
    }
    format::encode_blob_header({*id, payload}, base);
    std::memset(base + format::kBlobHeaderSize + payload, 0,
                value_len - format::kBlobHeaderSize - payload);
    std::byte* data = base + format::kBlobHeaderSize;
    if (reinterpret_cast<uintptr_t>(data) % format::kAlignment != 0)
      throw Error(ErrorCode::kIo, file_, "", "LMDB placed a blob payload off 64-byte alignment");
    payloads_.push_back(payload);
    return data;
  }
  const std::vector<uint64_t>& payloads() const { return payloads_; }

 private:
  // The writer touches the map only at a blob's first and last page (LMDB's
  // overflow page header, the blob header, the zeroed tail); pwrite() fills
  // the rest. Left to itself, each such fault reads around it, read_ahead_kb
  // at a time, in 4 KiB page-cache folios that pwrite() then fills: a fresh
  // archive ends up mostly in 4 KiB folios, and every reader pays for it (a
  // page-cache lookup per 4 KiB in pread(), a fault per 64 KiB through a map;
  // docs/performance.md, "Serving paths", third pass). From the first blob on
  // a fault reads its one page, and what earlier faults read around (LMDB's
  // first read of its meta page) is dropped while still clean, so pwrite()
  // allocates large folios. Hints only: an error is ignored.
  void advise_map() const {
    (void)::madvise(const_cast<std::byte*>(map_base_), map_size_, MADV_RANDOM);
    (void)::posix_fadvise(fd_, 0, static_cast<off_t>(map_size_), POSIX_FADV_DONTNEED);
  }

  MDB_txn* txn_;
  MDB_dbi dbi_;
  uint32_t page_size_;
  uint64_t map_size_;
  int fd_;
  bool writeback_;
  const std::string& file_;
  const std::byte* map_base_ = nullptr;
  mutable std::mutex pwrite_mutex_;
  uint32_t next_id_ = 0;
  uint64_t placeholders_ = 0;  // blob ids [0, placeholders_) hold a placeholder until reserved
  std::vector<uint64_t> payloads_;
};

// An upper bound of the blobs save() stores for `leaves` (lay_out_tree),
// at most kMaxPlaceholders. Per leaf larger than kPackLeafBytes: its raw
// parts or its LZ4 parts, whichever are more (the codec is chosen while
// writing). The packs: a pack is flushed only when its bytes plus the next
// leaf's worst case (under 2 * kPackLeafBytes) pass kPackBlobBytes, and a
// packed leaf takes at most its raw bytes plus 63 of alignment (a chunk LZ4
// cannot shrink is stored raw), so every pack but the last holds more than
// kPackBlobBytes - 2 * kPackLeafBytes of them.
constexpr uint64_t kMaxPlaceholders = uint64_t{1} << 20;  // 20 MiB of placeholder nodes at most
uint64_t blob_bound(std::span<const LeafInput> leaves, const SaveOptions& opt) {
  const uint64_t per_part = std::max<uint64_t>(
      1, std::min(opt.max_part_bytes / opt.chunk_size, format::kLz4PartBytes / opt.chunk_size));
  uint64_t bound = 0, packed = 0;
  for (const LeafInput& l : leaves) {
    const uint64_t len = l.data.size();
    if (len == 0) continue;
    if (len <= format::kPackLeafBytes) {
      packed += len + format::kAlignment - 1;
      continue;
    }
    bound += ((len + opt.chunk_size - 1) / opt.chunk_size + per_part - 1) / per_part;
  }
  if (packed) bound += packed / (format::kPackBlobBytes - 2 * format::kPackLeafBytes) + 1;
  return std::min(bound, kMaxPlaceholders);
}

// Small leaves packed into one staging buffer, flushed as one blob.
struct Pack {
  std::vector<std::byte> bytes;
  std::vector<std::pair<size_t, size_t>> members;  // (leaf index, first chunk)
};

// One save's blob writing. Built with designated initialisers (save()).
struct Writer {
  const std::string& file;            // the final path, for errors
  std::span<const LeafInput> leaves;
  const SaveOptions& opt;
  unsigned threads;                   // resolve_threads(opt.threads)
  BlobWriter& blobs;
  std::vector<LeafOut> out{};         // how each leaf was stored, filled by add()
  Pack pack{};                        // small leaves waiting for flush_pack()
  uint64_t done = 0;                  // raw bytes written so far (progress)
  uint64_t total = 0;                 // raw bytes of all leaves (progress)

  uint64_t chunk_count(uint64_t len) const { return (len + opt.chunk_size - 1) / opt.chunk_size; }
  std::span<const std::byte> chunk_src(size_t li, uint64_t ci) const {
    auto d = leaves[li].data;
    uint64_t off = ci * opt.chunk_size;
    return d.subspan(off, std::min<uint64_t>(opt.chunk_size, d.size() - off));
  }

  // Codec and filter of leaf `li`: SaveOptions::shuffle applies to LZ4 leaves
  // whose dtype has 2, 4, 8 or 16 bytes per element.
  void choose_codec(size_t li, LeafOut& lo) const {
    Compression c = leaves[li].compression.value_or(opt.compression);
    lo.codec = Codec::kNone;
    lo.shuffle_bytes = 0;
    if (c == Compression::kNone || leaves[li].data.empty()) return;
    unsigned shuffle = opt.shuffle ? shuffle_element_bytes(leaves[li].meta.dtype) : 0;
    if (c == Compression::kLZ4 || lz4_pays(leaves[li].data, shuffle)) {
      lo.codec = Codec::kLZ4;
      lo.shuffle_bytes = static_cast<uint8_t>(shuffle);
    }
  }

  void add(size_t li) {
    LeafOut& lo = out[li];
    choose_codec(li, lo);
    uint64_t len = leaves[li].data.size();
    lo.chunks.resize(chunk_count(len));
    if (len == 0) return;
    if (len <= format::kPackLeafBytes) {
      add_to_pack(li);
    } else if (lo.codec == Codec::kNone) {
      write_raw(li);
    } else if (!write_lz4(li, auto_mode(li) && len <= format::kLz4PartBytes)) {
      // Auto mode and the whole leaf saved < 10%: keep it raw (zero-copy).
      lo.codec = Codec::kNone;
      lo.shuffle_bytes = 0;
      for (auto& c : lo.chunks) c = ChunkOut{};
      write_raw(li);
    }
    report(len);
  }

  bool auto_mode(size_t li) const {
    return leaves[li].compression.value_or(opt.compression) == Compression::kAuto;
  }

  void report(uint64_t len) {
    done += len;
    if (opt.progress) opt.progress(done, total);
  }

  void add_to_pack(size_t li) {
    LeafOut& lo = out[li];
    uint64_t len = leaves[li].data.size();
    uint64_t need = align_up(pack.bytes.size(), format::kAlignment) +
                    (lo.codec == Codec::kLZ4 ? lz4_bound(len) + 64 * lo.chunks.size() : len);
    if (!pack.members.empty() && need > format::kPackBlobBytes) flush_pack();
    pack.bytes.resize(align_up(pack.bytes.size(), format::kAlignment));
    pack.members.emplace_back(li, 0);
    std::unique_ptr<std::byte[]> scratch;
    for (uint64_t ci = 0; ci < lo.chunks.size(); ++ci) {
      auto src = chunk_src(li, ci);
      ChunkOut& c = lo.chunks[ci];
      c.offset = pack.bytes.size();
      if (lo.codec == Codec::kLZ4) {
        src = filtered(src, lo.shuffle_bytes, scratch);
        pack.bytes.resize(c.offset + lz4_bound(src.size()));
        bool raw;
        c.stored = codec::lz4_compress(src, pack.bytes.data() + c.offset, &raw);
        if (raw) {
          c.flags = format::kChunkStoredRaw;
          std::memcpy(pack.bytes.data() + c.offset, src.data(), src.size());
        }
        pack.bytes.resize(c.offset + c.stored);
      } else {
        pack.bytes.insert(pack.bytes.end(), src.begin(), src.end());
        c.stored = src.size();
      }
      c.checksum = format::xxh3({pack.bytes.data() + c.offset, c.stored}, format::chunk_seed(li, ci));
    }
  }

  void flush_pack() {
    if (pack.members.empty()) return;
    uint32_t id;
    std::byte* dst = blobs.reserve(pack.bytes.size(), &id);
    blobs.copy(dst, pack.bytes.data(), pack.bytes.size());
    blobs.start_writeback(dst, pack.bytes.size());
    for (auto [li, first] : pack.members)
      for (auto& c : out[li].chunks) c.blob = id;
    pack.bytes.clear();
    pack.members.clear();
  }

  // Raw leaf: parts of <= 1 GiB, copied and hashed chunk by chunk on all threads.
  void write_raw(size_t li) {
    LeafOut& lo = out[li];
    uint64_t per_part = std::max<uint64_t>(1, opt.max_part_bytes / opt.chunk_size);
    for (uint64_t first = 0; first < lo.chunks.size(); first += per_part) {
      uint64_t last = std::min<uint64_t>(lo.chunks.size(), first + per_part);
      uint64_t begin = first * opt.chunk_size;
      uint64_t end = std::min<uint64_t>(leaves[li].data.size(), last * opt.chunk_size);
      uint32_t id;
      std::byte* dst = blobs.reserve(end - begin, &id);
      parallel_for(last - first, threads, [&](size_t k) {
        uint64_t ci = first + k;
        auto src = chunk_src(li, ci);
        ChunkOut& c = lo.chunks[ci];
        c.blob = id;
        c.offset = ci * opt.chunk_size - begin;
        c.stored = src.size();
        c.checksum = format::xxh3(src, format::chunk_seed(li, ci));
        blobs.copy(dst + c.offset, src.data(), src.size());
        blobs.start_writeback(dst + c.offset, src.size());
      });
    }
  }

  // LZ4 leaf: parts of <= 64 MiB raw, compressed in parallel into a bounded
  // staging buffer, then copied into one blob.
  // Returns false without writing anything when `undo_if_poor` and LZ4 saves
  // less than kAutoMinSaving of the (single-part) leaf: the samples that
  // chose LZ4 were not representative.
  bool write_lz4(size_t li, bool undo_if_poor) {
    LeafOut& lo = out[li];
    uint64_t per_part = std::max<uint64_t>(1, format::kLz4PartBytes / opt.chunk_size);
    uint64_t slot = lz4_bound(opt.chunk_size);
    std::vector<std::byte> staging;
    for (uint64_t first = 0; first < lo.chunks.size(); first += per_part) {
      uint64_t last = std::min<uint64_t>(lo.chunks.size(), first + per_part);
      staging.resize((last - first) * slot);
      parallel_for(last - first, threads, [&](size_t k) {
        uint64_t ci = first + k;
        std::unique_ptr<std::byte[]> scratch;
        auto src = filtered(chunk_src(li, ci), lo.shuffle_bytes, scratch);
        std::byte* dst = staging.data() + k * slot;
        ChunkOut& c = lo.chunks[ci];
        bool raw;
        c.stored = codec::lz4_compress(src, dst, &raw);
        if (raw) {
          c.flags = format::kChunkStoredRaw;
          // Stored raw after a filter: the filtered bytes go into the slot.
          if (lo.shuffle_bytes) std::memcpy(dst, src.data(), src.size());
        }
        c.checksum = format::xxh3(raw ? src : std::span<const std::byte>(dst, c.stored),
                                  format::chunk_seed(li, ci));
      });
      uint64_t payload = 0;
      for (uint64_t ci = first; ci < last; ++ci) {
        lo.chunks[ci].offset = payload;
        payload += lo.chunks[ci].stored;
      }
      if (undo_if_poor && static_cast<double>(payload) >
                              (1.0 - format::kAutoMinSaving) * static_cast<double>(leaves[li].data.size()))
        return false;
      uint32_t id;
      std::byte* dst = blobs.reserve(payload, &id);
      parallel_for(last - first, threads, [&](size_t k) {
        uint64_t ci = first + k;
        ChunkOut& c = lo.chunks[ci];
        c.blob = id;
        const std::byte* from = (c.flags & format::kChunkStoredRaw) && !lo.shuffle_bytes
                                    ? chunk_src(li, ci).data()
                                    : staging.data() + k * slot;
        blobs.copy(dst + c.offset, from, c.stored);
        blobs.start_writeback(dst + c.offset, c.stored);
      });
    }
    return true;
  }
};

// A value of a page or more (the manifest, mostly) is reserved and then
// copied by `blobs` (pwrite(): large page-cache folios, as for blobs).
void put_meta(MDB_txn* txn, MDB_dbi dbi, std::string_view key, std::span<const std::byte> value,
              const BlobWriter& blobs, uint32_t page_size, const std::string& file) {
  MDB_val k{key.size(), const_cast<char*>(key.data())};
  if (value.size() < page_size) {
    MDB_val v{value.size(), const_cast<std::byte*>(value.data())};
    lmdb::check(mdb_put(txn, dbi, &k, &v, 0), file, "mdb_put(meta)");
    return;
  }
  MDB_val v{value.size(), nullptr};
  lmdb::check(mdb_put(txn, dbi, &k, &v, MDB_RESERVE), file, "mdb_put(meta)");
  blobs.copy(static_cast<std::byte*>(v.mv_data), value.data(), value.size());
}

}  // namespace

std::string_view compression_name(Compression compression) noexcept {
  switch (compression) {
    case Compression::kAuto: return "auto";
    case Compression::kNone: return "none";
    case Compression::kLZ4: return "lz4";
  }
  return "invalid";
}

SaveStats save(const std::filesystem::path& path, const TreeDef& treedef,
               std::span<const LeafInput> leaves, const SaveOptions& opt) {
  const std::string file = path.string();
  // ---- validate everything before touching the file system ----
  if (is_url(file))  // never a local path "s3:/bucket/...": docs/remote.md
    throw Error(ErrorCode::kUnsupported, file, "",
                "save() writes local files; a URL is read-only for now (read it with Archive::open)");
  if (opt.chunk_size < format::kMinChunkSize || opt.chunk_size > format::kMaxChunkSize ||
      opt.chunk_size % 64 != 0)
    throw Error(ErrorCode::kInvalidArgument, file, "",
                "chunk_size must be a multiple of 64 in [4096, 64 MiB], got " +
                    std::to_string(opt.chunk_size));
  if (opt.max_part_bytes < opt.chunk_size || opt.max_part_bytes > format::kRawPartBytes)
    throw Error(ErrorCode::kInvalidArgument, file, "",
                "max_part_bytes must be at least chunk_size and at most 1 GiB");
  auto known = [](Compression c) { return compression_name(c) != "invalid"; };
  if (!known(opt.compression))
    throw Error(ErrorCode::kInvalidArgument, file, "",
                "unknown compression value " + std::to_string(static_cast<int>(opt.compression)));
  std::vector<std::string> paths = leaf_key_paths(treedef, ErrorCode::kInvalidArgument, file);
  if (paths.size() != leaves.size())
    throw Error(ErrorCode::kInvalidArgument, file, "",
                "treedef has " + std::to_string(paths.size()) + " leaves but " +
                    std::to_string(leaves.size()) + " were given");
  uint64_t total = 0;
  for (size_t i = 0; i < leaves.size(); ++i) {
    const LeafInput& in = leaves[i];
    if (!in.meta.key_path.empty() && in.meta.key_path != paths[i])
      throw Error(ErrorCode::kInvalidArgument, file, in.meta.key_path,
                  "leaf " + std::to_string(i) + " is at '" + paths[i] + "' in the treedef");
    LeafMeta m = in.meta;
    m.key_path = paths[i];
    check_leaf_meta(m, ErrorCode::kInvalidArgument, file);
    if (in.compression && !known(*in.compression))
      throw Error(ErrorCode::kInvalidArgument, file, paths[i],
                  "unknown compression value " + std::to_string(static_cast<int>(*in.compression)));
    uint64_t want;
    try {
      want = byte_length_for(m.dtype, m.shape);
    } catch (const Error& e) {
      throw Error(ErrorCode::kInvalidArgument, file, paths[i], e.message());
    }
    if (!m.shards.empty() && !in.data.empty())
      throw Error(ErrorCode::kInvalidArgument, file, paths[i],
                  "a leaf with shard references has its bytes in other files; its data must be empty");
    if (in.data.size() != want && m.shards.empty())
      throw Error(ErrorCode::kInvalidArgument, file, paths[i],
                  "data has " + std::to_string(in.data.size()) + " bytes, but " +
                      std::string(dtype_name(m.dtype)) + " with this shape needs " +
                      std::to_string(want));
    if (in.data.size() / opt.chunk_size >= format::kMaxChunksPerLeaf)
      throw Error(ErrorCode::kInvalidArgument, file, paths[i], "more than 2^32 chunks; raise chunk_size");
    total += in.data.size();
  }
  if (leaves.size() > format::kMaxLeaves)
    throw Error(ErrorCode::kInvalidArgument, file, "", "more than 2^24 leaves");
  check_archive_metadata(opt.metadata, ErrorCode::kInvalidArgument, file);
  if (!opt.shard_files.empty()) {  // SPEC.md "Sharded checkpoints" R8
    auto bound = bound_shard_files(opt.shard_files, ErrorCode::kInvalidArgument, file);
    bool sharded = false;
    for (size_t i = 0; i < leaves.size(); ++i)
      for (const ShardRef& r : leaves[i].meta.shards) {
        sharded = true;
        check_shard_bound(bound, r.file, paths[i], ErrorCode::kInvalidArgument, file);
      }
    if (!sharded)
      throw Error(ErrorCode::kInvalidArgument, file, "", "shard_files given, but no leaf has shard references");
  }

  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !opt.overwrite)
    throw Error(ErrorCode::kAlreadyExists, file, "", "file exists (save with overwrite to replace it)");
  remove_stale_temporaries(path);

  // ---- the temporary file ----
  const std::filesystem::path tmp = temporary_path(path);
  const std::string tmp_file = tmp.string();  // errors name `file`, never the temporary

  // Upper bound of the file: data (LZ4 worst case), per-blob page rounding,
  // manifest twice (B-tree copy-on-write), B-tree pages and slack.
  uint32_t psize = static_cast<uint32_t>(sysconf(_SC_PAGESIZE));
  uint64_t manifest_bound = 4096;
  uint64_t blobs_bound = 4;
  for (size_t i = 0; i < leaves.size(); ++i) {
    const auto& m = leaves[i].meta;
    manifest_bound += 256 + paths[i].size() + 8 * m.shape.size() +
                      32 * (leaves[i].data.size() / opt.chunk_size + 1);
    for (const auto& a : m.logical_axes) manifest_bound += a.size() + 8;
    for (const auto& [k, v] : m.metadata) manifest_bound += k.size() + v.size() + 16;
    if (m.sharding) manifest_bound += 1024;
    for (const auto& r : m.shards) manifest_bound += 64 + r.file.size() + r.key_path.size() + 16 * r.start.size();
    blobs_bound += 1 + leaves[i].data.size() / format::kLz4PartBytes;
  }
  for (const auto& n : treedef) {
    manifest_bound += 32 + n.type_name.size();
    for (const auto& k : n.keys) manifest_bound += k.size() + 8;
  }
  for (const auto& [k, v] : opt.metadata) manifest_bound += k.size() + v.size() + 16;
  for (const auto& f : opt.shard_files) manifest_bound += f.file.size() + 64;
  uint64_t data_bound = 0;
  for (const auto& l : leaves)
    data_bound += static_cast<uint64_t>(l.data.size() * 1.01) + 64 + 16 * (l.data.size() / opt.chunk_size + 1);
  uint64_t map_size = align_up(data_bound + blobs_bound * (2ull * psize + 64) + 3 * manifest_bound +
                                   (8ull << 20),
                               psize);

  SaveStats stats;
  try {
    lmdb::Env env;
    env.create(file);
    lmdb::check(mdb_env_set_maxdbs(env.get(), 2), file, "mdb_env_set_maxdbs");
    lmdb::check(mdb_env_set_mapsize(env.get(), map_size), file, "mdb_env_set_mapsize");
    int rc = mdb_env_open(env.get(), tmp_file.c_str(),
                          MDB_NOSUBDIR | MDB_NOLOCK | MDB_WRITEMAP | MDB_NOSYNC | MDB_NOMETASYNC,
                          0644);
    if (rc != 0) {
      if (rc == ENOENT) throw Error(ErrorCode::kNotFound, file, "", "directory does not exist");
      lmdb::fail(rc, file, "mdb_env_open");
    }
    MDB_envinfo info;
    mdb_env_info(env.get(), &info);
    MDB_stat st;
    mdb_env_stat(env.get(), &st);
    psize = st.ms_psize;
    int fd;
    lmdb::check(mdb_env_get_fd(env.get(), &fd), file, "mdb_env_get_fd");
    // Reserve the space now: a full disk is ENOSPC here, never a SIGBUS later.
    if (int err = posix_fallocate(fd, 0, static_cast<off_t>(map_size)); err != 0) {
      errno = err;
      io_error(file, "reserving " + std::to_string(map_size) + " bytes for the temporary file");
    }

    lmdb::Txn txn(env.get(), 0, file);
    MDB_dbi meta_dbi, blob_dbi;
    lmdb::check(mdb_dbi_open(txn.get(), format::kMetaDb, MDB_CREATE, &meta_dbi), file, "mdb_dbi_open(meta)");
    lmdb::check(mdb_dbi_open(txn.get(), format::kBlobDb, MDB_CREATE, &blob_dbi), file, "mdb_dbi_open(blobs)");

    BlobWriter blobs(txn.get(), blob_dbi, psize, map_size, fd, opt.durable, file);
    blobs.lay_out_tree(blob_bound(leaves, opt));
    Writer w{.file = file,
             .leaves = leaves,
             .opt = opt,
             .threads = resolve_threads(opt.threads),
             .blobs = blobs,
             .total = total};
    w.out.resize(leaves.size());
    for (size_t i = 0; i < leaves.size(); ++i) w.add(i);
    w.flush_pack();
    blobs.finish();

    const uint16_t major = format_major_of(w.out, leaves);  // header and manifest say the same
    const uint16_t minor = opt.shard_files.empty() ? 0 : format::kBindMinor;
    std::vector<EncodeLeaf> encode;
    encode.reserve(leaves.size());
    for (const LeafInput& l : leaves) encode.push_back({&l.meta, l.data.size()});
    std::vector<uint8_t> manifest = build_manifest(treedef, encode, paths, w.out, blobs.payloads(),
                                                   {major, minor, opt.chunk_size, opt.metadata, opt.shard_files});
    if (manifest.size() > format::kMaxManifestBytes)
      throw Error(ErrorCode::kInvalidArgument, file, "",
                  "the manifest would be " + std::to_string(manifest.size()) +
                      " bytes, over the 256 MiB limit (SPEC.md \"Limits\"): raise chunk_size");
    format::Header h;
    h.major = major;
    h.minor = minor;
    h.manifest_length = manifest.size();
    h.manifest_checksum = format::xxh3(std::as_bytes(std::span(manifest)), 0);
    std::byte header[format::kHeaderSize];
    format::encode_header(h, header);
    put_meta(txn.get(), meta_dbi, format::kManifestKey, std::as_bytes(std::span(manifest)), blobs, psize, file);
    put_meta(txn.get(), meta_dbi, format::kHeaderKey, header, blobs, psize, file);
    txn.commit(file);
    if (opt.durable) lmdb::check(mdb_env_sync(env.get(), 1), file, "mdb_env_sync");
    mdb_env_info(env.get(), &info);
    uint64_t used = (static_cast<uint64_t>(info.me_last_pgno) + 1) * psize;
    env.close();
    if (::truncate(tmp.c_str(), static_cast<off_t>(used)) != 0) io_error(file, "truncate");
    if (opt.durable) sync_path(tmp, file);
    publish(tmp, path, opt.overwrite, opt.durable, file);

    stats.file_bytes = used;
    stats.num_leaves = static_cast<uint32_t>(leaves.size());
    stats.num_blobs = static_cast<uint32_t>(blobs.payloads().size());
    for (size_t i = 0; i < leaves.size(); ++i) {
      stats.raw_bytes += leaves[i].data.size();
      for (const auto& c : w.out[i].chunks) stats.stored_bytes += c.stored;
    }
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  return stats;
}

}  // namespace treecask
