// export_safetensors (convert.h): an archive or a sharded checkpoint
// directory out as one .safetensors file or the Hub's sharded layout; and
// parse_size, the Hub's size syntax.
#include "convert.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <system_error>
#include <utility>

#include <nlohmann/json.hpp>

#include "files.h"
#include "safetensors.h"

namespace treecask::interop {
namespace fs = std::filesystem;

namespace {

using OJson = nlohmann::ordered_json;  // keeps the stored key order
using SJson = nlohmann::json;          // sorted keys (Python's sort_keys=True)

constexpr std::string_view kHfPrefix = "treecask.hf.";

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

// One tensor to write: the leaf of the source it comes from, and its header
// entry (name, dtype, shape; begin/end are placed when its file is laid out).
struct Item {
  size_t leaf;
  SafetensorsTensor tensor;
  uint64_t size;  // data bytes
};

// True when `def` is one dict whose children are all leaves (what
// flat_dict_treedef builds and every import writes): such a tree names
// tensors by its dict keys verbatim, any other by key paths.
bool is_flat_dict(const TreeDef& def) {
  if (def.empty() || def[0].kind != NodeKind::kDict || def.size() != def[0].arity + 1) return false;
  return std::all_of(def.begin() + 1, def.end(), [](const TreeNode& n) { return n.kind == NodeKind::kLeaf; });
}

// The tensors of `source`, named and checked by the one rule both layouts
// follow (convert.h export_safetensors).
std::vector<Item> name_tensors(const Reader& source) {
  const bool flat = is_flat_dict(source.treedef());
  std::vector<Item> items;
  std::set<std::string> names;
  for (size_t i = 0; i < source.size(); ++i) {
    const LeafInfo info = source.leaf(i);
    auto unsupported = [&](const std::string& why) {
      return Error(ErrorCode::kUnsupported, source.path(), info.key_path, why);
    };
    if (info.value_kind != ValueKind::kArray) {
      throw unsupported("a Python scalar/str leaf; safetensors holds array leaves only");
    }
    if (std::string why = safetensors_refusal(info.dtype, info.shape); !why.empty()) {
      throw unsupported(why);
    }
    Item it{i, {}, info.byte_length};
    it.tensor.name = flat ? source.treedef()[0].keys[i] : info.key_path;
    if (it.tensor.name.empty()) {
      throw unsupported("the archive is a single unnamed array; safetensors needs tensor names");
    }
    if (it.tensor.name == "__metadata__") {
      throw unsupported("a tensor cannot be named \"__metadata__\" in safetensors");
    }
    if (!names.insert(it.tensor.name).second) {
      throw unsupported("duplicate tensor name \"" + it.tensor.name + "\"");
    }
    it.tensor.dtype = info.dtype;
    it.tensor.shape = info.shape;
    items.push_back(std::move(it));
  }
  return items;
}

// Throws Error(kUnsupported) naming `file` when a key of `metadata` appears
// twice (safetensors' __metadata__ is a JSON object: keys are unique).
void check_unique_keys(const KeyValues& metadata, const std::string& file) {
  std::set<std::string> keys;
  for (const auto& kv : metadata) {
    if (!keys.insert(kv.first).second) {
      throw Error(ErrorCode::kUnsupported, file, "",
                  "metadata key \"" + kv.first + "\" appears twice; safetensors keys are unique");
    }
  }
}

// The header of one file holding `items[k]` for k in `group`, in that order,
// with data offsets tiling its data section. Errors name `source` (bad
// UTF-8) or `target` (a header over the format's limit).
std::string layout_header(const std::vector<Item>& items, const std::vector<size_t>& group,
                          bool has_metadata, const KeyValues& metadata, const std::string& source,
                          const std::string& target) {
  std::vector<SafetensorsTensor> tensors;
  tensors.reserve(group.size());
  uint64_t offset = 0;
  for (size_t k : group) {
    SafetensorsTensor t = items[k].tensor;
    t.begin = offset;
    t.end = offset + items[k].size;
    offset = t.end;
    tensors.push_back(std::move(t));
  }
  std::string header;
  try {
    header = safetensors_header(has_metadata, metadata, tensors);
  } catch (const OJson::exception& e) {
    throw Error(ErrorCode::kUnsupported, source, "",
                std::string("names or metadata are not valid UTF-8: ") + e.what());
  }
  if (header.size() - 8 > kSafetensorsMaxHeader) {
    throw Error(ErrorCode::kUnsupported, target, "",
                "the safetensors header would be " + std::to_string(header.size() - 8) +
                    " bytes, over the format's limit of " + std::to_string(kSafetensorsMaxHeader));
  }
  return header;
}

// Tensor data bytes written so far, reported through options.progress.
struct Progress {
  const std::function<void(uint64_t, uint64_t)>& report;
  uint64_t total = 0;
  uint64_t done = 0;
};

// Writes `header`, then the bytes of items[k] for k in `group`, to `out`.
void write_file(const Reader& source, const std::vector<Item>& items,
                const std::vector<size_t>& group, const std::string& header, OutputFile& out,
                Progress& progress) {
  out.write(header);
  for (size_t k : group) {
    for_each_leaf_piece(source, items[k].leaf, [&](std::span<const std::byte> piece) {
      out.write(piece);
      progress.done += piece.size();
      if (progress.report) progress.report(progress.done, progress.total);
    });
  }
}

SafetensorsExport export_one_file(const Reader& source, const std::string& output,
                                  const std::vector<Item>& items, const SafetensorsExportOptions& options,
                                  Progress& progress) {
  const KeyValues& metadata = source.metadata();
  check_unique_keys(metadata, source.path());
  std::vector<size_t> all(items.size());
  for (size_t k = 0; k < items.size(); ++k) all[k] = k;
  const std::string header = layout_header(items, all, !metadata.empty(), metadata, source.path(), source.path());
  OutputFile out(output, options.overwrite);
  write_file(source, items, all, header, out, progress);
  out.commit();
  SafetensorsExport r;
  r.files.push_back(output);
  r.file_bytes = out.bytes_written();
  return r;
}

// Greedy packing in leaf order (convert.h): indexes into `items`, per shard.
std::vector<std::vector<size_t>> pack(const std::vector<Item>& items, uint64_t max_shard_size) {
  std::vector<std::vector<size_t>> groups;
  uint64_t current = 0;
  for (size_t k = 0; k < items.size(); ++k) {
    const uint64_t size = items[k].size;
    if (size > max_shard_size) {
      groups.push_back({k});
      current = max_shard_size + 1;  // close it: the next tensor starts a new shard
      continue;
    }
    if (groups.empty() || current + size > max_shard_size) {
      groups.emplace_back();
      current = 0;
    }
    groups.back().push_back(k);
    current += size;
  }
  if (groups.empty()) groups.emplace_back();  // an archive with no leaves: one empty shard
  return groups;
}

SafetensorsExport export_sharded(const Reader& source, const std::string& dir,
                                 const std::vector<Item>& items, const SafetensorsExportOptions& options,
                                 Progress& progress) {
  const std::string& file = source.path();
  const std::vector<std::vector<size_t>> groups = pack(items, *options.max_shard_size);
  const size_t n = groups.size();

  // Metadata: the archive's without treecask.hf. keys for every shard, or each
  // shard's own from kHfShardMetadataKey; the index's from kHfIndexMetadataKey.
  KeyValues common;
  std::optional<OJson> per_shard, index_meta;
  for (const auto& [k, v] : source.metadata()) {
    if (k == kHfShardMetadataKey || k == kHfIndexMetadataKey) {
      OJson j;
      try {
        j = OJson::parse(v);
      } catch (const OJson::exception& e) {
        throw Error(ErrorCode::kInvalidArgument, file, "", "metadata " + k + " is not JSON: " + e.what());
      }
      if (!j.is_object()) throw Error(ErrorCode::kInvalidArgument, file, "", "metadata " + k + " is not a JSON object");
      (k == kHfShardMetadataKey ? per_shard : index_meta) = std::move(j);
    } else if (k.rfind(kHfPrefix, 0) != 0) {
      common.emplace_back(k, v);
    }
  }
  check_unique_keys(common, file);
  if (per_shard) {
    bool match = per_shard->size() == n;
    for (size_t g = 0; match && g < n; ++g) match = per_shard->contains(shard_name(g, n));
    if (!match) per_shard.reset();
  }

  // Refuse before writing anything if a target exists.
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(ErrorCode::kIo, dir, "", "cannot create the directory: " + ec.message());
  const fs::path d(dir);
  SafetensorsExport out;
  out.index = (d / "model.safetensors.index.json").string();
  for (size_t g = 0; g < n; ++g) out.files.push_back((d / shard_name(g, n)).string());
  if (!options.overwrite) {
    for (const std::string& p : out.files) {
      if (exists(p)) throw Error(ErrorCode::kAlreadyExists, p, "", "file exists (pass --overwrite to replace it)");
    }
    if (exists(out.index)) {
      throw Error(ErrorCode::kAlreadyExists, out.index, "", "file exists (pass --overwrite to replace it)");
    }
  }

  SJson weight_map = SJson::object();
  std::vector<std::unique_ptr<OutputFile>> outputs;
  for (size_t g = 0; g < n; ++g) {
    for (size_t k : groups[g]) weight_map[items[k].tensor.name] = shard_name(g, n);
    KeyValues md = common;
    bool has_md = !md.empty();
    if (per_shard) {
      const OJson& m = (*per_shard)[shard_name(g, n)];
      md.clear();
      has_md = m.is_object();
      if (has_md) {
        for (const auto& [k, v] : m.items()) {
          if (!v.is_string()) {
            throw Error(ErrorCode::kInvalidArgument, file, "",
                        std::string(kHfShardMetadataKey) + ": value of \"" + k + "\" is not a string");
          }
          md.emplace_back(k, v.get<std::string>());
        }
      }
    }
    const std::string header = layout_header(items, groups[g], has_md, md, file, out.files[g]);
    auto o = std::make_unique<OutputFile>(out.files[g], options.overwrite);
    write_file(source, items, groups[g], header, *o, progress);
    out.file_bytes += o->bytes_written();
    outputs.push_back(std::move(o));
  }

  SJson meta = index_meta ? SJson::parse(index_meta->dump()) : SJson::object();
  meta["total_size"] = progress.total;
  SJson index = SJson::object();
  index["metadata"] = std::move(meta);
  index["weight_map"] = std::move(weight_map);
  std::string text;
  try {
    text = index.dump(2, ' ', false, SJson::error_handler_t::strict) + "\n";
  } catch (const SJson::exception& e) {
    throw Error(ErrorCode::kUnsupported, file, "", std::string("names are not valid UTF-8: ") + e.what());
  }
  OutputFile index_out(out.index, options.overwrite);
  index_out.write(text);
  // An index left from an earlier export goes first: while the shards are
  // renamed there is no index, so no reader can pair an old index with a mix
  // of old and new shards (the import of a directory without one refuses).
  if (options.overwrite && ::unlink(out.index.c_str()) != 0 && errno != ENOENT) {
    throw Error(ErrorCode::kIo, out.index, "", std::string("cannot remove the old index: ") +
                                                   std::strerror(errno));
  }
  for (auto& o : outputs) o->commit();
  index_out.commit();
  return out;
}

}  // namespace

uint64_t parse_size(std::string_view text) {
  auto bad = [&](const std::string& why) {
    return Error(ErrorCode::kInvalidArgument, "", "",
                 "size \"" + std::string(text) + "\" " + why +
                     "; use bytes or a number with a unit: 5GB, 100KB, 500MB, 1GiB");
  };
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  const std::string number(text.substr(0, i));
  const std::string unit(text.substr(i));
  if (number.empty() || std::count(number.begin(), number.end(), '.') > 1 || number == ".") {
    throw bad("does not start with a number");
  }
  std::string upper = unit;
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  static const std::pair<std::string_view, long double> kUnits[] = {
      {"", 1.0L},           {"B", 1.0L},
      {"KIB", 1024.0L},     {"MIB", 1048576.0L},   {"GIB", 1073741824.0L},
      {"TIB", 1099511627776.0L}, {"PIB", 1125899906842624.0L},
      {"KB", 1e3L},         {"MB", 1e6L},          {"GB", 1e9L},
      {"TB", 1e12L},        {"PB", 1e15L},
  };
  const auto* u = std::find_if(std::begin(kUnits), std::end(kUnits),
                               [&](const auto& p) { return p.first == upper; });
  if (u == std::end(kUnits)) throw bad("has an unknown unit \"" + unit + "\"");
  long double value = std::strtold(number.c_str(), nullptr) * u->second;
  // transformers: "5Gb" (decimal unit, lowercase final b) is in bits.
  if (upper.size() == 2 && unit.back() == 'b') value /= 8;
  value = std::floor(value);
  if (!(value >= 1.0L)) throw bad("is less than one byte");
  if (value >= 9.2e18L) throw bad("is too large");
  return static_cast<uint64_t>(value);
}

SafetensorsExport export_safetensors(const Reader& source, const std::string& output,
                                     const SafetensorsExportOptions& options) {
  if (options.max_shard_size && *options.max_shard_size == 0) {
    throw Error(ErrorCode::kInvalidArgument, output, "", "--max-shard-size must be at least 1 byte");
  }
  const std::vector<Item> items = name_tensors(source);
  Progress progress{options.progress};
  for (const Item& it : items) progress.total += it.size;
  SafetensorsExport r = options.max_shard_size
                            ? export_sharded(source, output, items, options, progress)
                            : export_one_file(source, output, items, options, progress);
  r.num_tensors = items.size();
  r.total_size = progress.total;
  return r;
}

}  // namespace treecask::interop
