// The manifest's decoder: parse_manifest verifies a FlatBuffer from an
// untrusted file and checks every rule of SPEC.md "Reader checks" 17-35a,
// on two threads for large manifests, and builds the key-path index.
#include "format/manifest.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>

#include "format/codec.h"
#include "format/format.h"
#include "format/manifest_rules.h"
#include "util/parallel.h"

namespace treecask {

using namespace manifest_rules;

namespace {

flatbuffers::Verifier::Options verifier_options() {
  flatbuffers::Verifier::Options opts;
  opts.max_depth = 16;         // the schema nests at most 5 tables deep
  opts.max_tables = 1u << 27;  // bounded by the 256 MiB manifest anyway
  opts.check_alignment = true;
  return opts;
}

// The Manifest table verified as fb::Manifest::Verify does, except that the
// tables inside `nodes` and `leaves` are left to the parallel pass of
// parse_manifest, which verifies each one (fb::Node::Verify, fb::Leaf::Verify)
// right before checking it. Together the two accept exactly what
// fb::VerifyManifestBuffer accepts (the manifest fuzzer asserts it). A field
// added to Manifest in schema/treecask.fbs must be added here.
class ShallowManifest : private flatbuffers::Table {
 public:
  bool Verify(flatbuffers::Verifier& v) const {
    using M = fb::Manifest;
    const M* m = reinterpret_cast<const M*>(this);
    return VerifyTableStart(v) && VerifyField<uint16_t>(v, M::VT_FORMAT_MAJOR, 2) &&
           VerifyField<uint16_t>(v, M::VT_FORMAT_MINOR, 2) && VerifyOffset(v, M::VT_LIBRARY_VERSION) &&
           v.VerifyString(m->library_version()) && VerifyField<int64_t>(v, M::VT_CREATED_UNIX_NS, 8) &&
           VerifyOffset(v, M::VT_METADATA) && v.VerifyVector(m->metadata()) &&
           v.VerifyVectorOfTables(m->metadata()) && VerifyOffset(v, M::VT_NODES) && v.VerifyVector(m->nodes()) &&
           VerifyOffset(v, M::VT_LEAVES) && v.VerifyVector(m->leaves()) && VerifyOffset(v, M::VT_BLOBS) &&
           v.VerifyVector(m->blobs()) && v.VerifyVectorOfTables(m->blobs()) &&
           VerifyOffset(v, M::VT_SHARD_FILES) && v.VerifyVector(m->shard_files()) &&
           v.VerifyVectorOfTables(m->shard_files()) && v.EndTable();
  }
};
static_assert(fb::Manifest::VT_SHARD_FILES == 20, "Manifest gained or lost a field: update ShallowManifest");

// SPEC.md "Reader checks" 26-34 for one leaf whose table passed the verifier.
// Fills `r` (key_path already set). Throws Error(kCorruption) naming the leaf.
void check_leaf_record(LeafRecord& r, const std::vector<uint64_t>& blob_payload, uint16_t major,
                       const std::string& file) {
  const fb::Leaf* leaf = r.fb;
  auto bad = [&](const std::string& what) { return Error(ErrorCode::kCorruption, file, std::string(r.key_path), what); };
  if (!elements_aligned(leaf->shape()) || !elements_aligned(leaf->chunks()) ||
      (leaf->sharding() && !elements_aligned(leaf->sharding()->mesh_axis_sizes())))
    throw bad("a vector of 8-byte elements is not 8-byte aligned");
  if (const auto* refs = leaf->shards()) {
    for (const auto* ref : *refs)
      if (!elements_aligned(ref->start()) || !elements_aligned(ref->stop()))
        throw bad("a vector of 8-byte elements is not 8-byte aligned");
    r.num_shards = refs->size();
  }
  check_leaf(FbLeaf{*leaf}, ErrorCode::kCorruption, file, r.key_path);
  r.dtype = static_cast<DType>(leaf->dtype());
  if (static_cast<uint8_t>(r.dtype) >= kFirstDTypeOf4 && major < format::kDTypeMajor)
    throw bad("has dtype " + std::string(dtype_name(r.dtype)) + ", which format " + std::to_string(major) +
              ".x does not have (4.0 does)");
  uint64_t expect;
  try {
    expect = byte_length_for(r.dtype, span_of(leaf->shape()));
  } catch (const Error& e) {
    throw bad(e.message());
  }
  r.byte_length = leaf->byte_length();
  if (r.byte_length != expect)
    throw bad("byte length " + std::to_string(r.byte_length) + " does not match " +
              std::string(dtype_name(r.dtype)) + " x shape (" + std::to_string(expect) + " bytes)");
  uint8_t codec = static_cast<uint8_t>(leaf->codec());
  if (codec > 1) throw bad("unknown codec " + std::to_string(codec));
  r.codec = static_cast<Codec>(codec);
  uint8_t filter = static_cast<uint8_t>(leaf->filter());
  if (filter > 1) throw bad("unknown filter " + std::to_string(filter));
  r.filter = static_cast<Filter>(filter);
  if (r.filter == Filter::kByteShuffle) {
    if (major < format::kFilterMajor)
      throw bad("has a filter, which format " + std::to_string(major) + ".x does not have (2.0 does)");
    if (r.codec != Codec::kLZ4) throw bad("byte shuffle is only defined before LZ4");
    r.shuffle_bytes = static_cast<uint8_t>(shuffle_element_bytes(r.dtype));
    if (r.shuffle_bytes == 0)
      throw bad("byte shuffle of " + std::string(dtype_name(r.dtype)) + " (needs 2, 4, 8 or 16 bytes per element)");
  }
  r.chunk_size = leaf->chunk_size();
  r.chunks = leaf->chunks();
  uint64_t n_chunks = r.chunks ? r.chunks->size() : 0;
  if (r.num_shards != 0) {  // format 3.0: the bytes live in other files
    if (major < format::kShardMajor)
      throw bad("has shard references, which format " + std::to_string(major) + ".x does not have (3.0 does)");
    if (n_chunks != 0) throw bad("a leaf with shard references has chunks");
    if (r.codec != Codec::kNone || r.filter != Filter::kNone)
      throw bad("a leaf with shard references has a codec or filter");
  } else if (r.byte_length == 0) {
    if (n_chunks != 0) throw bad("an empty leaf has chunks");
  } else {
    if (r.chunk_size < format::kMinChunkSize || r.chunk_size > format::kMaxChunkSize || r.chunk_size % 64 != 0)
      throw bad("chunk size " + std::to_string(r.chunk_size) + " is not a multiple of 64 in [4096, 64 MiB]");
    uint64_t want = (r.byte_length + r.chunk_size - 1) / r.chunk_size;
    if (n_chunks != want) throw bad("has " + std::to_string(n_chunks) + " chunks, expected " + std::to_string(want));
  }
  uint32_t prev_blob = UINT32_MAX;
  uint64_t prev_end = 0;
  for (uint64_t ci = 0; ci < n_chunks; ++ci) {
    const fb::Chunk* c = r.chunks->Get(static_cast<flatbuffers::uoffset_t>(ci));
    uint64_t raw = std::min(r.chunk_size, r.byte_length - ci * r.chunk_size);
    auto chunk_bad = [&](const std::string& what) { return bad("chunk " + std::to_string(ci) + ": " + what); };
    if (c->blob() >= blob_payload.size()) throw chunk_bad("names a blob that does not exist");
    if (c->flags() & ~format::kChunkFlagsMask) throw chunk_bad("reserved flag bits are set");
    bool stored_raw = r.codec == Codec::kNone || (c->flags() & format::kChunkStoredRaw);
    if (r.codec == Codec::kNone && c->flags() != 0) throw chunk_bad("flags set on a raw leaf");
    if (stored_raw) {
      if (c->stored_size() != raw)
        throw chunk_bad("stored size " + std::to_string(c->stored_size()) + " != raw size " + std::to_string(raw));
    } else if (c->stored_size() == 0 || c->stored_size() > codec::lz4_bound(raw)) {
      throw chunk_bad("LZ4 stored size " + std::to_string(c->stored_size()) + " out of range");
    }
    uint64_t payload = blob_payload[c->blob()];
    if (c->offset() > payload || c->stored_size() > payload - c->offset())
      throw chunk_bad("extends past the end of blob " + std::to_string(c->blob()));
    if (c->blob() != prev_blob) {
      if (c->offset() % format::kAlignment != 0) throw chunk_bad("a part does not start 64-byte aligned");
      ++r.num_parts;
    } else if (r.codec == Codec::kNone && c->offset() != prev_end) {
      throw chunk_bad("raw chunks of one part are not contiguous");
    }
    prev_blob = c->blob();
    prev_end = c->offset() + c->stored_size();
    r.stored_bytes += c->stored_size();
  }
}

// The common leaf in one pass: verifies the table exactly as fb::Leaf::Verify
// would (the same bounds, alignment, offset-sign and string-terminator tests
// of flatbuffers::Verifier, reading the vtable once) and applies every rule of
// check_leaf_record while the fields are at hand. It decides only for a leaf
// without logical axes, sharding, metadata or shard references, and only
// when everything holds: it returns true with `r` filled (key_path, fb and
// every field check_leaf_record fills) exactly as the full path would have.
// Anything else, a damaged leaf included, returns false with `r` untouched
// but for key_path/fb, and the caller runs the generated verifier and
// check_leaf_record, which decide and name the finding. So the fast path can
// accept nothing the full path rejects; the manifest tests run both on every
// leaf of their archives and damaged manifests (parse_manifest's full_leaf_check).
// (Two thirds of the open time at 10,000 leaves was the generated verifier
// plus check_leaf_record; docs/performance.md "Serving paths".)
bool fast_leaf(const uint8_t* buf, size_t size, const fb::Leaf* leaf, const std::vector<uint64_t>& blob_payload,
               uint16_t major, LeafRecord& r) {
  using flatbuffers::ReadScalar;
  // flatbuffers::Verifier::Verify(elem, len) and Verify<T>(elem) (check_alignment on).
  auto in = [size](size_t elem, size_t len) { return len < size && elem <= size - len; };
  auto in_aligned = [&](size_t elem, size_t len) { return (elem & (len - 1)) == 0 && in(elem, len); };
  const size_t tableo = static_cast<size_t>(reinterpret_cast<const uint8_t*>(leaf) - buf);
  if (!in_aligned(tableo, 4)) return false;
  const size_t vtableo = tableo - static_cast<size_t>(ReadScalar<flatbuffers::soffset_t>(buf + tableo));
  if (!in_aligned(vtableo, 2)) return false;
  const size_t vsize = ReadScalar<flatbuffers::voffset_t>(buf + vtableo);
  if ((vsize & 1) != 0 || !in(vtableo, vsize)) return false;
  auto field = [&](size_t id) -> size_t {  // GetOptionalFieldOffset
    const size_t at = 4 + 2 * id;
    return at < vsize ? ReadScalar<flatbuffers::voffset_t>(buf + vtableo + at) : 0;
  };
  // Fields this path leaves to the full check.
  using L = fb::Leaf;
  if (field((L::VT_LOGICAL_AXES - 4) / 2) || field((L::VT_SHARDING - 4) / 2) ||
      field((L::VT_METADATA - 4) / 2) || field((L::VT_SHARDS - 4) / 2))
    return false;
  // VerifyField<T>: absent, or aligned and inside the buffer. Returns the value or `def`.
  bool ok = true;
  auto scalar8 = [&](size_t id) -> uint8_t {
    size_t fo = field(id);
    if (!fo) return 0;
    ok &= in(tableo + fo, 1);
    return ok ? buf[tableo + fo] : 0;
  };
  auto scalar64 = [&](size_t id) -> uint64_t {
    size_t fo = field(id);
    if (!fo) return 0;
    ok &= in_aligned(tableo + fo, 8);
    return ok ? ReadScalar<uint64_t>(buf + tableo + fo) : 0;
  };
  // VerifyOffset, then VerifyVectorOrString with Elem bytes per element
  // (and a string's terminator). Returns the vector's offset in the buffer,
  // 0 when absent, SIZE_MAX on failure.
  auto vec = [&]<size_t Elem, bool String>(size_t id) -> size_t {
    size_t fo = field(id);
    if (!fo) return 0;
    const size_t start = tableo + fo;
    if (!in_aligned(start, 4)) return SIZE_MAX;
    const auto o = ReadScalar<flatbuffers::uoffset_t>(buf + start);
    if (o == 0 || static_cast<flatbuffers::soffset_t>(o) < 0 || !in(start + o, 1)) return SIZE_MAX;
    const size_t veco = start + o;
    if (!in_aligned(veco, 4)) return SIZE_MAX;
    const auto n = ReadScalar<flatbuffers::uoffset_t>(buf + veco);
    if (n >= FLATBUFFERS_MAX_BUFFER_SIZE / Elem) return SIZE_MAX;
    const size_t bytes = sizeof(flatbuffers::uoffset_t) + Elem * n;
    if (!in(veco, bytes)) return SIZE_MAX;
    if (String && (!in(veco + bytes, 1) || buf[veco + bytes] != 0)) return SIZE_MAX;
    return veco;
  };
  const size_t key_o = vec.template operator()<1, true>((L::VT_KEY_PATH - 4) / 2);
  if (key_o == 0 || key_o == SIZE_MAX) return false;  // required
  const uint8_t value_kind = scalar8((L::VT_VALUE_KIND - 4) / 2);
  const uint8_t dtype = scalar8((L::VT_DTYPE - 4) / 2);
  const size_t shape_o = vec.template operator()<sizeof(int64_t), false>((L::VT_SHAPE - 4) / 2);
  const uint64_t byte_length = scalar64((L::VT_BYTE_LENGTH - 4) / 2);
  const uint8_t codec = scalar8((L::VT_CODEC - 4) / 2);
  const uint64_t chunk_size = scalar64((L::VT_CHUNK_SIZE - 4) / 2);
  const size_t chunks_o = vec.template operator()<sizeof(fb::Chunk), false>((L::VT_CHUNKS - 4) / 2);
  const uint8_t filter = scalar8((L::VT_FILTER - 4) / 2);
  if (!ok || shape_o == SIZE_MAX || chunks_o == SIZE_MAX) return false;
  // The verifier accepts the table. Now check_leaf_record's rules.
  const auto* shape = shape_o ? reinterpret_cast<const flatbuffers::Vector<int64_t>*>(buf + shape_o) : nullptr;
  const auto* chunks =
      chunks_o ? reinterpret_cast<const flatbuffers::Vector<const fb::Chunk*>*>(buf + chunks_o) : nullptr;
  if (!elements_aligned(shape) || !elements_aligned(chunks)) return false;
  if (!dtype_valid(dtype)) return false;
  if (dtype >= kFirstDTypeOf4 && major < format::kDTypeMajor) return false;
  const uint32_t rank = shape ? shape->size() : 0;
  if (rank > format::kMaxRank) return false;
  const auto d = static_cast<DType>(dtype);
  switch (static_cast<ValueKind>(value_kind)) {
    case ValueKind::kArray: break;
    case ValueKind::kInt: if (d != DType::kInt64 || rank != 0) return false; break;
    case ValueKind::kFloat: if (d != DType::kFloat64 || rank != 0) return false; break;
    case ValueKind::kBool: if (d != DType::kBool || rank != 0) return false; break;
    case ValueKind::kStr: if (d != DType::kUInt8 || rank != 1) return false; break;
    default: return false;
  }
  // byte_length_for, without its exceptions.
  const unsigned bits = static_cast<unsigned>(dtype_bits(d));
  const unsigned __int128 limit = static_cast<unsigned __int128>(1) << 63;
  unsigned __int128 count = 1;
  for (uint32_t i = 0; i < rank; ++i) {
    const int64_t dim = shape->Get(i);
    if (dim < 0) return false;
    count *= static_cast<uint64_t>(dim);
    if (count * bits > limit) return false;
  }
  if (byte_length != static_cast<uint64_t>((count * bits + 7) / 8)) return false;
  if (codec > 1 || filter > 1) return false;
  uint8_t shuffle = 0;
  if (filter == static_cast<uint8_t>(Filter::kByteShuffle)) {
    if (major < format::kFilterMajor || codec != static_cast<uint8_t>(Codec::kLZ4)) return false;
    shuffle = static_cast<uint8_t>(shuffle_element_bytes(d));
    if (shuffle == 0) return false;
  }
  const uint32_t n_chunks = chunks ? chunks->size() : 0;
  if (byte_length == 0) {
    if (n_chunks != 0) return false;
  } else {
    if (chunk_size < format::kMinChunkSize || chunk_size > format::kMaxChunkSize || chunk_size % 64 != 0)
      return false;
    if (n_chunks != (byte_length + chunk_size - 1) / chunk_size) return false;
  }
  const bool lz4 = codec == static_cast<uint8_t>(Codec::kLZ4);
  uint32_t prev_blob = UINT32_MAX, parts = 0;
  uint64_t prev_end = 0, stored = 0;
  for (uint32_t ci = 0; ci < n_chunks; ++ci) {
    const fb::Chunk* c = chunks->Get(ci);
    const uint64_t raw = std::min(chunk_size, byte_length - uint64_t{ci} * chunk_size);
    const uint32_t blob = c->blob(), flags = c->flags();
    const uint64_t off = c->offset(), sz = c->stored_size();
    if (blob >= blob_payload.size() || (flags & ~format::kChunkFlagsMask)) return false;
    if (!lz4 && flags != 0) return false;
    if (!lz4 || (flags & format::kChunkStoredRaw)) {
      if (sz != raw) return false;
    } else if (sz == 0 || sz > codec::lz4_bound(raw)) {
      return false;
    }
    const uint64_t payload = blob_payload[blob];
    if (off > payload || sz > payload - off) return false;
    if (blob != prev_blob) {
      if (off % format::kAlignment != 0) return false;
      ++parts;
    } else if (!lz4 && off != prev_end) {
      return false;
    }
    prev_blob = blob;
    prev_end = off + sz;
    stored += sz;
  }
  r.dtype = d;
  r.byte_length = byte_length;
  r.chunk_size = chunk_size;
  r.stored_bytes = stored;
  r.num_parts = parts;
  r.num_shards = 0;
  r.codec = static_cast<Codec>(codec);
  r.filter = static_cast<Filter>(filter);
  r.shuffle_bytes = shuffle;
  r.chunks = chunks;
  return true;
}

// SPEC.md "Coverage" (check 35): chunks tile each blob with no overlap; gaps
// are padding < 64 bytes. Extents are bucketed by blob (counting sort); a
// bucket is sorted only if the writer did not already emit it in order.
// REQUIRES: every leaf passed check_leaf_record.
// True when the chunks, taken in leaf order, already come in ascending offset
// order within each blob and tile every blob as check 35 asks: the writer's
// layout, checked in one pass over the chunks without bucketing them. False
// sends the manifest to the bucketed check below, which finds and names the
// first finding in blob order.
bool coverage_in_order(const Manifest& m) {
  const size_t n_blobs = m.blob_payload.size();
  std::vector<uint64_t> pos(n_blobs, 0);
  std::vector<uint8_t> used(n_blobs, 0);
  for (const auto& r : m.leaves)
    for (uint32_t ci = 0; ci < r.num_chunks(); ++ci) {
      const fb::Chunk* c = r.chunks->Get(ci);
      const uint32_t b = c->blob();
      const uint64_t begin = c->offset();
      if (begin < pos[b] || begin - pos[b] >= format::kAlignment) return false;
      pos[b] = begin + c->stored_size();
      used[b] = 1;
    }
  for (size_t b = 0; b < n_blobs; ++b) {
    if (!used[b] && m.blob_payload[b] != 0) return false;
    if (m.blob_payload[b] - pos[b] >= format::kAlignment) return false;
  }
  return true;
}

void check_coverage(const Manifest& m, const std::string& file) {
  if (coverage_in_order(m)) return;
  auto corrupt = [&](const std::string& what) { return Error(ErrorCode::kCorruption, file, "", what); };
  const size_t n_blobs = m.blob_payload.size();
  std::vector<uint32_t> start(n_blobs + 1, 0);
  for (const auto& r : m.leaves)
    for (uint32_t ci = 0; ci < r.num_chunks(); ++ci) ++start[r.chunks->Get(ci)->blob() + 1];
  for (size_t b = 1; b <= n_blobs; ++b) start[b] += start[b - 1];
  struct Extent {
    uint64_t begin, end;
  };
  std::vector<Extent> extents(start.back());
  {
    std::vector<uint32_t> fill(start.begin(), start.end() - 1);
    for (const auto& r : m.leaves)
      for (uint32_t ci = 0; ci < r.num_chunks(); ++ci) {
        const fb::Chunk* c = r.chunks->Get(ci);
        extents[fill[c->blob()]++] = {c->offset(), c->offset() + c->stored_size()};
      }
  }
  for (uint32_t b = 0; b < n_blobs; ++b) {
    auto first = extents.begin() + start[b], last = extents.begin() + start[b + 1];
    auto by_begin = [](const Extent& x, const Extent& y) { return x.begin < y.begin; };
    if (!std::is_sorted(first, last, by_begin)) std::sort(first, last, by_begin);
    if (first == last && m.blob_payload[b] != 0) throw corrupt("blob " + std::to_string(b) + " holds no chunk");
    uint64_t pos = 0;
    for (auto x = first; x != last; ++x) {
      if (x->begin < pos) throw corrupt("chunks overlap in blob " + std::to_string(b));
      if (x->begin - pos >= format::kAlignment)
        throw corrupt("blob " + std::to_string(b) + " has a hole of " + std::to_string(x->begin - pos) + " bytes");
      pos = x->end;
    }
    if (m.blob_payload[b] - pos >= format::kAlignment)
      throw corrupt("blob " + std::to_string(b) + " has unreferenced bytes at its end");
  }
}

// The key-path index (open addressing over XXH3 of the stored key path).
// Throws Error(kCorruption) on a duplicate key path.
void build_index(Manifest& m, const std::string& file) {
  size_t cap = 16;
  while (cap < 2 * m.leaves.size()) cap <<= 1;
  m.slots.assign(cap, 0);
  const size_t mask = cap - 1;
  for (size_t li = 0; li < m.leaves.size(); ++li) {
    std::string_view key = m.leaves[li].key_path;
    for (size_t s = hash_path(key) & mask;; s = (s + 1) & mask) {
      if (m.slots[s] == 0) {
        m.slots[s] = static_cast<uint32_t>(li + 1);
        break;
      }
      if (m.leaves[m.slots[s] - 1].key_path == key)
        throw Error(ErrorCode::kCorruption, file, std::string(key), "duplicate key path");
    }
  }
}

constexpr size_t kBlockTables = 256;  // tables per unit of work in the parallel pass

const char* const kVerifierFailed = "manifest fails the FlatBuffers verifier (or lacks identifier TCMF)";

// One parse_manifest call. For large manifests the work is shared by the
// calling thread and one WorkQueue helper (parallel.h), started first thing
// so that its start-up overlaps the caller's work; the queue's items are
// claimed by whichever thread gets to them first, so a helper that starts
// late only takes what is left. The stages: the checksum (queued first, so
// the helper takes it while the caller verifies the root table), pass 1 in
// blocks of tables, then the key-path index and coverage (queued with pass 1,
// to start when it ends, while the caller walks the treedef). Findings are reported in the order of SPEC.md
// "Reader checks" whichever thread makes them: checksum (17), verifier (19),
// treedef and key paths (20-21, 25), the first leaf in index order (26-34),
// duplicate key paths (T10), coverage (35).
class Parser {
 public:
  Parser(Manifest& m, const std::string& file, std::optional<uint64_t> checksum, bool full_leaf_check)
      : m_(m), file_(file), checksum_(checksum), full_leaf_check_(full_leaf_check) {}

