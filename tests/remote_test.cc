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

// A local file served as a range-read source: counts requests (read() calls)
// and bytes, flips one byte at `damage_at` in what it returns, or throws
// Error(kIo) once `fail_after` requests have been served.
class FileSource final : public Source {
 public:
  explicit FileSource(const fs::path& path) : name_("test://" + path.filename().string()) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd_ >= 0);
    size_ = static_cast<uint64_t>(::lseek(fd_, 0, SEEK_END));
  }
  ~FileSource() override { ::close(fd_); }
  const std::string& name() const noexcept override { return name_; }
  uint64_t size() const noexcept override { return size_; }
  void read(std::span<const ReadRange> ranges) const override {
    if (requests.fetch_add(1) >= fail_after)
      throw Error(ErrorCode::kIo, name_, "", "connection reset (injected)");
    for (const ReadRange& r : ranges) {
      REQUIRE(r.offset + r.out.size() <= size_);
      REQUIRE(::pread(fd_, r.out.data(), r.out.size(), static_cast<off_t>(r.offset)) ==
              static_cast<ssize_t>(r.out.size()));
      bytes += r.out.size();
      ranges_read += 1;
      if (on_range) on_range(r.offset, r.out.size());
      if (damage_at >= r.offset && damage_at < r.offset + r.out.size()) r.out[damage_at - r.offset] ^= std::byte{1};
    }
  }
  mutable std::atomic<uint64_t> requests{0}, ranges_read{0}, bytes{0};
  uint64_t damage_at = UINT64_MAX;
  uint64_t fail_after = UINT64_MAX;
  std::function<void(uint64_t, uint64_t)> on_range;  // called for every range read

 private:
  std::string name_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

std::vector<std::byte> read_all(const Archive& a, size_t i) {
  std::vector<std::byte> out(a.leaf(i).byte_length);
  a.read(i, out);
  return out;
}

// A tree with every storage path: multi-chunk raw leaves, several parts,
// LZ4, byte-shuffled LZ4, packed small leaves, a 0-byte leaf.
fs::path save_mixed(const TempDir& dir, bool shuffle) {
  FlatTree t;
  t.add_random("big", DType::kFloat32, {256, 1024}, 1);    // 1 MiB: 16 chunks of 64 KiB, 4 parts
  t.add("zeros", DType::kFloat32, {64, 1024}, tc_test::compressible_bytes(256 << 10, 2));
  for (int i = 0; i < 40; ++i) t.add_random("small_" + std::to_string(i), DType::kInt16, {17, 3}, 10 + i);
  t.add("empty", DType::kFloat32, {0, 4}, {});
  SaveOptions opt;
  opt.chunk_size = 64 << 10;
  opt.max_part_bytes = 256 << 10;
  opt.shuffle = shuffle;
  fs::path p = dir / (shuffle ? "shuffle.cask" : "mixed.cask");
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

TEST_CASE("a remote read fetches only the chunks it needs, coalesced") {
  TempDir dir;
  fs::path p = save_mixed(dir, false);
  auto src = std::make_shared<FileSource>(p);
  Archive a = Archive::open(src);
  const size_t big = a.index_of("big");
  // 100 bytes inside chunk 5: that chunk (64 KiB), with its blob's header
  // (64 KiB before it, within kFetchHeadReach) in the same request.
  src->requests = 0;
  src->bytes = 0;
  std::vector<std::byte> out(100);
  a.read_bytes(big, 5 * (64 << 10) + 10, out);
  CHECK(src->requests == 1);
  CHECK(src->bytes <= 2 * (64 << 10) + 64);
  // The whole 1 MiB leaf: 4 parts, each one coalesced request, header included.
  src->requests = 0;
  src->bytes = 0;
  read_all(a, big);
  CHECK(src->requests <= 4);
  CHECK(src->bytes <= (1 << 20) + 4 * 4096);
  // 40 packed small leaves in one read_many: one request.
  std::vector<size_t> idx;
  std::vector<std::vector<std::byte>> outs;
  std::vector<std::span<std::byte>> spans;
  for (int i = 0; i < 40; ++i) {
    idx.push_back(a.index_of("small_" + std::to_string(i)));
    outs.emplace_back(a.leaf(idx.back()).byte_length);
  }
  for (auto& o : outs) spans.emplace_back(o);
  src->requests = 0;
  a.read_many(idx, spans);
  CHECK(src->requests == 1);
}

TEST_CASE("a damaged remote object is a checksum error or corruption naming the URL and the key path") {
  TempDir dir;
  fs::path p = save_mixed(dir, false);
  Archive local = Archive::open(p);
  const size_t big = local.index_of("big");
  // A byte of chunk 3 of "big": its read fails, other leaves still read.
  auto src = std::make_shared<FileSource>(p);
  Archive a = Archive::open(src);
  // Chunk 3 of "big" is found in the file by its bytes.
  std::vector<std::byte> file_bytes(fs::file_size(p));
  {
    int fd = ::open(p.c_str(), O_RDONLY);
    REQUIRE(::pread(fd, file_bytes.data(), file_bytes.size(), 0) == static_cast<ssize_t>(file_bytes.size()));
    ::close(fd);
  }
  auto leaf = read_all(local, big);
  auto it = std::search(file_bytes.begin(), file_bytes.end(), leaf.begin() + 3 * (64 << 10),
                        leaf.begin() + 3 * (64 << 10) + 4096);
  REQUIRE(it != file_bytes.end());
  src->damage_at = static_cast<uint64_t>(it - file_bytes.begin()) + 100;
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

TEST_CASE("a failing source is an I/O error naming the URL and the key path, never a defect of the file") {
  TempDir dir;
  fs::path p = save_mixed(dir, false);
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
