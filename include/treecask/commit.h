// Atomic commit of a finished file or directory (SPEC.md "Atomic commit"):
// the one commit path of save(), the CLI's output files and the Python
// package's multi-process checkpoint directories. Everything is written under
// a temporary name beside the final one, made durable, and renamed onto the
// final name in one step, so a reader sees nothing or the whole thing.
#pragma once

#include <filesystem>
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

// Whether `entry` (a name beside `name` in one directory, or a key beside the
// key `name` in one store) is a temporary of `name` whose writer is gone: it
// is "<name>.tmp.<host>.<pid>.<x>" with <host> this host's name and no
// process <pid> running here. Names of earlier writers count too:
// "<name>.tmp.<pid>.<x>" (<x> without a dot; judged by the pid alone, the old
// single-host rule) and "<name>.tmpdir.<host>.<pid>.<x>" (the Python
// package's multi-process directories before the one rule). A temporary of
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