  void run(bool parallel) {
    WorkQueue queue(parallel ? 1 : 0);
    auto sum = queue.submit(1, [this](size_t) { sum_ok_ = checksum_matches(); });
    try {
      setup();
      auto blocks = queue.submit(n_blocks_, [this](size_t b) { run_block(b); });
      // Queued now, so that the helper starts it the moment pass 1 ends.
      auto tail = queue.submit(1, [this](size_t) { index_and_coverage(); }, blocks);
      queue.close();  // the last job: the helper ends once it has nothing left to take
      queue.wait(blocks);
      finish_pass1();
      walk();
      queue.wait(tail);
    } catch (...) {
      settle_checksum(queue, sum);  // a damaged manifest is a checksum mismatch first
      throw;
    }
    settle_checksum(queue, sum);
    for (const auto& e : block_error_)
      if (e) std::rethrow_exception(e);
    if (index_error_) std::rethrow_exception(index_error_);
    if (coverage_error_) std::rethrow_exception(coverage_error_);
    check_bound();
  }

 private:
  // R8, second half (SPEC.md check 35a): every ShardRef names a bound file.
  void check_bound() const {
    if (bound_.empty()) return;
    for (const LeafRecord& r : m_.leaves)
      if (r.num_shards != 0)
        for (const auto* ref : *r.fb->shards()) check_shard_bound(bound_, sv(ref->file()), r.key_path,
                                                                 ErrorCode::kCorruption, file_);
  }

