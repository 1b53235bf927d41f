// Archive's reads: zero-copy views, whole-leaf, bulk, row, byte-range and
// N-d slice copies, verify (SPEC.md "Per read"), on the engine of
// read/archive_impl.h.
#include "read/archive_impl.h"

namespace treecask {

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

std::vector<std::span<const std::byte>> Archive::view_parts(size_t index, Verify verify) const {
  const Impl& im = *impl_;
  const LeafRecord& r = im.data_rec(index);
  if (r.codec != Codec::kNone)
    throw Error(ErrorCode::kUnsupported, im.file, im.key(index),
                "an LZ4 leaf has no zero-copy view; use read()");
  if (im.source) throw im.no_view(index);
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
  if (im.source) throw im.no_view(index);
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
    if (r.codec != Codec::kNone || r.num_parts > 1 || im.source) continue;  // no view: the caller reads it
    if (r.byte_length == 0) {
      out[k] = view(indices[k], Verify::kNo);
      continue;
    }
    // One raw part: its chunks are contiguous (checked at open), so the leaf
    // runs from its first chunk's first byte to its last chunk's last byte.
    // A signed archive: every shard under the view, on all cores, before it
    // is handed out (its blob's headers: check_blob).
    if (im.guard) im.ensure_signed(im.chunk_offset(indices[k], 0), r.byte_length, indices[k], resolve_threads(threads));
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
  std::vector<Impl::ChunkJob> jobs(r.num_chunks());
  for (uint32_t ci = 0; ci < r.num_chunks(); ++ci) jobs[ci] = {index, ci};
  auto to = [&](const Impl::ChunkJob& j) { return out.data() + j.chunk * r.chunk_size; };
  im.for_chunks(
      jobs, threads, [&](const Impl::ChunkJob& j, unsigned) { im.decode_chunk(index, j.chunk, to(j), check); },
      [&](const Impl::ChunkJob& j) { return im.chunk_is_raw(r, im.chunk_of(j)) ? to(j) : nullptr; });
}

void Archive::read_many(std::span<const size_t> indices, std::span<const std::span<std::byte>> outs,
                        Verify verify, unsigned threads) const {
  const Impl& im = *impl_;
  if (indices.size() != outs.size())
    throw Error(ErrorCode::kInvalidArgument, im.file, "", "read_many needs one output per index");
  std::vector<Impl::ChunkJob> jobs;
  std::vector<std::byte*> dst;  // per job
  for (size_t k = 0; k < indices.size(); ++k) {
    const LeafRecord& r = im.data_rec(indices[k]);
    if (outs[k].size() != r.byte_length)
      throw Error(ErrorCode::kShapeMismatch, im.file, im.key(indices[k]),
                  "output buffer has " + std::to_string(outs[k].size()) + " bytes, leaf has " +
                      std::to_string(r.byte_length));
    for (uint32_t ci = 0; ci < r.num_chunks(); ++ci) {
      jobs.push_back({indices[k], ci});
      dst.push_back(outs[k].data() + uint64_t(ci) * r.chunk_size);
    }
  }
  bool check = im.want_verify(verify);
  const Impl::ChunkJob* first = jobs.data();
  auto to = [&](const Impl::ChunkJob& j) { return dst[static_cast<size_t>(&j - first)]; };
  im.for_chunks(
      jobs, resolve_threads(threads),
      [&](const Impl::ChunkJob& j, unsigned) { im.decode_chunk(j.leaf, j.chunk, to(j), check); },
      [&](const Impl::ChunkJob& j) { return im.chunk_is_raw(im.rec(j.leaf), im.chunk_of(j)) ? to(j) : nullptr; });
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

namespace {

// Archive::verify of a signed local archive: one pass on all cores over the
// signed shards in file order. Each shard is hashed (SHA-256, the guard),
// then the chunks whose last byte lies in it are checked (XXH3; LZ4 decoded)
// while its bytes are still in the CPU's caches, so every byte is read once
// where a signature pass and a checksum pass would read it twice. Every
// shard is hashed, those under no chunk (LMDB pages, the manifest) too: the
// result covers every signed byte and every chunk. A shard that does not
// match is an Error of each leaf with a chunk ending in it, else one naming
// no leaf, after the leaves'. `progress` is called from the calling thread,
// in leaf order, as leaves complete.
std::vector<Error> verify_signed(const Archive::Impl& im, const std::function<void(uint64_t, uint64_t)>& progress) {
  const sig::ShardGuard& guard = *im.guard;
  const sig::ShardTable& table = guard.table();
  const size_t nleaves = im.manifest->leaves.size();
  std::vector<std::vector<Archive::Impl::ChunkJob>> by_shard(table.count());
  std::vector<uint64_t> left(nleaves);  // chunks of each leaf not yet checked
  uint64_t total = 0;
  for (size_t li = 0; li < nleaves; ++li) {
    const LeafRecord& r = im.rec(li);
    total += r.byte_length;
    left[li] = r.num_chunks();
    for (uint32_t ci = 0; ci < r.num_chunks(); ++ci) {
      const uint64_t end = im.chunk_offset(li, ci) + im.chunk_of({li, ci})->stored_size();
      const size_t k = end == 0 ? 0 : end > table.size() ? table.count() - 1 : table.shard_of(end - 1);
      by_shard[k].push_back({li, ci});
    }
  }
  const unsigned threads = resolve_threads(0);
  std::vector<std::vector<std::byte>> scratch(threads);
  std::vector<std::optional<Error>> failed(nleaves);
  std::vector<Error> no_leaf;
  std::mutex mu;
  size_t reported = 0;  // leaves [0, reported) passed to progress
  uint64_t done = 0;
  auto report = [&] {  // REQUIRES mu held
    for (; reported < nleaves && left[reported] == 0; ++reported) {
      done += im.rec(reported).byte_length;
      progress(done, total);
    }
  };
  parallel_for(table.count(), threads, [&](size_t k, unsigned worker) {
    std::optional<Error> bad_shard;
    try {
      guard.verify_shard(k);
    } catch (const Error& e) {
      bad_shard = e;
    }
    for (const Archive::Impl::ChunkJob& j : by_shard[k]) {
      std::optional<Error> bad = bad_shard;
      if (!bad) {
        try {
          const LeafRecord& r = im.rec(j.leaf);
          if (im.chunk_is_raw(r, im.chunk_of(j))) {
            im.check_chunk(j.leaf, j.chunk);
          } else {
            scratch[worker].resize(im.raw_size(r, j.chunk));
            im.decode_chunk(j.leaf, j.chunk, scratch[worker].data(), true);
          }
        } catch (const Error& e) {
          bad = e;
        }
      }
      std::lock_guard lock(mu);
      if (bad && !failed[j.leaf]) failed[j.leaf] = Error(bad->code(), im.file, im.key(j.leaf), bad->message());
      --left[j.leaf];
    }
    std::lock_guard lock(mu);
    if (bad_shard && by_shard[k].empty()) no_leaf.push_back(*bad_shard);
    if (progress && worker == 0) report();
  });
  std::vector<Error> errors;
  for (auto& e : failed)
    if (e) errors.push_back(std::move(*e));
  errors.insert(errors.end(), no_leaf.begin(), no_leaf.end());
  if (progress) {
    report();
    if (nleaves == 0) progress(0, 0);
  }
  return errors;
}

}  // namespace

std::vector<Error> Archive::verify(const std::function<void(uint64_t, uint64_t)>& progress) const {
  const Impl& im = *impl_;
  // The index of a sharded checkpoint holds no leaf bytes: verifying it
  // verifies the checkpoint it describes, with the shard files beside it
  // (ShardedArchive::open_index: every file there, bound and tiling every
  // leaf, then every chunk of each), never "intact" for bytes it never saw;
  // a signed index's own bytes are every one hashed first.
  for (const LeafRecord& r : im.manifest->leaves)
    if (r.num_shards != 0) {
      if (im.guard && !im.source) im.guard->ensure_all(0);
      return ShardedArchive::open_index(*this, im.options).verify(progress);
    }
  if (im.guard && !im.source) return verify_signed(im, progress);
  // A local raw chunk is hashed through the map; any other chunk is decoded
  // (a remote one: fetched) into a per-worker scratch buffer. Leaves are
  // checked in batches, errors and progress reported per leaf in leaf order:
  // one leaf at a time locally, its chunks on the calling thread; up to
  // kRemoteVerifyBatch stored bytes of leaves of a remote archive at once,
  // their chunks fetched concurrently. A remote source's own failure (kIo,
  // kNotFound, an object that changed) is thrown, not counted as damage.
  constexpr uint64_t kRemoteVerifyBatch = uint64_t{64} << 20;
  std::vector<std::vector<std::byte>> scratch(im.chunk_workers(1));
  std::vector<Error> errors;
  uint64_t total = 0, done = 0;
  if (progress)
    for (const auto& r : im.manifest->leaves) total += r.byte_length;
  std::vector<Impl::ChunkJob> jobs;
  std::vector<std::optional<Error>> failed;
  std::mutex mu;
  for (size_t first = 0; first < size();) {
    size_t last = first;
    uint64_t bytes = 0;
    do bytes += im.rec(last++).stored_bytes;
    while (im.source && last < size() && bytes < kRemoteVerifyBatch);
    jobs.clear();
    for (size_t li = first; li < last; ++li)
      for (uint32_t ci = 0; ci < im.rec(li).num_chunks(); ++ci) jobs.push_back({li, ci});
    failed.assign(last - first, std::nullopt);
    im.for_chunks(jobs, 1, [&](const Impl::ChunkJob& j, unsigned worker) {
      const LeafRecord& r = im.rec(j.leaf);
      try {
        if (!im.source && im.chunk_is_raw(r, im.chunk_of(j))) {
          im.check_chunk(j.leaf, j.chunk);
        } else {
          scratch[worker].resize(im.raw_size(r, j.chunk));
          im.decode_chunk(j.leaf, j.chunk, scratch[worker].data(), true);
        }
      } catch (const Error& e) {
        if (im.source && e.code() != ErrorCode::kChecksumMismatch && e.code() != ErrorCode::kCorruption) throw;
        std::lock_guard lock(mu);
        if (!failed[j.leaf - first]) failed[j.leaf - first] = e;
      }
    });
    for (size_t li = first; li < last; ++li) {
      if (failed[li - first]) errors.push_back(*failed[li - first]);
      if (progress) {
        done += im.rec(li).byte_length;
        progress(done, total);
      }
    }
    first = last;
  }
  if (progress && size() == 0) progress(0, 0);
  return errors;
}

}  // namespace treecask
