#include "hf.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <system_error>
#include <utility>

#include <nlohmann/json.hpp>

#include "safetensors.h"
#include "util.h"

namespace treecask::cli {
namespace fs = std::filesystem;

namespace {

using OJson = nlohmann::ordered_json;  // keeps the file's key order
using SJson = nlohmann::json;          // sorted keys (Python's sort_keys=True)

constexpr std::string_view kIndexSuffix = ".safetensors.index.json";
constexpr std::string_view kHfPrefix = "treecask.hf.";

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::string read_text(const std::string& path) {
  MappedFile f = MappedFile::open(path);
  const auto b = f.bytes();
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

// The file `import_safetensors` reads for a directory (see hf.h).
std::string pick_in_directory(const std::string& dir) {
  std::vector<std::string> indexes, files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (!entry.is_regular_file()) continue;
    const std::string name = entry.path().filename().string();
    if (ends_with(name, kIndexSuffix)) indexes.push_back(name);
    else if (ends_with(name, ".safetensors")) files.push_back(name);
  }
  if (ec) throw Error(ErrorCode::kIo, dir, "", "cannot list the directory: " + ec.message());
  std::sort(indexes.begin(), indexes.end());
  std::sort(files.begin(), files.end());
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& n : v) s += (s.empty() ? "" : ", ") + n;
    return s;
  };
  const fs::path d(dir);
  if (std::find(indexes.begin(), indexes.end(), "model.safetensors.index.json") != indexes.end()) {
    return (d / "model.safetensors.index.json").string();
  }
  if (indexes.size() == 1) return (d / indexes[0]).string();
  if (indexes.size() > 1) {
    throw Error(ErrorCode::kInvalidArgument, dir, "",
                "several safetensors indexes (" + join(indexes) + "); name the one to import");
  }
  if (std::find(files.begin(), files.end(), "model.safetensors") != files.end()) {
    return (d / "model.safetensors").string();
  }
  if (files.size() == 1) return (d / files[0]).string();
  if (files.empty()) {
    throw Error(ErrorCode::kNotFound, dir, "",
                "no *.safetensors.index.json and no .safetensors file in this directory");
  }
  throw Error(ErrorCode::kInvalidArgument, dir, "",
              "several .safetensors files (" + join(files) +
                  ") and no index; import them one by one or add a *.safetensors.index.json");
}

struct Shard {
  std::string name;  // file name, as in the index
  MappedFile file;
  SafetensorsHeader header;
};

std::string compact(const OJson& v) { return v.dump(-1, ' ', false, OJson::error_handler_t::strict); }

