// Corruption sweeps over a small real archive: every bit of its index pages
// and manifest, one bit of every other byte, every truncation, every page
// swap and duplication, swapped payloads. Each read must give back exactly the
// original bytes or throw a typed treecask::Error: never a signal, never
// wrong data. (SPEC.md "Reader checks"; the model is leveldb's corruption_test.)
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <map>

#include "craft.h"
#include "lmdb/check.h"
#include "lmdb/env.h"
#include "format/manifest.h"

using namespace treecask;
using tc_test::FlatTree;
using tc_test::Sample;
using tc_test::TempDir;
namespace fs = std::filesystem;

namespace {

// Runs the reader over candidate file contents held in an in-memory file, and
// keeps score: how many opens failed with which code, how many leaf reads
// were exact, and any read that returned wrong bytes or threw something else.
class Harness {
 public:
  explicit Harness(const Sample& s) : s_(s) {
    fd_ = memfd_create("treecask-corruption", MFD_CLOEXEC);
    REQUIRE(fd_ >= 0);
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~Harness() { ::close(fd_); }

  // Replaces the whole file with `bytes`. `what` names the damage in failures.
  void run(std::span<const std::byte> bytes, const std::string& what) {
    if (::ftruncate(fd_, 0) != 0 ||
        ::pwrite(fd_, bytes.data(), bytes.size(), 0) != static_cast<ssize_t>(bytes.size()))
      FAIL("cannot write the in-memory file");
    check(what);
  }
  // Flips one bit of the file as it stands, runs the reader, flips it back.
  // `what` is only formatted if the read goes wrong.
  void flip(const std::vector<std::byte>& base, size_t at, int bit) {
    std::byte b = base[at] ^ std::byte(1u << bit);
    if (::pwrite(fd_, &b, 1, static_cast<off_t>(at)) != 1) FAIL("cannot write the in-memory file");
    check({}, at, bit);
    if (::pwrite(fd_, &base[at], 1, static_cast<off_t>(at)) != 1) FAIL("cannot write the in-memory file");
  }

  void report(const std::string& sweep, std::chrono::steady_clock::time_point t0) const {
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::string codes;
    for (auto [c, n] : codes_) codes += " " + std::string(error_code_name(c)) + "=" + std::to_string(n);
    MESSAGE(sweep << ": " << runs_ << " files in " << secs << " s; opened " << opened_
                  << ", exact leaf reads " << exact_ << ", exact read_many " << exact_many_
                  << ", read errors " << read_errors_
                  << "; open errors:" << codes);
  }
  uint64_t wrong_count() const { return wrong_; }
  const std::string& first_wrong() const { return first_wrong_; }
  uint64_t opened() const { return opened_; }
  uint64_t runs() const { return runs_; }

 private:
  void check(const std::string& what, size_t at = 0, int bit = 0) {
    what_ = what;
    at_ = at;
    bit_ = bit;
    ++runs_;
    try {
      Archive a = Archive::open(path_);
      ++opened_;
      if (a.size() != s_.tree.data.size()) return wrong("leaf count changed");
      for (size_t i = 0; i < a.size(); ++i) read_leaf(a, i);
      read_all(a);
    } catch (const Error& e) {
      ++codes_[e.code()];
    } catch (const std::exception& e) {
      wrong(std::string("non-treecask exception: ") + e.what());
    }
  }
  void read_leaf(const Archive& a, size_t i) {
    const auto& want = s_.tree.data[i];
    try {
      LeafInfo info = a.leaf(i);
      if (info.byte_length != want.size()) return wrong("byte length changed");
      out_.assign(want.size(), std::byte{0x5a});
      a.read(i, out_, Verify::kYes);
      if (!tc_test::same(out_, want)) return wrong("read() returned wrong bytes");
      if (info.codec == Codec::kNone) {
        size_t pos = 0;
        for (auto part : a.view_parts(i, Verify::kYes)) {
          if (pos + part.size() > want.size() ||
              (!part.empty() && std::memcmp(part.data(), want.data() + pos, part.size()) != 0))
            return wrong("view_parts() returned wrong bytes");
          pos += part.size();
        }
        if (pos != want.size()) return wrong("view_parts() returned the wrong length");
      }
      ++exact_;
    } catch (const Error&) {
      ++read_errors_;
    }
  }
  // The full-load path: read_many() of every leaf, verified.
  void read_all(const Archive& a) {
    std::vector<size_t> idx(a.size());
    std::vector<std::vector<std::byte>> bufs(a.size());
    std::vector<std::span<std::byte>> outs;
    for (size_t i = 0; i < a.size(); ++i) {
      idx[i] = i;
      bufs[i].assign(s_.tree.data[i].size(), std::byte{0x5a});
      outs.emplace_back(bufs[i]);
    }
    try {
      a.read_many(idx, outs, Verify::kYes, 1);
      for (size_t i = 0; i < a.size(); ++i)
        if (!tc_test::same(bufs[i], s_.tree.data[i])) return wrong("read_many() returned wrong bytes");
      ++exact_many_;
    } catch (const Error&) {
      ++read_errors_;
    }
  }
  void wrong(const std::string& why) {
    if (wrong_++ == 0)
      first_wrong_ = (what_.empty() ? "bit " + std::to_string(bit_) + " of byte " + std::to_string(at_)
                                    : what_) + ": " + why;
  }

  const Sample& s_;
  int fd_ = -1;
  std::string path_;
  std::vector<std::byte> out_;
  std::string what_;
  size_t at_ = 0;
  int bit_ = 0;
  uint64_t runs_ = 0, opened_ = 0, exact_ = 0, exact_many_ = 0, read_errors_ = 0, wrong_ = 0;
  std::map<ErrorCode, uint64_t> codes_;
  std::string first_wrong_;
};

#define CHECK_NEVER_WRONG(h)          \
  do {                                \
    INFO((h).first_wrong());          \
    CHECK((h).wrong_count() == 0u);   \
  } while (0)

// The bytes whose every bit the sweep flips: all that LMDB or treecask
// interpret before the payload -- the meta records, each B-tree page's header,
// node offsets and nodes (keys, named-DB records, in-page values such as the
// header record and a small manifest), the first 64 bytes of each overflow run
// (page header + blob header) -- and the manifest wherever it lies. The free
// gap inside tree pages, meta padding and payload bytes get one bit each.
std::vector<bool> dense_bytes(const Sample& s) {
  std::vector<bool> dense(s.bytes.size());
  auto mark = [&](size_t b, size_t e) {
    for (size_t i = b; i < std::min(e, dense.size()); ++i) dense[i] = true;
  };
  size_t pages = s.bytes.size() / s.page;
  for (size_t p = 0; p < pages; ++p) {
    size_t base = p * s.page;
    const std::byte* h = s.bytes.data() + base;
    uint16_t flags = format::get_u16(h + 10);
    if (p < 2) {
      mark(base, base + lmdb::kPageHeaderSize + 136);  // header + MDB_meta
    } else if (format::get_u64(h) == p && (flags & (lmdb::kPageBranch | lmdb::kPageLeaf))) {
      mark(base, base + format::get_u16(h + 12));                // header + node offsets
      mark(base + format::get_u16(h + 14), base + s.page);       // nodes
    } else if (format::get_u64(h) == p && (flags & lmdb::kPageOverflow)) {
      mark(base, base + 64);
    }
  }
  // The manifest: 4 bytes of root offset, then the "TCMF" identifier.
  size_t hdr = tc_test::find_bytes(s.bytes, std::as_bytes(std::span(format::kMagic)));
  REQUIRE(hdr != SIZE_MAX);
  uint64_t manifest_length = format::get_u64(s.bytes.data() + hdr + 16);
  std::string ident = "TCMF";
  size_t at = tc_test::find_bytes(s.bytes, std::as_bytes(std::span(ident)));
  REQUIRE(at != SIZE_MAX);
  mark(at - 4, at - 4 + manifest_length);
  return dense;
}

}  // namespace

TEST_CASE("bit flips: every bit of the index pages and manifest, one bit of every other byte") {
  Sample s;
  Harness h(s);
  auto t0 = std::chrono::steady_clock::now();
  auto dense = dense_bytes(s);
  size_t n_dense = static_cast<size_t>(std::count(dense.begin(), dense.end(), true));
  MESSAGE("every bit of " << n_dense << " bytes, one bit of " << s.bytes.size() - n_dense);
  h.run(s.bytes, "intact");
  for (size_t i = 0; i < s.bytes.size(); ++i)
    for (int bit = 0; bit < 8; ++bit)
      if (dense[i] || bit == static_cast<int>(i % 8)) h.flip(s.bytes, i, bit);
  h.report("bit flips", t0);
  CHECK_NEVER_WRONG(h);
  CHECK(h.opened() > 0);  // flips in padding and payload leave the file openable
}

TEST_CASE("truncation at every page boundary and at odd offsets") {
  Sample s;
  Harness h(s);
  auto t0 = std::chrono::steady_clock::now();
  std::vector<size_t> cuts;
  for (size_t c = 0; c < s.bytes.size(); c += s.page)
    for (size_t d : {size_t(0), size_t(1), size_t(15), size_t(16), size_t(17), size_t(s.page / 2),
                     size_t(s.page - 1)})
      if (c + d < s.bytes.size()) cuts.push_back(c + d);
  for (size_t c : cuts) h.run(std::span(s.bytes).first(c), "cut at " + std::to_string(c));
  h.report("truncation", t0);
  CHECK_NEVER_WRONG(h);
  CHECK(h.opened() == 0);  // every cut loses pages the archive needs

  // Growing the file (trailing garbage after the last page) is harmless.
  auto longer = s.bytes;
  longer.resize(longer.size() + s.page, std::byte{0xee});
  h.run(longer, "extended");
  CHECK(h.opened() == 1);
  CHECK_NEVER_WRONG(h);
}

TEST_CASE("swapping and duplicating whole pages") {
  Sample s;
  Harness h(s);
  auto t0 = std::chrono::steady_clock::now();
  size_t pages = s.bytes.size() / s.page;
  for (size_t i = 0; i < pages; ++i)
    for (size_t j = 0; j < pages; ++j) {
      if (i == j) continue;
      auto b = s.bytes;
      auto pi = b.begin() + static_cast<ptrdiff_t>(i * s.page);
      auto pj = b.begin() + static_cast<ptrdiff_t>(j * s.page);
      if (i < j) {
        auto c = b;
        std::swap_ranges(pi, pi + s.page, c.begin() + static_cast<ptrdiff_t>(j * s.page));
        std::copy(b.begin() + static_cast<ptrdiff_t>(j * s.page),
                  b.begin() + static_cast<ptrdiff_t>((j + 1) * s.page),
                  c.begin() + static_cast<ptrdiff_t>(i * s.page));
        h.run(c, "swap pages " + std::to_string(i) + " and " + std::to_string(j));
      }
      std::copy(pi, pi + s.page, pj);  // page i duplicated over page j
      h.run(b, "page " + std::to_string(i) + " copied over page " + std::to_string(j));
    }
  // A page zeroed, and a page of 0xff.
  for (size_t i = 0; i < pages; ++i)
    for (std::byte fill : {std::byte{0}, std::byte{0xff}}) {
      auto b = s.bytes;
      std::fill_n(b.begin() + static_cast<ptrdiff_t>(i * s.page), s.page, fill);
      h.run(b, "page " + std::to_string(i) + " filled");
    }
  h.report("page swaps", t0);
  CHECK_NEVER_WRONG(h);
}

TEST_CASE("two leaves' payloads swapped, and a payload replaced by another leaf's") {
  Sample s;
  Harness h(s);
  auto find = [&](size_t leaf) {
    size_t at = tc_test::find_bytes(s.bytes, s.tree.data[leaf]);
    REQUIRE(at != SIZE_MAX);
    return at;
  };
  size_t a = find(0), b = find(2);  // raw/f32 (1200 bytes) and raw/two_chunks (6000 bytes)
  size_t n = s.tree.data[0].size();
  auto swapped = s.bytes;
  std::swap_ranges(swapped.begin() + a, swapped.begin() + a + n, swapped.begin() + b);
  h.run(swapped, "payload prefixes swapped");
  auto copied = s.bytes;
  std::copy_n(s.bytes.begin() + b, n, copied.begin() + a);
  h.run(copied, "payload copied");
  CHECK(h.opened() == 2);  // blob bytes are not part of the structure...
  CHECK_NEVER_WRONG(h);    // ...but the checksums, seeded by place, catch them
  for (const char* name : {"swap.cask", "copy.cask"}) {
    tc_test::write_file(s.dir / name, std::string_view(name) == "swap.cask" ? swapped : copied);
    Archive arc = Archive::open(s.dir / name);
    auto errors = arc.verify();
    CHECK(!errors.empty());
    for (const auto& e : errors) CHECK(e.code() == ErrorCode::kChecksumMismatch);
  }
}
