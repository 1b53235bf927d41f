#include "util.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <optional>
#include <system_error>
#include <utility>

namespace treecask::cli {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

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

// ---- refuse_manager_directory ------------------------------------------------------

namespace {

// The step of "step_<digits>.cask" (python/treecask/_manager.py names steps so;
// readers accept any digit count), else nullopt.
std::optional<uint64_t> manager_step(const std::string& name) {
  constexpr std::string_view kPrefix = "step_", kSuffix = ".cask";
  if (name.size() <= kPrefix.size() + kSuffix.size() || !name.starts_with(kPrefix) ||
      !name.ends_with(kSuffix)) {
    return std::nullopt;
  }
  const std::string digits = name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  if (digits.size() > 19 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  return std::stoull(digits);
}

}  // namespace

void refuse_manager_directory(const std::string& file) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (file.find("://") != std::string::npos || !fs::is_directory(file, ec) ||
      fs::exists(fs::path(file) / "index.cask", ec)) {
    return;
  }
  std::optional<std::pair<uint64_t, std::string>> latest;
  for (fs::directory_iterator it(file, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::optional<uint64_t> step = manager_step(name);
    if (step && (!latest || *step > latest->first)) latest = std::pair(*step, name);
  }
  if (!latest) return;
  std::string dir = file;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  throw Error(ErrorCode::kNotAnArchive, file, "",
              "a directory, not an archive: a checkpoint manager directory: name a step, e.g. " +
                  dir + "/" + latest->second + " (its latest step)");
}

}  // namespace treecask::cli