SafetensorsImport import_sharded(const std::string& index_path, const std::string& output,
                                 SaveOptions options) {
  auto invalid = [&](const std::string& file, const std::string& key, const std::string& why) {
    return Error(ErrorCode::kInvalidArgument, file, key, why);
  };
  const std::string text = read_text(index_path);
  if (text.size() > kSafetensorsMaxHeader) {  // untrusted input: the same cap as a header
    throw invalid(index_path, "", "safetensors index is " + std::to_string(text.size()) +
                                      " bytes, over the limit of " +
                                      std::to_string(kSafetensorsMaxHeader));
  }
  // weight_map's entries go straight into `shard_of` (tensor -> shard file)
  // as the parser meets them and are dropped from the DOM: an OJson object
  // searches its entries linearly on every insert, which is quadratic at the
  // tens of thousands of tensors a large model's index lists. The rest of
  // the index (its "metadata") stays an OJson, in the file's key order.
  std::map<std::string, std::string> shard_of;
  bool in_weight_map = false;
  std::string last_top_key, tensor;
  OJson::parser_callback_t divert_weight_map = [&](int depth, OJson::parse_event_t event, OJson& parsed) {
    using E = OJson::parse_event_t;
    if (event == E::key && depth == 1) {
      last_top_key = parsed.get_ref<const std::string&>();
    } else if (event == E::object_start && depth == 1 && last_top_key == "weight_map") {
      in_weight_map = true;
    } else if (in_weight_map && event == E::object_end && depth == 1) {
      in_weight_map = false;
    } else if (in_weight_map && event == E::key && depth == 2) {
      tensor = parsed.get_ref<const std::string&>();
      return false;  // (a kept key is inserted into the DOM before its value)
    } else if (in_weight_map && depth == 2) {  // a value: a string, else a container starting
      if (event != E::value || !parsed.is_string())
        throw invalid(index_path, tensor, "\"weight_map\" value is not a string");
      if (!shard_of.emplace(tensor, parsed.get_ref<const std::string&>()).second)
        throw invalid(index_path, tensor, "\"weight_map\" lists the tensor twice");
      return false;
    }
    return true;
  };
  OJson index;
  try {
    index = OJson::parse(text, divert_weight_map);
  } catch (const OJson::exception& e) {
    throw invalid(index_path, "", std::string("safetensors index is not valid JSON: ") + e.what());
  }
  if (!index.is_object()) throw invalid(index_path, "", "safetensors index is not a JSON object");
  auto wm = index.find("weight_map");
  if (wm == index.end()) throw invalid(index_path, "", "safetensors index has no \"weight_map\"");
  if (!wm->is_object()) throw invalid(index_path, "", "\"weight_map\" is not an object");
  std::optional<OJson> index_metadata;
  if (auto md = index.find("metadata"); md != index.end() && !md->is_null()) {
    if (!md->is_object()) throw invalid(index_path, "", "\"metadata\" is not an object");
    index_metadata = *md;
  }

  // The shards, in file name order (model-00001-of-... first).
  std::set<std::string> shard_names;
  for (const auto& [tensor, f] : shard_of) {
    if (f.empty() || f.find('/') != std::string::npos || f.find('\\') != std::string::npos ||
        f == "." || f == "..") {
      throw invalid(index_path, tensor,
                    "weight_map names shard \"" + f + "\"; a shard must be a file name in the "
                    "index's directory");
    }
    shard_names.insert(f);
  }
  const fs::path dir = fs::path(index_path).parent_path();
  std::vector<Shard> shards;
  shards.reserve(shard_names.size());
  for (const std::string& name : shard_names) {
    const std::string path = (dir / name).string();
    if (!exists(path)) {
      std::string some;
      for (const auto& [t, f] : shard_of) {
        if (f == name) { some = t; break; }
      }
      throw Error(ErrorCode::kNotFound, path, "",
                  "shard missing: " + index_path + " names it for tensor \"" + some + "\"");
    }
    Shard s{name, MappedFile::open(path), {}};
    s.header = parse_safetensors(s.file.bytes(), path);
    shards.push_back(std::move(s));
  }

  // Every tensor in exactly one shard, the one the index names; every index entry held.
  std::map<std::string, const std::string*> found_in;
  for (const Shard& s : shards) {
    const std::string path = (dir / s.name).string();
    for (const SafetensorsTensor& t : s.header.tensors) {
      auto [it, fresh] = found_in.emplace(t.name, &s.name);
      if (!fresh) {
        throw invalid(path, t.name, "tensor found in two shards: " + *it->second + " and " +
                                        s.name + " (index " + index_path + ")");
      }
    }
  }
  for (const Shard& s : shards) {
    const std::string path = (dir / s.name).string();
    for (const SafetensorsTensor& t : s.header.tensors) {
      auto it = shard_of.find(t.name);
      if (it == shard_of.end()) {
        throw invalid(path, t.name, "tensor not in the index's weight_map (" + index_path + ")");
      }
      if (it->second != s.name) {
        throw invalid(path, t.name, "tensor found in shard " + s.name + " but the index " +
                                        index_path + " says " + it->second);
      }
    }
  }
  for (const auto& [tensor, file] : shard_of) {
    if (!found_in.count(tensor)) {
      throw invalid((dir / file).string(), tensor,
                    "the index " + index_path + " names this shard for the tensor, which it does "
                    "not hold");
    }
  }

  // Leaves: shard by shard, each's tensors in file order.
  SafetensorsImport out;
  out.kind = "sharded safetensors";
  out.index = index_path;
  std::vector<std::string> keys;
  std::vector<LeafInput> leaves;
  for (const Shard& s : shards) {
    out.files.push_back((dir / s.name).string());
    for (const SafetensorsTensor& t : s.header.tensors) {
      keys.push_back(t.name);
      LeafInput leaf;
      leaf.meta.dtype = t.dtype;
      leaf.meta.shape = t.shape;
      leaf.data = s.file.bytes().subspan(s.header.data_start + t.begin, t.end - t.begin);
      leaves.push_back(std::move(leaf));
    }
  }

  // Metadata: the shards' common __metadata__, else each shard's; then the index's.
  KeyValues metadata;
  const bool same = std::all_of(shards.begin(), shards.end(), [&](const Shard& s) {
    return s.header.has_metadata == shards[0].header.has_metadata &&
           s.header.metadata == shards[0].header.metadata;
  });
  if (same) {
    if (!shards.empty()) metadata = shards[0].header.metadata;
  } else {
    OJson per = OJson::object();
    for (const Shard& s : shards) {
      if (!s.header.has_metadata) {
        per[s.name] = nullptr;
        continue;
      }
      OJson m = OJson::object();
      for (const auto& [k, v] : s.header.metadata) m[k] = v;
      per[s.name] = std::move(m);
    }
    metadata.emplace_back(std::string(kHfShardMetadataKey), compact(per));
  }
  // total_size is recomputed by an export; the rest is kept when there is any,
  // so that a checkpoint with {"total_size": N} alone imports with its shards'
  // metadata only (and exports to one file byte-identical to the unsharded one).
  if (index_metadata) {
    index_metadata->erase("total_size");
    if (!index_metadata->empty()) {
      metadata.emplace_back(std::string(kHfIndexMetadataKey), compact(*index_metadata));
    }
  }
  for (const auto& [k, v] : metadata) {
    (void)v;
    if (std::count_if(metadata.begin(), metadata.end(), [&](const auto& kv) { return kv.first == k; }) > 1) {
      throw invalid(index_path, "", "metadata key \"" + k + "\" appears twice (a shard's "
                                    "__metadata__ uses a key treecask reserves)");
    }
  }
  options.metadata = std::move(metadata);
  out.stats = save(output, flat_dict_treedef(keys), leaves, options);
  return out;
}

