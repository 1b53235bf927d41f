// An inference server's view of a checkpoint: map the archive read-only once,
// hand out zero-copy weight views to many worker threads, never copy a byte.
//
//   serve_weights ARCHIVE [KEY_PATH...]
//
// Prints each requested leaf's dtype, shape and the address alignment of its
// view (all leaves when no key path is given). Exit 1 on any treecask::Error.
#include <treecask/treecask.h>

#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s ARCHIVE [KEY_PATH...]\n", argv[0]);
    return 2;
  }
  try {
    // Validate the whole file once at start-up (structure + every checksum),
    // then read without re-hashing on the hot path.
    treecask::OpenOptions options;
    options.verify_checksums = false;
    treecask::Archive weights = treecask::Archive::open(argv[1], options);
    if (auto damaged = weights.verify(); !damaged.empty()) {
      for (const auto& e : damaged) std::fprintf(stderr, "%s\n", e.what());
      return 1;
    }
    std::vector<size_t> wanted;
    for (int i = 2; i < argc; ++i) wanted.push_back(weights.index_of(argv[i]));
    if (wanted.empty())
      for (size_t i = 0; i < weights.size(); ++i) wanted.push_back(i);

    // Workers share the one mapping; spans stay valid while `weights` lives.
    std::vector<std::thread> workers;
    std::vector<uint64_t> checks(wanted.size());
    for (size_t w = 0; w < wanted.size(); ++w)
      workers.emplace_back([&, w] {
        treecask::LeafInfo info = weights.leaf(wanted[w]);
        if (info.codec != treecask::Codec::kNone || info.num_parts > 1) {
          std::vector<std::byte> copy(info.byte_length);  // compressed: one copy
          weights.read(wanted[w], copy);
          checks[w] = copy.empty() ? 0 : uint64_t(copy[0]);
        } else {
          std::span<const std::byte> view = weights.view(wanted[w]);  // zero-copy
          checks[w] = reinterpret_cast<uintptr_t>(view.data()) % 64;
        }
      });
    for (auto& t : workers) t.join();
    for (size_t w = 0; w < wanted.size(); ++w) {
      treecask::LeafInfo info = weights.leaf(wanted[w]);
      std::printf("%-40s %-10s rank %zu  %10llu bytes  %s\n", info.key_path.c_str(),
                  std::string(treecask::dtype_name(info.dtype)).c_str(), info.shape.size(),
                  static_cast<unsigned long long>(info.byte_length),
                  info.codec == treecask::Codec::kNone
                      ? (checks[w] == 0 ? "view, 64-byte aligned" : "view, MISALIGNED")
                      : "copied (lz4)");
    }
  } catch (const treecask::Error& e) {
    std::fprintf(stderr, "serve_weights: %s\n", e.what());
    return 1;
  }
  return 0;
}
