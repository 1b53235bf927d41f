// Archive::open(Source): a remote archive reads exactly what the same file
// reads locally, through a Source a server could implement itself (here a
// file read with pread() that counts requests and can be damaged or fail),
// fetches only the chunks a read needs, and reports a damaged object or a
// failing source as the local reader reports a damaged file.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <mutex>

#include "../format/vectors/contents.h"
#include "testutil.h"
#include "treecask/treecask.h"

using namespace treecask;
using tc_test::FlatTree;
using tc_test::TempDir;
namespace fs = std::filesystem;

namespace {

// A local file served as a range-read source: counts requests (read()
// calls), stretches (runs of touching ranges in one call: what an HTTP
// source sends as one GET) and bytes, checks the contract's order (ranges
// increasing, never overlapping), flips one byte at `damage_at` in what it
// returns, or throws Error(kIo) once `fail_after` requests have been served.
// With `learns_size`, size() is kUnknownSize until the first read, which
// then takes the open's {0, head} and from_end ranges as an HTTP object
// does (clipped to the object).
class FileSource final : public Source {
 public:
  explicit FileSource(const fs::path& path, bool learns_size = false)
      : name_("test://" + path.filename().string()) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd_ >= 0);
    file_size_ = static_cast<uint64_t>(::lseek(fd_, 0, SEEK_END));
    size_ = learns_size ? kUnknownSize : file_size_;
  }
  ~FileSource() override { ::close(fd_); }
  const std::string& name() const noexcept override { return name_; }
  uint64_t size() const noexcept override { return size_; }
  void read(std::span<const ReadRange> ranges) const override {
    if (requests.fetch_add(1) >= fail_after)
      throw Error(ErrorCode::kIo, name_, "", "connection reset (injected)");
    for (const ReadRange& r : ranges)
      if (!r.from_end && fail_at >= r.offset && fail_at - r.offset < r.out.size())
        throw Error(ErrorCode::kIo, name_, "", "connection reset (injected)");
    const bool first = size_ == kUnknownSize;
    uint64_t end = 0;
    for (size_t i = 0; i < ranges.size(); ++i) {
      const ReadRange& r = ranges[i];
      uint64_t off = r.offset, n = r.out.size();
      if (first) {  // clipped to the object, at the start of `out`
        CHECK((r.from_end ? r.offset == 0 : true));
        n = std::min<uint64_t>(n, r.from_end ? file_size_ : file_size_ - std::min(off, file_size_));
        if (r.from_end) off = file_size_ - n;
      } else {
        CHECK_FALSE(r.from_end);
        REQUIRE(off + n <= size_);
        CHECK((i == 0 || off >= end));  // increasing, never overlapping
        if (i == 0 || off != end) stretches += 1;
        end = off + n;
      }
      REQUIRE(::pread(fd_, r.out.data(), n, static_cast<off_t>(off)) == static_cast<ssize_t>(n));
      bytes += n;
      ranges_read += 1;
      if (on_range) on_range(off, n);
      if (damage_at >= off && damage_at < off + n) r.out[damage_at - off] ^= std::byte{1};
    }
    if (first) {
      stretches += ranges.size();
      size_ = file_size_;
    }
  }
  unsigned concurrency() const noexcept override { return parallel; }
  mutable std::atomic<uint64_t> requests{0}, stretches{0}, ranges_read{0}, bytes{0};
  unsigned parallel = 16;
  uint64_t damage_at = UINT64_MAX;
  uint64_t fail_after = UINT64_MAX;
  uint64_t fail_at = UINT64_MAX;  // a read of this byte throws Error(kIo)
  std::function<void(uint64_t, uint64_t)> on_range;  // called for every range read

 private:
  std::string name_;
  int fd_ = -1;
  uint64_t file_size_ = 0;
  mutable std::atomic<uint64_t> size_{0};
};

std::vector<std::byte> read_all(const Archive& a, size_t i) {
  std::vector<std::byte> out(a.leaf(i).byte_length);
  a.read(i, out);
  return out;
}

