// Resource faults: every failing file-system call of a save, a full disk, a
// file-size limit and an address-space limit must end in a clean failure:
// save() throws treecask::Error(kIo) (or std::bad_alloc for a failed
// allocation), the previous archive at the path still opens and verifies, no
// temporary file, descriptor or mapping is left behind, and the process never
// dies of SIGBUS. docs/robustness.md lists the guarantees.
//
// Injected faults run in tests/fault_child.cc under LD_PRELOAD of
// tests/fault_inject.c; their paths come from the compile definitions
// TC_FAULT_CHILD / TC_FAULT_SHIM or the environment variables
// TREECASK_FAULT_CHILD / TREECASK_FAULT_SHIM.
#include <malloc.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "robust_util.h"
#include "testutil.h"

extern char** environ;

using namespace treecask;
using tc_test::TempDir;
namespace fs = std::filesystem;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TC_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define TC_SANITIZED 1
#endif
#endif

namespace {

std::string setting(const char* env, const char* compiled) {
  const char* v = std::getenv(env);
  return v && *v ? v : compiled;
}
#ifndef TC_FAULT_CHILD
#define TC_FAULT_CHILD ""
#endif
#ifndef TC_FAULT_SHIM
#define TC_FAULT_SHIM ""
#endif

struct ChildRun {
  int status = 0;
  std::string out;
  // parsed
  std::string result;
  std::string err_file;  // Error::file()
  int fds_before = -1, fds_after = -1, maps = -1;
  long hits = -1;
  long news = -1;
  std::vector<std::pair<std::string, std::string>> trace;  // (op, file)
  pid_t pid = 0;
  bool exited_ok() const { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }
  bool killed() const { return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL; }
};

// Reads the child's end of `fd` until EOF, closes it, and reaps `pid`.
// Returns what the child wrote; *status is its wait status.
std::string drain_and_reap(int fd, pid_t pid, int* status) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  *status = 0;
  if (waitpid(pid, status, 0) != pid) *status = -1;
  return out;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("signal ") + strsignal(WTERMSIG(status));
  return "status " + std::to_string(status);
}

// Runs fault_child under the shim with `args`, collecting its stdout.
ChildRun run_child(const std::vector<std::string>& args) {
  std::string child = setting("TREECASK_FAULT_CHILD", TC_FAULT_CHILD);
  std::string shim = setting("TREECASK_FAULT_SHIM", TC_FAULT_SHIM);
  REQUIRE_MESSAGE(fs::exists(child), "fault child not found: '" << child << "'");
  REQUIRE_MESSAGE(fs::exists(shim), "fault shim not found: '" << shim << "'");
  std::vector<std::string> env;
  std::string asan = "verify_asan_link_order=0";
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    if (kv.rfind("LD_PRELOAD=", 0) == 0) continue;
    if (kv.rfind("ASAN_OPTIONS=", 0) == 0) {
      asan = kv.substr(13) + ":" + asan;
      continue;
    }
    env.push_back(kv);
  }
  env.push_back("LD_PRELOAD=" + shim);
  env.push_back("ASAN_OPTIONS=" + asan);
  std::vector<char*> envp, argv;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> a = {child};
  a.insert(a.end(), args.begin(), args.end());
  for (auto& s : a) argv.push_back(s.data());
  argv.push_back(nullptr);

  int pipefd[2];
  REQUIRE(pipe(pipefd) == 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, pipefd[1], 1);
  posix_spawn_file_actions_addclose(&fa, pipefd[0]);
  posix_spawn_file_actions_addclose(&fa, pipefd[1]);
  ChildRun run;
  int rc = posix_spawn(&run.pid, child.c_str(), &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  ::close(pipefd[1]);
  REQUIRE(rc == 0);
  run.out = drain_and_reap(pipefd[0], run.pid, &run.status);
  REQUIRE(run.status != -1);
  std::istringstream in(run.out);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("result ", 0) == 0) run.result = line.substr(7);
    else if (line.rfind("file ", 0) == 0) run.err_file = line.substr(5);
    else if (line.rfind("fds ", 0) == 0) std::sscanf(line.c_str(), "fds %d %d", &run.fds_before, &run.fds_after);
    else if (line.rfind("maps ", 0) == 0) run.maps = std::atoi(line.c_str() + 5);
    else if (line.rfind("hits ", 0) == 0) run.hits = std::atol(line.c_str() + 5);
    else if (line.rfind("news ", 0) == 0) run.news = std::atol(line.c_str() + 5);
    else if (line.rfind("trace ", 0) == 0) {
      auto sp = line.find(' ', 6);
      run.trace.emplace_back(line.substr(6, sp - 6), sp == std::string::npos ? "" : line.substr(sp + 1));
    }
  }
  return run;
}

