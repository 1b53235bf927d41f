// Reader behaviour: alignment, concurrency, read-only files, one-file commits.
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "testutil.h"

using namespace treecask;
using tc_test::FlatTree;
using tc_test::TempDir;
namespace fs = std::filesystem;

TEST_CASE("every zero-copy view is 64-byte aligned, small packed leaves included") {
  TempDir dir;
  FlatTree t;
  uint32_t seed = 100;
  for (int n : {1, 2, 3, 63, 64, 65, 100, 1000, 4095, 4097, 65536, 65537, 200000})
    for (DType d : {DType::kUInt8, DType::kFloat32, DType::kComplex128})
      t.add_random(std::string(dtype_name(d)) + "_" + std::to_string(n), d, {n}, seed++);
  SaveOptions opt;
  opt.compression = Compression::kNone;
  t.save(dir / "align.cask", opt);
  Archive a = Archive::open(dir / "align.cask");
  for (size_t i = 0; i < a.size(); ++i) {
    auto v = a.view(i);
    INFO(a.leaf(i).key_path);
    CHECK(reinterpret_cast<uintptr_t>(v.data()) % 64 == 0);
    CHECK(tc_test::same(v, t.data[i]));
  }
}

TEST_CASE("10,000 small leaves pack into few blobs and each stays a view") {
  TempDir dir;
  FlatTree t;
  for (int i = 0; i < 10000; ++i) t.add_random("layer" + std::to_string(i), DType::kFloat32, {i % 50 + 1}, i);
  SaveOptions opt;
  opt.compression = Compression::kNone;
  auto stats = t.save(dir / "many.cask", opt);
  CHECK(stats.num_blobs <= 2);
  Archive a = Archive::open(dir / "many.cask");
  CHECK(a.size() == 10000);
  for (size_t i = 0; i < a.size(); i += 97) CHECK(tc_test::same(a.view(a.index_of(t.keys[i])), t.data[i]));
}

TEST_CASE("many threads read and verify one archive at once") {
  TempDir dir;
  FlatTree t;
  for (int i = 0; i < 16; ++i) t.add_random("w" + std::to_string(i), DType::kFloat32, {50000}, i);
  t.add("z", DType::kInt32, {300000}, tc_test::compressible_bytes(1200000, 3));
  t.save(dir / "mt.cask");
  Archive a = Archive::open(dir / "mt.cask");
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int k = 0; k < 8; ++k)
    threads.emplace_back([&, k] {
      for (int rep = 0; rep < 20; ++rep) {
        size_t i = (k * 7 + rep) % a.size();
        std::vector<std::byte> out(a.leaf(i).byte_length);
        a.read(i, out);
        if (!tc_test::same(out, t.data[i])) ++bad;
        if (rep % 5 == 0 && !a.verify().empty()) ++bad;
      }
    });
  for (auto& th : threads) th.join();
  CHECK(bad == 0);
}

TEST_CASE("several processes map the same archive") {
  TempDir dir;
  FlatTree t;
  t.add_random("w", DType::kFloat32, {100000}, 1);
  t.save(dir / "shared.cask");
  std::vector<pid_t> kids;
  for (int k = 0; k < 4; ++k) {
    pid_t pid = fork();
    if (pid == 0) {
      try {
        Archive a = Archive::open(dir / "shared.cask");
        _exit(tc_test::same(a.view(0, Verify::kYes), t.data[0]) ? 0 : 1);
      } catch (...) {
        _exit(2);
      }
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
}

TEST_CASE("an archive opens from a read-only file in a read-only directory") {
  TempDir dir;
  FlatTree t;
  t.add_random("w", DType::kFloat64, {1000}, 2);
  auto path = dir / "ro.cask";
  t.save(path);
  fs::permissions(path, fs::perms::owner_read);
  fs::permissions(dir.path, fs::perms::owner_read | fs::perms::owner_exec);
  Archive a = Archive::open(path);
  CHECK(tc_test::same(a.view(0), t.data[0]));
  CHECK(a.verify().empty());
  fs::permissions(dir.path, fs::perms::owner_all);
}

TEST_CASE("a save leaves exactly one file: no lock, no temporary") {
  TempDir dir;
  FlatTree t;
  t.add_random("w", DType::kFloat32, {1000}, 3);
  t.save(dir / "one.cask");
  Archive::open(dir / "one.cask");  // opening must not create anything either
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path)) names.push_back(e.path().filename());
  CHECK(names == std::vector<std::string>{"one.cask"});
}