  Error corrupt(std::string_view key, const std::string& what) const {
    return Error(ErrorCode::kCorruption, file_, std::string(key), what);
  }

  bool checksum_matches() const {
    return !checksum_ || format::xxh3(std::as_bytes(std::span(m_.data, m_.size)), 0) == *checksum_;
  }
  void settle_checksum(WorkQueue& queue, const WorkQueue::Ticket& sum) const {
    queue.wait(sum);  // runs it here unless the helper has
    if (!sum_ok_)
      throw Error(ErrorCode::kChecksumMismatch, file_, "", "manifest does not match its XXH3 checksum");
  }

  // Root table, archive-level fields, and the work list of pass 1.
  void setup() {
    flatbuffers::Verifier verifier(m_.data, m_.size, verifier_options());
    if (!verifier.VerifyBuffer<ShallowManifest>(fb::ManifestIdentifier())) throw corrupt("", kVerifierFailed);
    const fb::Manifest* root = fb::GetManifest(m_.data);
    m_.root = root;
    major_ = root->format_major();
    m_.metadata = key_values(root->metadata());
    check_metadata_entries(m_.metadata, ErrorCode::kCorruption, file_);
    m_.library_version = std::string(sv(root->library_version()));
    if (auto why = check_string(m_.library_version, format::kMaxKeyBytes, true); !why.empty())
      throw corrupt("", "library version " + why);
    if (const auto* files = root->shard_files()) {  // R8, first half (SPEC.md check 22)
      if (files->size() != 0 && major_ < format::kShardMajor)
        throw corrupt("", "shard_files in a format " + std::to_string(major_) + ".x archive (3.1 has them)");
      m_.shard_files.reserve(files->size());
      for (const auto* f : *files)
        m_.shard_files.push_back({std::string(sv(f->file())), f->manifest_length(), f->manifest_checksum()});
      bound_ = bound_shard_files(m_.shard_files, ErrorCode::kCorruption, file_);
    }
    if (const auto* blobs = root->blobs()) {
      m_.blob_payload.reserve(blobs->size());
      for (const auto* b : *blobs) {
        if (b->payload_length() > format::kMaxBlobValue - format::kBlobHeaderSize)
          throw corrupt("", "blob payload length exceeds the 2 GiB value limit");
        m_.blob_payload.push_back(b->payload_length());
      }
    }
    nodes_ = root->nodes();
    if (!nodes_) throw corrupt("", "manifest has no treedef nodes");
    leaves_ = root->leaves();
    n_nodes_ = nodes_->size();
    n_leaves_ = leaves_ ? leaves_->size() : 0;
    if (n_nodes_ == 0) throw corrupt("", "treedef has no nodes (expected at least a root)");
    if (n_nodes_ > format::kMaxNodes) throw corrupt("", "treedef has more than 2^26 nodes");
    if (n_leaves_ > format::kMaxLeaves) throw corrupt("", "more than 2^24 leaves");
    m_.leaves.resize(n_leaves_);
    compact_.resize(n_nodes_);
    node_blocks_ = (n_nodes_ + kBlockTables - 1) / kBlockTables;
    n_blocks_ = node_blocks_ + (n_leaves_ + kBlockTables - 1) / kBlockTables;
    block_error_.resize(n_blocks_);
    block_fatal_.resize(n_blocks_);
    node_error_.resize(node_blocks_);
  }

