// Archives of every LMDB page size SPEC.md lets a reader meet (512 to 65536
// bytes), mapped at every alignment the kernel may give (SPEC.md "LMDB
// container", rule S11): each reads back, and a damaged overflow page header
// of a blob or of the manifest is found whatever the page size and wherever
// the map starts.
#include <doctest/doctest.h>
#include <unistd.h>

#include <functional>
#include <string>

#include "craft.h"
#include "pages.h"
#include "testutil.h"

using namespace treecask;
using tc_test::FlatTree;
using tc_test::TempDir;
namespace fs = std::filesystem;

namespace {

constexpr uint32_t kPageSizes[] = {512, 4096, 16384, 65536};

// Where LMDB's map starts in the tests below: wherever the kernel puts it
// (-1), then every 4 KiB step of a 64 KiB page, so that the map's offset
// from a page boundary of the file takes every value it can.
std::vector<long> map_shifts() {
  std::vector<long> s{-1};
  for (long k = 0; k < 16; ++k) s.push_back(k * 4096);
  return s;
}

// Saves `t` to `p` with LMDB pages of `page` bytes.
void save_paged(FlatTree& t, const fs::path& p, uint32_t page, SaveOptions opt = {}) {
  opt.overwrite = true;
  opt.durable = false;
  if (page == 65536) {  // beyond LMDB 0.9's MAX_PAGESIZE: 32 KiB pages, doubled
    {
      tc_test::OsPageSize os(32768);
      t.save(p, opt);
    }
    tc_test::write_file(p, tc_test::double_pages(tc_test::read_file(p)));
  } else {
    tc_test::OsPageSize os(page);
    t.save(p, opt);
  }
  REQUIRE(tc_test::page_size_of(tc_test::read_file(p)) == page);
}

// Opens `p` with LMDB's map placed `shift` bytes past a 2 MiB boundary.
Archive open_at(const fs::path& p, long shift, OpenOptions o = {}) {
  tc_test::MapShift at(shift);
  const long placed = tc_pages_maps_placed();
  Archive a = Archive::open(p, o);
  if (shift >= 0) REQUIRE(tc_pages_maps_placed() == placed + 1);  // the shift applied
  return a;
}

void check_all_leaves(const Archive& a, const FlatTree& t) {
  REQUIRE(a.size() == t.data.size());
  for (size_t i = 0; i < a.size(); ++i) {
    std::vector<std::byte> out(t.data[i].size());
    a.read(i, out, Verify::kYes);
    CHECK(tc_test::same(out, t.data[i]));
  }
  CHECK(a.verify().empty());
}

// A small archive (under 2 MiB): a raw leaf with a blob of its own, an LZ4
// leaf and a small packed one.
void small_tree(FlatTree& t) {
  t.add_random("a", DType::kFloat32, {32768}, 1);  // 128 KiB
  t.add("b", DType::kInt32, {4096}, tc_test::compressible_bytes(16384, 2));
  t.leaves.back().compression = Compression::kLZ4;
  t.add_random("c", DType::kUInt8, {100}, 3);
}

// A large archive (over 2 MiB): raw leaves in several blobs of many pages,
// and enough leaves that the manifest takes an overflow run at every page
// size.
void large_tree(FlatTree& t) {
  t.add_random("a", DType::kFloat32, {262144}, 1);  // 1 MiB
  t.add_random("b", DType::kFloat32, {262144}, 2);
  t.add_random("c", DType::kUInt8, {700000}, 3);
  for (int i = 0; i < 600; ++i) t.add_random("t/" + std::to_string(1000 + i), DType::kUInt8, {8}, 100 + i);
}

// The file offset of blob 0's header (the 48 bytes after its overflow page
// header), and the index of a raw leaf whose bytes start its payload.
std::pair<size_t, size_t> blob_zero(const std::vector<std::byte>& file, const FlatTree& t, uint32_t page) {
  const auto magic = std::as_bytes(std::span(format::kBlobMagic));
  for (size_t from = 0;;) {
    const size_t hit = tc_test::find_bytes(std::span(file).subspan(from), magic);
    REQUIRE(hit != SIZE_MAX);
    const size_t at = from + hit;
    from = at + 1;
    if (at < 16 || (at - 16) % page != 0 || format::get_u32(file.data() + at + 8) != 0) continue;
    for (size_t i = 0; i < t.data.size(); ++i) {
      if (t.data[i].size() < 64) continue;
      if (std::memcmp(file.data() + at + 48, t.data[i].data(), 64) == 0) return {at, i};
    }
    FAIL("blob 0 does not start with a raw leaf");
  }
}

// Damages of an overflow run's first page header (SPEC.md S11).
struct Damage {
  const char* name;
  std::function<void(std::byte*)> apply;  // given the page header
};
const Damage kDamages[] = {
    {"mp_flags = 0", [](std::byte* h) { std::memset(h + 10, 0, 2); }},
    {"wrong mp_pgno", [](std::byte* h) { h[0] ^= std::byte{0x01}; }},
    {"mp_pages = 0", [](std::byte* h) { std::memset(h + 12, 0, 4); }},
};

void expect_overflow_error(const std::function<void()>& f, const std::string& key) {
  auto e = tc_test::expect_error(ErrorCode::kCorruption, f);
  CHECK(e.key_path() == key);
  CHECK(std::string(e.what()).find("LMDB overflow page") != std::string::npos);
}

// Every read path of leaf `li`, in blob 0, fails on blob 0's damaged page
// header, at every map alignment; the other leaves still read.
void check_blob_damage(const fs::path& good, const FlatTree& t, uint32_t page, const TempDir& dir) {
  const auto bytes = tc_test::read_file(good);
  const auto [header, li] = blob_zero(bytes, t, page);
  const std::string key = t.keys[li];
  for (const Damage& d : kDamages) {
    CAPTURE(std::string(d.name));
    auto damaged = bytes;
    d.apply(damaged.data() + header - 16);
    const auto p = dir / "bad_blob.cask";
    tc_test::write_file(p, damaged);
    for (long shift : map_shifts()) {
      CAPTURE(shift);
      Archive a = open_at(p, shift);
      std::vector<std::byte> out(t.data[li].size());
      const std::vector<size_t> one{li};
      const std::vector<std::span<std::byte>> outs{std::span(out)};
      const std::vector<int64_t> start{0}, stop{static_cast<int64_t>(t.data[li].size() / 4)};
      expect_overflow_error([&] { (void)a.view_parts(li, Verify::kNo); }, key);
      if (a.leaf(li).num_parts == 1) expect_overflow_error([&] { (void)a.view(li); }, key);
      expect_overflow_error([&] { a.read(li, out); }, key);
      expect_overflow_error([&] { a.read(li, out, Verify::kNo); }, key);
      expect_overflow_error([&] { a.read_many(one, outs); }, key);
      expect_overflow_error([&] { a.read_slice(li, start, stop, out); }, key);
      bool reported = false;  // verify(): one error per leaf in blob 0, `key` among them
      for (const Error& e : a.verify()) {
        CHECK(e.code() == ErrorCode::kCorruption);
        CHECK(std::string(e.what()).find("blob 0: LMDB overflow page") != std::string::npos);
        reported = reported || e.key_path() == key;
      }
      CHECK(reported);
      for (size_t i = 0; i < t.data.size(); i += (i < 4 ? 1 : 97)) {  // others: some of them
        if (i == li) continue;
        std::vector<std::byte> o(t.data[i].size());
        try {
          a.read(i, o);
          CHECK(tc_test::same(o, t.data[i]));
        } catch (const Error& e) {  // a leaf packed into blob 0 with `li`
          CHECK(std::string(e.what()).find("blob 0: LMDB overflow page") != std::string::npos);
        }
      }
    }
    OpenOptions trusted;
    trusted.validate_structure = false;  // no walk: S11 is not checked (SPEC.md)
    Archive a = Archive::open(p, trusted);
    std::vector<std::byte> out(t.data[li].size());
    a.read(li, out);
    CHECK(tc_test::same(out, t.data[li]));
  }
}

// A damaged page header of the manifest's overflow run fails open, at every
// map alignment.
void check_manifest_damage(const fs::path& good, uint32_t page, const TempDir& dir) {
  const auto bytes = tc_test::read_file(good);
  const size_t tcmf = tc_test::find_bytes(bytes, std::as_bytes(std::span("TCMF", 4)));
  REQUIRE(tcmf != SIZE_MAX);
  const size_t head = tcmf - 4 - 16;  // root offset, then the identifier
  REQUIRE(head % page == 0);          // the manifest starts an overflow run
  REQUIRE(format::get_u16(bytes.data() + head + 10) == lmdb::kPageOverflow);
  for (const Damage& d : kDamages) {
    CAPTURE(std::string(d.name));
    auto damaged = bytes;
    d.apply(damaged.data() + head);
    const auto p = dir / "bad_manifest.cask";
    tc_test::write_file(p, damaged);
    for (long shift : map_shifts()) {
      CAPTURE(shift);
      auto e = tc_test::expect_error(ErrorCode::kCorruption, [&] { (void)open_at(p, shift); });
      CHECK(std::string(e.what()).find("manifest: LMDB overflow page") != std::string::npos);
      CHECK(e.file() == p.string());
    }
  }
}

// One archive of the page-size matrix in dir/good.cask: the large tree (over
// 2 MiB, 64 KiB chunks) or the small one (16 KiB chunks), with `page`-byte pages.
fs::path save_case(const TempDir& dir, FlatTree& t, uint32_t page, bool large) {
  large ? large_tree(t) : small_tree(t);
  SaveOptions opt;
  opt.chunk_size = large ? 65536 : 16384;
  auto p = dir / "good.cask";
  save_paged(t, p, page, opt);
  return p;
}

}  // namespace

