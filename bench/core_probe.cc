// A fixed C++ workload over the public API, built against two revisions of
// the library by bench/revisions.py to show that a refactor kept the core's
// speed. It uses only API that every revision since format 4.0
// has, so the same source builds against each. Not a test.
//
// Usage: core_probe open  ARCHIVE KEY N   N opens + index_of + verified view of KEY
//        core_probe save  ARCHIVE R       R non-durable raw saves of the bulk tree
//        core_probe read_many ARCHIVE R   R Archive::read_many of every leaf (all cores)
//        core_probe read  ARCHIVE R       R Archive::read of each leaf in turn
//        core_probe views ARCHIVE R       R Archive::view_many of every leaf (verified)
//        core_probe small ARCHIVE         writes the 10,000-leaf archive for `open`
//                                         (one dict: w0, b0, w1, b1, ..., b4999)
// The bulk tree: 64 uint8 leaves of 4 MiB and 8 of 32 MiB (512 MiB), so that
// read() fans out (leaves from 8 MiB) and read_many/view_many fan out over
// chunks. Exit status 0, or 1 with the error on stderr.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "treecask/treecask.h"

namespace {

using namespace treecask;

std::vector<size_t> bulk_sizes() {
  std::vector<size_t> sizes(64, size_t{4} << 20);
  sizes.insert(sizes.end(), 8, size_t{32} << 20);
  return sizes;
}

void save_bulk(const std::string& path, int rounds) {
  std::vector<size_t> sizes = bulk_sizes();
  std::vector<std::vector<std::byte>> data;
  std::vector<std::string> keys;
  std::vector<LeafInput> leaves(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    data.emplace_back(sizes[i]);
    for (size_t j = 0; j < sizes[i]; j += 64) data.back()[j] = std::byte(i * 31 + j / 64);
    keys.push_back("l" + std::to_string(i));
    leaves[i].meta.dtype = DType::kUInt8;
    leaves[i].meta.shape = {static_cast<int64_t>(sizes[i])};
    leaves[i].data = data.back();
  }
  SaveOptions o;
  o.compression = Compression::kNone;
  o.durable = false;
  o.overwrite = true;
  for (int r = 0; r < rounds; ++r) save(path, flat_dict_treedef(keys), leaves, o);
}

void save_small(const std::string& path) {
  std::vector<std::string> keys;
  std::vector<std::vector<float>> data;
  std::vector<LeafInput> leaves(10000);
  for (int i = 0; i < 10000; ++i) {
    keys.push_back((i % 2 ? "b" : "w") + std::to_string(i / 2));
    data.emplace_back(i % 2 ? 4 : 16, static_cast<float>(i));
    leaves[i].meta.dtype = DType::kFloat32;
    leaves[i].meta.shape = {static_cast<int64_t>(data.back().size())};
    leaves[i].data = std::as_bytes(std::span<const float>(data.back()));
  }
  SaveOptions o;
  o.compression = Compression::kNone;
  o.overwrite = true;
  save(path, flat_dict_treedef(keys), leaves, o);
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc < 3) {
    std::fprintf(stderr, "usage: core_probe open|save|read_many|read|views|small ARCHIVE [KEY] [N]\n");
    return 1;
  }
  const std::string mode = argv[1], path = argv[2];
  if (mode == "small") {
    save_small(path);
    return 0;
  }
  if (mode == "open") {
    const int n = std::atoi(argv[4]);
    for (int i = 0; i < n; ++i) {
      Archive a = Archive::open(path);
      if (a.view(a.index_of(argv[3])).empty()) return 1;
    }
    return 0;
  }
  const int rounds = std::atoi(argv[3]);
  if (mode == "save") {
    save_bulk(path, rounds);
    return 0;
  }
  Archive a = Archive::open(path);
  std::vector<size_t> idx;
  std::vector<std::vector<std::byte>> bufs;
  std::vector<std::span<std::byte>> outs;
  for (size_t i = 0; i < a.size(); ++i) {
    idx.push_back(i);
    bufs.emplace_back(a.leaf(i).byte_length);
  }
  for (auto& b : bufs) outs.emplace_back(b);
  for (int r = 0; r < rounds; ++r) {
    if (mode == "read_many") {
      a.read_many(idx, outs);
    } else if (mode == "read") {
      for (size_t i : idx) a.read(i, outs[i]);
    } else if (mode == "views") {
#ifndef CORE_PROBE_NO_VIEW_MANY
      if (!a.view_many(idx).front()) return 1;
#else
      std::fprintf(stderr, "this revision has no Archive::view_many\n");
      return 1;
#endif
    } else {
      std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
      return 1;
    }
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "core_probe: %s\n", e.what());
  return 1;
}
