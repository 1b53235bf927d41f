// The one commit path (include/treecask/commit.h): temporary names, the sweep
// of crashed writers' temporaries, and publish()'s refusals and failures.
// save()'s use of it under injected faults and SIGKILL is fault_test.cc's.
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <regex>

#include "doctest/doctest.h"
#include "testutil.h"
#include "treecask/commit.h"

using namespace treecask;
using tc_test::TempDir;
namespace fs = std::filesystem;

namespace {

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream(p) << text;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A pid that is certainly gone: a child that has exited and been reaped.
pid_t dead_pid() {
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  waitpid(pid, nullptr, 0);
  return pid;
}

}  // namespace

std::string host() {
  char h[256] = {};
  if (gethostname(h, sizeof h - 1) != 0 || h[0] == '\0') return "localhost";
  return h;
}

TEST_CASE("commit: temporary_path is <path>.tmp.<host>.<pid>.<16 hex digits>, different each call") {
  TempDir dir;
  fs::path a = temporary_path(dir / "x.cask"), b = temporary_path(dir / "x.cask");
  CHECK(a.parent_path() == dir.path);
  const std::string want = "x.cask.tmp." + host() + "." + std::to_string(getpid()) + ".";
  CHECK(a.filename().string().rfind(want, 0) == 0);
  CHECK(std::regex_match(a.filename().string().substr(want.size()), std::regex("[0-9a-f]{16}")));
  CHECK(a != b);
}

TEST_CASE("commit: is_stale_temporary: this host's dead writers, and the names of earlier writers") {
  const std::string dead = std::to_string(dead_pid()), live = std::to_string(getpid());
  CHECK(is_stale_temporary("s.cask", "s.cask.tmp." + host() + "." + dead + ".0123456789abcdef"));
  CHECK(is_stale_temporary("run/s.cask", "run/s.cask.tmp." + host() + "." + dead + ".00"));  // object keys
  CHECK(!is_stale_temporary("s.cask", "s.cask.tmp." + host() + "." + live + ".0123456789abcdef"));
  CHECK(!is_stale_temporary("s.cask", "s.cask.tmp.other-host.example." + dead + ".0123456789abcdef"));
  CHECK(is_stale_temporary("s.cask", "s.cask.tmp." + dead + ".0badc0de"));  // before hosts were named
  CHECK(is_stale_temporary("s.cask", "s.cask.tmp." + dead + ".deleting"));
  CHECK(is_stale_temporary("s.cask", "s.cask.tmpdir." + host() + "." + dead + ".0123456789abcdef"));
  CHECK(!is_stale_temporary("s.cask", "s.cask.tmpdir." + dead + ".0badc0de"));
  CHECK(!is_stale_temporary("s.cask", "s.cask"));
  CHECK(!is_stale_temporary("s.cask", "s.cask.tmp."));
  CHECK(!is_stale_temporary("s.cask", "s.cask.tmp.notapid.0"));
  CHECK(!is_stale_temporary("s.cask", "t.cask.tmp." + host() + "." + dead + ".00"));
  CHECK(!is_stale_temporary("s.cask", "s.cask.tmp." + host() + ".0.00"));  // pid 0 is no process
}

TEST_CASE("commit: publish refuses an existing file or directory without overwrite") {
  TempDir dir;
  fs::path path = dir / "out", tmp = temporary_path(path);
  write_text(path, "old");
  write_text(tmp, "new");
  try {
    publish(tmp, path, /*overwrite=*/false, /*durable=*/true, path.string());
    FAIL("expected kAlreadyExists");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kAlreadyExists);
    CHECK(e.file() == path.string());
  }
  CHECK(read_text(path) == "old");  // untouched
  CHECK(read_text(tmp) == "new");   // left for the caller
  publish(tmp, path, /*overwrite=*/true, /*durable=*/true, path.string());
  CHECK(read_text(path) == "new");
  CHECK(!fs::exists(tmp));

  fs::path d = dir / "ckpt", dtmp = temporary_path(d);
  fs::create_directory(d);
  write_text(d / "index", "old");
  fs::create_directory(dtmp);
  write_text(dtmp / "index", "new");
  CHECK_THROWS_AS(publish(dtmp, d, false, true, d.string()), Error);
  CHECK(read_text(d / "index") == "old");
  // With overwrite a non-empty directory is exchanged, and the old one removed.
  publish(dtmp, d, true, true, d.string());
  CHECK(read_text(d / "index") == "new");
  CHECK(!fs::exists(dtmp));
}

TEST_CASE("commit: publish and sync_path report what the OS refused as kIo naming the file") {
  TempDir dir;
  fs::path path = dir / "out";
  try {
    publish(dir / "missing.tmp.1.0", path, false, true, "user/path.cask");
    FAIL("expected kIo");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kIo);
    CHECK(e.file() == "user/path.cask");
  }
  try {
    sync_path(dir / "no-such-dir" / "f", "user/path.cask");
    FAIL("expected kIo");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kIo);
    CHECK(e.file() == "user/path.cask");
  }
  // Into a directory that does not exist: the rename fails, nothing appears.
  fs::path tmp = temporary_path(path);
  write_text(tmp, "x");
  CHECK_THROWS_AS(publish(tmp, dir / "gone" / "out", false, true, "o"), Error);
  CHECK(fs::exists(tmp));
}

TEST_CASE("commit: remove_stale_temporaries removes dead writers' files and directories only") {
  TempDir dir;
  fs::path path = dir / "s.cask";
  const std::string dead = std::to_string(dead_pid());
  write_text(dir / ("s.cask.tmp." + dead + ".0badc0de"), "x");
  fs::create_directory(dir / ("s.cask.tmp." + dead + ".12345678"));
  write_text(dir / ("s.cask.tmp." + dead + ".12345678") / "process_0.cask", "x");
  fs::path live = temporary_path(path);  // this process: still running
  write_text(live, "x");
  write_text(dir / ("other.cask.tmp." + dead + ".00000000"), "x");  // another name's
  write_text(dir / "s.cask.tmp.notapid.0", "x");                   // not a temporary name
  const fs::path dead_now = dir / ("s.cask.tmp." + host() + "." + dead + ".0123456789abcdef");
  fs::create_directory(dead_now);  // a multi-process save's directory of today's naming
  const fs::path elsewhere = dir / ("s.cask.tmp.another-host." + dead + ".0123456789abcdef");
  write_text(elsewhere, "x");  // another host's: its writer may be running there
  remove_stale_temporaries(path);
  CHECK(!fs::exists(dead_now));
  CHECK(fs::exists(elsewhere));
  CHECK(!fs::exists(dir / ("s.cask.tmp." + dead + ".0badc0de")));
  CHECK(!fs::exists(dir / ("s.cask.tmp." + dead + ".12345678")));
  CHECK(fs::exists(live));
  CHECK(fs::exists(dir / ("other.cask.tmp." + dead + ".00000000")));
  CHECK(fs::exists(dir / "s.cask.tmp.notapid.0"));
}