  // Pass 1, block `b` of the tables (nodes first, then leaves), on either
  // thread: verify every node table and check it on its own; verify every
  // leaf table and check the leaf. Never throws.
  void run_block(size_t b) {
    bool ok = false;
    try {
      ok = b < node_blocks_ ? node_block(b) : leaf_block(b);
    } catch (...) {  // not a finding about the file (std::bad_alloc): rethrown as is
      block_fatal_[b] = std::current_exception();
    }
    if (!ok) tables_ok_.store(false, std::memory_order_relaxed);
  }

  bool node_block(size_t b) {
    flatbuffers::Verifier verifier(m_.data, m_.size, verifier_options());
    for (size_t i = b * kBlockTables, e = std::min(n_nodes_, i + kBlockTables); i < e; ++i) {
      const fb::Node* node = nodes_->Get(static_cast<flatbuffers::uoffset_t>(i));
      // A leaf's node has every field at its default, so the writer stores
      // it as a table whose vtable lists no field: verifying the table and
      // vtable bounds is then all there is to verify (what Node::Verify does
      // for absent fields is nothing).
      const auto* table = reinterpret_cast<const uint8_t*>(node);
      if (!verifier.VerifyTableStart(table)) return false;
      const uint8_t* vtable = table - flatbuffers::ReadScalar<flatbuffers::soffset_t>(table);
      const bool empty = flatbuffers::ReadScalar<flatbuffers::voffset_t>(vtable) <= 2 * sizeof(flatbuffers::voffset_t);
      verifier.EndTable();
      if (empty) {
        compact_[i] = {nullptr, 0, static_cast<uint8_t>(NodeKind::kLeaf)};
        continue;
      }
      if (!verifier.VerifyTable(node)) return false;
      const FbStrings* keys = node->keys();
      compact_[i] = {keys, node->arity(), static_cast<uint8_t>(node->kind())};
      if (!node_error_[b].second.empty()) continue;
      NodeInfo info{compact_[i].kind, compact_[i].arity, sv(node->type_name()), keys ? keys->size() : 0u};
      auto key_at = [&](size_t c) { return sv(keys->Get(static_cast<flatbuffers::uoffset_t>(c))); };
      if (std::string why = node_problem(info, key_at, nullptr); !why.empty()) node_error_[b] = {i, std::move(why)};
    }
    return true;
  }

