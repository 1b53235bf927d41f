// save_async(): the snapshot survives the caller's memory, borrowed leaves are
// not copied, errors come through the future, a dropped future waits.
#include <future>

#include "testutil.h"

using namespace treecask;
using tc_test::expect_error;
using tc_test::FlatTree;
using tc_test::TempDir;

namespace {

// A tree with a leaf larger than one 8 MiB copy piece, a packed small leaf,
// an LZ4 leaf and an empty leaf.
FlatTree make_tree(uint32_t seed) {
  FlatTree t;
  t.add_random("big", DType::kFloat32, {5, 1 << 20}, seed);  // 20 MiB: 3 copy pieces
  t.add_random("small", DType::kInt16, {7, 3}, seed + 1);
  t.add("zip", DType::kUInt8, {300000}, tc_test::compressible_bytes(300000, seed + 2));
  t.add("empty", DType::kFloat64, {0, 4}, {});
  return t;
}

void check_archive(const std::filesystem::path& p, const std::vector<std::vector<std::byte>>& want) {
  Archive a = Archive::open(p);
  REQUIRE(a.size() == want.size());
  CHECK(a.verify().empty());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(a.leaf(i).key_path);
    std::vector<std::byte> got(a.leaf(i).byte_length);
    a.read(i, got);
    CHECK(tc_test::same(got, want[i]));
  }
}

}  // namespace

TEST_CASE("save_async copies the leaves before returning: the caller may overwrite and free them") {
  TempDir dir;
  auto path = dir / "a.cask";
  std::future<SaveStats> done;
  std::vector<std::vector<std::byte>> want;
  {
    FlatTree t = make_tree(7);
    want = t.data;  // what the archive must hold
    auto in = t.inputs();
    SaveOptions opt;
    opt.threads = 2;
    done = save_async(path, t.treedef(), in, opt);
    for (auto& d : t.data) std::fill(d.begin(), d.end(), std::byte{0xAB});  // overwritten...
  }                                                                         // ...and freed
  SaveStats st = done.get();
  CHECK(st.num_leaves == 4);
  CHECK(st.raw_bytes == (uint64_t{20} << 20) + 42 + 300000);
  check_archive(path, want);
}

TEST_CASE("save_async borrows only the leaves marked borrowed") {
  TempDir dir;
  auto path = dir / "b.cask";
  FlatTree t = make_tree(11);
  std::vector<std::vector<std::byte>> want = t.data;
  auto in = t.inputs();
  const bool borrowed[] = {true, false, false, true};  // "big" and "empty" stay the caller's
  auto done = save_async(path, t.treedef(), in, {}, borrowed);
  std::fill(t.data[1].begin(), t.data[1].end(), std::byte{0});  // copied: may change now
  std::fill(t.data[2].begin(), t.data[2].end(), std::byte{0});
  done.get();  // t.data[0] (borrowed) stayed alive and unchanged until here
  check_archive(path, want);
}

TEST_CASE("save_async delivers save()'s errors through the future") {
  TempDir dir;
  FlatTree t = make_tree(3);
  auto in = t.inputs();
  auto path = dir / "c.cask";
  save_async(path, t.treedef(), in).get();

  auto again = save_async(path, t.treedef(), in);  // exists, no overwrite
  Error e = expect_error(ErrorCode::kAlreadyExists, [&] { again.get(); });
  CHECK(e.file() == path.string());

  auto bad = in;
  bad[1].data = bad[1].data.first(3);  // wrong byte length
  auto invalid = save_async(dir / "d.cask", t.treedef(), bad);
  Error e2 = expect_error(ErrorCode::kInvalidArgument, [&] { invalid.get(); });
  CHECK(e2.key_path() == "small");
  CHECK_FALSE(std::filesystem::exists(dir / "d.cask"));

  auto missing_dir = save_async(dir / "no" / "such" / "e.cask", t.treedef(), in);
  expect_error(ErrorCode::kNotFound, [&] { missing_dir.get(); });

  const bool two[] = {true, false};  // not one per leaf: refused at once
  expect_error(ErrorCode::kInvalidArgument, [&] { (void)save_async(dir / "f.cask", t.treedef(), in, {}, two); });
  // Nothing but the one good archive was left behind (no temporary files).
  size_t entries = 0;
  for ([[maybe_unused]] auto& ent : std::filesystem::directory_iterator(dir.path)) ++entries;
  CHECK(entries == 1);
}

TEST_CASE("a dropped save_async future waits for the save") {
  TempDir dir;
  auto path = dir / "g.cask";
  {
    FlatTree t = make_tree(5);
    auto in = t.inputs();
    auto f = save_async(path, t.treedef(), in);
  }  // the future's destructor returned only once the archive was in place
  CHECK(std::filesystem::exists(path));
  CHECK(Archive::open(path).verify().empty());
}

TEST_CASE("a SnapshotPool keeps one snapshot buffer between saves and reuses it") {
  TempDir dir;
  SnapshotPool pool;
  CHECK(pool.held_bytes() == 0);
  FlatTree t = make_tree(21);
  const uint64_t need = (uint64_t{20} << 20) + 64 + 300032;  // the copied leaves, 64-aligned
  for (int step = 0; step < 3; ++step) {
    for (auto& d : t.data) std::fill(d.begin(), d.end(), std::byte(step + 1));
    std::vector<std::vector<std::byte>> want = t.data;
    auto in = t.inputs();
    auto path = dir / ("p" + std::to_string(step) + ".cask");
    auto done = save_async(path, t.treedef(), in, {}, {}, &pool);
    for (auto& d : t.data) std::fill(d.begin(), d.end(), std::byte{0xEE});
    done.get();
    CHECK(pool.held_bytes() >= need);  // given back, not unmapped
    check_archive(path, want);         // the reused buffer held this step's bytes only
  }
  FlatTree bigger = make_tree(22);
  bigger.add_random("more", DType::kUInt8, {4 << 20}, 23);
  auto in = bigger.inputs();
  save_async(dir / "bigger.cask", bigger.treedef(), in, {}, {}, &pool).get();  // replaces the buffer
  CHECK(pool.held_bytes() >= need + (4 << 20));
  check_archive(dir / "bigger.cask", bigger.data);
  pool.clear();
  CHECK(pool.held_bytes() == 0);
}
