// How a remote archive's reads fetch their chunks (archive_impl.h,
// for_chunks): the groups, one Source::read call each, that cover the chunks
// a read needs and the blob headers their first use checks, with no byte
// fetched twice and none the open already holds (SPEC.md "Remote reading").
#include "read/archive_impl.h"

namespace treecask {

namespace {
// The bytes check_blob reads: an LMDB overflow page header and a blob header.
constexpr uint64_t kHeadBytes = lmdb::kOverflowDataOffset + format::kBlobHeaderSize;
}  // namespace

Archive::Impl::FetchPlan Archive::Impl::plan_fetch(
    std::span<const ChunkJob> jobs, const std::function<std::byte*(const ChunkJob&)>& in_place) const {
  FetchPlan p;
  const size_t n = jobs.size();
  p.at.resize(n);
  p.dst.assign(n, nullptr);
  std::vector<size_t> sorted(n);
  for (size_t j = 0; j < n; ++j) {
    sorted[j] = j;
    p.at[j] = chunk_offset(jobs[j].leaf, jobs[j].chunk);
    if (in_place) p.dst[j] = in_place(jobs[j]);
  }
  std::sort(sorted.begin(), sorted.end(), [&](size_t a, size_t b) { return p.at[a] < p.at[b]; });
  auto stored_end = [&](size_t j) { return p.at[j] + chunk_of(jobs[j])->stored_size(); };
  // Only runs of in-place chunks (consecutive in the file and in memory) of
  // at least kInPlaceMin bytes are fetched in place: small ones (packed
  // leaves) are coalesced through a buffer.
  for (size_t k = 0; k < n;) {
    size_t e = k + 1;
    while (p.dst[sorted[k]] && e < n && p.dst[sorted[e]] && p.at[sorted[e]] == stored_end(sorted[e - 1]) &&
           p.dst[sorted[e]] == p.dst[sorted[e - 1]] + (p.at[sorted[e]] - p.at[sorted[e - 1]]))
      ++e;
    if (stored_end(sorted[e - 1]) - p.at[sorted[k]] < kInPlaceMin)
      for (size_t q = k; q < e; ++q) p.dst[sorted[q]] = nullptr;
    k = e;
  }
  // The bytes between the open's: [lo, hi).
  const uint64_t lo = open_head.size(), hi = std::max(tail_start, lo);
  uint64_t chunk_bytes = 0;  // of the last group
  for (size_t j : sorted) {
    const uint64_t b = std::max(p.at[j], lo), e = std::min(stored_end(j), hi);
    if (b >= e) {
      p.held.push_back(j);
      continue;
    }
    p.order.push_back(j);
    if (!p.groups.empty()) {
      FetchPlan::Group& g = p.groups.back();
      if (b <= g.end + kFetchGap && chunk_bytes + (e - b) <= kFetchGroup && std::max(e, g.end) - g.start <= kFetchSpan) {
        g.end = std::max(g.end, e);
        g.last = p.order.size();
        chunk_bytes += e - b;
        continue;
      }
    }
    FetchPlan::Group g;
    g.first = p.order.size() - 1;
    g.last = p.order.size();
    g.start = b;
    g.end = e;
    p.groups.push_back(std::move(g));
    chunk_bytes = e - b;
  }
  // The blob headers still to check: each by the group holding it, or, for
  // a header that no group holds, by the first group that needs the blob,
  // as a range of its own. The header of a group's first blob that lies
  // shortly before it (and after the previous group) widens the group.
  std::vector<size_t> owner(blob_site.size(), SIZE_MAX);
  for (size_t gi = 0; gi < p.groups.size(); ++gi) {
    FetchPlan::Group& g = p.groups[gi];
    for (size_t k = g.first; k < g.last; ++k) {
      const ChunkJob& job = jobs[p.order[k]];
      const uint32_t blob = chunk_of(job)->blob();
      if (owner[blob] != SIZE_MAX) {
        if (owner[blob] != gi && (g.waits.empty() || g.waits.back() != owner[blob])) g.waits.push_back(owner[blob]);
        continue;
      }
      if (blob_checked[blob].load(std::memory_order_acquire) != 0) continue;
      const uint64_t head = blob_head_offset(blob);
      const uint64_t hb = std::max(head, lo), he = std::min(head + kHeadBytes, std::min(file_size, hi));
      if (hb >= he) continue;  // inside the open's bytes
      const uint64_t prev_end = gi ? p.groups[gi - 1].end : lo;
      if (k == g.first && hb < g.start && g.start - hb <= kFetchHeadReach && hb >= prev_end) g.start = hb;
      // The group whose stretch holds the header: searched back, since the
      // header precedes the chunk.
      auto holds = [&](size_t o) { return p.groups[o].start <= hb && he <= p.groups[o].end; };
      size_t o = gi;
      while (o > 0 && !holds(o) && p.groups[o].start > hb) --o;
      if (holds(o)) {
        owner[blob] = o;
      } else if (g.head == UINT64_MAX && he <= g.start && (gi == 0 || hb >= prev_end)) {
        owner[blob] = gi;
        g.head = hb;
        g.head_end = he;
      } else {
        continue;  // checked at its first use, with a request of its own (a layout no writer makes)
      }
      p.groups[owner[blob]].owns.emplace_back(blob, job.leaf);
      if (owner[blob] != gi) g.waits.push_back(owner[blob]);
    }
  }
  // The jobs inside the open's bytes wait for the groups that check their
  // blobs' headers; a header that no group holds is a group of its own.
  for (size_t j : p.held) {
    const uint32_t blob = chunk_of(jobs[j])->blob();
    if (owner[blob] == SIZE_MAX) {
      if (blob_checked[blob].load(std::memory_order_acquire) != 0) continue;
      const uint64_t head = blob_head_offset(blob);
      const uint64_t hb = std::max(head, lo), he = std::min(head + kHeadBytes, std::min(file_size, hi));
      if (hb >= he) continue;  // inside the open's bytes
      FetchPlan::Group g;
      g.first = g.last = p.order.size();
      g.start = hb;
      g.end = he;
      g.owns.emplace_back(blob, jobs[j].leaf);
      owner[blob] = p.groups.size();
      p.groups.push_back(std::move(g));
    }
    if (p.held_waits.empty() || p.held_waits.back() != owner[blob]) p.held_waits.push_back(owner[blob]);
  }
  return p;
}

void Archive::Impl::fetch_group(std::span<const ChunkJob> jobs, const FetchPlan& plan, size_t gi, Buffer& buf,
                                std::vector<Piece>& pieces) const {
  const FetchPlan::Group& g = plan.groups[gi];
  const uint64_t lo = open_head.size(), hi = std::max(tail_start, lo);
  // The ranges, in file order: a buffered one holds its offset into `buf`
  // (placed once the buffer's size is known), an in-place one its address.
  struct Part {
    uint64_t start, end;
    std::byte* to;  // nullptr: buffered
  };
  std::vector<Part> parts;
  auto buffered = [&](uint64_t b, uint64_t e) {
    if (!parts.empty() && !parts.back().to && parts.back().end == b)
      parts.back().end = e;
    else
      parts.push_back({b, e, nullptr});
  };
  if (g.head != UINT64_MAX) buffered(g.head, g.head_end);
  uint64_t pos = g.start;
  for (size_t k = g.first; k < g.last; ++k) {
    const size_t j = plan.order[k];
    const uint64_t at = plan.at[j];
    const uint64_t b = std::max(at, lo), e = std::min(at + chunk_of(jobs[j])->stored_size(), hi);
    if (e <= pos) continue;  // already asked for (a chunk read twice)
    if (plan.dst[j] && b >= pos) {
      if (b > pos) buffered(pos, b);
      std::byte* to = plan.dst[j] + (b - at);
      if (!parts.empty() && parts.back().to && parts.back().end == b &&
          parts.back().to + (parts.back().end - parts.back().start) == to)
        parts.back().end = e;
      else
        parts.push_back({b, e, to});
    } else {
      buffered(pos, e);
    }
    pos = e;
  }
  if (pos < g.end) buffered(pos, g.end);  // a group of a blob header alone
  uint64_t in_buf = 0;
  for (const Part& p : parts)
    if (!p.to) in_buf += p.end - p.start;
  std::byte* base = buf.get(in_buf);
  std::vector<ReadRange> ranges;
  ranges.reserve(parts.size());
  pieces.clear();
  for (const Part& p : parts) {
    std::byte* to = p.to ? p.to : base;
    if (!p.to) base += p.end - p.start;
    ranges.push_back({p.start, {to, p.end - p.start}});
    pieces.push_back({p.start, ranges.back().out});
  }
  try {
    source->read(ranges);
  } catch (const Error& e) {
    throw Error(e.code(), file, key(jobs[plan.order[g.first]].leaf), e.message());
  }
}

}  // namespace treecask