TEST_CASE("double_pages gives an archive of twice the page size with the same leaves") {
  TempDir dir;
  FlatTree t;
  small_tree(t);
  auto p = dir / "p.cask";
  save_paged(t, p, 16384);
  tc_test::write_file(p, tc_test::double_pages(tc_test::read_file(p)));
  CHECK(tc_test::page_size_of(tc_test::read_file(p)) == 32768);
  check_all_leaves(Archive::open(p), t);
}

TEST_CASE("archives of every LMDB page size read back at every map alignment") {
  for (uint32_t page : kPageSizes) {
    for (bool large : {false, true}) {
      CAPTURE(page);
      CAPTURE(large);
      TempDir dir;
      FlatTree t;
      auto p = save_case(dir, t, page, large);
      if (large) CHECK(fs::file_size(p) > (2u << 20));
      for (long shift : map_shifts()) {
        CAPTURE(shift);
        check_all_leaves(open_at(p, shift), t);
      }
    }
  }
}

// SPEC.md S11 whatever the page size: a damaged overflow page header of blob
// 0 fails every read of a leaf in that blob, and one of the manifest fails
// open, wherever the map starts (before, pages larger than the OS page hid
// the damage from reads whenever the map did not start on a page boundary).
TEST_CASE("a damaged overflow page header is found at every page size and map alignment") {
  for (uint32_t page : kPageSizes) {
    for (bool large : {false, true}) {
      CAPTURE(page);
      CAPTURE(large);
      TempDir dir;
      FlatTree t;
      auto p = save_case(dir, t, page, large);
      check_blob_damage(p, t, page, dir);
      if (large || page == 512) check_manifest_damage(p, page, dir);
    }
  }
}

