// import_safetensors (convert.h): a .safetensors file or the Hub's sharded
// layout into one archive.
#include "convert.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <map>
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

using OJson = nlohmann::ordered_json;  // keeps the file's key order

constexpr std::string_view kIndexSuffix = ".safetensors.index.json";

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

// The file `import_safetensors` reads for a directory (see convert.h).
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

// One mapped .safetensors file and its parsed header.
struct Shard {
  std::string name;  // file name, as in the index (one file: its path)
  MappedFile file;
  SafetensorsHeader header;
};

// Appends the tensors of `s`, in data order, as leaves (their bytes point
// into s.file's map) and their names as keys.
void append_leaves(const Shard& s, std::vector<std::string>& keys, std::vector<LeafInput>& leaves) {
  for (const SafetensorsTensor& t : s.header.tensors) {
    keys.push_back(t.name);
    LeafInput leaf;
    leaf.meta.dtype = t.dtype;
    leaf.meta.shape = t.shape;
    leaf.data = s.file.bytes().subspan(s.header.data_start + t.begin, t.end - t.begin);
    leaves.push_back(std::move(leaf));
  }
}

std::string compact(const OJson& v) { return v.dump(-1, ' ', false, OJson::error_handler_t::strict); }

SafetensorsImport import_sharded(const std::string& index_path, const std::string& output,
                                 SaveOptions options) {
  // A malformed index, or shards that disagree with it, is a damaged
  // checkpoint: kCorruption naming the file and the tensor.
  auto corrupt = [&](const std::string& file, const std::string& key, const std::string& why) {
    return Error(ErrorCode::kCorruption, file, key, why);
  };
  const std::string text = read_text(index_path);
  if (text.size() > kSafetensorsMaxHeader) {  // untrusted input: the same cap as a header
    throw corrupt(index_path, "", "safetensors index is " + std::to_string(text.size()) +
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
        throw corrupt(index_path, tensor, "\"weight_map\" value is not a string");
      if (!shard_of.emplace(tensor, parsed.get_ref<const std::string&>()).second)
        throw corrupt(index_path, tensor, "\"weight_map\" lists the tensor twice");
      return false;
    }
    return true;
  };
  OJson index;
  try {
    index = OJson::parse(text, divert_weight_map);
  } catch (const OJson::exception& e) {
    throw corrupt(index_path, "", std::string("safetensors index is not valid JSON: ") + e.what());
  }
  if (!index.is_object()) throw corrupt(index_path, "", "safetensors index is not a JSON object");
  auto wm = index.find("weight_map");
  if (wm == index.end()) throw corrupt(index_path, "", "safetensors index has no \"weight_map\"");
  if (!wm->is_object()) throw corrupt(index_path, "", "\"weight_map\" is not an object");
  std::optional<OJson> index_metadata;
  if (auto md = index.find("metadata"); md != index.end() && !md->is_null()) {
    if (!md->is_object()) throw corrupt(index_path, "", "\"metadata\" is not an object");
    index_metadata = *md;
  }

  // The shards, in file name order (model-00001-of-... first).
  std::set<std::string> shard_names;
  for (const auto& [tensor, f] : shard_of) {
    if (f.empty() || f.find('/') != std::string::npos || f.find('\\') != std::string::npos ||
        f == "." || f == "..") {
      throw corrupt(index_path, tensor,
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
        throw corrupt(path, t.name, "tensor found in two shards: " + *it->second + " and " +
                                        s.name + " (index " + index_path + ")");
      }
    }
  }
  for (const Shard& s : shards) {
    const std::string path = (dir / s.name).string();
    for (const SafetensorsTensor& t : s.header.tensors) {
      auto it = shard_of.find(t.name);
      if (it == shard_of.end()) {
        throw corrupt(path, t.name, "tensor not in the index's weight_map (" + index_path + ")");
      }
      if (it->second != s.name) {
        throw corrupt(path, t.name, "tensor found in shard " + s.name + " but the index " +
                                        index_path + " says " + it->second);
      }
    }
  }
  for (const auto& [tensor, file] : shard_of) {
    if (!found_in.count(tensor)) {
      throw corrupt((dir / file).string(), tensor,
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
    append_leaves(s, keys, leaves);
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
  for (const auto& entry : metadata) {
    const std::string& k = entry.first;  // (not a structured binding: clang 14 cannot capture one)
    if (std::count_if(metadata.begin(), metadata.end(), [&](const auto& kv) { return kv.first == k; }) > 1) {
      throw Error(ErrorCode::kInvalidArgument, index_path, "",
                  "metadata key \"" + k + "\" appears twice (a shard's __metadata__ uses a key "
                  "treecask reserves)");
    }
  }
  options.metadata = std::move(metadata);
  out.stats = save(output, flat_dict_treedef(keys), leaves, options);
  return out;
}

SafetensorsImport import_single(const std::string& path, const std::string& output,
                                SaveOptions options) {
  Shard file{path, MappedFile::open(path), {}};
  file.header = parse_safetensors(file.file.bytes(), path);
  std::vector<std::string> keys;
  std::vector<LeafInput> leaves;
  append_leaves(file, keys, leaves);
  options.metadata = file.header.metadata;
  SafetensorsImport out;
  out.kind = "safetensors";
  out.files.push_back(path);
  out.stats = save(output, flat_dict_treedef(keys), leaves, options);
  return out;
}

}  // namespace

SafetensorsImport import_safetensors(const std::string& input, const std::string& output,
                                     const SaveOptions& options) {
  struct stat st {};
  if (::stat(input.c_str(), &st) != 0) throw Error(ErrorCode::kNotFound, input, "", "no such file");
  std::string path = input;
  if (S_ISDIR(st.st_mode)) path = pick_in_directory(input);
  if (ends_with(path, kIndexSuffix)) return import_sharded(path, output, options);
  return import_single(path, output, options);
}

}  // namespace treecask::interop
