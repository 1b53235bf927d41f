// Concurrent readers and a writer that keeps replacing the archive under the
// same name (save with overwrite): every Archive a reader opens holds exactly
// one complete version -- every leaf it reads carries the same version number
// as the archive's "version" leaf and equals that version's bytes -- and an
// Archive opened before a replacement keeps reading its own version.
//
// Test names containing "threads" are the multi-threaded ones, which
// ThreadSanitizer runs (docs/robustness.md):
//   treecask_tests -ts=concurrency -tc='*threads*'
// TREECASK_CONCURRENCY_VERSIONS (default 120) sets how many versions the
// writer saves.
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "robust_util.h"
#include "testutil.h"

using namespace treecask;
using tc_test::TempDir;
namespace fs = std::filesystem;

namespace {

using tc_robust::env_int;

constexpr int kScale = 1;  // ~0.9 MiB of leaves per version

// Shared between processes (MAP_SHARED) or threads.
struct Board {
  std::atomic<int> stop{0};
  std::atomic<uint64_t> latest{0};     // last version the writer finished
  std::atomic<long> opens{0};          // archives opened and checked
  std::atomic<long> stale_reads{0};    // checks of an Archive opened before a replacement
  std::atomic<long> errors{0};
  std::atomic<uint64_t> max_seen{0};
  std::atomic<uint64_t> distinct{0};   // version changes observed by readers
  char first_error[1024] = {};
  std::atomic<int> error_lock{0};