  bool leaf_block(size_t b) {
    flatbuffers::Verifier verifier(m_.data, m_.size, verifier_options());
    const size_t first = (b - node_blocks_) * kBlockTables;
    for (size_t li = first, e = std::min(n_leaves_, first + kBlockTables); li < e; ++li) {
      const fb::Leaf* leaf = leaves_->Get(static_cast<flatbuffers::uoffset_t>(li));
      LeafRecord& r = m_.leaves[li];
      if (!full_leaf_check_ && fast_leaf(m_.data, m_.size, leaf, m_.blob_payload, major_, r)) {
        r.fb = leaf;
        r.key_path = sv(leaf->key_path());
        continue;
      }
      r = LeafRecord{};  // check_leaf_record counts from zero
      if (!verifier.VerifyTable(leaf)) return false;
      r.fb = leaf;
      r.key_path = sv(leaf->key_path());
      if (block_error_[b]) continue;  // verify the rest; one leaf error per block is kept
      try {
        check_leaf_record(r, m_.blob_payload, major_, file_);
      } catch (const Error&) {
        block_error_[b] = std::current_exception();
      }
    }
    return true;
  }

  void finish_pass1() {
    if (tables_ok_.load(std::memory_order_relaxed)) return;
    for (const auto& e : block_fatal_)
      if (e) std::rethrow_exception(e);
    throw corrupt("", kVerifierFailed);
  }