// mode: "1" durable, "0" not durable; a trailing "n": without overwrite.
ChildRun run_save(const fs::path& path, uint64_t version, int scale, const std::string& mode,
                  const std::string& op, long nth, const std::string& action, const std::string& err = "0") {
  return run_child({path.string(), std::to_string(version), std::to_string(scale), mode, op,
                    std::to_string(nth), action, err});
}

// Index of the first trace entry with `op` whose file satisfies `pred`, or -1.
template <typename Pred>
int find_op(const ChildRun& r, const std::string& op, Pred pred, int from = 0) {
  for (int i = from; i < static_cast<int>(r.trace.size()); ++i)
    if (r.trace[i].first == op && pred(r.trace[i].second)) return i;
  return -1;
}

bool is_temp(const std::string& file) { return file.find(".tmp.") != std::string::npos; }

// Reports what is wrong after a save that must have failed or been killed.
std::string check_state(const fs::path& path, int scale, uint64_t want_version) {
  uint64_t v = 0;
  std::string why = tc_robust::check_path(path, scale, &v);
  if (!why.empty()) return why;
  if (v != want_version)
    return "path holds version " + std::to_string(v) + ", expected " + std::to_string(want_version);
  return "";
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

std::string trace_text(const ChildRun& r) {
  std::string s;
  for (size_t i = 0; i < r.trace.size(); ++i)
    s += "\n  " + std::to_string(i + 1) + ". " + r.trace[i].first + " " + r.trace[i].second;
  return s;
}

}  // namespace