TEST_CASE("save refuses to replace a file unless asked, and replaces it atomically") {
  TempDir dir;
  FlatTree t1, t2;
  t1.add_random("a", DType::kFloat32, {10}, 1);
  t2.add_random("b", DType::kFloat32, {20}, 2);
  auto path = dir / "x.cask";
  t1.save(path);
  tc_test::expect_error(ErrorCode::kAlreadyExists, [&] { t2.save(path); });
  CHECK(Archive::open(path).leaf(0).key_path == "a");
  Archive old = Archive::open(path);  // a reader holding the old version
  SaveOptions opt;
  opt.overwrite = true;
  t2.save(path, opt);
  CHECK(Archive::open(path).leaf(0).key_path == "b");
  CHECK(tc_test::same(old.view(0), t1.data[0]));  // the old mapping is intact
}

TEST_CASE("the next save removes a temporary file left by a dead process") {
  TempDir dir;
  auto path = dir / "x.cask";
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  waitpid(pid, nullptr, 0);  // a pid that no longer runs
  auto stale = dir / ("x.cask.tmp." + std::to_string(pid) + ".deadbeef");
  tc_test::write_file(stale, tc_test::random_bytes(100, 1));
  auto live = dir / ("x.cask.tmp." + std::to_string(getpid()) + ".0badf00d");
  tc_test::write_file(live, tc_test::random_bytes(100, 1));
  FlatTree t;
  t.add_random("a", DType::kFloat32, {10}, 1);
  t.save(path);
  CHECK(!fs::exists(stale));
  CHECK(fs::exists(live));  // a running process's temporary is left alone
}

TEST_CASE("progress reports bytes done out of the total") {
  TempDir dir;
  FlatTree t;
  t.add_random("a", DType::kFloat32, {100000}, 1);
  t.add_random("b", DType::kFloat32, {10}, 2);
  uint64_t last = 0, total = 0;
  SaveOptions opt;
  opt.progress = [&](uint64_t d, uint64_t n) {
    CHECK(d >= last);
    last = d;
    total = n;
  };
  t.save(dir / "p.cask", opt);
  CHECK(total == 400040);
  CHECK(last == total);
}

