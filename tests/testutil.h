// Helpers shared by the doctest suites: scratch directories, deterministic
// data, and trees built from (key, dtype, shape) lists.
#pragma once

#include <doctest/doctest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "treecask/treecask.h"

namespace tc_test {

namespace fs = std::filesystem;

// A fresh directory under $TMPDIR, removed with its contents on scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    std::random_device rd;
    path = fs::temp_directory_path() /
           ("treecask-test-" + std::to_string(getpid()) + "-" + std::to_string(rd()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path, ec);
  }
  fs::path operator/(const std::string& name) const { return path / name; }
};

inline std::vector<std::byte> random_bytes(size_t n, uint32_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t x = rng();
    std::memcpy(v.data() + i, &x, std::min<size_t>(8, n - i));
  }
  return v;
}

// Bytes that LZ4 compresses well: runs of small integers.
inline std::vector<std::byte> compressible_bytes(size_t n, uint32_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937 rng(seed);
  for (size_t i = 0; i < n; ++i) v[i] = std::byte((i / 97) % 5 + (rng() % 16 == 0 ? rng() % 3 : 0));
  return v;
}

// Owns the bytes of a flat-dict tree so LeafInput spans stay valid.
struct FlatTree {
  std::vector<std::string> keys;
  std::vector<std::vector<std::byte>> data;
  std::vector<treecask::LeafInput> leaves;

  void add(const std::string& key, treecask::DType dtype, std::vector<int64_t> shape,
           std::vector<std::byte> bytes) {
    keys.push_back(key);
    data.push_back(std::move(bytes));
    treecask::LeafInput in;
    in.meta.dtype = dtype;
    in.meta.shape = std::move(shape);
    leaves.push_back(std::move(in));
  }
  void add_random(const std::string& key, treecask::DType dtype, std::vector<int64_t> shape,
                  uint32_t seed) {
    auto n = treecask::byte_length_for(dtype, shape);
    add(key, dtype, std::move(shape), random_bytes(n, seed));
  }
  treecask::TreeDef treedef() const { return treecask::flat_dict_treedef(keys); }
  std::vector<treecask::LeafInput> inputs() {
    for (size_t i = 0; i < leaves.size(); ++i) leaves[i].data = std::as_bytes(std::span(data[i]));
    return leaves;
  }
  treecask::SaveStats save(const fs::path& p, treecask::SaveOptions opt = {}) {
    auto in = inputs();
    return treecask::save(p, treedef(), in, opt);
  }
};

inline std::vector<std::byte> read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(c.size());
  std::memcpy(out.data(), c.data(), c.size());
  return out;
}
inline void write_file(const fs::path& p, std::span<const std::byte> bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline bool same(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

// Expects `fn` to throw treecask::Error with `code`; returns the error.
template <typename Fn>
treecask::Error expect_error(treecask::ErrorCode code, Fn&& fn) {
  try {
    fn();
  } catch (const treecask::Error& e) {
    INFO(e.what());
    CHECK(e.code() == code);
    return e;
  }
  FAIL("expected treecask::Error with code " << treecask::error_code_name(code));
  return treecask::Error(code, "", "", "");
}

}  // namespace tc_test
