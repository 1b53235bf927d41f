#include "files.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

namespace treecask::interop {
namespace {

[[noreturn]] void throw_io(const std::string& path, const std::string& what, int err) {
  throw Error(ErrorCode::kIo, path, "", what + ": " + std::strerror(err));
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

}  // namespace treecask::interop