// A tree with every storage path: multi-chunk raw leaves, several parts,
// LZ4, byte-shuffled LZ4, packed small leaves, a 0-byte leaf. With `pad`,
// random leaves before and after them (512 KiB and 5 MiB) put them outside
// the object's first 256 KiB and last 4 MiB, which the open fetches.
fs::path save_mixed(const TempDir& dir, bool shuffle, bool pad = false) {
  FlatTree t;
  if (pad) t.add_random("a_pad", DType::kUInt8, {512 << 10}, 90);
  t.add_random("big", DType::kFloat32, {256, 1024}, 1);    // 1 MiB: 16 chunks of 64 KiB, 4 parts
  t.add("zeros", DType::kFloat32, {64, 1024}, tc_test::compressible_bytes(256 << 10, 2));
  for (int i = 0; i < 40; ++i) t.add_random("small_" + std::to_string(i), DType::kInt16, {17, 3}, 10 + i);
  t.add("empty", DType::kFloat32, {0, 4}, {});
  if (pad) t.add_random("zz_pad", DType::kUInt8, {5 << 20}, 91);
  SaveOptions opt;
  opt.chunk_size = 64 << 10;
  opt.max_part_bytes = 256 << 10;
  opt.shuffle = shuffle;
  fs::path p = dir / (std::string(shuffle ? "shuffle" : "mixed") + (pad ? "_pad" : "") + ".cask");
  save(p, t.treedef(), t.inputs(), opt);
  return p;
}

}  // namespace

TEST_CASE("a remote archive reads what the local file reads, through every read") {
  TempDir dir;
  for (bool shuffle : {false, true}) {
    fs::path p = save_mixed(dir, shuffle);
    Archive local = Archive::open(p);
    auto src = std::make_shared<FileSource>(p);
    Archive remote = Archive::open(src);
    CHECK(remote.path() == src->name());
    CHECK(remote.source() == src.get());
    CHECK(local.source() == nullptr);
    CHECK(remote.size() == local.size());
    CHECK(remote.format_major() == local.format_major());
    CHECK(remote.manifest_fingerprint().manifest_checksum == local.manifest_fingerprint().manifest_checksum);
    for (size_t i = 0; i < local.size(); ++i) {
      INFO(local.leaf(i).key_path);
      CHECK(remote.leaf(i).key_path == local.leaf(i).key_path);
      CHECK_FALSE(remote.leaf(i).zero_copy());  // no map to view
      CHECK(tc_test::same(read_all(remote, i), read_all(local, i)));
    }
    // read_many of everything, rows, bytes and a strided N-d slice.
    std::vector<size_t> all(local.size());
    std::vector<std::vector<std::byte>> outs;
    std::vector<std::span<std::byte>> spans;
    for (size_t i = 0; i < all.size(); ++i) {
      all[i] = i;
      outs.emplace_back(local.leaf(i).byte_length);
    }
    for (auto& o : outs) spans.emplace_back(o);
    remote.read_many(all, spans);
    for (size_t i = 0; i < all.size(); ++i) CHECK(tc_test::same(outs[i], read_all(local, i)));
    const size_t big = local.index_of("big");
    std::vector<std::byte> r1(10 * 4096), r2(10 * 4096);
    local.read_rows(big, 100, 110, r1);
    remote.read_rows(big, 100, 110, r2);
    CHECK(tc_test::same(r1, r2));
    const int64_t start[] = {3, 5}, stop[] = {250, 900};
    std::vector<std::byte> s1(247 * 895 * 4), s2(s1.size());
    local.read_slice(big, start, stop, s1);
    remote.read_slice(big, start, stop, s2);
    CHECK(tc_test::same(s1, s2));
    CHECK(remote.verify().empty());
    // No map, so no view; view_many leaves every leaf to read().
    CHECK_THROWS_AS(remote.view(big), Error);
    for (const auto& v : remote.view_many(all)) CHECK(!v.has_value());
  }
}

TEST_CASE("every golden vector reads remotely as it reads locally") {
  const fs::path vectors = fs::path(TREECASK_SOURCE_DIR) / "format" / "vectors";
  for (const auto& v : golden::all_vectors()) {
    INFO(v.file);
    Archive local = Archive::open(vectors / v.file);
    Archive remote = Archive::open(std::make_shared<FileSource>(vectors / v.file));
    CHECK(remote.format_major() == local.format_major());
    CHECK(remote.treedef().size() == local.treedef().size());
    REQUIRE(remote.size() == local.size());
    for (size_t i = 0; i < local.size(); ++i) CHECK(tc_test::same(read_all(remote, i), read_all(local, i)));
  }
}

