// Structure-aware fuzz target: a real archive, damaged as the input says.
//
// At start-up the seed archives of fuzz_util.h are written once (plus a
// "wide" one whose blob database has branch pages). The input picks one
// (first byte) and then lists damage operations -- bit flips, byte and
// 16/64-bit field writes at page-relative offsets, truncation, page swaps and
// duplication, range copies -- that land on LMDB structure far more often
// than random bytes would. The damaged file is read through every API.
// Properties: a typed treecask::Error or success, never a crash; and any
// read that passes checksum verification returns exactly the original bytes.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "fuzz_util.h"

namespace {

struct Base {
  std::vector<std::byte> file;
  std::vector<std::vector<std::byte>> leaves;
  size_t page = 4096;
  size_t max_leaves = SIZE_MAX;
};

std::vector<Base>& bases() {
  static std::vector<Base> b;
  return b;
}

void init_bases() {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("treecask-mutate-" + std::to_string(getpid()));
  fs::create_directories(dir);
  auto trees = tc_fuzz::seed_trees();
  {
    // Enough blobs (one per LZ4 leaf over 64 KiB) that the blob database
    // needs two leaf pages and a branch page: 190 leaves of 65600 zero bytes,
    // each a one-page blob (two overflow pages), ~1.6 MB on disk.
    tc_fuzz::Tree wide;
    std::vector<std::string> keys;
    for (int i = 0; i < 190; ++i) {
      keys.push_back("w" + std::to_string(i));
      wide.leaf(treecask::DType::kUInt8, {65600}, std::vector<std::byte>(65600),
                treecask::Compression::kLZ4);
    }
    wide.treedef = treecask::flat_dict_treedef(keys);
    trees.emplace_back("wide", std::move(wide));
  }
  for (auto& [name, tree] : trees) {
    fs::path p = dir / (name + ".cask");
    tree.save(p);
    Base b;
    b.file = tc_fuzz::slurp(p);
    b.leaves = tree.data;
    b.page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    if (name == "wide") b.max_leaves = 8;
    bases().push_back(std::move(b));
  }
  fs::remove_all(dir);
}

// Reads little-endian integers off the front of the input; 0 when exhausted.
struct Input {
  const uint8_t* p;
  size_t n;
  bool empty() const { return n == 0; }
  uint64_t take(int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes && n > 0; ++i, ++p, --n) v |= uint64_t{*p} << (8 * i);
    return v;
  }
};

void put(std::vector<std::byte>& f, size_t at, uint64_t v, int bytes) {
  for (int i = 0; i < bytes && at + i < f.size(); ++i) f[at + i] = std::byte(v >> (8 * i));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  init_bases();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (bases().empty()) init_bases();
  Input in{data, size};
  const Base& base = bases()[in.take(1) % bases().size()];
  std::vector<std::byte> f = base.file;
  const size_t ps = base.page;
  for (int ops = 0; !in.empty() && ops < 64 && !f.empty(); ++ops) {
    size_t pages = std::max<size_t>(1, f.size() / ps);
    uint64_t op = in.take(1);
    switch (op % 9) {
      case 0: {  // flip one bit anywhere
        size_t at = in.take(4) % f.size();
        f[at] ^= std::byte(1u << (in.take(1) % 8));
        break;
      }
      case 1: {  // one byte anywhere
        size_t at = in.take(4) % f.size();
        f[at] = std::byte(in.take(1));
        break;
      }
      case 2: {  // a 16-bit field of a page: flags, lower, upper, node offsets, sizes
        size_t at = (in.take(2) % pages) * ps + (in.take(2) % ps) / 2 * 2;
        put(f, at, in.take(2), 2);
        break;
      }
      case 3: {  // a 64-bit field of a page: page numbers, counts, lengths
        size_t at = (in.take(2) % pages) * ps + (in.take(2) % ps) / 8 * 8;
        static const uint64_t kValues[] = {0, 1, 2, 3, ~uint64_t{0}, uint64_t{1} << 31,
                                           uint64_t{1} << 32, uint64_t{1} << 40};
        uint64_t pick = in.take(1);
        uint64_t v = pick < 8 ? kValues[pick] : pick < 16 ? pages - 8 + pick : pick < 32 ? ps * (pick - 16) : pick;
        put(f, at, v, 8);
        break;
      }
      case 4: {  // truncate, at a page boundary or anywhere
        uint64_t v = in.take(4);
        size_t cut = (v & 1) ? (v >> 1) % f.size() : ((v >> 1) % pages) * ps;
        f.resize(cut);
        break;
      }
      case 5: {  // swap two pages
        size_t a = in.take(2) % pages, b = in.take(2) % pages;
        if (f.size() >= (std::max(a, b) + 1) * ps && a != b)
          std::swap_ranges(f.begin() + a * ps, f.begin() + (a + 1) * ps, f.begin() + b * ps);
        break;
      }
      case 6: {  // page a duplicated over page b
        size_t a = in.take(2) % pages, b = in.take(2) % pages;
        if (f.size() >= (std::max(a, b) + 1) * ps && a != b)
          std::copy(f.begin() + a * ps, f.begin() + (a + 1) * ps, f.begin() + b * ps);
        break;
      }
      case 7: {  // copy a short range (a node, a key, a record) elsewhere
        size_t a = in.take(4) % f.size(), b = in.take(4) % f.size();
        size_t n = std::min<size_t>({in.take(1) + 1, f.size() - a, f.size() - b});
        std::memmove(f.data() + b, f.data() + a, n);
        break;
      }
      case 8: {  // fill a page with one byte value
        size_t a = in.take(2) % pages;
        std::byte v = std::byte(in.take(1));
        if (f.size() >= (a + 1) * ps) std::fill(f.begin() + a * ps, f.begin() + (a + 1) * ps, v);
        break;
      }
    }
  }
  static tc_fuzz::MemFile file;
  file.write(f);
  tc_fuzz::exercise(file.path(), &base.leaves, base.max_leaves);
  return 0;
}
