// Archive::open(Source): a remote archive, opened with the checks of a local
// open (SPEC.md "Reader checks" 1-37, read/archive_open.cc) on bytes read
// by range. LMDB never sees a remote object: the structure walk that guards
// LMDB locally is here also the index, listing where every value lies
// (SPEC.md "Remote reading").
#include <sys/mman.h>

#include <algorithm>
#include <map>

#include "read/archive_impl.h"
#include "sign/signed_source.h"

namespace treecask {

namespace {

// The structure checks' view of a remote object: the open's first read
// (Impl::open_head and open_tail) first, then what else it fetched for the
// rest of the open (B-tree pages outside them: freed when the open returns).
// A source error propagates as the source threw it (Error naming the URL),
// never as a defect of the file.
class SourceReader final : public lmdb::FileReader {
 public:
  SourceReader(const Archive::Impl& impl, const Source& source) : impl_(impl), source_(source) {}

  std::string read(uint64_t offset, std::byte* buf, size_t n) const override {
    const uint64_t size = impl_.file_size;
    if (offset > size || n > size - offset) return "unexpected end of file";
    impl_.copy_held(offset, buf, n);
    if (n == 0) return {};
    if (auto it = held_.upper_bound(offset); it != held_.begin()) {
      --it;
      const uint64_t at = offset - it->first;
      if (at <= it->second.size() && n <= it->second.size() - at) {
        std::memcpy(buf, it->second.data() + at, n);
        return {};
      }
    }
    ReadRange r{offset, {buf, n}};
    source_.read(std::span<const ReadRange>(&r, 1));
    return {};
  }

  // Fetches the pages at `offsets` (n bytes each) not held yet, as one batch
  // of ranges (adjacent pages merged), and holds them.
  void will_read(std::span<const uint64_t> offsets, size_t n) const override {
    const uint64_t size = impl_.file_size;
    std::vector<uint64_t> want;
    for (uint64_t off : offsets)
      if (off <= size && n <= size - off && !holds(off, n)) want.push_back(off);
    if (want.empty()) return;
    std::sort(want.begin(), want.end());
    std::vector<std::pair<uint64_t, uint64_t>> runs;  // [begin, end)
    for (uint64_t off : want) {
      if (!runs.empty() && off <= runs.back().second) {
        runs.back().second = std::max(runs.back().second, off + n);
        continue;
      }
      runs.emplace_back(off, off + n);
    }
    std::vector<ReadRange> ranges;
    for (auto [b, e] : runs) {
      std::vector<std::byte>& buf = held_[b];
      buf.resize(e - b);
      ranges.push_back({b, buf});
    }
    source_.read(ranges);
  }

  // The bytes [offset, offset + n) as a buffer of their own.
  std::vector<std::byte> bytes(uint64_t offset, uint64_t n) const {
    std::vector<std::byte> out(n);
    if (std::string why = read(offset, out.data(), n); !why.empty())
      throw Error(ErrorCode::kCorruption, source_.name(), "", why);
    return out;
  }

 private:
  bool holds(uint64_t off, size_t n) const {
    if (off + n <= impl_.open_head.size() || off >= impl_.tail_start) return true;
    auto it = held_.upper_bound(off);
    if (it == held_.begin()) return false;
    --it;
    return off - it->first <= it->second.size() && n <= it->second.size() - (off - it->first);
  }

