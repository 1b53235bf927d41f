// The pre-open LMDB checks (src/lmdb_check.{h,cc}): the walk accepts a real
// archive and reads only index pages; damaged B-tree pages and meta records
// are corruption errors before LMDB sees the file. (The sweeps over every bit,
// truncation and page swap are in corruption_test.cc.)
#include <fcntl.h>
#include <unistd.h>

#include <functional>

#include "craft.h"
#include "lmdb/check.h"

using namespace treecask;
using tc_test::Sample;

TEST_CASE("the structure check walks every database of a real archive and accepts it") {
  Sample s;
  int fd = ::open(s.path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  lmdb::MetaInfo meta;
  bool not_lmdb;
  REQUIRE(lmdb::check_meta_pages(fd, s.bytes.size(), &meta, &not_lmdb).empty());
  lmdb::StructureStats st;
  CHECK(lmdb::check_structure(fd, s.bytes.size(), meta, &st) == "");
  ::close(fd);
  CHECK(st.named_dbs == 2);
  CHECK(st.tree_pages >= 3);
  CHECK(st.overflow_runs >= 2);  // the manifest or the blobs live in overflow pages
  // Only headers are read: never more pages than the tree plus one per run.
  CHECK(st.pages_read == st.tree_pages + st.overflow_runs);
  MESSAGE("sample archive: " << s.bytes.size() << " bytes, " << st.tree_pages << " tree pages, "
                             << st.overflow_runs << " overflow runs of " << st.overflow_pages
                             << " pages");

  // The option skips the walk for trusted files; the archive reads the same.
  OpenOptions trusted;
  trusted.validate_structure = false;
  Archive a = Archive::open(s.path, trusted);
  std::vector<std::byte> out(s.tree.data[0].size());
  a.read(0, out);
  CHECK(tc_test::same(out, s.tree.data[0]));
}

TEST_CASE("damaged B-tree pages are corruption errors before LMDB sees them") {
  Sample s;
  auto corrupt = [&](const std::function<void(std::vector<std::byte>&)>& edit) {
    auto b = s.bytes;
    edit(b);
    auto p = s.dir / "damaged.cask";
    tc_test::write_file(p, b);
    auto e = tc_test::expect_error(ErrorCode::kCorruption, [&] { Archive::open(p); });
    CHECK(e.message().find("LMDB") != std::string::npos);
    return e;
  };
  size_t pages = s.bytes.size() / s.page;
  std::vector<size_t> leaves;
  for (size_t p = 2; p < pages; ++p)
    if (format::get_u64(s.bytes.data() + p * s.page) == p &&
        (format::get_u16(s.bytes.data() + p * s.page + 10) & lmdb::kPageLeaf))
      leaves.push_back(p);
  REQUIRE(leaves.size() >= 3);
  for (size_t p : leaves) {
    std::byte* base = nullptr;
    INFO("leaf page " << p);
    // A node offset that points past the page.
    corrupt([&](auto& b) { base = b.data() + p * s.page; format::put_u16(base + 16, 0xfff0); });
    // A key size that runs past the page.
    corrupt([&](auto& b) {
      base = b.data() + p * s.page;
      format::put_u16(base + format::get_u16(base + 16) + 6, 0x7fff);
    });
    // Upper bound beyond the page.
    corrupt([&](auto& b) { base = b.data() + p * s.page; format::put_u16(base + 14, 0xffff); });
    // A page that says it is another page.
    corrupt([&](auto& b) { base = b.data() + p * s.page; format::put_u64(base, p + 1); });
    // A leaf that turns into a branch page.
    corrupt([&](auto& b) { base = b.data() + p * s.page; format::put_u16(base + 10, lmdb::kPageBranch); });
  }
  // The main DB's root pointing at a meta page, at itself through a named DB, past the end.
  for (uint64_t root : {uint64_t{0}, uint64_t{1}, uint64_t{pages}, uint64_t{1} << 50}) {
    INFO("main root " << root);
    corrupt([&](auto& b) {
      for (int m = 0; m < 2; ++m) format::put_u64(b.data() + m * s.page + 16 + 72 + 40, root);
    });
  }
}