  // The treedef, and every leaf's key path against the one stored.
  void walk() {
    size_t bad_node = SIZE_MAX;
    std::string bad_why;
    for (auto& [i, why] : node_error_)
      if (!why.empty()) {
        bad_node = i;
        bad_why = std::move(why);
        break;
      }
    size_t walked = 0;
    walk_treedef(FbNodes{compact_, bad_node, bad_why}, ErrorCode::kCorruption, file_,
                 [&](size_t li, const std::string& path) {
      if (li >= n_leaves_)
        throw corrupt(path, "the treedef has more leaves than the manifest's " + std::to_string(n_leaves_));
      std::string_view stored = m_.leaves[li].key_path;
      if (stored != path)
        throw corrupt(path, "leaf " + std::to_string(li) + " has key path '" + std::string(stored) +
                                "' but the treedef gives '" + path + "'");
      walked = li + 1;
    });
    if (walked != n_leaves_)
      throw corrupt("", "manifest has " + std::to_string(n_leaves_) + " leaves but the treedef has " +
                            std::to_string(walked));
  }

  // Needs every table verified; coverage also needs every leaf checked.
  void index_and_coverage() {
    if (!tables_ok_.load(std::memory_order_relaxed)) return;
    try {  // kept, to be reported after the leaves' own findings
      build_index(m_, file_);
    } catch (...) {
      index_error_ = std::current_exception();
      return;
    }
    for (const auto& e : block_error_)
      if (e) return;
    try {
      check_coverage(m_, file_);
    } catch (...) {
      coverage_error_ = std::current_exception();
    }
  }