TEST_CASE("view_many: views of the raw one-part leaves, none for the others, a damaged chunk refused") {
  TempDir dir;
  FlatTree t;
  t.add_random("raw_big", DType::kFloat32, {40000}, 1);       // three 64 KiB chunks
  t.add_random("raw_small", DType::kUInt8, {100}, 2);         // packed with other small leaves
  t.add("raw_empty", DType::kFloat32, {0}, {});
  t.add("lz4", DType::kInt32, {30000}, tc_test::compressible_bytes(120000, 3));
  t.add_random("parts", DType::kUInt8, {300000}, 4);          // > max_part_bytes: two parts
  SaveOptions opt;
  opt.compression = Compression::kAuto;
  opt.chunk_size = 65536;
  opt.max_part_bytes = 196608;
  t.save(dir / "vm.cask", opt);
  Archive a = Archive::open(dir / "vm.cask");
  std::vector<size_t> all(a.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  auto views = a.view_many(all, Verify::kYes);
  REQUIRE(views.size() == a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    LeafInfo info = a.leaf(i);
    INFO(info.key_path);
    bool viewable = info.codec == Codec::kNone && info.num_parts <= 1;
    REQUIRE(views[i].has_value() == viewable);
    if (!viewable) continue;
    CHECK(tc_test::same(*views[i], t.data[a.index_of(info.key_path)]));
    CHECK(views[i]->data() == a.view(i).data());  // the map itself, not a copy
  }
  CHECK(a.leaf(a.index_of("lz4")).codec == Codec::kLZ4);
  CHECK(a.leaf(a.index_of("parts")).num_parts == 2);

  // One flipped byte in raw_big's last chunk (found by its last 10 bytes): refused, naming the leaf.
  size_t big = a.index_of("raw_big");
  auto v = a.view(big, Verify::kNo);
  std::vector<std::byte> bytes = tc_test::read_file(dir / "vm.cask");
  std::vector<std::byte> last(v.end() - 10, v.end());
  auto at = std::search(bytes.begin(), bytes.end(), last.begin(), last.end());
  REQUIRE(at != bytes.end());
  *at ^= std::byte{1};
  tc_test::write_file(dir / "bad.cask", bytes);
  Archive b = Archive::open(dir / "bad.cask");
  Error e = tc_test::expect_error(ErrorCode::kChecksumMismatch, [&] { b.view_many(all); });
  CHECK(e.key_path() == "raw_big");
  CHECK(b.view_many(all, Verify::kNo).size() == all.size());  // unverified: no check
}

TEST_CASE("LeafInfo::zero_copy: a view of whole-byte elements; packed, LZ4 and several-part leaves are not") {
  TempDir dir;
  FlatTree t;
  t.add_random("f32", DType::kFloat32, {1000}, 1);            // raw, one part: viewed
  t.add_random("int4", DType::kInt4, {1000}, 2);              // raw, one part, packed: has a view, no array view
  t.add("empty", DType::kBFloat16, {0}, {});                  // 0 bytes: an empty view
  t.add("lz4", DType::kInt32, {30000}, tc_test::compressible_bytes(120000, 3));
  t.add_random("parts", DType::kUInt8, {300000}, 4);          // > max_part_bytes: two parts
  SaveOptions opt;
  opt.compression = Compression::kAuto;
  opt.chunk_size = 65536;
  opt.max_part_bytes = 196608;
  t.save(dir / "zc.cask", opt);
  Archive a = Archive::open(dir / "zc.cask");
  auto info = [&](const char* key) { return a.leaf(a.index_of(key)); };
  CHECK((info("f32").has_view && info("f32").zero_copy()));
  CHECK((info("empty").has_view && info("empty").zero_copy()));
  CHECK((info("int4").has_view && !info("int4").zero_copy()));
  CHECK((!info("lz4").has_view && !info("lz4").zero_copy()));
  CHECK((!info("parts").has_view && !info("parts").zero_copy()));
  for (DType d : {DType::kInt2, DType::kUInt4, DType::kFloat4E2M1FN, DType::kFloat6E3M2FN}) {
    LeafInfo li;
    li.has_view = true;
    li.dtype = d;
    CHECK_FALSE(li.zero_copy());
  }
}

namespace {
// Fills 256 KiB of this thread's stack below the caller's frame with what a
// finished checksum stream leaves behind: every 64-byte block holds `seed`
// at the word where XXH3_state_t keeps its seed (byte 552 of the state,
// word 5 of a 64-byte block) and zero where it keeps its external-secret
// pointer (byte 568, word 7), and junk everywhere else. A reader's 64-byte
// aligned stream state placed anywhere in that memory then sees its own
// seed in the seed field before it is reset.
[[gnu::noinline]] void leave_stale_hash_state_on_stack(uint64_t seed) {
  alignas(64) volatile uint64_t junk[32768];
  for (size_t i = 0; i < 32768; ++i) junk[i] = i % 8 == 5 ? seed : i % 8 == 7 ? 0 : 0x5a5a5a5a5a5a5a5aull + i;
  (void)junk[0];
}
}  // namespace

TEST_CASE("a checked read is right whatever the stack held before it (the checksum stream starts clean)") {
  TempDir dir;
  FlatTree t;
  t.add_random("a", DType::kFloat32, {3000}, 1);  // 3 chunks of 4096 bytes
  t.add_random("b", DType::kFloat32, {3000}, 2);
  SaveOptions opt;
  opt.compression = Compression::kNone;
  opt.chunk_size = 4096;
  t.save(dir / "s.cask", opt);
  Archive a = Archive::open(dir / "s.cask");
  std::vector<std::byte> out(t.data[1].size());
  for (uint64_t ci = 0; ci < 3; ++ci) {
    leave_stale_hash_state_on_stack((uint64_t{1} << 32) | ci);  // leaf 1's chunk seed (SPEC.md)
    CHECK_NOTHROW(a.read(1, out, Verify::kYes));
    CHECK(tc_test::same(out, t.data[1]));
    leave_stale_hash_state_on_stack((uint64_t{1} << 32) | ci);
    std::vector<std::byte> part(5000);
    CHECK_NOTHROW(a.read_bytes(1, 3000, part, Verify::kYes));
    CHECK(tc_test::same(part, std::span(t.data[1]).subspan(3000, 5000)));
  }
}