  void fail(const std::string& what) {
    if (errors.fetch_add(1) == 0) {
      std::snprintf(first_error, sizeof first_error, "%s", what.c_str());
      error_lock.store(1);
    }
  }
};

Board* shared_board() {
  void* p = mmap(nullptr, sizeof(Board), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  REQUIRE(p != MAP_FAILED);
  return new (p) Board;
}

// Saves versions first, first+step, ... up to `last` over `path`.
void writer_loop(const fs::path& path, uint64_t first, uint64_t last, uint64_t step, Board* b) {
  SaveOptions opt = tc_robust::tree_options(kScale);
  opt.threads = 1;
  for (uint64_t v = first; v <= last; v += step) {
    opt.durable = v % 16 == 0;  // mostly page-cache only: the race is the point
    tc_robust::save_tree(path, tc_robust::make_tree(v, kScale), opt);
    uint64_t prev = b->latest.load();
    while (prev < v && !b->latest.compare_exchange_weak(prev, v)) {
    }
  }
}

// One reader: open, check every leaf (all read paths), repeatedly; keeps one
// Archive across replacements and re-checks it. `monotonic`: with a single
// writer, successive opens never go back to an older version.
void reader_loop(const fs::path& path, Board* b, bool monotonic, int max_iters = 1 << 30) {
  uint64_t last = 0;
  std::optional<Archive> held;
  uint64_t held_version = 0;
  for (int it = 0; it < max_iters && !b->stop.load(); ++it) {
    try {
      Archive a = Archive::open(path);
      uint64_t v = 0;
      std::string why = tc_robust::check_tree(a, kScale, &v, /*compare=*/true, /*run_verify=*/it % 4 == 0);
      b->opens.fetch_add(1);
      if (!why.empty()) {
        b->fail("version " + std::to_string(v) + ": " + why);
        continue;
      }
      if (monotonic && v < last)
        b->fail("went back in time: saw version " + std::to_string(last) + " then " + std::to_string(v));
      if (v != last) b->distinct.fetch_add(1);
      last = v;
      uint64_t m = b->max_seen.load();
      while (m < v && !b->max_seen.compare_exchange_weak(m, v)) {
      }
      if (!held) {
        held = a;  // a copy shares the mapping
        held_version = v;
      } else if (it % 7 == 0) {
        uint64_t hv = 0;
        std::string hwhy = tc_robust::check_tree(*held, kScale, &hv, true, false);
        b->stale_reads.fetch_add(1);
        if (!hwhy.empty() || hv != held_version)
          b->fail("held archive of version " + std::to_string(held_version) + " now reads " +
                  std::to_string(hv) + ": " + hwhy);
        if (it % 21 == 0) held.reset();
      }
    } catch (const std::exception& e) {
      b->fail(std::string("reader threw: ") + e.what());
    }
  }
}

void wait_ok(pid_t pid, const char* who) {
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK_MESSAGE((WIFEXITED(status) && WEXITSTATUS(status) == 0), who << " exited abnormally: " << status);
}

}  // namespace

TEST_SUITE("concurrency") {

TEST_CASE("concurrency: reader processes see one whole version while a writer process replaces the archive") {
  const int versions = env_int("TREECASK_CONCURRENCY_VERSIONS", 120);
  const int readers = 3;
  TempDir dir;
  const fs::path path = dir / "live.cask";
  tc_robust::save_tree(path, tc_robust::make_tree(1, kScale), tc_robust::tree_options(kScale));
  Board* b = shared_board();
  b->latest = 1;
  std::vector<pid_t> kids;
  for (int r = 0; r < readers; ++r) {
    pid_t pid = tc_robust::fork_flushed();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      reader_loop(path, b, /*monotonic=*/true);
      _exit(0);
    }
    kids.push_back(pid);
  }
  pid_t writer = tc_robust::fork_flushed();
  REQUIRE(writer >= 0);
  if (writer == 0) {
    try {
      writer_loop(path, 2, static_cast<uint64_t>(versions) + 1, 1, b);
    } catch (const std::exception& e) {
      b->fail(std::string("writer threw: ") + e.what());
    }
    b->stop = 1;
    _exit(0);
  }
  wait_ok(writer, "writer");
  b->stop = 1;  // also when the writer died
  for (pid_t pid : kids) wait_ok(pid, "reader");
  CHECK_MESSAGE(b->errors == 0, b->errors.load() << " errors, first: " << b->first_error);
  MESSAGE(versions << " versions saved; readers opened and checked " << b->opens.load() << " archives ("
                   << b->distinct.load() << " version changes seen, newest " << b->max_seen.load()
                   << "), re-checked held archives " << b->stale_reads.load() << " times");
  CHECK(b->distinct.load() > static_cast<uint64_t>(readers));  // readers really overlapped saves
  uint64_t v = 0;
  CHECK(tc_robust::check_path(path, kScale, &v) == "");
  CHECK(v == static_cast<uint64_t>(versions) + 1);
  CHECK(tc_robust::other_files(dir.path, "live.cask").empty());
  munmap(b, sizeof(Board));
}

TEST_CASE("concurrency: two writer processes and readers on one path") {
  // Both writers are alive, so neither sweeps the other's temporary; the last
  // rename wins and every archive a reader opens is whole.
  const int versions = env_int("TREECASK_CONCURRENCY_VERSIONS", 120) / 3;
  TempDir dir;
  const fs::path path = dir / "two.cask";
  tc_robust::save_tree(path, tc_robust::make_tree(1, kScale), tc_robust::tree_options(kScale));
  Board* b = shared_board();
  std::vector<pid_t> kids;
  for (int r = 0; r < 2; ++r) {
    pid_t pid = tc_robust::fork_flushed();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      reader_loop(path, b, /*monotonic=*/false);
      _exit(0);
    }
    kids.push_back(pid);
  }
  std::vector<pid_t> writers;
  std::atomic<int>* done = new (mmap(nullptr, 64, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0))
      std::atomic<int>(0);
  for (uint64_t w = 0; w < 2; ++w) {
    pid_t pid = tc_robust::fork_flushed();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      try {
        writer_loop(path, 2 + w, 2 * static_cast<uint64_t>(versions) + 1, 2, b);  // even / odd versions
      } catch (const std::exception& e) {
        b->fail(std::string("writer threw: ") + e.what());
      }
      if (done->fetch_add(1) == 1) b->stop = 1;
      _exit(0);
    }
    writers.push_back(pid);
  }
  for (pid_t pid : writers) wait_ok(pid, "writer");
  b->stop = 1;  // also when a writer died
  for (pid_t pid : kids) wait_ok(pid, "reader");
  CHECK_MESSAGE(b->errors == 0, b->errors.load() << " errors, first: " << b->first_error);
  uint64_t v = 0;
  CHECK(tc_robust::check_path(path, kScale, &v) == "");
  CHECK(v >= 2 * static_cast<uint64_t>(versions));
  CHECK(tc_robust::other_files(dir.path, "two.cask").empty());
  MESSAGE("two writers, " << b->opens.load() << " archives checked by 2 readers");
  munmap(done, 64);
  munmap(b, sizeof(Board));
}