TEST_SUITE("fault") {

TEST_CASE("fault: save makes its durability calls in order (recorded by the LD_PRELOAD shim)") {
  TempDir dir;
  const std::string d = dir.path.string();
  uint64_t version = 0;
  for (const std::string mode : {"1", "0", "1n", "0n"}) {
    const bool durable = mode[0] == '1';
    const fs::path path = dir / ("o" + mode + ".cask");  // "n": a new path, no overwrite
    ChildRun r = run_save(path, ++version, 1, mode, "any", 0, "record");
    REQUIRE_MESSAGE(r.exited_ok(), describe_status(r.status) << "\n" << r.out);
    REQUIRE(r.result == "ok");
    INFO("mode " << mode << ", trace:" << trace_text(r));
    auto any = [](const std::string&) { return true; };
    int create = find_op(r, "open", is_temp);
    int falloc = find_op(r, "fallocate", is_temp);
    int msync = find_op(r, "msync", any);
    int trunc = find_op(r, "truncate", is_temp);
    int fsync_tmp = find_op(r, "fsync", is_temp);
    int rename = find_op(r, "rename", [&](const std::string& f) {
      return is_temp(f) && f.size() > path.string().size() &&
             f.compare(f.size() - path.string().size(), std::string::npos, path.string()) == 0;
    });
    int fsync_dir = find_op(r, "fsync", [&](const std::string& f) { return f == d; });
    CHECK(create >= 0);
    CHECK(falloc > create);
    CHECK(trunc > falloc);
    CHECK(rename > trunc);
    if (durable) {
      // Data pages reach the disk (msync of the map, then fsync of the
      // truncated file) before the rename publishes the name, and the
      // directory entry is made durable after it.
      CHECK(msync > falloc);
      CHECK(trunc > msync);
      CHECK(fsync_tmp > trunc);
      CHECK(rename > fsync_tmp);
      CHECK(fsync_dir > rename);
      CHECK(find_op(r, "fsync", any, fsync_dir + 1) == -1);
    } else {
      CHECK(msync == -1);
      CHECK(find_op(r, "fsync", any) == -1);
      CHECK(find_op(r, "fdatasync", any) == -1);
    }
    // Nothing touches the final path except the rename.
    for (size_t i = 0; i < r.trace.size(); ++i)
      if (static_cast<int>(i) != rename) CHECK(r.trace[i].second != path.string());
    uint64_t v = 0;
    CHECK(tc_robust::check_path(path, 1, &v) == "");
    CHECK(v == version);
  }
}

namespace {

// After a save failed or was killed: `want` 0 means the path must not exist
// (a save without overwrite to a new path), else it holds that version.
std::string check_outcome(const fs::path& path, int scale, uint64_t want) {
  if (want == 0) return fs::exists(path) ? "the path exists after a failed first save" : "";
  return check_state(path, scale, want);
}

// Makes each call of a clean save's trace fail in turn with each plausible
// errno. With `replace`, a previous archive is at the path; without, the path
// is new and the publish step is renameat2(RENAME_NOREPLACE) (or link()).
void fail_sweep(bool replace) {
  const int scale = 1;
  TempDir dir;
  const fs::path path = dir / "f.cask";
  const std::string mode = replace ? "1" : "1n";
  uint64_t cur = 1;
  tc_robust::save_tree(path, tc_robust::make_tree(cur, scale), tc_robust::tree_options(scale));
  if (!replace) fs::remove(path);
  ChildRun rec = run_save(path, ++cur, scale, mode, "any", 0, "record");
  REQUIRE(rec.exited_ok());
  REQUIRE(rec.result == "ok");
  if (!replace) fs::remove(path);
  int rename_at = find_op(rec, "rename", [](const std::string&) { return true; });
  REQUIRE(rename_at >= 0);
  INFO("trace of a clean durable save (mode " << mode << "):" << trace_text(rec));

  std::map<std::string, int> seen;  // occurrences of each op so far
  int runs = 0;
  for (int i = 0; i < static_cast<int>(rec.trace.size()); ++i) {
    const std::string& op = rec.trace[i].first;
    int nth = ++seen[op];
    std::vector<std::string> errs = {"ENOSPC", "EIO"};
    if (op == "open") errs.push_back("EMFILE");
    if (op == "mmap" || op == "msync") errs.push_back("ENOMEM");
    if (op == "pwrite" || op == "fallocate") errs.push_back("EDQUOT");
    for (const auto& err : errs) {
      uint64_t next = cur + 1;
      ChildRun r = run_save(path, next, scale, mode, op, nth, "fail", err);
      ++runs;
      INFO("fault: " << op << " #" << nth << " fails with " << err << " (call " << i + 1
                     << " of the trace)\n" << r.out);
      // Never a crash (SIGBUS, abort) and never a leak report (LeakSanitizer
      // exits non-zero) in the child.
      REQUIRE_MESSAGE(r.exited_ok(), describe_status(r.status));
      CHECK(r.hits == 1);
      CHECK(r.result.rfind("error 9 ", 0) == 0);  // ErrorCode::kIo
      CHECK(r.err_file == path.string());          // the caller's path, not the temporary
      CHECK(r.fds_before == r.fds_after);
      CHECK(r.maps == 0);
      CHECK_MESSAGE(tc_robust::other_files(dir.path, "f.cask").empty(),
                    "left: " << join(tc_robust::other_files(dir.path, "f.cask")));
      if (i <= rename_at) {
        CHECK(check_outcome(path, scale, replace ? cur : 0) == "");
      } else {
        // Only the directory fsync follows the rename: the new archive is in
        // place and complete, but save() reports that it may not be durable.
        CHECK(check_outcome(path, scale, next) == "");
        cur = next;
        if (!replace) fs::remove(path);
      }
    }
  }
  MESSAGE(runs << " injected faults over the " << rec.trace.size() << " calls of a save (mode " << mode << ")");
}

// SIGKILL just before and just after each call of a clean save's trace.
void kill_sweep(const std::string& mode) {
  const int scale = 1;
  const bool replace = mode.find('n') == std::string::npos;
  TempDir dir;
  const fs::path path = dir / "k.cask";
  uint64_t cur = 1;
  tc_robust::save_tree(path, tc_robust::make_tree(cur, scale), tc_robust::tree_options(scale));
  if (!replace) fs::remove(path);
  ChildRun rec = run_save(path, ++cur, scale, mode, "any", 0, "record");
  REQUIRE(rec.exited_ok());
  if (!replace) fs::remove(path);
  int rename_at = find_op(rec, "rename", [](const std::string&) { return true; });
  REQUIRE(rename_at >= 0);
  INFO("mode " << mode << ", trace:" << trace_text(rec));
  pid_t last_killed = 0;
  for (int i = 0; i < static_cast<int>(rec.trace.size()); ++i) {
    for (const char* action : {"kill-before", "kill-after"}) {
      uint64_t next = cur + 1;
      ChildRun r = run_save(path, next, scale, mode, "any", i + 1, action);
      INFO(action << " call " << i + 1 << " (" << rec.trace[i].first << ")");
      REQUIRE_MESSAGE(r.killed(), describe_status(r.status) << "\n" << r.out);
      bool renamed = i > rename_at || (i == rename_at && std::string(action) == "kill-after");
      CHECK(check_outcome(path, scale, renamed ? next : (replace ? cur : 0)) == "");
      if (renamed) cur = next;
      // Left behind: at most this child's own temporary (a killed process
      // cannot clean up); the previous child's was swept by this save.
      for (const auto& name : tc_robust::other_files(dir.path, "k.cask")) {
        INFO("left: " << name);
        CHECK(!renamed);
        CHECK(name.rfind(tc_robust::temp_prefix("k.cask", r.pid), 0) == 0);
        CHECK(name.rfind(tc_robust::temp_prefix("k.cask", last_killed), 0) != 0);
      }
      last_killed = r.pid;
      if (renamed && !replace) fs::remove(path);
    }
  }
  tc_robust::save_tree(path, tc_robust::make_tree(cur + 1, scale), tc_robust::tree_options(scale));
  CHECK(tc_robust::other_files(dir.path, "k.cask").empty());
}

}  // namespace

TEST_CASE("fault: each failing file-system call makes save throw kIo and keeps the old archive") {
  fail_sweep(true);
}

TEST_CASE("fault: each failing file-system call of a save to a new path leaves no file") {
  fail_sweep(false);
}

TEST_CASE("fault: SIGKILL just before and just after each file-system call") {
  for (const char* mode : {"1", "0", "1n"}) kill_sweep(mode);
}

namespace {
// The nth operator new of a save throws std::bad_alloc (fault_child replaces
// the global operator new): every allocation up to 150, then 100 more spread
// over the rest.
void new_fail_sweep(unsigned threads) {
  const int scale = 1;
  TempDir dir;
  const fs::path path = dir / "n.cask";
  uint64_t cur = 1;
  tc_robust::save_tree(path, tc_robust::make_tree(cur, scale), tc_robust::tree_options(scale));
  auto run = [&](uint64_t version, long nth, const char* action) {
    return run_child({path.string(), std::to_string(version), std::to_string(scale), "0", "any",
                      std::to_string(nth), action, "0", std::to_string(threads)});
  };
  ChildRun rec = run(++cur, 0, "record");
  REQUIRE(rec.exited_ok());
  REQUIRE(rec.result == "ok");
  const long total = rec.news;
  REQUIRE(total > 0);
  std::vector<long> points;
  for (long n = 1; n <= std::min(total, 150l); ++n) points.push_back(n);
  for (long k = 1; k <= 100 && total > 150; ++k) points.push_back(150 + (total - 150) * k / 100);
  points.erase(std::unique(points.begin(), points.end()), points.end());
  std::map<std::string, int> outcomes;
  for (long n : points) {
    uint64_t next = cur + 1;
    ChildRun r = run(next, n, "new-fail");
    INFO("threads " << threads << ", operator new #" << n << " of " << total << " throws\n" << r.out);
    REQUIRE_MESSAGE(r.exited_ok(), describe_status(r.status));  // never std::terminate
    std::string kind = r.result.substr(0, r.result.find(' '));
    ++outcomes[kind];
    CHECK((r.result == "bad_alloc" || r.result == "ok"));
    CHECK(r.fds_before == r.fds_after);
    CHECK(r.maps == 0);
    CHECK_MESSAGE(tc_robust::other_files(dir.path, "n.cask").empty(),
                  "left: " << join(tc_robust::other_files(dir.path, "n.cask")));
    CHECK(check_state(path, scale, r.result == "ok" ? next : cur) == "");
    if (r.result == "ok") cur = next;
  }
  std::string summary;
  for (const auto& [k, n] : outcomes) summary += " " + k + ":" + std::to_string(n);
  MESSAGE("threads=" << threads << ": " << points.size() << " of the " << total
                     << " allocations of a save made to fail; outcomes:" << summary);
  CHECK(outcomes["bad_alloc"] > 0);
}
}  // namespace

TEST_CASE("fault: a failing allocation (std::bad_alloc) at any point, two saving threads") {
  new_fail_sweep(2);
}

// A std::thread whose state cannot be allocated must not terminate the
// process (parallel_for runs on the threads that did start).
TEST_CASE("fault: a failing allocation (std::bad_alloc) at any point, four saving threads") {
  new_fail_sweep(4);
}

TEST_CASE("fault: disk full on a small tmpfs") {
  // Needs a mount namespace: root (CAP_SYS_ADMIN) or unprivileged user
  // namespaces. The child unshares, makes its mounts private and mounts a
  // tmpfs, so nothing is visible outside it; it runs every check itself and
  // sends back a report ("OK ..." is a pass, "SKIP ..." a skip).
  TempDir dir;
  const fs::path mnt = dir / "mnt";
  fs::create_directories(mnt);
  int pipefd[2];
  REQUIRE(pipe(pipefd) == 0);
  pid_t pid = tc_robust::fork_flushed();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(pipefd[0]);
    std::string report;
    auto send = [&](const std::string& s) {
      (void)!::write(pipefd[1], s.data(), s.size());
      _exit(0);
    };
    const bool root = geteuid() == 0;
    const uid_t uid = geteuid();
    const gid_t gid = getegid();
    if (unshare(CLONE_NEWNS | (root ? 0 : CLONE_NEWUSER)) != 0)
      send(std::string("SKIP unshare: ") + strerror(errno));
    if (!root) {  // map ourselves to root in the new user namespace, or file creation fails
      auto put = [&](const char* file, const std::string& text) {
        int fd = ::open(file, O_WRONLY | O_CLOEXEC);
        bool ok = fd >= 0 && ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
        if (fd >= 0) ::close(fd);
        if (!ok) send(std::string("SKIP writing ") + file + ": " + strerror(errno));
      };
      put("/proc/self/setgroups", "deny");
      put("/proc/self/uid_map", "0 " + std::to_string(uid) + " 1");
      put("/proc/self/gid_map", "0 " + std::to_string(gid) + " 1");
    }
    if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
      send(std::string("SKIP make-private: ") + strerror(errno));
    const uint64_t fs_bytes = 32 << 20;
    std::string opts = "size=" + std::to_string(fs_bytes);
    if (mount("tmpfs", mnt.c_str(), "tmpfs", 0, opts.c_str()) != 0)
      send(std::string("SKIP mount tmpfs: ") + strerror(errno));
    try {
      const int scale = 4;
      const fs::path path = mnt / "full.cask";
      SaveOptions opt = tc_robust::tree_options(scale);
      tc_robust::save_tree(path, tc_robust::make_tree(1, scale), opt);
      const uint64_t archive = fs::file_size(path);
      // Fill the file system so that a fraction of the next save's map fits,
      // from nothing to almost all of it.
      const fs::path filler = mnt / "filler";
      uint64_t free0 = fs::space(mnt).available;
      int failed = 0, succeeded = 0;
      for (uint64_t leave : {uint64_t{0}, uint64_t{4096}, uint64_t{8192}, uint64_t{65536},
                             uint64_t{1} << 20, archive / 2, archive, archive + (4 << 20),
                             archive + (8 << 20), free0}) {
        fs::remove(filler);
        if (leave < free0) {
          int fd = ::open(filler.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
          if (fd < 0 || posix_fallocate(fd, 0, static_cast<off_t>(free0 - leave)) != 0)
            send("cannot create the filler");
          ::close(fd);
        }
        int fds0 = tc_robust::count_fds();
        bool ok = false;
        std::string what;
        try {
          tc_robust::save_tree(path, tc_robust::make_tree(2, scale), opt);
          ok = true;
        } catch (const Error& e) {
          what = e.what();
          if (e.code() != ErrorCode::kIo) report += "leave " + std::to_string(leave) + ": not kIo: " + what + "\n";
        }
        if (tc_robust::count_fds() != fds0) report += "leave " + std::to_string(leave) + ": fd leak\n";
        if (tc_robust::count_maps(".tmp.") != 0) report += "leave " + std::to_string(leave) + ": mapping leak\n";
        uint64_t v = 0;
        std::string why = tc_robust::check_path(path, scale, &v);
        if (!why.empty() || v != (ok ? 2u : 1u))
          report += "leave " + std::to_string(leave) + ": archive: " + why + " version " + std::to_string(v) + "\n";
        for (const auto& name : tc_robust::other_files(mnt, "full.cask"))
          if (name != "filler") report += "leave " + std::to_string(leave) + ": left " + name + "\n";
        if (ok) {
          ++succeeded;
          tc_robust::save_tree(path, tc_robust::make_tree(1, scale), opt);  // back to version 1
        } else {
          ++failed;
          if (what.find("No space left") == std::string::npos)
            report += "leave " + std::to_string(leave) + ": not ENOSPC: " + what + "\n";
        }
      }
      if (failed < 5 || succeeded < 1)
        report += "expected most fills to fail and the emptiest to succeed: " + std::to_string(failed) +
                  " failed, " + std::to_string(succeeded) + " succeeded\n";
      if (report.empty())
        report = "OK " + std::to_string(failed) + " saves failed with ENOSPC, " + std::to_string(succeeded) +
                 " fitted";
    } catch (const std::exception& e) {
      report += std::string("unexpected: ") + e.what() + "\n";
    }
    umount2(mnt.c_str(), MNT_DETACH);
    send(report);
  }
  ::close(pipefd[1]);
  int status;
  std::string report = drain_and_reap(pipefd[0], pid, &status);
  REQUIRE_MESSAGE(WIFEXITED(status), describe_status(status));  // no SIGBUS
  if (report.rfind("SKIP", 0) == 0) {
    MESSAGE("tmpfs disk-full test skipped: " << report);
    return;
  }
  CHECK_MESSAGE(report.rfind("OK ", 0) == 0, report);
  MESSAGE("tmpfs disk full: " << report);
}

TEST_CASE("fault: a file-size limit (RLIMIT_FSIZE) is an ordinary kIo failure") {
  // Portable, no privileges: the kernel refuses to extend a file beyond the
  // limit with EFBIG (SIGXFSZ ignored), whatever the file system.
  const int scale = 2;
  TempDir dir;
  const fs::path path = dir / "l.cask";
  SaveOptions opt = tc_robust::tree_options(scale);
  tc_robust::save_tree(path, tc_robust::make_tree(1, scale), opt);
  for (rlim_t limit : {rlim_t{0}, rlim_t{4096}, rlim_t{8192}, rlim_t{1} << 20, rlim_t{4} << 20}) {
    pid_t pid = tc_robust::fork_flushed();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      signal(SIGXFSZ, SIG_IGN);
      rlimit rl{limit, RLIM_INFINITY};
      if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(10);
      int fds0 = tc_robust::count_fds();
      int code = 0;
      try {
        tc_robust::save_tree(path, tc_robust::make_tree(2, scale), opt);
        code = 1;
      } catch (const Error& e) {
        code = e.code() == ErrorCode::kIo ? 0 : 2;
      } catch (...) {
        code = 3;
      }
      if (tc_robust::count_fds() != fds0) code = 4;
      if (tc_robust::count_maps(".tmp.") != 0) code = 5;
      std::exit(code);  // exit(), not _exit(): LeakSanitizer runs at exit
    }
    int status = 0;
    waitpid(pid, &status, 0);
    INFO("RLIMIT_FSIZE " << limit);
    CHECK_MESSAGE((WIFEXITED(status) && WEXITSTATUS(status) == 0), describe_status(status));
    CHECK(check_state(path, scale, 1) == "");
    CHECK(tc_robust::other_files(dir.path, "l.cask").empty());
  }
}

