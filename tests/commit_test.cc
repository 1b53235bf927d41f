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
  CHECK(is_stale_temporary("run/s.cask", "run/s.cask.tmp." + host() + "." + dead + ".0123456789abcdef"));  // keys
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
  CHECK(!is_stale_temporary("s.cask", "s.cask.tmp." + host() + ".0.0123456789abcdef"));  // pid 0 is no process
  CHECK(!is_stale_temporary("s.cask", "s.cask.tmp." + host() + "." + dead + ".00"));  // no writer's <x>
}

TEST_CASE("commit: the temporary-name grammar: every form a writer makes or made, taken apart") {
  // What temporary_path writes now.
  const fs::path tmp = temporary_path("dir/step_7.cask");
  const std::string name = tmp.filename().string();
  std::optional<TemporaryName> t = parse_temporary_name(name);
  REQUIRE(t);
  CHECK(t->target == "step_7.cask");
  CHECK(t->kind == ".tmp.");
  CHECK(t->host == host());
  CHECK(host_name() == host());
  CHECK(t->pid == uint64_t(getpid()));
  CHECK(t->random.size() == 16);
  CHECK(is_temporary_name(name));
  // A host with dots, a target with ".tmp." in it: the rightmost kind.
  t = parse_temporary_name("a.tmp.b.cask.tmp.node-1.example.org.42.0123456789abcdef");
  REQUIRE(t);
  CHECK(t->target == "a.tmp.b.cask");
  CHECK(t->host == "node-1.example.org");
  CHECK(t->pid == 42);
  // The forms of earlier writers.
  t = parse_temporary_name("s.cask.tmp.42.0badc0de");
  REQUIRE(t);
  CHECK(t->target == "s.cask");
  CHECK(t->host.empty());
  CHECK(t->pid == 42);
  t = parse_temporary_name("step_3.cask.tmp.42.deleting");
  REQUIRE(t);
  CHECK(t->random == "deleting");
  t = parse_temporary_name("ckpt.tmpdir.h.7.0123456789abcdef");
  REQUIRE(t);
  CHECK(t->kind == ".tmpdir.");
  CHECK(t->target == "ckpt");
  CHECK(t->host == "h");
  // Upload scratch and markers are the same grammar.
  CHECK(is_temporary_name("treecask-upload.tmp.h.9.0123456789abcdef"));
  // Not temporaries: final names, user files that only look alike, paths.
  for (const char* no : {"step_7.cask", "index.cask", ".tmp.h.1.0123456789abcdef", "s.cask.tmp.", "s.cask.tmp.h.1.",
                         "notes.tmp.2024.final", "s.cask.tmp.h.x1.0123456789abcdef", "s.cask.tmp.h.1.0123ABCD",
                         "s.cask.tmp.h.1.0123", "s.cask.tmpdir.1.0badc0de", "s.cask.tmp.h.1234567890.0123456789abcdef",
                         "d/s.cask.tmp.h.1.0123456789abcdef", "s.cask.tmp.h.1.deleting"})
    CHECK_MESSAGE(!is_temporary_name(no), no);
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