TEST_CASE("a source opens with one read, and what it fetched costs no request again") {
  TempDir dir;
  fs::path p = save_mixed(dir, false);  // smaller than the open's 256 KiB + 4 MiB
  Archive local = Archive::open(p);
  for (bool learns_size : {false, true}) {
    auto src = std::make_shared<FileSource>(p, learns_size);
    Archive a = Archive::open(src);
    CHECK(src->requests == 1);
    // The whole object, once (a source that learns the size gets the head
    // and a tail that holds the head again: no size to clip them by).
    CHECK(src->bytes == fs::file_size(p) + (learns_size ? kOpenHeadBytes : 0));
    CHECK(a.file_size() == fs::file_size(p));
    for (size_t i = 0; i < local.size(); ++i) CHECK(tc_test::same(read_all(a, i), read_all(local, i)));
    CHECK(a.verify().empty());
    CHECK(src->requests == 1);
  }
}

TEST_CASE("a source that learns its size from its first read opens every golden vector and a large file") {
  const fs::path vectors = fs::path(TREECASK_SOURCE_DIR) / "format" / "vectors";
  TempDir dir;
  std::vector<fs::path> files{save_mixed(dir, true, /*pad=*/true)};
  for (const auto& v : golden::all_vectors()) files.push_back(vectors / v.file);
  for (const fs::path& f : files) {
    INFO(f);
    Archive local = Archive::open(f);
    auto src = std::make_shared<FileSource>(f, /*learns_size=*/true);
    Archive remote = Archive::open(src);
    CHECK(src->requests == 1);
    CHECK(remote.file_size() == fs::file_size(f));
    REQUIRE(remote.size() == local.size());
    for (size_t i = 0; i < local.size(); ++i) CHECK(tc_test::same(read_all(remote, i), read_all(local, i)));
  }
}

TEST_CASE("a remote read fetches only the chunks it needs, coalesced") {
  TempDir dir;
  fs::path p = save_mixed(dir, false, /*pad=*/true);
  auto src = std::make_shared<FileSource>(p);
  Archive a = Archive::open(src);
  CHECK(src->requests == 1);
  const size_t big = a.index_of("big");
  // 100 bytes inside chunk 5: that chunk (64 KiB), with its blob's header
  // (64 KiB before it, within kFetchHeadReach) in the same stretch.
  src->requests = src->stretches = src->bytes = 0;
  std::vector<std::byte> out(100);
  a.read_bytes(big, 5 * (64 << 10) + 10, out);
  CHECK(src->requests == 1);
  CHECK(src->stretches == 1);
  CHECK(src->bytes <= 2 * (64 << 10) + 64);
  // The whole 1 MiB leaf: 4 parts (blobs), one stretch, every header in it.
  src->requests = src->stretches = src->bytes = 0;
  read_all(a, big);
  CHECK(src->requests == 1);
  CHECK(src->stretches == 1);
  CHECK(src->bytes <= (1 << 20) + 4 * 4096);
  // 40 packed small leaves in one read_many: at most one request (none
  // when their pack lies in the object's last 4 MiB, which the open fetched).
  std::vector<size_t> idx;
  std::vector<std::vector<std::byte>> outs;
  std::vector<std::span<std::byte>> spans;
  for (int i = 0; i < 40; ++i) {
    idx.push_back(a.index_of("small_" + std::to_string(i)));
    outs.emplace_back(a.leaf(idx.back()).byte_length);
  }
  for (auto& o : outs) spans.emplace_back(o);
  src->requests = src->stretches = 0;
  a.read_many(idx, spans);
  CHECK(src->requests <= 1);
  CHECK(src->stretches == src->requests);
}