#ifndef TC_SANITIZED
// The address-space limit: every allocation and mapping can fail. Sanitizer
// runtimes reserve terabytes of address space, so this runs unsanitized only.
namespace {
long vm_size() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmSize:", 0) == 0) return std::atol(line.c_str() + 7) * 1024;
  return -1;
}

enum Outcome : int { kOk = 0, kIoError = 1, kOtherError = 2, kBadAlloc = 3, kSystemError = 4, kOther = 5 };

// Saves `t` over `path` in a child whose address space may grow by only
// `headroom` bytes. Returns the outcome; 101/102 for a descriptor/mapping
// leak; 200 + signal when the child died.
int save_under_limit(const fs::path& path, const tc_robust::VTree& t, long headroom, unsigned threads,
                     std::string* what) {
  int pipefd[2];
  REQUIRE(pipe(pipefd) == 0);
  pid_t pid = tc_robust::fork_flushed();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(pipefd[0]);
    SaveOptions opt = tc_robust::tree_options(t.scale);
    opt.threads = threads;
    opt.durable = false;
    std::string msg;
    msg.reserve(512);
    int fds0 = tc_robust::count_fds();
    // Every allocation of 64 KiB or more gets fresh address space (a fixed
    // mmap threshold, not glibc's adaptive one), so the buffers of the save
    // hit the limit too, not only LMDB's map, whatever the parent's heap holds.
    mallopt(M_MMAP_THRESHOLD, 64 << 10);
    malloc_trim(0);
    rlimit old;
    getrlimit(RLIMIT_AS, &old);
    rlimit rl{static_cast<rlim_t>(vm_size() + headroom), old.rlim_max};
    setrlimit(RLIMIT_AS, &rl);
    int code;
    try {
      tc_robust::save_tree(path, t, opt);
      code = kOk;
    } catch (const Error& e) {
      code = e.code() == ErrorCode::kIo ? kIoError : kOtherError;
      msg.assign(e.what(), std::min<size_t>(std::strlen(e.what()), 400));
    } catch (const std::bad_alloc&) {
      code = kBadAlloc;
    } catch (const std::system_error& e) {
      code = kSystemError;
      msg.assign(e.what(), std::min<size_t>(std::strlen(e.what()), 400));
    } catch (...) {
      code = kOther;
    }
    setrlimit(RLIMIT_AS, &old);
    if (tc_robust::count_fds() != fds0) code = 101;
    if (tc_robust::count_maps(".tmp.") != 0) code = 102;
    (void)!::write(pipefd[1], msg.data(), msg.size());
    _exit(code);
  }
  ::close(pipefd[1]);
  int status;
  *what = drain_and_reap(pipefd[0], pid, &status);
  if (!WIFEXITED(status)) return 200 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return WEXITSTATUS(status);
}

