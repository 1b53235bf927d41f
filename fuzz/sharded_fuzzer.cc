// Fuzz target: a sharded checkpoint directory (SPEC.md "Sharded checkpoints"),
// an index.cask and its shard files in a temporary directory, opened with
// ShardedArchive::open and through its index alone (Archive::verify, which
// runs ShardedArchive::open_index), every leaf read whole and as a strided
// box, every chunk verified. The input is one of two forms (first byte):
//
//  'F'  the files themselves: [u8 n] [u32 little-endian length] x n, then the
//       n files' bytes one after the other: index.cask, then process_0.cask,
//       process_1.cask, ... (seeds: the golden 3.x vectors). Mutations land on
//       LMDB pages, headers and chunk bytes of every file.
//  else a layout program (bytes read in order; missing bytes read as 0): the
//       target writes a real checkpoint with treecask::save -- 1-3 shard
//       files, 1-3 leaves of 0-2 dimensions, each cut along axis 0 into 1-4
//       boxes spread over the files, the index bound (3.1) or not (3.0) --
//       then applies up to 2 perturbations of the index (a box moved: overlap
//       and hole; a box saved with another dtype or shape; a reference to a
//       key or file that is not there, or to the index itself) and up to 2
//       damages of the files (a bit flip, truncation, a file removed, a file
//       replaced by the same file of another save). This reaches the checks
//       of ShardedArchive::open (R5-R7, R9) with manifests whose checksums
//       are right, which random bytes never do.
//
// Properties: a typed treecask::Error or success, never a crash, a sanitizer
// report or a hang; a checkpoint the writer wrote and nothing changed opens,
// reads and verifies (else abort: REFUSED); and when the index was not
// perturbed (and no file of another save was put in an unbound checkpoint),
// every verified read that succeeds returns the saved global array's bytes
// (else abort: WRONG DATA).
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "treecask/treecask.h"

namespace {

namespace fs = std::filesystem;
using namespace treecask;

// The input as a stream of bytes; past the end every read is 0.
struct Input {
  const uint8_t* p;
  size_t n;
  uint8_t u8() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
  uint32_t u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t(u8()) << (8 * i);
    return v;
  }
};

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "%s: %s\n", what, detail.c_str());
  std::abort();
}

const fs::path& work() {
  static const fs::path dir = fs::temp_directory_path() / ("treecask-sharded-fuzz-" + std::to_string(getpid()));
  return dir;
}

void fresh(const fs::path& d) {
  fs::remove_all(d);
  fs::create_directories(d);
}

