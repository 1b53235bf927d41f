// Atomic commit of a finished file or directory (SPEC.md "Atomic commit"):
// the one commit path of save(), the CLI's output files and the Python
// package's multi-process checkpoint directories. Everything is written under
// a temporary name beside the final one, made durable, and renamed onto the
// final name in one step, so a reader sees nothing or the whole thing.
#pragma once

#include <filesystem>
#include <string>

#include "treecask/error.h"

namespace treecask {

// The temporary name beside `path`: "<path>.tmp.<pid>.<8 random hex digits>".
// The pid lets remove_stale_temporaries() tell a crashed writer's leftovers
// from a live writer's; the random part keeps two writers in one process (or
// a pid reused after a crash) apart. Throws nothing but std::bad_alloc.
TREECASK_API std::filesystem::path temporary_path(const std::filesystem::path& path);

// Removes the temporaries of `path` ("<name>.tmp.<pid>.<anything>", files or
// directories) whose process no longer exists; those of live processes are
// kept. Best effort: entries that cannot be removed are left, and nothing is
// thrown (a leftover temporary is never mistaken for a committed file).
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