SafetensorsImport import_single(const std::string& path, const std::string& output,
                                SaveOptions options) {
  MappedFile file = MappedFile::open(path);
  const SafetensorsHeader header = parse_safetensors(file.bytes(), path);
  std::vector<std::string> keys;
  std::vector<LeafInput> leaves;
  for (const SafetensorsTensor& t : header.tensors) {
    keys.push_back(t.name);
    LeafInput leaf;
    leaf.meta.dtype = t.dtype;
    leaf.meta.shape = t.shape;
    leaf.data = file.bytes().subspan(header.data_start + t.begin, t.end - t.begin);
    leaves.push_back(std::move(leaf));
  }
  options.metadata = header.metadata;
  SafetensorsImport out;
  out.kind = "safetensors";
  out.files.push_back(path);
  out.stats = save(output, flat_dict_treedef(keys), leaves, options);
  return out;
}

std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
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

SafetensorsImport import_safetensors(const std::string& input, const std::string& output,
                                     const SaveOptions& options) {
  struct stat st {};
  if (::stat(input.c_str(), &st) != 0) throw Error(ErrorCode::kNotFound, input, "", "no such file");
  std::string path = input;
  if (S_ISDIR(st.st_mode)) path = pick_in_directory(input);
  if (ends_with(path, kIndexSuffix)) return import_sharded(path, output, options);
  return import_single(path, output, options);
}

