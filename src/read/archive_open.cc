// Archive::open: validate an untrusted file before anything is mapped or
// returned (SPEC.md "Reader checks" 1-37), find the map's base for the blob
// checks of step 38, and the accessors of what open verified.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>

#include "read/archive_impl.h"
#include "remote/url.h"
#include "treecask/remote.h"

namespace treecask {

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

// The structure checks' view of a signed local file: every range they read,
// recorded for the one hashing pass that follows them (Archive::open_at).
class RecordingReader final : public lmdb::FileReader {
 public:
  explicit RecordingReader(const lmdb::FileReader& inner) : inner_(inner) {}
  std::string read(uint64_t offset, std::byte* buf, size_t n) const override {
    ranges.emplace_back(offset, n);
    return inner_.read(offset, buf, n);
  }
  void will_read(std::span<const uint64_t> offsets, size_t n) const override { inner_.will_read(offsets, n); }
  mutable std::vector<std::pair<uint64_t, uint64_t>> ranges;  // {offset, length}

 private:
  const lmdb::FileReader& inner_;
};

[[noreturn]] void open_fail(ErrorCode code, const std::string& file, const std::string& what) {
  throw Error(code, file, "", what);
}
}  // namespace

void Archive::Impl::check_blob(uint32_t id, size_t li) const {
  const BlobSite& site = blob_site[id];
  const std::byte* value = blob_data[id] - format::kBlobHeaderSize;
  // A signed archive: the headers gate this check and are never handed out,
  // and where the blob lies came from verified B-tree pages; so their shard
  // is hashed only when the check fails, to report bytes that do not match
  // the signature (kSignature) before a corrupt signed file (kCorruption).
  auto bad = [&](const std::string& what) {
    if (guard) {
      const auto r = blob_head_range(id);
      ensure_signed(r.first, r.second, li);
    }
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
  if (source) {  // from the fetched group holding it (for_chunks), else one range read
    try {
      fetch(static_cast<uint64_t>(from - map_base), head + skip, n);
    } catch (const Error& e) {
      throw Error(e.code(), file, key(li), e.message());
    }
    got = true;
  } else if (map_base && fd >= 0) {
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
  if (is_url(path.string())) return open(remote::open_object(path.string()), options);
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

  // A signed open (docs/signing.md "What is verified when"): the bundle's
  // check (the envelope under the key, this file found in the statement, its
  // signed ranges tiling the file exactly: sign/shards.h) starts on a helper
  // thread while this one opens the file as every unsigned open does, with
  // the checks that make that safe on any bytes: the structure walk (forced
  // on; it records what it reads) before LMDB sees the file, then the
  // manifest's verifier. The walk's ranges and the meta database's values
  // (the header record, the manifest with its overflow page header) are
  // handed over for hashing as soon as the walk ends; the two threads share
  // the check and the hashing (SignedOpen: whichever gets to each first).
  // Only then does the open return: no byte is handed out, and no error but
  // the signature's is reported, before they match.
  std::optional<sig::SignedOpen> signed_open;
  if (options.signature) {
    impl->options.validate_structure = true;
    signed_open.emplace(*options.signature, file, impl->file_size, fd);
  }
  lmdb::MetaInfo meta;
  lmdb::StructureStats structure;  // with the first page of every overflow run (its header: check_blob)
  const lmdb::FdReader fd_reader(fd);
  const RecordingReader recording(fd_reader);
  std::exception_ptr failed;  // a signed open's error, reported once the signature is checked
  try {
    // 1, 1b. The LMDB meta pages and every page the reads below can reach,
    // before LMDB sees the file.
    if (signed_open) {
      structure.record_values = true;
      structure.record_only = format::kMetaDb;
      try {
        impl->check_container(recording, &meta, &structure);
      } catch (...) {
        signed_open->trust(recording.ranges);  // what was read before the walk stopped
        throw;
      }
      sig::SignedOpen::Ranges trusted = recording.ranges;
      for (const lmdb::ValueSite& v : structure.values) {
        const uint64_t head = v.overflow_page != UINT64_MAX ? kOverflowPageHeader : 0;
        trusted.emplace_back(v.offset - head, v.size + head);
      }
      signed_open->trust(std::move(trusted));
    } else {
      impl->check_container(fd_reader, &meta, impl->options.validate_structure ? &structure : nullptr);
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
    impl->take_header(hdr);
    auto man = get(meta_dbi, std::as_bytes(std::span(format::kManifestKey)), "mdb_get(manifest)");
    // The map base locates the LMDB overflow page headers of S11 (and lets
    // reads copy with pread()). Without it those headers cannot be checked: an
    // open that must check them fails instead.
    std::string no_base;
    ErrorCode no_base_code = ErrorCode::kIo;
    impl->map_base = find_map_base(hdr, meta, fd, impl->file_size, &no_base, &no_base_code);
    if (signed_open && impl->map_base) signed_open->use_map(impl->map_base);
    if (!impl->map_base && impl->options.validate_structure)
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
    impl->take_manifest(man);

    // 5. Blobs: count, headers, lengths, alignment.
    MDB_stat bst;
    lmdb::check(mdb_stat(txn, blob_dbi, &bst), file, "mdb_stat(blobs)", ErrorCode::kCorruption);
    impl->take_blobs(bst.ms_entries, [&](uint32_t id) {
      std::byte key[4];
      format::put_blob_key(key, id);
      auto v = get(blob_dbi, key, "mdb_get(blob)");
      return Impl::BlobValue{v, overflow_run_of(impl->map_base, v, meta, structure).value_or(UINT64_MAX)};
    });
  } catch (...) {
    if (!signed_open) throw;
    failed = std::current_exception();
  }
  if (signed_open) {
    impl->guard = signed_open->finish();  // the bundle's error, then a mismatch, before the open's own
    if (failed) std::rethrow_exception(failed);
  }
  impl->fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  return Archive(std::move(impl));
}

void Archive::Impl::check_container(const lmdb::FileReader& in, lmdb::MetaInfo* meta,
                                    lmdb::StructureStats* structure) {
  // 1. LMDB meta pages.
  bool not_lmdb = false;
  if (std::string why = lmdb::check_meta_pages(in, file_size, meta, &not_lmdb); !why.empty())
    open_fail(not_lmdb ? ErrorCode::kNotAnArchive : ErrorCode::kCorruption, file,
              not_lmdb ? "not a treecask archive (" + why + ")" : why);
  page_size = meta->page_size;
  last_page = meta->last_page;
  if (!structure) return;
  // 1b. The B-tree pages (overflow runs bounded; their first pages are
  // checked before use: the manifest's at open, a blob's at its first use).
  bool other_lmdb = false;
  if (std::string why = lmdb::check_structure(in, file_size, *meta, structure, &other_lmdb,
                                              /*read_overflow_heads=*/false);
      !why.empty())
    open_fail(other_lmdb ? ErrorCode::kNotAnArchive : ErrorCode::kCorruption, file,
              other_lmdb ? "not a treecask archive (" + why + ")" : why);
}

void Archive::Impl::take_header(std::span<const std::byte> hdr) {
  // 3. Header record: magic, version, manifest length and checksum.
  if (hdr.empty()) open_fail(ErrorCode::kNotAnArchive, file, "no treecask header record");
  if (!format::decode_header(hdr, &header))
    open_fail(ErrorCode::kNotAnArchive, file, "header record lacks the TREECASK magic");
  const auto& h = header;
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
}

void Archive::Impl::take_manifest(std::span<const std::byte> man) {
  const auto& h = header;
  if (man.size() != h.manifest_length)
    open_fail(ErrorCode::kCorruption, file,
              "manifest is " + std::to_string(man.size()) + " bytes, header says " +
                  std::to_string(h.manifest_length));
  manifest = parse_manifest(man, file, /*borrow=*/true, h.manifest_checksum);
  if (manifest->root->format_major() != h.major)
    open_fail(ErrorCode::kCorruption, file, "manifest and header disagree on the format major version");
}

void Archive::Impl::take_blobs(uint64_t entries, const std::function<BlobValue(uint32_t)>& value_of) {
  const Manifest& m = *manifest;
  if (entries != m.blob_payload.size())
    open_fail(ErrorCode::kCorruption, file,
              "blob database has " + std::to_string(entries) + " entries, manifest lists " +
                  std::to_string(m.blob_payload.size()));
  const size_t n_blobs = m.blob_payload.size();
  blob_data.resize(n_blobs);
  blob_site.resize(n_blobs);
  blob_checked.reset(new std::atomic<uint8_t>[n_blobs]);
  for (uint32_t id = 0; id < n_blobs; ++id) {
    blob_checked[id].store(0, std::memory_order_relaxed);
    const BlobValue bv = value_of(id);
    const std::span<const std::byte> v = bv.value;
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
    blob_data[id] = data;
    BlobSite& site = blob_site[id];
    site.value_size = v.size();
    site.overflow_page = bv.overflow_page;
  }
}

Reader::~Reader() = default;  // reader.h: the one out-of-line member anchors its vtable

const std::string& Archive::path() const noexcept { return impl_->file; }
const Source* Archive::source() const noexcept { return impl_->source.get(); }
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
  info.has_view = r.codec == Codec::kNone && r.num_parts <= 1 && r.num_shards == 0 && !impl_->source;
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

}  // namespace treecask
