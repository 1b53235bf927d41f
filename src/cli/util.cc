#include "util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <utility>

namespace treecask::cli {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

[[noreturn]] void throw_io(const std::string& path, const std::string& what, int err) {
  throw Error(ErrorCode::kIo, path, "", what + ": " + errno_text(err));
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// ---- MappedFile ---------------------------------------------------------------

MappedFile MappedFile::open(const std::filesystem::path& path) {
  MappedFile file;
  file.path_ = path.string();
  int fd = ::open(file.path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      throw Error(ErrorCode::kNotFound, file.path_, "", "no such file");
    }
    throw_io(file.path_, "cannot open", err);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw_io(file.path_, "cannot stat", err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(ErrorCode::kIo, file.path_, "", "not a regular file");
  }
  file.size_ = static_cast<size_t>(st.st_size);
  if (file.size_ > 0) {
    void* p = ::mmap(nullptr, file.size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      throw_io(file.path_, "cannot map", err);
    }
    file.data_ = static_cast<const std::byte*>(p);
  }
  ::close(fd);  // the mapping keeps the file open
  return file;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
}

// A dict of leaves only: tensors are named by the dict keys verbatim.
bool is_flat_dict(const TreeDef& def) {
  if (def.empty() || def[0].kind != NodeKind::kDict || def.size() != def[0].arity + 1) return false;
  return std::all_of(def.begin() + 1, def.end(),
                     [](const TreeNode& n) { return n.kind == NodeKind::kLeaf; });
}

// ---- OutputFile ---------------------------------------------------------------

OutputFile::OutputFile(const std::filesystem::path& path, bool overwrite)
    : path_(path.string()), overwrite_(overwrite) {
  struct stat st {};
  if (!overwrite_ && ::stat(path_.c_str(), &st) == 0) {  // fail early; publish() decides
    throw Error(ErrorCode::kAlreadyExists, path_, "",
                "file exists (pass --overwrite to replace it)");
  }
  remove_stale_temporaries(path);
  tmp_path_ = temporary_path(path).string();
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_io(path_, "cannot create " + tmp_path_, errno);
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_path_.c_str());
}

void OutputFile::write(std::span<const std::byte> bytes) {
  const std::byte* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    ssize_t n = ::write(fd_, p, std::min<size_t>(left, size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_io(path_, "cannot write", errno);
    }
    p += n;
    left -= static_cast<size_t>(n);
    written_ += static_cast<uint64_t>(n);
  }
}

void OutputFile::commit() {
  if (::fsync(fd_) != 0) throw_io(path_, "cannot fsync", errno);
  if (::close(fd_) != 0) {
    fd_ = -1;
    throw_io(path_, "cannot close", errno);
  }
  fd_ = -1;
  publish(tmp_path_, path_, overwrite_, /*durable=*/true, path_);
  committed_ = true;
}

// ---- Progress -----------------------------------------------------------------

Progress::Progress(std::string label, uint64_t total_bytes)
    : label_(std::move(label)), total_(total_bytes), enabled_(::isatty(STDOUT_FILENO) == 1) {}

Progress::~Progress() { finish(); }

void Progress::finish() {
  if (drawn_) {
    std::fputs("\r\033[K", stdout);
    std::fflush(stdout);
    drawn_ = false;
  }
}

void Progress::update(uint64_t done_bytes) {
  if (!enabled_ || total_ == 0) return;
  const int permille = static_cast<int>(std::min<uint64_t>(done_bytes, total_) * 1000 / total_);
  const int64_t now = now_ns();
  if (permille == last_permille_ || (now - last_draw_ns_ < 100'000'000 && permille != 1000)) {
    return;
  }
  last_permille_ = permille;
  last_draw_ns_ = now;
  constexpr int kWidth = 30;
  std::string bar(static_cast<size_t>(permille * kWidth / 1000), '#');
  bar.resize(kWidth, '.');
  std::fprintf(stdout, "\r%s [%s] %3d%%  %.1f / %.1f MiB\033[K", label_.c_str(), bar.c_str(),
               permille / 10, static_cast<double>(done_bytes) / (1 << 20),
               static_cast<double>(total_) / (1 << 20));
  std::fflush(stdout);
  drawn_ = true;
}

// ---- formatting ---------------------------------------------------------------

std::string format_shape(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ',';
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string format_bytes(uint64_t bytes) {
  std::string s = std::to_string(bytes);
  if (bytes < 1024) return s;
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes) / 1024;
  size_t unit = 0;
  while (v >= 1024 && unit + 1 < std::size(kUnits)) {
    v /= 1024;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, " (%.1f %s)", v, kUnits[unit]);
  return s + buf;
}

std::string format_unix_ns(int64_t unix_ns) {
  int64_t sec = unix_ns / 1'000'000'000;
  int64_t nsec = unix_ns % 1'000'000'000;
  if (nsec < 0) {
    nsec += 1'000'000'000;
    sec -= 1;
  }
  std::time_t t = static_cast<std::time_t>(sec);
  std::tm tm {};
  if (::gmtime_r(&t, &tm) == nullptr) return "(unrepresentable time)";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%09" PRId64 "Z", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, nsec);
  return buf;
}

std::string escape_for_terminal(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (u < 0x20 || u == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", u);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

}  // namespace treecask::cli
