// Fuzz target: the safetensors importer (src/interop: import_safetensors,
// parse_safetensors) and the export of what it imported. The input is one of
// two forms (first byte):
//
//  'S'  the Hugging Face sharded layout: [u8 n] (1-3 shards), [u32
//       little-endian length] x (n + 1), then the bytes of
//       model.safetensors.index.json and of model-0000k-of-0000n.safetensors,
//       k = 1..n, one after the other, imported from the index.
//  else the rest of the input is one .safetensors file (seeds: files written
//       by the reference `safetensors` package).
//
// The files are written to a temporary directory and imported into an
// archive; what the import wrote is opened, read and verified, then exported
// back to safetensors (one file, and the sharded layout).
// Properties: a typed treecask::Error or success, never a crash, a sanitizer
// report or a hang; and for one file, when the import succeeds, the file is
// one parse_safetensors accepts and the archive holds exactly its tensors
// (name -> key path, dtype, shape, bytes) and metadata, and an export of the
// archive parses back to the same tensors (else abort: WRONG DATA).
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
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "convert.h"
#include "safetensors.h"
#include "treecask/treecask.h"

namespace {

namespace fs = std::filesystem;
using namespace treecask;

[[noreturn]] void wrong(const std::string& what) {
  std::fprintf(stderr, "WRONG DATA: %s\n", what.c_str());
  std::abort();
}

const fs::path& work() {
  static const fs::path dir = fs::temp_directory_path() / ("treecask-st-fuzz-" + std::to_string(getpid()));
  return dir;
}

void put(const fs::path& p, std::span<const uint8_t> bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::vector<std::byte> slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(c.size());
  if (!c.empty()) std::memcpy(out.data(), c.data(), c.size());
  return out;
}

// The tensors of a parsed file, each with its bytes.
struct Tensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
};

std::vector<Tensor> tensors_of(std::span<const std::byte> file, const interop::SafetensorsHeader& h) {
  std::vector<Tensor> out;
  for (const auto& t : h.tensors) {
    auto b = file.subspan(h.data_start + t.begin, t.end - t.begin);
    out.push_back({t.name, t.dtype, t.shape, {b.begin(), b.end()}});
  }
  std::sort(out.begin(), out.end(), [](const Tensor& a, const Tensor& b) { return a.name < b.name; });
  return out;
}

// Checks that `archive` holds exactly `want` (by name) and, with `metadata`, that metadata.
void check_archive(const Archive& a, const std::vector<Tensor>& want, const KeyValues* metadata) {
  if (a.size() != want.size()) wrong("the archive has " + std::to_string(a.size()) + " leaves, the file " +
                                     std::to_string(want.size()) + " tensors");
  if (metadata && a.metadata() != *metadata) wrong("the archive's metadata differ from __metadata__");
  for (const Tensor& t : want) {
    auto i = a.find(escape_key(t.name));
    if (!i) wrong("no leaf for tensor '" + t.name + "'");
    LeafInfo info = a.leaf(*i);
    if (info.dtype != t.dtype || info.shape != t.shape) wrong("dtype or shape of '" + t.name + "'");
    std::vector<std::byte> out(info.byte_length);
    a.read(*i, out, Verify::kYes);
    if (out != t.bytes) wrong("the bytes of '" + t.name + "'");
  }
}

void one_file(std::span<const uint8_t> bytes) {
  const fs::path dir = work() / "one";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path in = dir / "model.safetensors", out = dir / "model.cask", back = dir / "back.safetensors";
  put(in, bytes);
  const auto file = std::as_bytes(bytes);
  std::optional<interop::SafetensorsHeader> header;
  try {
    header = interop::parse_safetensors(file, in.string());
  } catch (const Error&) {
  }
  SaveOptions o;
  o.durable = false;
  try {
    interop::import_safetensors(in.string(), out.string(), o);
  } catch (const Error&) {
    return;
  }
  if (!header) wrong("import accepted a file parse_safetensors refuses");
  const auto want = tensors_of(file, *header);
  Archive a = Archive::open(out);
  check_archive(a, want, header->has_metadata ? &header->metadata : nullptr);
  if (!a.verify().empty()) wrong("verify() of the imported archive");
  try {
    interop::export_safetensors(a, back.string(), {});
  } catch (const Error&) {
    return;  // a name or value safetensors cannot hold on the way back, refused by name
  }
  const auto again = slurp(back);
  interop::SafetensorsHeader h2 = interop::parse_safetensors(again, back.string());
  const auto got = tensors_of(again, h2);
  if (got.size() != want.size()) wrong("the export has another number of tensors");
  for (size_t k = 0; k < got.size(); ++k)
    if (got[k].name != want[k].name || got[k].dtype != want[k].dtype || got[k].shape != want[k].shape ||
        got[k].bytes != want[k].bytes)
      wrong("the export's tensor '" + want[k].name + "'");
}

void sharded(std::span<const uint8_t> rest) {
  const fs::path dir = work() / "hub";
  fs::remove_all(dir);
  fs::create_directories(dir);
  size_t pos = 0;
  auto u8 = [&]() -> uint8_t { return pos < rest.size() ? rest[pos++] : 0; };
  const size_t n = 1 + u8() % 3;
  std::vector<uint32_t> len(n + 1);
  for (auto& l : len) l = uint32_t(u8()) | uint32_t(u8()) << 8 | uint32_t(u8()) << 16 | uint32_t(u8()) << 24;
  for (size_t k = 0; k <= n; ++k) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k, n);
    const size_t take = std::min<size_t>(len[k], rest.size() - pos);
    put(dir / (k == 0 ? std::string("model.safetensors.index.json") : std::string(name)), rest.subspan(pos, take));
    pos += take;
  }
  SaveOptions o;
  o.durable = false;
  try {
    interop::import_safetensors((dir / "model.safetensors.index.json").string(), (dir / "m.cask").string(), o);
    Archive a = Archive::open(dir / "m.cask");
    if (!a.verify().empty()) wrong("verify() of the imported archive");
    interop::SafetensorsExportOptions e;
    e.max_shard_size = 64;
    interop::export_safetensors(a, (dir / "back").string(), e);
  } catch (const Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> in(data, size);
  if (!in.empty() && in[0] == 'S') return sharded(in.subspan(1)), 0;
  one_file(in.empty() ? in : in.subspan(1));
  return 0;
}
