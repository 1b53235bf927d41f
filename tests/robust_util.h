// Helpers shared by the robustness suites (crash_test.cc, fault_test.cc,
// concurrency_test.cc) and the fault-injection child (fault_child.cc):
// deterministic "versioned" trees whose every leaf carries its version number,
// a checker that opens an archive and proves it holds exactly one complete
// version, and small process utilities. No doctest here: the checks run in
// forked or exec'd children too, so they return a description ("" = good)
// instead of asserting.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "treecask/treecask.h"

namespace tc_robust {

namespace fs = std::filesystem;

// An integer knob from the environment (run counts of the long variants).
// "<base>.tmp.<host>.<pid>.": how the temporary names of process `pid` on
// this host start (treecask::temporary_path; SPEC.md "Atomic commit").
inline std::string temp_prefix(const std::string& base, long pid) {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::strcpy(host, "localhost");
  return base + ".tmp." + host + "." + std::to_string(pid) + ".";
}

// The pid in a temporary name "<base>.tmp.<host>.<pid>.<hex>", or -1.
inline long temp_pid(const std::string& name, const std::string& base) {
  const std::string prefix = base + ".tmp.";
  if (name.rfind(prefix, 0) != 0) return -1;
  const size_t last = name.rfind('.');
  const size_t before = last == std::string::npos || last == 0 ? std::string::npos : name.rfind('.', last - 1);
  if (before == std::string::npos || before < prefix.size()) return -1;
  return std::strtol(name.substr(before + 1, last - before - 1).c_str(), nullptr, 10);
}

inline int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

inline uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Bytes of leaf `leaf` of version `version`: the version as u64 LE in the
// first 8 bytes, then either pseudo-random bytes (incompressible: stored raw)
// or runs of small integers (LZ4 pays: stored compressed).
inline void fill_leaf(std::byte* out, size_t n, uint64_t version, uint32_t leaf, bool compressible) {
  if (compressible) {
    for (size_t i = 0; i < n; ++i) out[i] = std::byte(((i / 97) + leaf + version) % 5);
  } else {
    uint64_t s = version * 0x100000001B3ull + leaf;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t x = splitmix64(s);
      std::memcpy(out + i, &x, 8);
    }
    if (i < n) {
      uint64_t x = splitmix64(s);
      std::memcpy(out + i, &x, n - i);
    }
  }
  if (n >= 8) std::memcpy(out, &version, 8);  // little-endian hosts only (as the format)
}

// Shape of a versioned tree; `scale` 4 gives ~3.5 MiB, 1 gives ~0.9 MiB.
//   {"big": f32 raw, several zero-copy parts; "lz4": i32 compressible;
//    "mid": u8 raw, one part; "small": [16*scale packed leaves];
//    "version": int scalar; "empty": f32[0]}
struct LeafSpec {
  std::string key;
  treecask::DType dtype;
  std::vector<int64_t> shape;
  bool compressible;
  treecask::ValueKind kind = treecask::ValueKind::kArray;
};

inline std::vector<LeafSpec> tree_specs(int scale) {
  using treecask::DType;
  std::vector<LeafSpec> s;
  s.push_back({"big", DType::kFloat32, {128 * scale, 1024}, false});         // 512 KiB * scale
  s.push_back({"lz4", DType::kInt32, {64 * scale, 1024}, true});             // 256 KiB * scale
  s.push_back({"mid", DType::kUInt8, {75 * 1024 * scale}, false});           // 75 KiB * scale
  for (int k = 0; k < 16 * scale; ++k)
    s.push_back({"small/" + std::to_string(k), DType::kUInt8, {256 + 64 * k}, false});
  s.push_back({"version", DType::kInt64, {}, false, treecask::ValueKind::kInt});
  s.push_back({"empty", DType::kFloat32, {0}, false});
  return s;
}