TEST_CASE("a full load fetches no byte twice, in stretches of about 8 MiB") {
  // 9 raw leaves of 3 MiB (1 MiB chunks, one blob each), a raw leaf of 20
  // MiB (one blob over three groups: the later two wait for the first to
  // check its header), an LZ4 leaf, 300 packed small leaves: ~52 MiB.
  TempDir dir;
  FlatTree t;
  for (int i = 0; i < 9; ++i) t.add_random("w" + std::to_string(i), DType::kFloat32, {768, 1024}, 200 + i);
  t.add_random("x_huge", DType::kFloat32, {5 << 10, 1024}, 199);
  t.add("lz", DType::kFloat32, {1024, 1024}, tc_test::compressible_bytes(4 << 20, 3));
  for (int i = 0; i < 300; ++i) t.add_random("s" + std::to_string(i), DType::kUInt8, {1000}, 300 + i);
  const fs::path p = dir / "load.cask";
  save(p, t.treedef(), t.inputs(), SaveOptions{});
  Archive local = Archive::open(p);
  auto src = std::make_shared<FileSource>(p);
  std::mutex mu;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  src->on_range = [&](uint64_t off, uint64_t n) {
    std::lock_guard lock(mu);
    ranges.emplace_back(off, n);
  };
  Archive a = Archive::open(src);
  std::vector<size_t> all(a.size());
  std::vector<std::vector<std::byte>> outs;
  std::vector<std::span<std::byte>> spans;
  uint64_t max_chunk = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    all[i] = i;
    outs.emplace_back(a.leaf(i).byte_length);
    max_chunk = std::max(max_chunk, a.leaf(i).chunk_size);
  }
  for (auto& o : outs) spans.emplace_back(o);
  src->stretches = 0;
  a.read_many(all, spans);
  for (size_t i = 0; i < all.size(); ++i) CHECK(tc_test::same(outs[i], read_all(local, i)));
  // No byte twice: the open's ranges and the load's never overlap.
  std::sort(ranges.begin(), ranges.end());
  uint64_t fetched = 0;
  for (size_t k = 0; k < ranges.size(); ++k) {
    if (k > 0) CHECK(ranges[k].first >= ranges[k - 1].first + ranges[k - 1].second);
    fetched += ranges[k].second;
  }
  CHECK(fetched <= fs::file_size(p));
  // Groups of at most 8 MiB of chunks (Impl::kFetchGroup): a group is closed
  // only when the next chunk (at most max_chunk) would pass 8 MiB, so every
  // group but the last fetches more than 8 MiB - max_chunk of the file.
  const uint64_t load_bytes = fetched - std::min<uint64_t>(fetched, (4 << 20) + (256 << 10));
  const uint64_t bound = (load_bytes + (8 << 20) - max_chunk - 1) / ((8 << 20) - max_chunk) + 1;
  INFO("stretches " << src->stretches.load() << ", bound " << bound);
  CHECK(src->stretches <= bound);

  // One request at a time: the groups that wait for a header run after the
  // group that checks it (parallel_for claims them in file order).
  auto serial = std::make_shared<FileSource>(p);
  serial->parallel = 1;
  Archive b = Archive::open(serial);
  const size_t huge = b.index_of("x_huge");
  CHECK(tc_test::same(read_all(b, huge), read_all(local, huge)));
  INFO("serial stretches " << serial->stretches.load());
  CHECK(serial->stretches == 2 + 3);  // the open's two, then 20 MiB as 8 + 8 + 4

  // The group that holds its header fails: the groups waiting for that
  // check give up, and the read fails naming the leaf (never hangs).
  const std::vector<std::byte> file_bytes = tc_test::read_file(p);
  const std::vector<std::byte> want = read_all(local, huge);
  auto first = std::search(file_bytes.begin(), file_bytes.end(), want.begin(), want.begin() + 4096);
  REQUIRE(first != file_bytes.end());
  for (unsigned parallel : {16u, 1u}) {
    auto failing = std::make_shared<FileSource>(p);
    failing->parallel = parallel;
    failing->fail_at = static_cast<uint64_t>(first - file_bytes.begin());
    Archive c = Archive::open(failing);
    std::vector<std::byte> out(want.size());
    try {
      c.read(huge, out);
      FAIL("a read through a failing source succeeded");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::kIo);
      CHECK(e.key_path() == "x_huge");
    }
  }
}

TEST_CASE("a damaged remote object is a checksum error or corruption naming the URL and the key path") {
  TempDir dir;
  for (bool pad : {false, true}) {  // the damaged chunk in the open's bytes, or fetched by the read
    INFO("pad " << pad);
    fs::path p = save_mixed(dir, false, pad);
    Archive local = Archive::open(p);
    const size_t big = local.index_of("big");
    std::vector<std::byte> file_bytes = tc_test::read_file(p);
    // Chunk 3 of "big" is found in the file by its bytes; a byte of it is
    // damaged: its read fails, other leaves still read.
    auto leaf = read_all(local, big);
    auto it = std::search(file_bytes.begin(), file_bytes.end(), leaf.begin() + 3 * (64 << 10),
                          leaf.begin() + 3 * (64 << 10) + 4096);
    REQUIRE(it != file_bytes.end());
    auto src = std::make_shared<FileSource>(p);
    src->damage_at = static_cast<uint64_t>(it - file_bytes.begin()) + 100;
    Archive a = Archive::open(src);
    std::vector<std::byte> out(leaf.size());
    try {
      a.read(big, out);
      FAIL("a damaged chunk read without error");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::kChecksumMismatch);
      CHECK(e.file() == src->name());
      CHECK(e.key_path() == "big");
    }
    CHECK(tc_test::same(read_all(a, a.index_of("small_3")), read_all(local, local.index_of("small_3"))));
    CHECK(a.verify().size() == 1);

    // A damaged manifest (a byte of a key path it holds): the open fails as a
    // local open would, with the manifest's checksum.
    const std::string key = "small_17";
    auto at = std::search(file_bytes.begin(), file_bytes.end(), reinterpret_cast<const std::byte*>(key.data()),
                          reinterpret_cast<const std::byte*>(key.data()) + key.size());
    REQUIRE(at != file_bytes.end());
    auto src2 = std::make_shared<FileSource>(p);
    src2->damage_at = static_cast<uint64_t>(at - file_bytes.begin()) + 2;
    try {
      Archive::open(src2);
      FAIL("a damaged manifest opened");
    } catch (const Error& e) {
      CHECK(e.file() == src2->name());
      CHECK(e.code() == ErrorCode::kChecksumMismatch);
    }
  }
}

