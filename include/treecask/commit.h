// Atomic commit of a finished file or directory (SPEC.md "Atomic commit"):
// the one commit path of save(), the CLI's output files and the Python
// package's multi-process checkpoint directories. Everything is written under
// a temporary name beside the final one, made durable, and renamed onto the
// final name in one step, so a reader sees nothing or the whole thing.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "treecask/error.h"

namespace treecask {

// The temporary name beside `path`: "<path>.tmp.<host>.<pid>.<16 random hex
// digits>" (SPEC.md "Atomic commit", step 4), <host> this host's name
// (gethostname(2); "localhost" if it has none). The host and pid let
// is_stale_temporary() tell a crashed writer's leftovers from a live writer's,
// also in a directory several hosts share; the random part keeps two writers
// in one process (or a pid reused after a crash) apart. The one naming rule of
// every temporary: files, checkpoint directories, entries being deleted and,
// in the Python package, objects in a store. Throws nothing but std::bad_alloc.
TREECASK_API std::filesystem::path temporary_path(const std::filesystem::path& path);

// A temporary name taken apart (parse_temporary_name); views into the name
// given, which must outlive it.
struct TemporaryName {
  std::string_view target;  // the final name it stands for: "step_1.cask" of "step_1.cask.tmp.h.7.<x>"
  std::string_view kind;    // ".tmp." (every writer now), or ".tmpdir." (earlier multi-process saves)
  std::string_view host;    // the writer's host name (may hold dots); "" in the old "<target>.tmp.<pid>.<x>"
  uint64_t pid = 0;         // the writer's process id
  std::string_view random;  // <x>: lowercase hex digits (16 now; 8 in the old form), or "deleting"
};

// The temporary-name grammar (SPEC.md "Atomic commit", step 4): `name` (one
// path component, no '/') taken apart when it is one of the forms a writer
// of treecask makes or made:
//   <target>.tmp.<host>.<pid>.<x>     temporary_path(), every writer now
//   <target>.tmp.<pid>.<x>            writers before 2026-11-26 (<x> also
//                                     "deleting": a step being deleted)
//   <target>.tmpdir.<host>.<pid>.<x>  Python multi-process saves before then
// with <target> and <host> not empty, <pid> 1-9 decimal digits and <x> 8 or
// more lowercase hex digits; else nullopt. When several splits fit (a target
// or host holding ".tmp."), the one with the rightmost kind is taken.
// is_temporary_name(name) is parse_temporary_name(name).has_value(). Bound to
// Python as _core.parse_temporary_name / is_temporary_name: the sweeps of
// stores (markers, scratch directories, temporaries of a run) use this rule.
// Throws nothing.
TREECASK_API std::optional<TemporaryName> parse_temporary_name(std::string_view name) noexcept;
TREECASK_API bool is_temporary_name(std::string_view name) noexcept;

// This host's name as temporary names carry it (gethostname(2); "localhost"
// when it has none). Bound to Python as _core.host_name.
TREECASK_API std::string host_name();

// Whether `entry` (a name beside `name` in one directory, or a key beside the
// key `name` in one store) is a temporary of `name` whose writer is gone: it
// is "<name>.tmp.<host>.<pid>.<x>" with <host> this host's name and no
// process <pid> running here. Names of earlier writers count too, in
// parse_temporary_name's grammar with <target> = `name`:
// "<name>.tmp.<pid>.<x>" (judged by the pid alone, the old single-host rule)
// and "<name>.tmpdir.<host>.<pid>.<x>" (the Python package's multi-process
// directories before the one rule). A temporary of
// another host is never stale here: remove it from that host, or by hand
// once no writer runs. Throws nothing but std::bad_alloc.
TREECASK_API bool is_stale_temporary(std::string_view name, std::string_view entry);

// Removes the stale temporaries of `path` (is_stale_temporary: files or
// directories) from its directory; those of live writers are kept. Best
// effort: entries that cannot be removed are left, and nothing is thrown (a
// leftover temporary is never mistaken for a committed file).
TREECASK_API void remove_stale_temporaries(const std::filesystem::path& path);

// fsync(2) of the file or directory `p`. Throws Error(kIo) naming `file` (the
// user-facing name, not the temporary) with the OS's reason, also when the
// file system refuses fsync on a directory: durability that cannot be had is
// an error, never silently skipped.
TREECASK_API void sync_path(const std::filesystem::path& p, const std::string& file);

// Renames the finished temporary `tmp` (a file or a directory) onto `path`.
// Without overwrite the rename itself refuses an existing `path`
// (renameat2 RENAME_NOREPLACE; for a file on a file system without it,
// link() + unlink()), so an entry created meanwhile is never replaced:
// Error(kAlreadyExists). On a file system with neither (no renameat2 flags,
// no hard links: EPERM/ENOTSUP from link()) an existing `path` is refused the
// same way, then a plain rename(2) publishes: only an entry created between
// that check and the rename would be replaced. With overwrite a file is replaced by rename(2); a
// directory by renameat2 RENAME_EXCHANGE, after which the old directory (now
// at `tmp`) is removed. When durable, the parent directory is fsynced after
// the rename (sync_path). Throws Error(kIo) naming `file` otherwise; `tmp` is
// then left for the caller to remove.
TREECASK_API void publish(const std::filesystem::path& tmp, const std::filesystem::path& path,
                          bool overwrite, bool durable, const std::string& file);

}  // namespace treecask