// Save options the suites use: 64 KiB chunks, parts of 2 chunks per scale unit,
// so "big" is 4 parts and every save writes many blobs.
inline treecask::SaveOptions tree_options(int scale) {
  treecask::SaveOptions o;
  o.chunk_size = 64 << 10;
  o.max_part_bytes = uint64_t(128 << 10) * scale;
  o.overwrite = true;
  return o;
}

struct VTree {
  uint64_t version = 0;
  int scale = 1;
  treecask::TreeDef def;
  std::vector<std::vector<std::byte>> data;
  std::vector<treecask::LeafInput> leaves;
};

inline treecask::TreeDef tree_def(int scale) {
  using treecask::NodeKind;
  using treecask::TreeNode;
  treecask::TreeDef d;
  d.push_back({NodeKind::kDict, 6, "", {"big", "lz4", "mid", "small", "version", "empty"}});
  for (int i = 0; i < 3; ++i) d.push_back({NodeKind::kLeaf, 0, "", {}});
  d.push_back({NodeKind::kList, static_cast<uint32_t>(16 * scale), "", {}});
  for (int k = 0; k < 16 * scale; ++k) d.push_back({NodeKind::kLeaf, 0, "", {}});
  d.push_back({NodeKind::kLeaf, 0, "", {}});
  d.push_back({NodeKind::kLeaf, 0, "", {}});
  return d;
}

inline VTree make_tree(uint64_t version, int scale) {
  VTree t;
  t.version = version;
  t.scale = scale;
  t.def = tree_def(scale);
  auto specs = tree_specs(scale);
  t.data.resize(specs.size());
  t.leaves.resize(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const LeafSpec& s = specs[i];
    size_t n = treecask::byte_length_for(s.dtype, s.shape);
    t.data[i].resize(n);
    fill_leaf(t.data[i].data(), n, version, static_cast<uint32_t>(i), s.compressible);
    treecask::LeafInput& in = t.leaves[i];
    in.meta.key_path = s.key;
    in.meta.dtype = s.dtype;
    in.meta.shape = s.shape;
    in.meta.value_kind = s.kind;
    in.data = std::as_bytes(std::span(t.data[i]));
  }
  return t;
}

inline treecask::SaveStats save_tree(const fs::path& p, const VTree& t, treecask::SaveOptions o) {
  return treecask::save(p, t.def, t.leaves, o);
}

inline uint64_t version_of(std::span<const std::byte> bytes) {
  uint64_t v = ~uint64_t{0};
  if (bytes.size() >= 8) std::memcpy(&v, bytes.data(), 8);
  return v;
}