TEST_CASE("a failing source is an I/O error naming the URL and the key path, never a defect of the file") {
  TempDir dir;
  fs::path p = save_mixed(dir, false, /*pad=*/true);  // "big" outside the open's bytes
  auto src = std::make_shared<FileSource>(p);
  src->fail_after = 0;
  try {
    Archive::open(src);
    FAIL("open through a failing source succeeded");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kIo);
    CHECK(e.file() == src->name());
  }
  auto src2 = std::make_shared<FileSource>(p);
  Archive a = Archive::open(src2);
  src2->fail_after = src2->requests;
  std::vector<std::byte> out(a.leaf(a.index_of("big")).byte_length);
  try {
    a.read(a.index_of("big"), out);
    FAIL("read through a failing source succeeded");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kIo);
    CHECK(e.file() == src2->name());
    CHECK(e.key_path() == "big");
  }
}

TEST_CASE("an archive of this writer opens from its first 256 KiB and last 4 MiB alone") {
  // SPEC.md "Remote reading", writer rule: the blob B-tree (here 1,024 blobs,
  // several leaf pages and a branch page) at the start, the header record and
  // the manifest at the end, so an open needs nothing between them.
  TempDir dir;
  FlatTree t;
  t.add_random("w", DType::kUInt8, {4 << 20}, 7);
  for (int i = 0; i < 300; ++i) t.add_random("b_" + std::to_string(i), DType::kUInt8, {100}, 100 + i);
  SaveOptions opt;
  opt.chunk_size = 4096;
  opt.max_part_bytes = 4096;  // one blob per chunk
  opt.compression = Compression::kNone;
  const fs::path p = dir / "many_blobs.cask";
  save(p, t.treedef(), t.inputs(), opt);
  REQUIRE(fs::file_size(p) > (8u << 20));
  auto src = std::make_shared<FileSource>(p);
  std::vector<std::pair<uint64_t, uint64_t>> outside;  // ranges the open read beyond both ends
  const uint64_t size = src->size(), head = 256 << 10, tail = 4 << 20;
  src->on_range = [&](uint64_t off, uint64_t n) {
    if (!(off + n <= head || off >= size - tail)) outside.emplace_back(off, n);
  };
  Archive a = Archive::open(src);
  CHECK(a.size() == 301);
  CHECK(outside.empty());
  CHECK(src->requests == 1);
  std::vector<std::byte> out(4 << 20);
  a.read(a.index_of("w"), out);
  CHECK(tc_test::same(out, t.data[0]));
}

TEST_CASE("set_url_opener: every URL open of the process goes through the program's own client") {
  TempDir dir;
  fs::path p = save_mixed(dir, false);
  std::vector<std::string> asked;
  set_url_opener([&](const std::string& url) -> std::shared_ptr<const Source> {
    asked.push_back(url);
    return std::make_shared<FileSource>(p);
  });
  Archive local = Archive::open(p);
  {
    Archive remote = Archive::open("mystore://bucket/run/x.cask");
    CHECK(asked == std::vector<std::string>{"mystore://bucket/run/x.cask"});
    for (size_t i = 0; i < local.size(); ++i) CHECK(tc_test::same(read_all(remote, i), read_all(local, i)));
  }
  set_url_opener({});  // the built-in source again: a scheme it does not serve is refused
  CHECK_THROWS_AS(Archive::open("mystore://bucket/run/x.cask"), Error);
  CHECK(asked.size() == 1);
}