// Finds the smallest headroom that lets a save succeed, then sweeps the 8 MiB
// below it in 64 KiB steps: there the mapping, then the buffers, then (with
// threads) the thread stacks are refused one after the other.
void oom_sweep(unsigned threads) {
  const int scale = 2;
  TempDir dir;
  const fs::path path = dir / "m.cask";
  SaveOptions opt = tc_robust::tree_options(scale);
  const tc_robust::VTree v1 = tc_robust::make_tree(1, scale), v2 = tc_robust::make_tree(2, scale);
  tc_robust::save_tree(path, v1, opt);
  std::string what;
  long hi = 256l << 10;
  while (save_under_limit(path, v2, hi, threads, &what) != kOk) {
    REQUIRE(hi < (1l << 30));
    hi *= 2;
  }
  tc_robust::save_tree(path, v1, opt);
  long lo = 0;  // fails at lo (assumed), succeeds at hi
  while (hi - lo > (64 << 10)) {
    long mid = (lo + hi) / 2;
    int code = save_under_limit(path, v2, mid, threads, &what);
    if (code == kOk) {
      hi = mid;
      tc_robust::save_tree(path, v1, opt);
    } else {
      lo = mid;
    }
  }
  std::map<int, int> outcomes;
  std::set<std::string> failures;
  for (long headroom = std::max(0l, hi - (8l << 20)); headroom <= hi; headroom += 64 << 10) {
    int code = save_under_limit(path, v2, headroom, threads, &what);
    ++outcomes[code];
    if (code != kOk) failures.insert(std::to_string(code) + " " + what.substr(what.find(": ") + 2));
    INFO("headroom " << (headroom >> 10) << " KiB, threads " << threads << ": outcome " << code << " " << what);
    // A clean failure: kIo (a mapping refused with ENOMEM) or std::bad_alloc;
    // never a crash (>= 200), a leak (>= 100) or another exception.
    CHECK((code == kOk || code == kIoError || code == kBadAlloc));
    if (code == kOk) {
      CHECK(check_state(path, scale, 2) == "");
      tc_robust::save_tree(path, v1, opt);
    } else {
      CHECK(check_state(path, scale, 1) == "");
    }
    CHECK(tc_robust::other_files(dir.path, "m.cask").empty());
  }
  std::string summary;
  for (auto [c, n] : outcomes) summary += " " + std::to_string(c) + ":" + std::to_string(n);
  for (const auto& f : failures) summary += "\n  " + f;
  MESSAGE("threads=" << threads << ": a save needs " << (hi >> 10)
                     << " KiB of address space; outcomes below that (0 ok, 1 kIo, 3 bad_alloc):" << summary);
  CHECK(outcomes[kIoError] + outcomes[kBadAlloc] > 0);
}
}  // namespace