// Checks that `a` holds one complete version of the tree of `scale`: the
// expected leaves, verify() clean, every leaf's version equal to the
// "version" leaf, and (when `compare`) every byte equal to make_tree(v).
// Reads through every read path: view, view_parts, read, read_rows, read_many.
// Returns "" and sets *version, or a description of what is wrong.
inline std::string check_tree(const treecask::Archive& a, int scale, uint64_t* version,
                              bool compare = true, bool run_verify = true) {
  using namespace treecask;
  auto specs = tree_specs(scale);
  if (a.size() != specs.size())
    return "archive has " + std::to_string(a.size()) + " leaves, expected " + std::to_string(specs.size());
  if (run_verify) {
    auto errs = a.verify();
    if (!errs.empty()) return std::string("verify(): ") + errs.front().what();
  }
  auto vi = a.find("version");
  if (!vi) return "no 'version' leaf";
  uint64_t v = 0;
  a.read(*vi, std::as_writable_bytes(std::span(&v, 1)));
  *version = v;
  std::vector<std::byte> expect, got;
  std::vector<size_t> many_idx;
  std::vector<std::vector<std::byte>> many_buf;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (a.leaf(i).key_path != specs[i].key) return "leaf " + std::to_string(i) + " is " + a.leaf(i).key_path;
    LeafInfo info = a.leaf(i);
    if (info.byte_length == 0) continue;
    got.resize(info.byte_length);
    if (specs[i].key == "big") {
      size_t off = 0;
      for (auto part : a.view_parts(i)) {
        if (off + part.size() > got.size()) return "big: parts longer than the leaf";
        std::memcpy(got.data() + off, part.data(), part.size());
        off += part.size();
      }
      if (off != got.size()) return "big: parts shorter than the leaf";
      // and rows straddling a part boundary through read_rows
      std::vector<std::byte> rows(4096 * 3);
      int64_t r0 = specs[i].shape[0] / 4 - 1;
      a.read_rows(i, r0, r0 + 3, rows);
      if (std::memcmp(rows.data(), got.data() + r0 * 4096, rows.size()) != 0)
        return "big: read_rows disagrees with view_parts";
    } else if (specs[i].key == "mid") {
      auto view = a.view(i);
      std::memcpy(got.data(), view.data(), view.size());
    } else if (specs[i].key.rfind("small/", 0) == 0) {
      many_idx.push_back(i);
      many_buf.emplace_back(info.byte_length);
      continue;
    } else {
      a.read(i, got);
    }
    if (version_of(got) != v)
      return "leaf '" + specs[i].key + "' has version " + std::to_string(version_of(got)) +
             ", the archive's version leaf says " + std::to_string(v);
    if (compare) {
      expect.resize(got.size());
      fill_leaf(expect.data(), expect.size(), v, static_cast<uint32_t>(i), specs[i].compressible);
      if (std::memcmp(expect.data(), got.data(), got.size()) != 0)
        return "leaf '" + specs[i].key + "' differs from version " + std::to_string(v);
    }
  }
  std::vector<std::span<std::byte>> outs;
  for (auto& b : many_buf) outs.emplace_back(b);
  a.read_many(many_idx, outs, Verify::kDefault, 2);
  for (size_t k = 0; k < many_idx.size(); ++k) {
    size_t i = many_idx[k];
    if (version_of(many_buf[k]) != v)
      return "leaf '" + specs[i].key + "' has version " + std::to_string(version_of(many_buf[k])) +
             ", the archive's version leaf says " + std::to_string(v);
    if (compare) {
      expect.resize(many_buf[k].size());
      fill_leaf(expect.data(), expect.size(), v, static_cast<uint32_t>(i), false);
      if (std::memcmp(expect.data(), many_buf[k].data(), expect.size()) != 0)
        return "leaf '" + specs[i].key + "' differs from version " + std::to_string(v);
    }
  }
  return "";
}

// Opens `p` and runs check_tree; exceptions become descriptions.
inline std::string check_path(const fs::path& p, int scale, uint64_t* version, bool compare = true) {
  try {
    treecask::Archive a = treecask::Archive::open(p);
    return check_tree(a, scale, version, compare);
  } catch (const std::exception& e) {
    return std::string("open/read threw: ") + e.what();
  }
}

// Names in `dir` other than `keep`: temporaries and anything else left behind.
inline std::vector<std::string> other_files(const fs::path& dir, const std::string& keep) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename() != keep) out.push_back(e.path().filename().string());
  return out;
}

// Open file descriptors of this process (the count's own directory fd excluded).
inline int count_fds() {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n - 1;
}

// Mappings of this process whose file name contains `needle`.
inline int count_maps(const char* needle) {
  int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  std::string all;
  char buf[4096];
  ssize_t k;
  while ((k = ::read(fd, buf, sizeof buf)) > 0) all.append(buf, static_cast<size_t>(k));
  ::close(fd);
  int n = 0;
  for (size_t pos = 0; (pos = all.find(needle, pos)) != std::string::npos; pos += std::strlen(needle)) ++n;
  return n;
}

}  // namespace tc_robust

namespace tc_robust {
// fork() after flushing the parent's output buffers, so that a child that
// exits through exit() (e.g. for LeakSanitizer) does not print them again.
// In the child, crash signals get their default action back, so that the
// parent sees how the child died rather than doctest's report from the child.
inline pid_t fork_flushed() {
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0)
    for (int sig : {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL}) ::signal(sig, SIG_DFL);
  return pid;
}
}  // namespace tc_robust
