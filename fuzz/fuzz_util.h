// Helpers shared by the fuzz targets, the seed generator and the replay
// build: an in-memory file the reader can open by path, small deterministic
// archives, and one routine that drives every read API over an archive.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "treecask/treecask.h"

namespace tc_fuzz {

namespace fs = std::filesystem;

// An anonymous in-memory file (memfd). Archive::open reads it through
// "/proc/self/fd/N" like any regular file, without touching the disk.
class MemFile {
 public:
  MemFile() {
    fd_ = memfd_create("treecask-fuzz", MFD_CLOEXEC);
    if (fd_ < 0) {
      std::perror("memfd_create");
      std::abort();
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;

  void write(std::span<const std::byte> bytes) {
    if (::ftruncate(fd_, 0) != 0 ||
        (!bytes.empty() &&
         ::pwrite(fd_, bytes.data(), bytes.size(), 0) != static_cast<ssize_t>(bytes.size()))) {
      std::perror("writing the in-memory file");
      std::abort();
    }
  }
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

inline std::vector<std::byte> slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(c.size());
  if (!c.empty()) std::memcpy(out.data(), c.data(), c.size());
  return out;
}

// Deterministic bytes: random (incompressible) or runs of small values.
inline std::vector<std::byte> noise(size_t n, uint32_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = std::byte(rng() & 0xff);
  return v;
}
inline std::vector<std::byte> runs(size_t n, uint32_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937 rng(seed);
  for (size_t i = 0; i < n; ++i) v[i] = std::byte((i / 97) % 5 + (rng() % 16 == 0 ? rng() % 3 : 0));
  return v;
}

// A tree and the bytes of its leaves: what a seed archive holds.
struct Tree {
  treecask::TreeDef treedef;
  std::vector<treecask::LeafMeta> metas;
  std::vector<std::vector<std::byte>> data;
  std::vector<std::optional<treecask::Compression>> compression;
  treecask::SaveOptions options;

  void leaf(treecask::DType dtype, std::vector<int64_t> shape, std::vector<std::byte> bytes,
            std::optional<treecask::Compression> c = std::nullopt) {
    treecask::LeafMeta m;
    m.dtype = dtype;
    m.shape = std::move(shape);
    metas.push_back(std::move(m));
    data.push_back(std::move(bytes));
    compression.push_back(c);
  }
  void save(const fs::path& p) const {
    std::vector<treecask::LeafInput> in;
    for (size_t i = 0; i < data.size(); ++i) in.push_back({metas[i], std::span(data[i]), compression[i]});
    auto opt = options;
    opt.overwrite = true;
    opt.durable = false;
    treecask::save(p, treedef, in, opt);
  }
};

// The seed archives, small but covering every storage path a reader has.
inline std::vector<std::pair<std::string, Tree>> seed_trees() {
  using treecask::Compression;
  using treecask::DType;
  std::vector<std::pair<std::string, Tree>> out;
  {
    // Raw and LZ4 leaves packed in one blob, a two-chunk leaf, an LZ4 leaf
    // with its own blob, an LZ4 chunk stored raw, an empty leaf, a scalar.
    Tree t;
    t.treedef = treecask::flat_dict_treedef(
        {"raw_f32", "lz4_i32", "two_chunks", "big_lz4", "lz4_noise", "empty", "scalar"});
    t.leaf(DType::kFloat32, {300}, noise(1200, 1));
    t.leaf(DType::kInt32, {1024}, runs(4096, 2), Compression::kLZ4);
    t.leaf(DType::kUInt8, {6000}, noise(6000, 3));
    t.leaf(DType::kInt16, {40000}, runs(80000, 4), Compression::kLZ4);
    t.leaf(DType::kUInt8, {4100}, noise(4100, 5), Compression::kLZ4);
    t.leaf(DType::kFloat32, {0, 3}, {});
    t.leaf(DType::kInt64, {}, noise(8, 6));
    t.metas[6].value_kind = treecask::ValueKind::kInt;
    t.options.compression = Compression::kNone;
    t.options.chunk_size = 4096;
    out.emplace_back("mixed", std::move(t));
  }
  {
    // Every node kind, logical axes, a sharding, metadata, a str leaf.
    Tree t;
    using treecask::NodeKind;
    using treecask::TreeNode;
    t.treedef = {
        TreeNode{NodeKind::kDict, 3, {}, {"params", "opt", "step"}},
        TreeNode{NodeKind::kList, 2, {}, {}},
        TreeNode{},
        TreeNode{NodeKind::kNone, 0, {}, {}},
        TreeNode{NodeKind::kNamedTuple, 2, "optax.ScaleByAdamState", {"mu", "nu"}},
        TreeNode{NodeKind::kTuple, 1, {}, {}},
        TreeNode{},
        TreeNode{NodeKind::kDataclass, 1, "flax.core.meta.Partitioned", {"value"}},
        TreeNode{},
        TreeNode{},
    };
    t.leaf(DType::kBFloat16, {4, 8}, noise(64, 7));
    t.metas[0].logical_axes = {"batch", ""};
    t.leaf(DType::kFloat16, {2, 2}, noise(8, 8));
    t.leaf(DType::kFloat32, {8, 4}, runs(128, 9), Compression::kLZ4);
    t.metas[2].sharding = treecask::Sharding{{"data", "model"}, {2, 4}, {{"data"}, {"model"}}};
    t.metas[2].metadata = {{"note", "sharded"}};
    t.leaf(DType::kUInt8, {5}, {std::byte{'h'}, std::byte{'e'}, std::byte{'l'}, std::byte{'l'},
                                std::byte{'o'}});
    t.metas[3].value_kind = treecask::ValueKind::kStr;
    t.options.metadata = {{"purpose", "fuzz seed"}};
    out.emplace_back("tree", std::move(t));
  }
  {
    // A raw leaf in several zero-copy parts (SPEC.md "Large leaves").
    Tree t;
    t.treedef = {treecask::TreeNode{}};
    t.leaf(DType::kFloat64, {700, 3}, noise(16800, 10));
    t.options.compression = Compression::kNone;
    t.options.chunk_size = 4096;
    t.options.max_part_bytes = 8192;
    out.emplace_back("parts", std::move(t));
  }
  {
    // The smallest archive: one int4 leaf.
    Tree t;
    t.treedef = {treecask::TreeNode{}};
    t.leaf(DType::kInt4, {3, 5}, noise(8, 11));
    out.emplace_back("int4", std::move(t));
  }
  return out;
}

// Leaves this large are not read (their bytes would only cost time).
inline constexpr uint64_t kMaxReadBytes = 16u << 20;

// Drives every read API over the archive at `path`, catching the typed
// errors the reader promises. With `expected` (the leaves' original bytes),
// any read that passes checksum verification must return exactly those
// bytes, else this aborts: that would be wrong data, not an error.
// `max_leaves` bounds the leaves read (first and last ones).
inline void exercise(const std::string& path, const std::vector<std::vector<std::byte>>* expected,
                     size_t max_leaves = SIZE_MAX) {
  using namespace treecask;
  auto wrong = [](const char* what, size_t i) {
    std::fprintf(stderr, "WRONG DATA: %s of leaf %zu returned bytes that differ from the original\n",
                 what, i);
    std::abort();
  };
  std::vector<std::byte> out;
  // TREECASK_FUZZ_NO_VALIDATE=1 opens without the LMDB structure walk, to
  // show what it protects against (README "Record"); never set it otherwise.
  static const bool validate = std::getenv("TREECASK_FUZZ_NO_VALIDATE") == nullptr;
  OpenOptions options;
  options.validate_structure = validate;
  try {
    Archive a = Archive::open(path, options);
    (void)a.treedef();
    (void)a.metadata();
    (void)a.library_version();
    (void)a.created_unix_ns();
    bool compare = expected && expected->size() == a.size();
    for (size_t i = 0; i < a.size(); ++i) {
      if (a.size() > max_leaves && i >= max_leaves / 2 && i < a.size() - max_leaves / 2) continue;
      try {
        LeafInfo info = a.leaf(i);
        if (a.find(info.key_path) != i) std::abort();  // key paths are unique
        if (info.byte_length > kMaxReadBytes) continue;
        const std::vector<std::byte>* want = compare ? &(*expected)[i] : nullptr;
        if (want && want->size() != info.byte_length) want = nullptr;
        out.assign(info.byte_length, std::byte{0});
        try {
          a.read(i, out, Verify::kYes);
          if (want && !out.empty() && std::memcmp(out.data(), want->data(), out.size()) != 0)
            wrong("read()", i);
        } catch (const Error&) {
        }
        try {
          a.read(i, out, Verify::kNo);
        } catch (const Error&) {
        }
        if (info.codec == Codec::kNone) {
          try {
            size_t pos = 0;
            for (auto part : a.view_parts(i, Verify::kYes)) {
              if (pos + part.size() > info.byte_length) std::abort();  // parts overrun the leaf
              if (want && !part.empty() && std::memcmp(part.data(), want->data() + pos, part.size()) != 0)
                wrong("view_parts()", i);
              pos += part.size();
            }
            if (pos != info.byte_length) std::abort();
          } catch (const Error&) {
          }
          try {
            auto v = a.view(i, Verify::kNo);
            if (v.size() != info.byte_length) std::abort();
            if (reinterpret_cast<uintptr_t>(v.data()) % 64 != 0) std::abort();
          } catch (const Error&) {
          }
        }
        if (!info.shape.empty() && info.shape[0] > 0) {
          int64_t rows = info.shape[0], b = rows / 3, e = rows - rows / 3;
          uint64_t row_bytes = info.byte_length / static_cast<uint64_t>(rows);
          std::vector<std::byte> part((e - b) * row_bytes);
          try {
            a.read_rows(i, b, e, part, Verify::kYes);
            if (want && !part.empty() &&
                std::memcmp(part.data(), want->data() + b * row_bytes, part.size()) != 0)
              wrong("read_rows()", i);
          } catch (const Error&) {
          }
        }
        // Element reads (read_slice; packed sub-byte dtypes unpacked to one
        // byte per element): the whole leaf, verified, must give the original
        // elements; an inner box, unverified, must only stay in bounds.
        const bool packed = dtype_packed(info.dtype);
        const uint64_t unit = packed ? 1 : static_cast<uint64_t>(dtype_bits(info.dtype)) / 8;
        uint64_t count = 1;
        for (int64_t d : info.shape) count = d > 0 && count <= kMaxReadBytes ? count * static_cast<uint64_t>(d) : 0;
        if (unit > 0 && count > 0 && count * unit <= kMaxReadBytes) {
          std::vector<int64_t> start(info.shape.size(), 0), stop(info.shape);
          std::vector<std::byte> elems(count * unit);
          try {
            a.read_slice(i, start, stop, elems, {}, Verify::kYes, 1);
            if (want && packed) {  // element k at bits [k * bits, (k + 1) * bits) of the original
              const unsigned bits = static_cast<unsigned>(dtype_bits(info.dtype));
              for (uint64_t k = 0; k < count; ++k) {
                const uint64_t bit = k * bits;
                unsigned v = static_cast<uint8_t>((*want)[bit / 8]);
                if (bit % 8 + bits > 8) v |= static_cast<unsigned>(static_cast<uint8_t>((*want)[bit / 8 + 1])) << 8;
                if (static_cast<uint8_t>(elems[k]) != ((v >> (bit % 8)) & ((1u << bits) - 1)))
                  wrong("read_slice() (unpacked)", i);
              }
            } else if (want && elems != *want) {
              wrong("read_slice()", i);
            }
          } catch (const Error&) {
          }
          uint64_t inner = unit;
          for (size_t d = 0; d < info.shape.size(); ++d) {
            start[d] = info.shape[d] / 3;
            stop[d] = info.shape[d] - info.shape[d] / 4;
            inner *= static_cast<uint64_t>(stop[d] - start[d]);
          }
          try {
            a.read_slice(i, start, stop, std::span(elems).first(inner), {}, Verify::kNo, 1);
          } catch (const Error&) {
          }
        }
      } catch (const Error&) {
      }
    }
    // The full-load path: every readable leaf at once, pread + checksum.
    {
      std::vector<size_t> idx;
      std::vector<std::vector<std::byte>> bufs;
      for (size_t i = 0; i < a.size() && idx.size() < max_leaves; ++i) {
        try {
          uint64_t n = a.leaf(i).byte_length;
          if (n > kMaxReadBytes) continue;
          idx.push_back(i);
          bufs.emplace_back(n);
        } catch (const Error&) {
        }
      }
      std::vector<std::span<std::byte>> outs(bufs.begin(), bufs.end());
      try {
        a.read_many(idx, outs, Verify::kYes, 1);
        for (size_t k = 0; k < idx.size(); ++k) {
          const auto* want = compare ? &(*expected)[idx[k]] : nullptr;
          if (want && want->size() == bufs[k].size() && !bufs[k].empty() &&
              std::memcmp(bufs[k].data(), want->data(), bufs[k].size()) != 0)
            wrong("read_many()", idx[k]);
        }
      } catch (const Error&) {
      }
    }
    try {
      (void)a.subtree("");
    } catch (const Error&) {
    }
    // verify() of a sharded checkpoint's index opens the shard files beside
    // it; beside this in-memory file (/proc/self/fd) are the fuzzer's own
    // descriptors, so an index is verified by the sharded target instead.
    if (a.size() <= max_leaves && !ShardedArchive::is_index(a)) (void)a.verify();
  } catch (const Error&) {
  }
}

}  // namespace tc_fuzz