  const Archive::Impl& impl_;
  const Source& source_;
  mutable std::map<uint64_t, std::vector<std::byte>> held_;  // by first byte
};

// The open's first read: the object's first kOpenHeadBytes and last
// kOpenTailBytes in one call (source.h), into impl.open_head and open_tail;
// learns the object's size (impl.file_size).
void read_ends(Archive::Impl& impl, const Source& source) {
  uint64_t size = source.size();
  std::vector<std::byte>& head = impl.open_head;
  std::vector<std::byte>& tail = impl.open_tail;
  if (size == kUnknownSize) {
    head.resize(kOpenHeadBytes);
    tail.resize(kOpenTailBytes);
    ReadRange r[2] = {{0, head}, {0, tail, /*from_end=*/true}};
    source.read(r);
    size = source.size();
    if (size == kUnknownSize)
      throw Error(ErrorCode::kIo, source.name(), "", "the source did not learn the object's size from its first read");
    head.resize(std::min(kOpenHeadBytes, size));
    tail.resize(std::min(kOpenTailBytes, size));  // the object's last bytes, at the buffer's start
    if (size - tail.size() < head.size())  // they overlap: the tail keeps what the head lacks
      tail.erase(tail.begin(), tail.begin() + static_cast<ptrdiff_t>(head.size() - (size - tail.size())));
  } else {
    head.resize(std::min(kOpenHeadBytes, size));
    tail.resize(std::min(kOpenTailBytes, size - head.size()));
    std::vector<ReadRange> r;
    if (!head.empty()) r.push_back({0, head});
    if (!tail.empty()) r.push_back({size - tail.size(), tail});
    if (!r.empty()) source.read(r);
  }
  head.shrink_to_fit();
  tail.shrink_to_fit();
  impl.file_size = size;
  impl.tail_start = size - tail.size();
}

}  // namespace

Archive Archive::open(std::shared_ptr<const Source> source, const OpenOptions& options) {
  if (!source) throw Error(ErrorCode::kInvalidArgument, "", "", "Archive::open: no source");
  auto impl = std::make_shared<Impl>();
  impl->file = source->name();
  impl->options = options;
  // A signed open: every byte comes through a source that fetches whole
  // signed shards and hashes them before handing any byte out
  // (sig::verified_source), the open's own reads included.
  if (options.signature) source = sig::signed_source(std::move(source), *options.signature);
  impl->source = source;
  const std::string& file = impl->file;
  read_ends(*impl, *source);
  SourceReader in(*impl, *source);

  // 1, 1b. The meta pages and the whole B-tree walk, always: it is how the
  // values are found (there is no LMDB to ask).
  lmdb::MetaInfo meta;
  lmdb::StructureStats structure;
  structure.record_values = true;
  impl->check_container(in, &meta, &structure);
  std::map<std::pair<std::string, std::string>, const lmdb::ValueSite*> sites;
  uint64_t blob_entries = 0;
  for (const lmdb::ValueSite& v : structure.values) {
    sites[{v.db, v.key}] = &v;
    blob_entries += v.db == format::kBlobDb;
  }
  auto site = [&](const char* db, std::string_view key) -> const lmdb::ValueSite* {
    auto it = sites.find({db, std::string(key)});
    return it == sites.end() ? nullptr : it->second;
  };

  // An address range as long as the file, reserved and never touched: the
  // engine's blob addresses minus map_base are file offsets (archive_impl.h).
  impl->reserved_bytes = std::max<uint64_t>(impl->file_size, 1);
  impl->reserved = ::mmap(nullptr, impl->reserved_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (impl->reserved == MAP_FAILED) {
    impl->reserved = nullptr;
    throw Error(ErrorCode::kIo, file, "", "cannot reserve address space for the archive: " +
                                              std::string(std::strerror(errno)));
  }
  impl->map_base = static_cast<const std::byte*>(impl->reserved);

  // 3. The header record.
  std::vector<std::byte> hdr;
  if (const lmdb::ValueSite* h = site(format::kMetaDb, format::kHeaderKey)) hdr = in.bytes(h->offset, h->size);
  impl->take_header(hdr);

  // 4. The manifest, with its overflow run's first page header (S11) when
  // it has one, read in the same range.
  const lmdb::ValueSite* m = site(format::kMetaDb, format::kManifestKey);
  if (!m) throw Error(ErrorCode::kCorruption, file, "", "manifest is 0 bytes, header says " +
                                                           std::to_string(impl->header.manifest_length));
  if (m->overflow_page != UINT64_MAX) {
    std::vector<std::byte> run = in.bytes(m->offset - lmdb::kOverflowDataOffset, lmdb::kOverflowDataOffset + m->size);
    if (std::string why = lmdb::check_overflow_head(std::span(run).first(lmdb::kOverflowDataOffset),
                                                    m->overflow_page, m->size, meta.page_size, meta.last_page);
        !why.empty())
      throw Error(ErrorCode::kCorruption, file, "",
                  "manifest: LMDB overflow page " + std::to_string(m->overflow_page) + " " + why);
    impl->manifest_bytes.assign(run.begin() + lmdb::kOverflowDataOffset, run.end());
  } else {
    impl->manifest_bytes = in.bytes(m->offset, m->size);
  }
  impl->take_manifest(impl->manifest_bytes);

  // 5. The blobs, where the walk found them.
  impl->take_blobs(blob_entries, [&](uint32_t id) {
    std::byte key[4];
    format::put_blob_key(key, id);
    const lmdb::ValueSite* b = site(format::kBlobDb, std::string_view(reinterpret_cast<const char*>(key), 4));
    if (!b) return Impl::BlobValue{};
    return Impl::BlobValue{{impl->map_base + b->offset, b->size}, b->overflow_page};
  });
  return Archive(std::move(impl));
}

}  // namespace treecask