  Manifest& m_;
  const std::string& file_;
  const std::optional<uint64_t> checksum_;
  const bool full_leaf_check_;
  uint16_t major_ = 0;
  std::vector<std::string_view> bound_;  // sorted names of m_.shard_files
  const flatbuffers::Vector<flatbuffers::Offset<fb::Node>>* nodes_ = nullptr;
  const flatbuffers::Vector<flatbuffers::Offset<fb::Leaf>>* leaves_ = nullptr;
  size_t n_nodes_ = 0, n_leaves_ = 0, node_blocks_ = 0, n_blocks_ = 0;
  std::vector<CompactNode> compact_;
  std::vector<std::exception_ptr> block_error_;  // the block's first leaf error
  std::vector<std::exception_ptr> block_fatal_;  // what stopped a block that is not a finding
  std::vector<std::pair<size_t, std::string>> node_error_;  // the block's first node problem
  std::atomic<bool> tables_ok_{true};
  bool sum_ok_ = true;  // written by the checksum item, read after waiting for it
  std::exception_ptr index_error_, coverage_error_;
};

}  // namespace

std::unique_ptr<Manifest> parse_manifest(std::span<const std::byte> bytes, const std::string& file, bool borrow,
                                         std::optional<uint64_t> checksum, size_t parallel_from,
                                         bool full_leaf_check) {
  if (bytes.size() > format::kMaxManifestBytes)
    throw Error(ErrorCode::kCorruption, file, "", "manifest larger than 256 MiB");
  auto m = std::make_unique<Manifest>();
  m->size = bytes.size();
  if (borrow && reinterpret_cast<uintptr_t>(bytes.data()) % 8 == 0) {
    m->data = reinterpret_cast<const uint8_t*>(bytes.data());
  } else {
    size_t cap = format::align_up(std::max<size_t>(bytes.size(), 1), 64);
    m->buffer = {static_cast<uint8_t*>(std::aligned_alloc(64, cap)), free_aligned};
    if (!m->buffer) throw std::bad_alloc();  // error.h: out of memory is std::bad_alloc
    std::memcpy(m->buffer.get(), bytes.data(), bytes.size());
    m->data = m->buffer.get();
  }
  Parser(*m, file, checksum, full_leaf_check).run(m->size >= parallel_from);
  return m;
}

}  // namespace treecask