void put(const fs::path& p, std::span<const uint8_t> bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// One leaf of the layout: the global array and its boxes along axis 0.
struct Leaf {
  DType dtype = DType::kInt32;
  std::vector<int64_t> shape;
  struct Box {
    size_t file = 0;
    int64_t begin = 0, end = 0;  // rows [begin, end) along axis 0 (a 0-d leaf: one box, unused)
  };
  std::vector<Box> boxes;
  uint64_t item() const { return uint64_t(dtype_bits(dtype) / 8); }
  uint64_t row_elems() const {
    uint64_t n = 1;
    for (size_t d = 1; d < shape.size(); ++d) n *= uint64_t(shape[d]);
    return n;
  }
  uint64_t elems() const { return shape.empty() ? 1 : uint64_t(shape[0]) * row_elems(); }
};

// Byte k of leaf `leaf`'s global array in save `save`.
std::byte pattern(size_t leaf, uint64_t k, unsigned save) {
  return std::byte((k * 131 + leaf * 17 + save * 101 + 7) & 0xff);
}

std::vector<std::byte> global_bytes(const Leaf& l, size_t i, unsigned save) {
  std::vector<std::byte> out(l.elems() * l.item());
  for (uint64_t k = 0; k < out.size(); ++k) out[k] = pattern(i, k, save);
  return out;
}

std::string box_key(size_t leaf, size_t box) { return "L" + std::to_string(leaf) + "@" + std::to_string(box); }

const DType kDTypes[] = {DType::kUInt8, DType::kInt16, DType::kInt32, DType::kFloat32, DType::kInt64, DType::kBFloat16};

// Perturbations of the index (what the index says differs from what was saved).
enum class Perturb : uint8_t { kMoveBox, kShardDType, kShardShape, kMissingKey, kMissingFile, kSelf, kCount };

struct Layout {
  size_t files = 1;
  bool bind = false;
  unsigned lz4_mask = 0;
  std::vector<Leaf> leaves;
  struct P {
    Perturb kind;
    size_t leaf, box;
    bool up;
  };
  std::vector<P> perturb;
};

Layout read_layout(Input& in) {
  Layout L;
  L.files = 1 + in.u8() % 3;
  const size_t nleaves = 1 + in.u8() % 3;
  const uint8_t flags = in.u8();
  L.bind = flags & 1;
  L.lz4_mask = (flags >> 1) & 7;
  for (size_t i = 0; i < nleaves; ++i) {
    Leaf l;
    l.dtype = kDTypes[in.u8() % std::size(kDTypes)];
    const size_t rank = in.u8() % 3;
    for (size_t d = 0; d < rank; ++d) l.shape.push_back(in.u8() % 7);
    const size_t nbox = rank == 0 ? 1 : 1 + in.u8() % 4;
    std::vector<int64_t> cuts;
    for (size_t b = 1; b < nbox; ++b) cuts.push_back(rank ? in.u8() % (l.shape[0] + 1) : 0);
    std::sort(cuts.begin(), cuts.end());
    int64_t at = 0;
    for (size_t b = 0; b < nbox; ++b) {
      int64_t end = b + 1 < nbox ? cuts[b] : (rank ? l.shape[0] : 0);
      l.boxes.push_back({size_t(in.u8() % L.files), at, end});
      at = end;
    }
    L.leaves.push_back(std::move(l));
  }
  const size_t np = in.u8() % 3;
  for (size_t k = 0; k < np; ++k) {
    uint8_t kind = in.u8() % uint8_t(Perturb::kCount);
    size_t leaf = in.u8() % L.leaves.size();
    size_t box = in.u8() % L.leaves[leaf].boxes.size();
    L.perturb.push_back({Perturb(kind), leaf, box, bool(in.u8() & 1)});
  }
  return L;
}

bool has(const Layout& L, Perturb kind, size_t leaf, size_t box) {
  for (const auto& p : L.perturb)
    if (p.kind == kind && p.leaf == leaf && p.box == box) return true;
  return false;
}

std::string file_name(size_t f) { return "process_" + std::to_string(f) + ".cask"; }

// Writes the checkpoint of `L` into `dir` (save `which`: its bytes), applying
// the perturbations. Returns false when the writer refused it (typed error).
bool write_checkpoint(const Layout& L, const fs::path& dir, unsigned which) {
  std::map<size_t, std::vector<std::pair<std::string, std::vector<std::byte>>>> data;  // per file
  std::map<size_t, std::vector<LeafMeta>> metas;
  for (size_t i = 0; i < L.leaves.size(); ++i) {
    const Leaf& l = L.leaves[i];
    const auto all = global_bytes(l, i, which);
    const uint64_t row = l.row_elems() * l.item();
    for (size_t b = 0; b < l.boxes.size(); ++b) {
      const auto& bx = l.boxes[b];
      LeafMeta m;
      m.key_path = box_key(i, b);
      m.dtype = l.dtype;
      m.shape = l.shape;
      std::vector<std::byte> bytes = all;
      if (!l.shape.empty()) {
        m.shape[0] = bx.end - bx.begin;
        bytes.assign(all.begin() + int64_t(uint64_t(bx.begin) * row), all.begin() + int64_t(uint64_t(bx.end) * row));
      }
      if (has(L, Perturb::kShardDType, i, b)) {
        m.dtype = l.dtype == DType::kUInt8 ? DType::kInt8 : DType::kUInt8;
        bytes.resize(bytes.size() / l.item());  // one byte per element
      }
      if (has(L, Perturb::kShardShape, i, b)) {
        if (m.shape.empty()) {
          m.shape = {1};
        } else {
          m.shape[0] += 1;
          bytes.resize(bytes.size() + row, std::byte{0x5a});
        }
      }
      metas[bx.file].push_back(m);
      data[bx.file].emplace_back(m.key_path, std::move(bytes));
    }
  }
  std::vector<ShardFile> bound;
  for (auto& [f, entries] : data) {
    std::vector<std::string> keys;
    std::vector<LeafInput> in;
    for (size_t k = 0; k < entries.size(); ++k) {
      keys.push_back(entries[k].first);
      in.push_back({metas[f][k], std::span(entries[k].second), std::nullopt});
    }
    SaveOptions o;
    o.overwrite = true;
    o.durable = false;
    o.chunk_size = 4096;
    o.compression = (L.lz4_mask >> f) & 1 ? Compression::kLZ4 : Compression::kNone;
    o.metadata = {{std::string(kSaveIdKey), std::string(32, char('a' + which))}};
    treecask::save(dir / file_name(f), flat_dict_treedef(keys), in, o);
    bound.push_back(Archive::open(dir / file_name(f)).manifest_fingerprint());
  }
  std::vector<std::string> names;
  std::vector<LeafInput> index;
  for (size_t i = 0; i < L.leaves.size(); ++i) {
    const Leaf& l = L.leaves[i];
    LeafMeta m;
    m.key_path = "a" + std::to_string(i);
    names.push_back(m.key_path);
    m.dtype = l.dtype;
    m.shape = l.shape;
    for (size_t b = 0; b < l.boxes.size(); ++b) {
      ShardRef r{file_name(l.boxes[b].file), escape_key(box_key(i, b)), {}, {}};
      if (!l.shape.empty()) {
        r.start.assign(l.shape.size(), 0);
        r.stop = l.shape;
        r.start[0] = l.boxes[b].begin;
        r.stop[0] = l.boxes[b].end;
      }
      for (const auto& p : L.perturb) {
        if (p.leaf != i || p.box != b) continue;
        if (p.kind == Perturb::kMoveBox && !r.start.empty()) {
          r.start[0] += p.up ? 1 : -1;
          r.stop[0] += p.up ? 1 : -1;
        } else if (p.kind == Perturb::kMissingKey) {
          r.key_path += "x";
        } else if (p.kind == Perturb::kMissingFile) {
          r.file = "missing.cask";
        } else if (p.kind == Perturb::kSelf) {
          r.file = std::string(kShardedIndexName);
          r.key_path = m.key_path;
        }
      }
      m.shards.push_back(std::move(r));
    }
    index.push_back({m, {}, std::nullopt});
  }
  SaveOptions o;
  o.overwrite = true;
  o.durable = false;
  o.metadata = {{std::string(kSaveIdKey), std::string(32, char('a' + which))}};
  if (L.bind) o.shard_files = bound;
  try {
    treecask::save(dir / kShardedIndexName, flat_dict_treedef(names), index, o);
  } catch (const Error&) {
    if (L.perturb.empty()) throw;  // a plain layout must be writable
    return false;  // e.g. R8 (a bound index naming a file it does not bind), R2/R3 of a moved box
  }
  return true;
}

// Damage to the written files: [kind, file (the index is number `files`), args].
struct Damage {
  bool any = false;            // a file was changed, removed or replaced
  bool foreign_index = false;  // the index of another save was put in place
  bool foreign_shard = false;  // a shard file of another save was put in place
};
Damage damage(Input& in, const Layout& L, const fs::path& dir, const fs::path& other) {
  Damage out;
  const size_t n = in.u8() % 3;
  for (size_t k = 0; k < n; ++k) {
    const uint8_t kind = in.u8() % 4;
    const size_t f = in.u8() % (L.files + 1);
    const fs::path p = dir / (f == L.files ? std::string(kShardedIndexName) : file_name(f));
    const uint32_t at = in.u8() | uint32_t(in.u8()) << 8 | uint32_t(in.u8()) << 16;
    const uint8_t bit = in.u8() % 8;
    std::error_code ec;
    if (!fs::exists(p, ec)) continue;
    out.any = true;
    const uint64_t size = fs::file_size(p, ec);
    if (kind == 0 && size > 0) {  // flip one bit
      std::fstream s(p, std::ios::binary | std::ios::in | std::ios::out);
      s.seekg(std::streamoff(at % size));
      char c = 0;
      s.read(&c, 1);
      c = char(c ^ (1 << bit));
      s.seekp(std::streamoff(at % size));
      s.write(&c, 1);
    } else if (kind == 1) {
      fs::resize_file(p, size ? at % size : 0, ec);
    } else if (kind == 2) {
      fs::remove(p, ec);
    } else if (fs::exists(other / p.filename(), ec)) {  // the same file of another save
      fs::copy_file(other / p.filename(), p, fs::copy_options::overwrite_existing, ec);
      (f == L.files ? out.foreign_index : out.foreign_shard) = true;
    }
  }
  return out;
}

// Reads and verifies the checkpoint in `dir` every way there is. With
// `expected` (leaf i's global bytes), a verified read that succeeds must give
// them; with `must_open`, the checkpoint must open, read and verify; with
// `must_refuse`, it must not open (a bound index with a shard file of another
// save in the directory: SPEC.md R9).
void exercise(const fs::path& dir, const std::vector<std::vector<std::byte>>* expected, bool must_open,
              bool must_refuse = false) {
  auto refused = [&](const Error& e) {
    if (must_open) fail("REFUSED: a checkpoint the writer wrote, unchanged", e.what());
  };
  try {
    Archive::open(dir / kShardedIndexName).verify();
    if (must_refuse) fail("ACCEPTED", "verify() of a bound index beside a shard file of another save");
  } catch (const Error&) {
  }
  try {
    ShardedArchive s = ShardedArchive::open(dir);
    if (must_refuse) fail("ACCEPTED", "a bound index opened beside a shard file of another save");
    const bool compare = expected && expected->size() == s.size();
    for (size_t i = 0; i < s.size(); ++i) {
      LeafInfo info = s.leaf(i);
      if (info.byte_length > (1u << 20)) continue;
      std::vector<std::byte> out(info.byte_length);
      try {
        s.read(i, out, Verify::kYes);
        if (compare && out != (*expected)[i]) fail("WRONG DATA", "read() of leaf " + std::to_string(i));
      } catch (const Error& e) {
        refused(e);
      }
      try {
        s.read(i, out, Verify::kNo);
      } catch (const Error& e) {
        refused(e);
      }
      // The inner box [shape/3, shape - shape/4) into a buffer with a gap after each element.
      const uint64_t item = uint64_t(dtype_bits(info.dtype) / 8);
      const size_t rank = info.shape.size();
      if (item == 0 || rank == 0) continue;
      std::vector<int64_t> start(rank), stop(rank), strides(rank);
      uint64_t count = 1;
      for (size_t d = 0; d < rank; ++d) {
        start[d] = info.shape[d] / 3;
        stop[d] = info.shape[d] - info.shape[d] / 4;
        count *= uint64_t(stop[d] - start[d]);
      }
      int64_t st = int64_t(item * 2);
      for (size_t d = rank; d-- > 0;) {
        strides[d] = st;
        st *= std::max<int64_t>(stop[d] - start[d], 1);  // never a stride 0 (refused along an extent > 1)
      }
      std::vector<std::byte> box(count * item * 2, std::byte{0xee});
      try {
        s.read_slice(i, start, stop, box, strides, Verify::kYes, 1);
        if (compare && rank <= 2) {  // element (r, c) of the box from the global array
          const int64_t cols = rank == 2 ? info.shape[1] : 1;
          const int64_t r0 = start[0], r1 = stop[0];
          const int64_t c0 = rank == 2 ? start[1] : 0, c1 = rank == 2 ? stop[1] : 1;
          uint64_t k = 0;
          for (int64_t r = r0; r < r1; ++r)
            for (int64_t c = c0; c < c1; ++c, ++k)
              if (std::memcmp(box.data() + k * item * 2, (*expected)[i].data() + uint64_t(r * cols + c) * item,
                              item) != 0 ||
                  box[k * item * 2 + item] != std::byte{0xee})
                fail("WRONG DATA", "read_slice() of leaf " + std::to_string(i));
        }
      } catch (const Error& e) {
        refused(e);
      }
    }
    auto errors = s.verify();
    if (must_open && !errors.empty()) fail("REFUSED: verify() of an unchanged checkpoint", errors[0].what());
  } catch (const Error& e) {
    refused(e);
  }
  // The index alone: Archive::verify() of it is the checkpoint's verify.
  try {
    Archive index = Archive::open(dir / kShardedIndexName);
    auto errors = index.verify();
    if (must_open && !errors.empty()) fail("REFUSED: verify() of an unchanged checkpoint's index", errors[0].what());
  } catch (const Error& e) {
    refused(e);
  }
  try {
    auto r = open_reader(dir);
    (void)r->size();
  } catch (const Error& e) {
    refused(e);
  }
}

void run_files(Input& in) {
  const fs::path dir = work() / "files";
  fresh(dir);
  const size_t n = 1 + in.u8() % 4;
  std::vector<uint32_t> len(n);
  for (auto& l : len) l = in.u32();
  for (size_t k = 0; k < n; ++k) {
    const size_t take = std::min<size_t>(len[k], in.n);
    put(dir / (k == 0 ? std::string(kShardedIndexName) : file_name(k - 1)), {in.p, take});
    in.p += take;
    in.n -= take;
  }
  exercise(dir, nullptr, false);
}

void run_layout(Input& in) {
  const fs::path dir = work() / "ckpt", other = work() / "other";
  fresh(dir);
  fresh(other);
  Layout L = read_layout(in);
  Layout plain = L;
  plain.perturb.clear();
  try {
    if (!write_checkpoint(L, dir, 0)) return;
    write_checkpoint(plain, other, 1);  // the same layout saved again, other bytes
  } catch (const Error& e) {
    // A perturbed box (another dtype or shape) may not be writable; a plain layout always is.
    if (L.perturb.empty()) fail("the writer refused a layout it must write", e.what());
    return;
  }
  const Damage d = damage(in, L, dir, other);
  std::vector<std::vector<std::byte>> expected;
  for (size_t i = 0; i < L.leaves.size(); ++i) expected.push_back(global_bytes(L.leaves[i], i, 0));
  // What the index says is what was saved, unless it was perturbed, replaced by another save's,
  // or a shard file of another save was put in an unbound checkpoint (nothing to detect it by:
  // SPEC.md R9 needs 3.1). A bound one must refuse that file.
  const bool plain_index = L.perturb.empty() && !d.foreign_index;
  const bool comparable = plain_index && (!d.foreign_shard || L.bind);
  exercise(dir, comparable ? &expected : nullptr, L.perturb.empty() && !d.any,
           plain_index && L.bind && d.foreign_shard);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in{data, size};
  if (size > 0 && data[0] == 'F') {
    in.u8();
    run_files(in);
  } else {
    in.u8();
    run_layout(in);
  }
  return 0;
}