TEST_CASE("fault: out of memory (RLIMIT_AS) fails cleanly, one saving thread") { oom_sweep(1); }

// With more than one worker thread to start, a refused thread
// (std::system_error, std::bad_alloc) must not escape parallel_for while an
// earlier one is joinable (std::terminate): it runs on the threads that started.
TEST_CASE("fault: out of memory (RLIMIT_AS) fails cleanly, four saving threads") {
  oom_sweep(4);
}

// LMDB's ENOMEM from mapping a valid archive is the OS refusing, not damage:
// kIo, never kCorruption.
TEST_CASE("fault: Archive::open under an address-space limit fails with kIo, never kCorruption") {
  const int scale = 4;
  TempDir dir;
  const fs::path path = dir / "o.cask";
  tc_robust::save_tree(path, tc_robust::make_tree(1, scale), tc_robust::tree_options(scale));
  std::map<std::string, int> outcomes;
  for (long headroom = 0; headroom <= (8l << 20); headroom += 128 << 10) {
    int pipefd[2];
    REQUIRE(pipe(pipefd) == 0);
    pid_t pid = tc_robust::fork_flushed();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(pipefd[0]);
      std::string msg;
      msg.reserve(1024);
      mallopt(M_MMAP_THRESHOLD, 64 << 10);
      malloc_trim(0);
      rlimit rl{static_cast<rlim_t>(vm_size() + headroom), RLIM_INFINITY};
      setrlimit(RLIMIT_AS, &rl);
      try {
        Archive a = Archive::open(path);
        uint64_t v = 0;
        msg = tc_robust::check_tree(a, scale, &v);
        if (msg.empty()) msg = "ok";
      } catch (const Error& e) {
        msg = "Error " + std::to_string(static_cast<int>(e.code())) + " " + e.what();
      } catch (const std::bad_alloc&) {
        msg = "bad_alloc";
      } catch (...) {
        msg = "other exception";
      }
      (void)!::write(pipefd[1], msg.data(), msg.size());
      _exit(0);
    }
    ::close(pipefd[1]);
    int status;
    std::string msg = drain_and_reap(pipefd[0], pid, &status);
    INFO("headroom " << (headroom >> 10) << " KiB: " << msg);
    CHECK_MESSAGE((WIFEXITED(status) && WEXITSTATUS(status) == 0), describe_status(status));
    CHECK((msg == "ok" || msg == "bad_alloc" || msg.rfind("Error 9 ", 0) == 0));  // kIo
    ++outcomes[msg.substr(0, 20)];
  }
  CHECK(outcomes["ok"] > 0);
}
#endif  // TC_SANITIZED

}  // TEST_SUITE("fault")