ShardedExport export_safetensors_sharded(const std::string& file, const std::string& dir,
                                         uint64_t max_shard_size, bool overwrite,
                                         const std::function<void(uint64_t, uint64_t)>& progress) {
  if (max_shard_size == 0) {
    throw Error(ErrorCode::kInvalidArgument, dir, "", "--max-shard-size must be at least 1 byte");
  }
  Archive archive = Archive::open(file);
  const bool flat = is_flat_dict(archive.treedef());

  // The tensors, named and checked as `treecask export` does (convert.cc run_export).
  struct Item {
    size_t leaf;
    SafetensorsTensor t;
  };
  std::vector<Item> items;
  std::set<std::string> names;
  for (size_t i = 0; i < archive.size(); ++i) {
    const LeafInfo info = archive.leaf(i);
    auto unsupported = [&](const std::string& why) {
      return Error(ErrorCode::kUnsupported, file, info.key_path, why);
    };
    if (info.value_kind != ValueKind::kArray) {
      throw unsupported("a Python scalar/str leaf; safetensors holds array leaves only");
    }
    if (std::string why = safetensors_refusal(info.dtype, info.shape); !why.empty()) {
      throw unsupported(why);
    }
    Item it{i, {}};
    it.t.name = flat ? archive.treedef()[0].keys[i] : info.key_path;
    if (it.t.name.empty()) {
      throw unsupported("the archive is a single unnamed array; safetensors needs tensor names");
    }
    if (it.t.name == "__metadata__") throw unsupported("a tensor cannot be named \"__metadata__\"");
    if (!names.insert(it.t.name).second) {
      throw unsupported("duplicate tensor name \"" + it.t.name + "\"");
    }
    it.t.dtype = info.dtype;
    it.t.shape = info.shape;
    it.t.end = info.byte_length;  // a size for now; offsets below
    items.push_back(std::move(it));
  }

  // Greedy packing in leaf order (see hf.h).
  std::vector<std::vector<size_t>> groups;  // indexes into items
  uint64_t current = 0;
  for (size_t k = 0; k < items.size(); ++k) {
    const uint64_t size = items[k].t.end;
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

  // Metadata.
  KeyValues common;
  std::optional<OJson> per_shard, index_meta;
  for (const auto& [k, v] : archive.metadata()) {
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
  const size_t n = groups.size();
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
  ShardedExport out;
  out.index = (d / "model.safetensors.index.json").string();
  for (size_t g = 0; g < n; ++g) out.shards.push_back((d / shard_name(g, n)).string());
  if (!overwrite) {
    for (const std::string& p : out.shards) {
      if (exists(p)) throw Error(ErrorCode::kAlreadyExists, p, "", "file exists (pass --overwrite to replace it)");
    }
    if (exists(out.index)) {
      throw Error(ErrorCode::kAlreadyExists, out.index, "", "file exists (pass --overwrite to replace it)");
    }
  }

  uint64_t total = 0;
  for (const Item& it : items) total += it.t.end;
  uint64_t done = 0;
  SJson weight_map = SJson::object();
  std::vector<std::unique_ptr<OutputFile>> outputs;
  for (size_t g = 0; g < n; ++g) {
    std::vector<SafetensorsTensor> tensors;
    uint64_t offset = 0;
    for (size_t k : groups[g]) {
      SafetensorsTensor t = items[k].t;
      const uint64_t size = t.end;
      t.begin = offset;
      t.end = offset + size;
      offset = t.end;
      weight_map[t.name] = shard_name(g, n);
      tensors.push_back(std::move(t));
    }
    KeyValues md = common;
    bool has_md = !md.empty();
    if (per_shard) {
      const OJson& m = (*per_shard)[shard_name(g, n)];
      md.clear();
      has_md = m.is_object();
      if (has_md) {
        for (const auto& [k, v] : m.items()) {
          if (!v.is_string()) {
            throw Error(ErrorCode::kInvalidArgument, file, "", std::string(kHfShardMetadataKey) + ": value of \"" + k + "\" is not a string");
          }
          md.emplace_back(k, v.get<std::string>());
        }
      }
    }
    std::string header;
    try {
      header = safetensors_header(has_md, md, tensors);
    } catch (const OJson::exception& e) {
      throw Error(ErrorCode::kUnsupported, file, "",
                  std::string("names or metadata are not valid UTF-8: ") + e.what());
    }
    if (header.size() - 8 > kSafetensorsMaxHeader) {
      throw Error(ErrorCode::kUnsupported, out.shards[g], "",
                  "the safetensors header would be " + std::to_string(header.size() - 8) +
                      " bytes, over the format's limit of " + std::to_string(kSafetensorsMaxHeader));
    }
    auto o = std::make_unique<OutputFile>(out.shards[g], overwrite);
    o->write(header);
    for (size_t k : groups[g]) {
      for_each_leaf_piece(archive, items[k].leaf, [&](std::span<const std::byte> piece) {
        o->write(piece);
        done += piece.size();
        if (progress) progress(done, total);
      });
    }
    outputs.push_back(std::move(o));
  }

  SJson meta = index_meta ? SJson::parse(index_meta->dump()) : SJson::object();
  meta["total_size"] = total;
  SJson index = SJson::object();
  index["metadata"] = std::move(meta);
  index["weight_map"] = std::move(weight_map);
  std::string text;
  try {
    text = index.dump(2, ' ', false, SJson::error_handler_t::strict) + "\n";
  } catch (const SJson::exception& e) {
    throw Error(ErrorCode::kUnsupported, file, "", std::string("names are not valid UTF-8: ") + e.what());
  }
  OutputFile index_out(out.index, overwrite);
  index_out.write(text);
  // An index left from an earlier export goes first: while the shards are
  // renamed there is no index, so no reader can pair an old index with a mix
  // of old and new shards (the import of a directory without one refuses).
  if (overwrite && ::unlink(out.index.c_str()) != 0 && errno != ENOENT) {
    throw Error(ErrorCode::kIo, out.index, "", std::string("cannot remove the old index: ") +
                                                   std::strerror(errno));
  }
  for (auto& o : outputs) o->commit();
  index_out.commit();
  out.num_tensors = items.size();
  out.total_size = total;
  return out;
}

}  // namespace treecask::cli
