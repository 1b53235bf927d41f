/* Fault-injection shim for the robustness tests (tests/fault_test.cc).
 *
 * Loaded with LD_PRELOAD into tests/fault_child.cc only. It wraps the calls a
 * save() makes to put bytes on disk -- open, write, pwrite, fallocate,
 * posix_fallocate, ftruncate, truncate, msync, fsync, fdatasync, rename,
 * renameat2 (through syscall()), link and file-backed mmap -- and, while
 * armed by the child through tc_fault_arm():
 *   - records each call (op name and the file it concerns) in a trace, and
 *   - on the Nth call of the chosen op ("any" counts every op), either fails
 *     it with the chosen errno without calling through, or kills the process
 *     with SIGKILL just before or just after calling through.
 * Calls made while disarmed pass straight through and are not counted.
 *
 * Interception is by symbol: calls LMDB (a shared library) and treecask make
 * through the PLT. glibc-internal calls (e.g. opendir's open) are not seen.
 * The writer's worker threads pwrite payloads concurrently: recording a call
 * and counting it happen under one lock, so the trace order is the count order.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#define TC_EXPORT __attribute__((visibility("default")))

enum { kFail = 0, kKillBefore = 1, kKillAfter = 2, kRecord = 3 };

static int g_armed;
static char g_op[32];
static long g_nth;
static int g_errno;
static int g_action;
static long g_seen_op;   /* calls of g_op so far (or of every op for "any") */
static long g_hits;      /* faults injected */
static char g_trace[1 << 16];
static size_t g_trace_len;

TC_EXPORT void tc_fault_arm(const char* op, long nth, int action, int err) {
  snprintf(g_op, sizeof g_op, "%s", op);
  g_nth = nth;
  g_action = action;
  g_errno = err;
  g_seen_op = 0;
  g_hits = 0;
  g_trace_len = 0;
  g_trace[0] = 0;
  __atomic_store_n(&g_armed, 1, __ATOMIC_SEQ_CST);
}

TC_EXPORT void tc_fault_disarm(void) { __atomic_store_n(&g_armed, 0, __ATOMIC_SEQ_CST); }
TC_EXPORT const char* tc_fault_trace(void) { return g_trace; }
TC_EXPORT long tc_fault_hits(void) { return g_hits; }

static void trace_add(const char* op, const char* what) {
  int n = snprintf(g_trace + g_trace_len, sizeof g_trace - g_trace_len, "%s %s\n", op, what);
  if (n > 0 && g_trace_len + (size_t)n < sizeof g_trace) g_trace_len += (size_t)n;
}

static void fd_name(int fd, char* out, size_t cap) {
  char link[64];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, out, cap - 1);
  if (n < 0) n = snprintf(out, cap, "fd:%d", fd);
  out[n < (ssize_t)cap ? n : (ssize_t)cap - 1] = 0;
}

/* A pthread mutex, not a spinlock: sanitizers see its ordering. t_inside
   lets calls made while this thread is inside the shim (a sanitizer's
   symbolizer opening files during a report, say) pass straight through
   instead of deadlocking. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static __thread int t_inside;

/* Decides the fate of one call. Returns 1 when the call must fail (errno set). */
static int before(const char* op, const char* what, int* kill_after) {
  *kill_after = 0;
  if (!__atomic_load_n(&g_armed, __ATOMIC_SEQ_CST) || t_inside) return 0;
  t_inside = 1;
  pthread_mutex_lock(&g_mu);
  trace_add(op, what);
  long k = 0;
  if (g_action != kRecord && (strcmp(g_op, "any") == 0 || strcmp(g_op, op) == 0)) k = ++g_seen_op;
  pthread_mutex_unlock(&g_mu);
  t_inside = 0;
  if (k == 0 || k != g_nth) return 0;
  __atomic_add_fetch(&g_hits, 1, __ATOMIC_SEQ_CST);
  if (g_action == kKillBefore) kill(getpid(), SIGKILL);
  if (g_action == kKillAfter) {
    *kill_after = 1;
    return 0;
  }
  errno = g_errno;
  return 1;
}
static void after(int kill_after) {
  if (kill_after) kill(getpid(), SIGKILL);
}

