// The process that tests/fault_test.cc runs under LD_PRELOAD=fault_inject.so:
// one save() with one injected fault, reported on stdout.
//
//   treecask_fault_child <path> <version> <scale> <mode> <op> <nth> <action> <errno> [threads]
//
// mode: "1" durable, "0" not; a trailing "n" saves without overwrite (the
//       publish step is then renameat2(RENAME_NOREPLACE) or link()).
// action: record (trace only) | fail (the nth <op> call fails with <errno>) |
//         kill-before | kill-after (SIGKILL around the nth <op> call) |
//         new-fail (the nth operator new during the save throws std::bad_alloc;
//         this program replaces the global operator new, which the library,
//         libstdc++ and FlatBuffers allocate with).
// op: open write pwrite fallocate ftruncate truncate msync fsync fdatasync
//     rename link mmap, or "any" (the nth intercepted call of any kind).
//
// Output (then exit 0; LeakSanitizer, when built in, checks at exit):
//   result ok | result error <code> <what> | result bad_alloc | result other <what>
//   file <path>              treecask::Error::file() of the error, if any
//   fds <before> <after>     open descriptors around the save
//   maps <n>                 mappings of a ".tmp." file still present afterwards
//   hits <n>                 faults the shim injected
//   news <n>                 operator new calls during the save
//   trace <op> <file>        every intercepted call while armed, in order
#include <dlfcn.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "robust_util.h"

namespace {
std::atomic<bool> g_new_armed{false};
std::atomic<long> g_new_count{0};
std::atomic<long> g_new_fail_at{0};
}  // namespace

void* operator new(std::size_t n) {
  if (g_new_armed.load(std::memory_order_relaxed) && g_new_count.fetch_add(1) + 1 == g_new_fail_at.load())
    throw std::bad_alloc();
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return ::operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace {

using ArmFn = void (*)(const char*, long, int, int);
using DisarmFn = void (*)();
using TraceFn = const char* (*)();
using HitsFn = long (*)();

int errno_from_name(const std::string& s) {
  if (s == "ENOSPC") return ENOSPC;
  if (s == "EIO") return EIO;
  if (s == "EDQUOT") return EDQUOT;
  if (s == "EMFILE") return EMFILE;
  if (s == "ENOMEM") return ENOMEM;
  if (s == "EFBIG") return EFBIG;
  return std::atoi(s.c_str());
}

int action_from_name(const std::string& s) {
  if (s == "fail") return 0;
  if (s == "kill-before") return 1;
  if (s == "kill-after") return 2;
  return 3;  // record
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 9 && argc != 10) {
    std::fprintf(stderr, "usage: %s path version scale durable op nth action errno [threads]\n", argv[0]);
    return 2;
  }
  auto arm = reinterpret_cast<ArmFn>(dlsym(RTLD_DEFAULT, "tc_fault_arm"));
  auto disarm = reinterpret_cast<DisarmFn>(dlsym(RTLD_DEFAULT, "tc_fault_disarm"));
  auto trace = reinterpret_cast<TraceFn>(dlsym(RTLD_DEFAULT, "tc_fault_trace"));
  auto hits = reinterpret_cast<HitsFn>(dlsym(RTLD_DEFAULT, "tc_fault_hits"));
  if (!arm || !disarm || !trace || !hits) {
    std::fprintf(stderr, "fault_inject shim not preloaded\n");
    return 3;
  }
  std::string path = argv[1];
  uint64_t version = std::strtoull(argv[2], nullptr, 10);
  int scale = std::atoi(argv[3]);
  bool durable = argv[4][0] == '1';
  bool replace = std::strchr(argv[4], 'n') == nullptr;
  tc_robust::VTree tree = tc_robust::make_tree(version, scale);
  treecask::SaveOptions opt = tc_robust::tree_options(scale);
  opt.durable = durable;
  opt.overwrite = replace;
  opt.threads = argc == 10 ? static_cast<unsigned>(std::atoi(argv[9])) : 2;
  const bool new_fail = std::string(argv[7]) == "new-fail";

  int fds_before = tc_robust::count_fds();
  std::string result, err_file;
  arm(argv[5], new_fail ? 0 : std::atol(argv[6]), new_fail ? 3 : action_from_name(argv[7]),
      errno_from_name(argv[8]));
  auto disarm_all = [&] {
    g_new_armed = false;
    disarm();
  };
  g_new_fail_at = new_fail ? std::atol(argv[6]) : 0;
  g_new_count = 0;
  g_new_armed = true;
  try {
    tc_robust::save_tree(path, tree, opt);
    disarm_all();
    result = "ok";
  } catch (const treecask::Error& e) {
    disarm_all();
    result = "error " + std::to_string(static_cast<int>(e.code())) + " " + e.what();
    err_file = e.file();
  } catch (const std::bad_alloc&) {
    disarm_all();
    result = "bad_alloc";
  } catch (const std::exception& e) {
    disarm_all();
    result = std::string("other ") + e.what();
  }
  int fds_after = tc_robust::count_fds();
  for (char& c : result)
    if (c == '\n') c = ' ';
  if (!err_file.empty()) std::printf("file %s\n", err_file.c_str());
  std::printf("result %s\nfds %d %d\nmaps %d\nhits %ld\nnews %ld\n", result.c_str(), fds_before,
              fds_after, tc_robust::count_maps(".tmp."), hits(), g_new_count.load());
  const char* t = trace();
  while (*t) {
    const char* nl = std::strchr(t, '\n');
    size_t n = nl ? static_cast<size_t>(nl - t) : std::strlen(t);
    std::printf("trace %.*s\n", static_cast<int>(n), t);
    t += n + (nl ? 1 : 0);
  }
  std::fflush(stdout);
  return 0;
}
