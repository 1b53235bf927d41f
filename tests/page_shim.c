/* Test-only control over what a test cannot otherwise choose: the page size
 * LMDB gives a new file, and where and how a file is mapped (tests/pages.h).
 *
 * Linked into the test executable (and the golden-vector generator), whose
 * definitions of sysconf() and mmap() come before libc's for every caller
 * that goes through the PLT: LMDB (a shared library) and treecask's own code.
 * glibc-internal calls are not seen. Both pass straight through unless a
 * test has set an override:
 *   - tc_pages_set_os_page_size(P): sysconf(_SC_PAGESIZE) returns P, so
 *     mdb_env_create() records P as the OS page size and a new LMDB file gets
 *     min(P, 32768)-byte pages (LMDB 0.9's MAX_PAGESIZE); 0 restores it;
 *   - tc_pages_set_map_shift(S): a file mapping at offset 0 with no address
 *     asked for is placed S bytes past a 2 MiB boundary (S a multiple of
 *     the OS page size, below 2 MiB); -1 restores the kernel's choice;
 *   - tc_pages_set_map_copy(1): such a mapping, read-only, is instead an
 *     anonymous mapping holding a copy of the file's bytes (what a reader
 *     sees when the OS cannot say which file a map shows); 0 restores it.
 * Not thread-safe to set while another thread maps or creates environments.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

extern long __sysconf(int name);

static _Atomic long os_page_size_override = 0;
static _Atomic long map_shift = -1;
static _Atomic long maps_placed = 0;
static _Atomic int map_copy = 0;

void tc_pages_set_os_page_size(long p) { atomic_store(&os_page_size_override, p); }
void tc_pages_set_map_shift(long s) { atomic_store(&map_shift, s); }
void tc_pages_set_map_copy(int on) { atomic_store(&map_copy, on); }
/* How many maps the shift or the copy has made so far (a test's proof that it applied). */
long tc_pages_maps_placed(void) { return atomic_load(&maps_placed); }

long sysconf(int name) {
  long p = atomic_load(&os_page_size_override);
  if (p > 0 && name == _SC_PAGESIZE) return p; /* _SC_PAGE_SIZE is the same name */
  return __sysconf(name);
}

/* An anonymous mapping of `len` bytes holding the bytes of `fd` from offset 0. */
static void* map_copy_of(size_t len, int prot, int fd) {
  void* m = mmap64(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return m;
  for (size_t done = 0; done < len;) {
    ssize_t n = pread(fd, (char*)m + done, len - done, (off_t)done);
    if (n <= 0) break; /* past the end of the file: zeros, as a file map's tail */
    done += (size_t)n;
  }
  mprotect(m, len, prot);
  atomic_fetch_add(&maps_placed, 1);
  return m;
}

void* mmap(void* addr, size_t len, int prot, int flags, int fd, off_t off) {
  if (atomic_load(&map_copy) && addr == NULL && fd >= 0 && off == 0 && !(flags & MAP_FIXED) && len > 0 &&
      !(prot & PROT_WRITE))
    return map_copy_of(len, prot, fd);
  long shift = atomic_load(&map_shift);
  if (shift < 0 || addr != NULL || fd < 0 || off != 0 || (flags & MAP_FIXED) || len == 0)
    return mmap64(addr, len, prot, flags, fd, off);
  /* Reserve room for the map plus a 2 MiB boundary, map at boundary + shift
   * over the reservation, then give back the rest of the reservation. */
  const uintptr_t align = (uintptr_t)2 << 20;
  const size_t os_page = (size_t)__sysconf(_SC_PAGESIZE);
  const size_t span = (len + os_page - 1) / os_page * os_page;
  const size_t room = span + align + (size_t)shift;
  void* r = mmap64(NULL, room, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r == MAP_FAILED) return r;
  uintptr_t lo = (uintptr_t)r, at = ((lo + align - 1) & ~(align - 1)) + (uintptr_t)shift;
  void* m = mmap64((void*)at, len, prot, flags | MAP_FIXED, fd, off);
  if (m == MAP_FAILED) {
    munmap(r, room);
    return m;
  }
  if (at > lo) munmap(r, at - lo);
  if (lo + room > at + span) munmap((void*)(at + span), lo + room - (at + span));
  atomic_fetch_add(&maps_placed, 1);
  return m;
}