TEST_CASE("concurrency threads: reader threads open, share and read archives while a writer thread replaces the file") {
  // One process: a writer thread saving, reader threads each opening their own
  // Archive, and reader threads sharing one Archive object (copies share the
  // map; its const methods are thread-safe) that is swapped for a newer one
  // now and then. ThreadSanitizer runs this test.
  const int versions = env_int("TREECASK_CONCURRENCY_VERSIONS", 120) / 2;
  TempDir dir;
  const fs::path path = dir / "threads.cask";
  tc_robust::save_tree(path, tc_robust::make_tree(1, kScale), tc_robust::tree_options(kScale));
  auto board = std::make_unique<Board>();
  Board* b = board.get();
  std::mutex mu;
  std::shared_ptr<const Archive> current = std::make_shared<const Archive>(Archive::open(path));

  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) threads.emplace_back([&] { reader_loop(path, b, /*monotonic=*/true); });
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      for (int it = 0; !b->stop.load(); ++it) {
        std::shared_ptr<const Archive> a;
        {
          std::lock_guard<std::mutex> lock(mu);
          a = current;
        }
        try {
          uint64_t v = 0;
          std::string why = tc_robust::check_tree(*a, kScale, &v, /*compare=*/r != 0, /*run_verify=*/it % 3 == 0);
          b->opens.fetch_add(1);
          if (!why.empty()) b->fail("shared archive: " + why);
          if (r == 0 && it % 2 == 0) {  // swap in the newest version
            auto fresh = std::make_shared<const Archive>(Archive::open(path));
            std::lock_guard<std::mutex> lock(mu);
            current = std::move(fresh);
          }
        } catch (const std::exception& e) {
          b->fail(std::string("shared reader threw: ") + e.what());
        }
      }
    });
  std::thread writer([&] {
    try {
      writer_loop(path, 2, static_cast<uint64_t>(versions) + 1, 1, b);
    } catch (const std::exception& e) {
      b->fail(std::string("writer threw: ") + e.what());
    }
    b->stop = 1;
  });
  writer.join();
  for (auto& t : threads) t.join();
  CHECK_MESSAGE(b->errors == 0, b->errors.load() << " errors, first: " << b->first_error);
  CHECK(b->distinct.load() > 2);
  MESSAGE(versions << " versions; " << b->opens.load() << " checks by reader threads");
}

TEST_CASE("concurrency threads: many threads read one archive through every read path") {
  const int scale = 2;
  TempDir dir;
  const fs::path path = dir / "one.cask";
  tc_robust::save_tree(path, tc_robust::make_tree(5, scale), tc_robust::tree_options(scale));
  const Archive a = Archive::open(path);
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t)
    threads.emplace_back([&, t] {
      for (int it = 0; it < 6; ++it) {
        uint64_t v = 0;
        if (!tc_robust::check_tree(a, scale, &v, true, (it + t) % 2 == 0).empty() || v != 5) ++bad;
      }
    });
  for (auto& th : threads) th.join();
  CHECK(bad == 0);
}

}  // TEST_SUITE("concurrency")
