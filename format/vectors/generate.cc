// Writes the golden vectors of one format version into format/vectors/ (run
// once per format version, by hand: `build/format/vectors/treecask_make_vectors
// format/vectors 2`, or `... 3.1` for a minor version), or with `pages` instead of a
// version the vectors of other LMDB page sizes. Never rerun for an existing version:
// committed vectors are the compatibility promise (SPEC.md "Versioning").
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "contents.h"
#include "pages.h"  // tests/: LMDB page sizes other than the OS page (with tests/page_shim.c)

namespace fs = std::filesystem;

static std::vector<char> slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
static void spit(const fs::path& p, const std::vector<char>& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(b.data(), std::streamsize(b.size()));
}

static void write_vector(const fs::path& out, const golden::Vector& v) {
  std::vector<std::vector<std::byte>> data;
  std::vector<treecask::LeafInput> in;
  for (const auto& l : v.leaves) data.push_back(l.bytes());
  for (size_t i = 0; i < v.leaves.size(); ++i)
    in.push_back({v.leaves[i].meta, std::span(data[i]), std::nullopt});
  auto opt = v.options;
  opt.overwrite = true;
  treecask::save(out / v.file, v.treedef, in, opt);
}

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr,
                 "usage: %s OUTPUT_DIR MAJOR[.MINOR]   (writes the vectors of format MAJOR.MINOR)\n"
                 "       %s OUTPUT_DIR pages   (writes the vectors of other LMDB page sizes)\n",
                 argv[0], argv[0]);
    return 2;
  }
  fs::path out = argv[1];
  if (std::strcmp(argv[2], "pages") == 0) {
    for (const auto& v : golden::all_vectors()) {
      if (v.page_size == 0) continue;
      {  // LMDB takes the OS page size, at most 32768; 65536 is 32768 doubled
        tc_test::OsPageSize os(std::min<uint32_t>(v.page_size, 32768));
        write_vector(out, v);
      }
      if (v.page_size == 65536) {
        auto b = slurp(out / v.file);
        auto doubled = tc_test::double_pages(std::as_bytes(std::span(b)));
        std::ofstream(out / v.file, std::ios::binary | std::ios::trunc)
            .write(reinterpret_cast<const char*>(doubled.data()), std::streamsize(doubled.size()));
      }
      auto b = slurp(out / v.file);
      if (tc_test::page_size_of(std::as_bytes(std::span(b))) != v.page_size) {
        std::fprintf(stderr, "%s: not %u-byte pages\n", v.file.c_str(), unsigned(v.page_size));
        return 1;
      }
      std::printf("wrote %s\n", (out / v.file).c_str());
    }
    return 0;
  }
  const int major = std::atoi(argv[2]);
  const char* dot = std::strchr(argv[2], '.');
  const int minor = dot ? std::atoi(dot + 1) : 0;
  for (const auto& v : golden::all_vectors()) {
    if (v.major != major || minor != 0 || v.page_size != 0) continue;
    write_vector(out, v);
    std::printf("wrote %s\n", (out / v.file).c_str());
  }
  if (major == 4) {
    auto b = slurp(out / "v4_0_dtypes.cask");  // header record major version 4 -> 5
    auto at = std::search(b.begin(), b.end(), "TREECASK", "TREECASK" + 8);
    at[8] = 5;
    spit(out / "bad_major_5.cask", b);
    std::puts("wrote bad_major_5.cask");
    return 0;
  }
  if (major == 3 && minor == 1) {
    // 3.1: the same checkpoint with the index binding its shard files, and a
    // copy whose process_1.cask comes from another save of the same layout.
    golden::write_sharded(out / "v3_1_bound", "00112233445566778899aabbccddeeff", true);
    std::puts("wrote v3_1_bound/");
    golden::write_sharded(out / "other_save", "ffeeddccbbaa99887766554433221100", true);
    fs::copy(out / "v3_1_bound", out / "bad_v3_1_stale_shard", fs::copy_options::recursive);
    fs::copy_file(out / "other_save" / "process_1.cask", out / "bad_v3_1_stale_shard" / "process_1.cask",
                  fs::copy_options::overwrite_existing);
    fs::remove_all(out / "other_save");
    std::puts("wrote bad_v3_1_stale_shard/");
    return 0;
  }
  if (major == 3) {
    // The sharded checkpoint directory: shard files (format 1.0) and index (3.0).
    fs::path dir = out / golden::sharded_vector().dir;
    golden::write_sharded(dir, "", false);
    std::printf("wrote %s/\n", dir.c_str());
    {
      auto b = slurp(dir / "index.cask");  // header record major version 3 -> 4
      auto at = std::search(b.begin(), b.end(), "TREECASK", "TREECASK" + 8);
      at[8] = 4;
      spit(out / "bad_major_4.cask", b);
      std::puts("wrote bad_major_4.cask");
    }
    return 0;
  }
  if (major == 2) {
    auto b = slurp(out / "v2_0_shuffle.cask");  // header record major version 2 -> 3
    auto at = std::search(b.begin(), b.end(), "TREECASK", "TREECASK" + 8);
    at[8] = 3;
    spit(out / "bad_major_3.cask", b);
    std::puts("wrote bad_major_3.cask");
    return 0;
  }
  if (major != 1) return 0;
  // Inputs that must fail, derived from the tree vector by patching bytes.
  auto tree = slurp(out / "v1_0_tree.cask");
  {
    auto b = tree;  // header record major version 1 -> 2
    auto at = std::search(b.begin(), b.end(), "TREECASK", "TREECASK" + 8);
    at[8] = 2;
    spit(out / "bad_newer_major.cask", b);
  }
  {
    auto b = tree;  // one flipped bit in the payload of "nested/0/0"
    golden::Leaf l = golden::tree_vector().leaves[19];
    auto bytes = l.bytes();
    auto at = std::search(b.begin(), b.end(), reinterpret_cast<const char*>(bytes.data()),
                          reinterpret_cast<const char*>(bytes.data()) + bytes.size());
    at[5] ^= 0x10;
    spit(out / "bad_blob_checksum.cask", b);
  }
  {
    auto b = tree;  // cut in half
    b.resize(b.size() / 2);
    spit(out / "bad_truncated.cask", b);
  }
  std::puts("wrote bad_newer_major.cask bad_blob_checksum.cask bad_truncated.cask");
  return 0;
}