#define REAL(name) \
  static __typeof__(name)* real_##name; \
  if (!real_##name) real_##name = (__typeof__(name)*)dlsym(RTLD_NEXT, #name)

#define FD_CALL(op, fd, fail_value, call) \
  do { \
    char what_[512] = ""; \
    int ka_; \
    if (__atomic_load_n(&g_armed, __ATOMIC_SEQ_CST)) fd_name(fd, what_, sizeof what_); \
    if (before(op, what_, &ka_)) return fail_value; \
    __typeof__(call) r_ = call; \
    int e_ = errno; \
    after(ka_); \
    errno = e_; \
    return r_; \
  } while (0)

#define PATH_CALL(op, path, fail_value, call) \
  do { \
    int ka_; \
    if (before(op, path, &ka_)) return fail_value; \
    __typeof__(call) r_ = call; \
    int e_ = errno; \
    after(ka_); \
    errno = e_; \
    return r_; \
  } while (0)

TC_EXPORT int open(const char* path, int flags, ...) {
  REAL(open);
  mode_t mode = 0;
  if ((flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE) {
    va_list ap;
    va_start(ap, flags);
    mode = va_arg(ap, mode_t);
    va_end(ap);
  }
  PATH_CALL("open", path, -1, real_open(path, flags, mode));
}
TC_EXPORT int open64(const char* path, int flags, ...) {
  REAL(open64);
  mode_t mode = 0;
  if ((flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE) {
    va_list ap;
    va_start(ap, flags);
    mode = va_arg(ap, mode_t);
    va_end(ap);
  }
  PATH_CALL("open", path, -1, real_open64(path, flags, mode));
}
TC_EXPORT int openat(int dirfd, const char* path, int flags, ...) {
  REAL(openat);
  mode_t mode = 0;
  if ((flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE) {
    va_list ap;
    va_start(ap, flags);
    mode = va_arg(ap, mode_t);
    va_end(ap);
  }
  PATH_CALL("open", path, -1, real_openat(dirfd, path, flags, mode));
}
TC_EXPORT ssize_t write(int fd, const void* buf, size_t n) {
  REAL(write);
  FD_CALL("write", fd, -1, real_write(fd, buf, n));
}
TC_EXPORT ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) {
  REAL(pwrite);
  FD_CALL("pwrite", fd, -1, real_pwrite(fd, buf, n, off));
}
TC_EXPORT ssize_t pwrite64(int fd, const void* buf, size_t n, off_t off) {
  REAL(pwrite64);
  FD_CALL("pwrite", fd, -1, real_pwrite64(fd, buf, n, off));
}
TC_EXPORT int fallocate(int fd, int mode, off_t off, off_t len) {
  REAL(fallocate);
  FD_CALL("fallocate", fd, -1, real_fallocate(fd, mode, off, len));
}
TC_EXPORT int fallocate64(int fd, int mode, off_t off, off_t len) {
  REAL(fallocate64);
  FD_CALL("fallocate", fd, -1, real_fallocate64(fd, mode, off, len));
}
/* posix_fallocate returns the error number instead of setting errno. */
TC_EXPORT int posix_fallocate(int fd, off_t off, off_t len) {
  REAL(posix_fallocate);
  char what[512] = "";
  int ka;
  if (__atomic_load_n(&g_armed, __ATOMIC_SEQ_CST)) fd_name(fd, what, sizeof what);
  if (before("fallocate", what, &ka)) return errno;
  int r = real_posix_fallocate(fd, off, len);
  after(ka);
  return r;
}
TC_EXPORT int posix_fallocate64(int fd, off_t off, off_t len) {
  REAL(posix_fallocate64);
  char what[512] = "";
  int ka;
  if (__atomic_load_n(&g_armed, __ATOMIC_SEQ_CST)) fd_name(fd, what, sizeof what);
  if (before("fallocate", what, &ka)) return errno;
  int r = real_posix_fallocate64(fd, off, len);
  after(ka);
  return r;
}
TC_EXPORT int ftruncate(int fd, off_t len) {
  REAL(ftruncate);
  FD_CALL("ftruncate", fd, -1, real_ftruncate(fd, len));
}
TC_EXPORT int ftruncate64(int fd, off_t len) {
  REAL(ftruncate64);
  FD_CALL("ftruncate", fd, -1, real_ftruncate64(fd, len));
}
TC_EXPORT int truncate(const char* path, off_t len) {
  REAL(truncate);
  PATH_CALL("truncate", path, -1, real_truncate(path, len));
}
TC_EXPORT int truncate64(const char* path, off_t len) {
  REAL(truncate64);
  PATH_CALL("truncate", path, -1, real_truncate64(path, len));
}
TC_EXPORT int fsync(int fd) {
  REAL(fsync);
  FD_CALL("fsync", fd, -1, real_fsync(fd));
}
TC_EXPORT int fdatasync(int fd) {
  REAL(fdatasync);
  FD_CALL("fdatasync", fd, -1, real_fdatasync(fd));
}
TC_EXPORT int msync(void* addr, size_t len, int flags) {
  REAL(msync);
  char what[64];
  snprintf(what, sizeof what, "%zu", len);
  PATH_CALL("msync", what, -1, real_msync(addr, len, flags));
}
TC_EXPORT int rename(const char* from, const char* to) {
  REAL(rename);
  char what[1100];
  snprintf(what, sizeof what, "%s -> %s", from, to);
  PATH_CALL("rename", what, -1, real_rename(from, to));
}
TC_EXPORT int renameat(int fd1, const char* from, int fd2, const char* to) {
  REAL(renameat);
  char what[1100];
  snprintf(what, sizeof what, "%s -> %s", from, to);
  PATH_CALL("rename", what, -1, real_renameat(fd1, from, fd2, to));
}
/* Only file-backed mappings are counted: anonymous ones are malloc's and
   thread stacks, and are exercised by the RLIMIT_AS test instead. */
TC_EXPORT void* mmap(void* addr, size_t len, int prot, int flags, int fd, off_t off) {
  REAL(mmap);
  if (fd < 0 || (flags & MAP_ANONYMOUS)) return real_mmap(addr, len, prot, flags, fd, off);
  FD_CALL("mmap", fd, MAP_FAILED, real_mmap(addr, len, prot, flags, fd, off));
}
TC_EXPORT void* mmap64(void* addr, size_t len, int prot, int flags, int fd, off_t off) {
  REAL(mmap64);
  if (fd < 0 || (flags & MAP_ANONYMOUS)) return real_mmap64(addr, len, prot, flags, fd, off);
  FD_CALL("mmap", fd, MAP_FAILED, real_mmap64(addr, len, prot, flags, fd, off));
}
TC_EXPORT int link(const char* from, const char* to) {
  REAL(link);
  char what[1100];
  snprintf(what, sizeof what, "%s -> %s", from, to);
  PATH_CALL("link", what, -1, real_link(from, to));
}
/* The writer publishes without replacing through syscall(SYS_renameat2, ...)
   (glibc 2.28+ has renameat2(), but not every libc). Other system calls pass
   through: six register-sized arguments cover every one on x86-64/aarch64. */
TC_EXPORT long syscall(long number, ...) {
  REAL(syscall);
  va_list ap;
  va_start(ap, number);
  long a1 = va_arg(ap, long), a2 = va_arg(ap, long), a3 = va_arg(ap, long);
  long a4 = va_arg(ap, long), a5 = va_arg(ap, long), a6 = va_arg(ap, long);
  va_end(ap);
#ifdef SYS_renameat2
  if (number == SYS_renameat2) {
    char what[1100];
    snprintf(what, sizeof what, "%s -> %s", (const char*)a2, (const char*)a4);
    PATH_CALL("rename", what, -1, real_syscall(number, a1, a2, a3, a4, a5, a6));
  }
#endif
  return real_syscall(number, a1, a2, a3, a4, a5, a6);
}