// Where the map base cannot be found, an open that must check S11 fails
// (kIo, naming the file) instead of skipping the check; one that need not
// (structure validation off) opens and reads through the map. A map the OS
// lists no file behind gives no base for pages larger than the OS page; for
// pages up to the OS page the base comes from the map's own bytes.
TEST_CASE("without a map base, an open that must check S11 fails instead of skipping it") {
  for (uint32_t page : kPageSizes) {
    CAPTURE(page);
    TempDir dir;
    FlatTree t;
    small_tree(t);
    auto p = dir / "good.cask";
    save_paged(t, p, page);
    tc_test::MapCopy copy;
    const long placed = tc_pages_maps_placed();
    if (page <= static_cast<uint32_t>(::sysconf(_SC_PAGESIZE))) {
      check_all_leaves(Archive::open(p), t);
    } else {
      auto e = tc_test::expect_error(ErrorCode::kIo, [&] { (void)Archive::open(p); });
      CHECK(std::string(e.what()).find("S11") != std::string::npos);
      CHECK(e.file() == p.string());
    }
    OpenOptions trusted;
    trusted.validate_structure = false;
    check_all_leaves(Archive::open(p, trusted), t);
    CHECK(tc_pages_maps_placed() == placed + 2);  // both opens saw the copy
  }
}
