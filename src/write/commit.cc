// Atomic commit of a finished file or directory (SPEC.md "Atomic commit").
#include "treecask/commit.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string_view>
#include <system_error>
#include <vector>

namespace treecask {

namespace {

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif
#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

[[noreturn]] void io_error(const std::string& file, const std::string& what, int err) {
  throw Error(ErrorCode::kIo, file, "", what + ": " + std::strerror(err));
}

int renameat2(const std::filesystem::path& from, const std::filesystem::path& to, unsigned flags) {
  return static_cast<int>(::syscall(SYS_renameat2, AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), flags));
}

std::filesystem::path parent_of(const std::filesystem::path& path) {
  return path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path();
}

// Whether no process `pid` runs on this host (kill(pid, 0) fails with ESRCH).
bool dead(uint64_t pid) {
  return pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

constexpr std::string_view kKinds[] = {".tmp.", ".tmpdir."};

// `rest` ("<host>.<pid>.<x>", or "<pid>.<x>" when `kind` is ".tmp.") into
// `t`; false when it is not of that form (commit.h parse_temporary_name).
bool parse_rest(std::string_view kind, std::string_view rest, TemporaryName& t) {
  const size_t last = rest.rfind('.');
  if (last == std::string_view::npos) return false;
  const std::string_view x = rest.substr(last + 1);
  const std::string_view head = rest.substr(0, last);
  const size_t before = head.rfind('.');
  const bool hex = x.size() >= 8 && x.find_first_not_of("0123456789abcdef") == std::string_view::npos;
  if (!hex && !(x == "deleting" && before == std::string_view::npos)) return false;
  const std::string_view pid = before == std::string_view::npos ? head : head.substr(before + 1);
  if (pid.empty() || pid.size() > 9 || pid.find_first_not_of("0123456789") != std::string_view::npos) return false;
  const std::string_view host = before == std::string_view::npos ? std::string_view() : head.substr(0, before);
  if (host.empty() && (kind != ".tmp." || before != std::string_view::npos)) return false;
  t.kind = kind;
  t.host = host;
  t.pid = 0;
  for (char c : pid) t.pid = t.pid * 10 + uint64_t(c - '0');
  t.random = x;
  return true;
}

}  // namespace

std::string host_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') return "localhost";
  return host;
}

std::optional<TemporaryName> parse_temporary_name(std::string_view name) noexcept {
  if (name.find('/') != std::string_view::npos) return std::nullopt;
  // The rightmost kind whose split fits (commit.h).
  for (size_t end = name.size(); end > 0;) {
    size_t best = std::string_view::npos;
    std::string_view kind;
    for (std::string_view k : kKinds) {
      const size_t at = name.rfind(k, end - 1);
      if (at != std::string_view::npos && (best == std::string_view::npos || at > best)) {
        best = at;
        kind = k;
      }
    }
    if (best == std::string_view::npos) return std::nullopt;
    TemporaryName t;
    if (best > 0 && parse_rest(kind, name.substr(best + kind.size()), t)) {
      t.target = name.substr(0, best);
      return t;
    }
    end = best;
  }
  return std::nullopt;
}

bool is_temporary_name(std::string_view name) noexcept { return parse_temporary_name(name).has_value(); }

std::filesystem::path temporary_path(const std::filesystem::path& path) {
  std::random_device rd;
  char suffix[64];
  std::snprintf(suffix, sizeof suffix, ".%ld.%08x%08x", static_cast<long>(::getpid()), static_cast<unsigned>(rd()),
                static_cast<unsigned>(rd()));
  std::filesystem::path tmp = path;
  tmp += ".tmp." + host_name() + suffix;
  return tmp;
}

bool is_stale_temporary(std::string_view name, std::string_view entry) {
  for (std::string_view kind : kKinds) {
    if (entry.size() <= name.size() + kind.size() || entry.substr(0, name.size()) != name ||
        entry.substr(name.size(), kind.size()) != kind) {
      continue;
    }
    TemporaryName t;
    if (!parse_rest(kind, entry.substr(name.size() + kind.size()), t)) return false;
    return (t.host.empty() || t.host == host_name()) && dead(t.pid);
  }
  return false;
}

void remove_stale_temporaries(const std::filesystem::path& path) {
  const std::filesystem::path dir = parent_of(path);
  const std::string target = path.filename().string();
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  std::vector<std::filesystem::path> stale;
  while (dirent* ent = ::readdir(d)) {
    if (is_stale_temporary(target, ent->d_name)) stale.push_back(dir / ent->d_name);
  }
  ::closedir(d);
  for (const auto& p : stale) {  // best effort, see the header
    struct stat st {};
    if (::lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      std::error_code ec;
      std::filesystem::remove_all(p, ec);
    } else {
      ::unlink(p.c_str());
    }
  }
}

void sync_path(const std::filesystem::path& p, const std::string& file) {
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) io_error(file, "open " + p.string() + " for fsync", errno);
  int rc = ::fsync(fd);
  int saved = errno;
  ::close(fd);
  if (rc != 0) io_error(file, "fsync " + p.string(), saved);
}

void publish(const std::filesystem::path& tmp, const std::filesystem::path& path, bool overwrite,
             bool durable, const std::string& file) {
  struct stat st {};
  if (::lstat(tmp.c_str(), &st) != 0) io_error(file, "stat " + tmp.string(), errno);
  const bool directory = S_ISDIR(st.st_mode);
  if (overwrite && !directory) {
    if (::rename(tmp.c_str(), path.c_str()) != 0) io_error(file, "rename into place", errno);
  } else if (renameat2(tmp, path, RENAME_NOREPLACE) == 0) {
    // published
  } else if (errno == EEXIST || errno == ENOTEMPTY) {
    if (!overwrite)
      throw Error(ErrorCode::kAlreadyExists, file, "",
                  "already exists (pass overwrite to replace it); nothing was replaced");
    // A directory: rename(2) cannot replace a non-empty one, so swap the
    // two, then drop the old one, which now lives at `tmp`.
    if (renameat2(tmp, path, RENAME_EXCHANGE) != 0) io_error(file, "exchange into place", errno);
    std::error_code ec;
    std::filesystem::remove_all(tmp, ec);
    if (ec) io_error(file, "remove the replaced directory " + tmp.string(), ec.value());
  } else if ((errno == EINVAL || errno == ENOSYS) && !directory) {
    // A file system without renameat2 flags: link() refuses an existing name too.
    if (::link(tmp.c_str(), path.c_str()) == 0) {
      ::unlink(tmp.c_str());
    } else if (errno == EEXIST) {
      throw Error(ErrorCode::kAlreadyExists, file, "",
                  "already exists (pass overwrite to replace it); nothing was replaced");
    } else if (errno == EPERM || errno == ENOTSUP) {
      // No hard links either: refuse an entry that exists now, then a plain
      // rename (an entry created between the two would be replaced).
      struct stat there {};
      if (::lstat(path.c_str(), &there) == 0)
        throw Error(ErrorCode::kAlreadyExists, file, "",
                    "already exists (pass overwrite to replace it); nothing was replaced");
      if (::rename(tmp.c_str(), path.c_str()) != 0) io_error(file, "rename into place", errno);
    } else {
      io_error(file, "link into place", errno);
    }
  } else {
    io_error(file, "rename into place", errno);
  }
  if (durable) sync_path(parent_of(path), file);
}

}  // namespace treecask
