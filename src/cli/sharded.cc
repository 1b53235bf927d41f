// `export` of a sharded checkpoint directory (SPEC.md "Sharded checkpoints"):
// each global array is assembled from its saved boxes by ShardedArchive and
// written as one safetensors tensor. Kept apart from convert.cc, which exports
// single archives.
#include <algorithm>
#include <iostream>
#include <set>
#include <vector>

#include "cli/commands.h"
#include "cli/safetensors.h"
#include "cli/util.h"
#include "treecask/treecask.h"

namespace treecask::cli {

// Writes every leaf of the checkpoint directory options.file to the
// safetensors file options.output: names are the flat dict's keys or the key
// paths, data the global arrays in C order (read one leaf at a time, so peak
// memory is the largest leaf). Throws Error(kUnsupported) for scalar/str
// leaves, dtypes safetensors lacks, bad names; what ShardedArchive throws.
int run_export_sharded(const ExportOptions& options) {
  ShardedArchive s = ShardedArchive::open(options.file);
  const TreeDef& def = s.index().treedef();
  const bool flat = !def.empty() && def[0].kind == NodeKind::kDict && def.size() == def[0].arity + 1 &&
                    std::all_of(def.begin() + 1, def.end(), [](const TreeNode& n) { return n.kind == NodeKind::kLeaf; });
  std::vector<SafetensorsTensor> tensors;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const LeafInfo info = s.leaf(i);
    auto unsupported = [&](const std::string& why) {
      return Error(ErrorCode::kUnsupported, options.file, info.key_path, why);
    };
    if (info.value_kind != ValueKind::kArray)
      throw unsupported("a Python scalar/str leaf; safetensors holds array leaves only");
    if (!safetensors_dtype(info.dtype))
      throw unsupported("dtype " + std::string(dtype_name(info.dtype)) + " has no safetensors equivalent");
    SafetensorsTensor t;
    t.name = flat ? def[0].keys[i] : info.key_path;
    if (t.name.empty()) throw unsupported("the checkpoint is a single unnamed array; safetensors needs tensor names");
    if (t.name == "__metadata__") throw unsupported("a tensor cannot be named \"__metadata__\" in safetensors");
    if (!names.insert(t.name).second) throw unsupported("duplicate tensor name \"" + t.name + "\"");
    t.dtype = info.dtype;
    t.shape = info.shape;
    t.begin = offset;
    t.end = offset + info.byte_length;
    offset = t.end;
    tensors.push_back(std::move(t));
  }
  const KeyValues& metadata = s.index().metadata();
  std::set<std::string> meta_keys;
  for (const auto& kv : metadata)
    if (!meta_keys.insert(kv.first).second)
      throw Error(ErrorCode::kUnsupported, options.file, "",
                  "metadata key \"" + kv.first + "\" appears twice; safetensors keys are unique");
  std::string header;
  try {
    header = safetensors_header(!metadata.empty(), metadata, tensors);
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kUnsupported, options.file, "",
                std::string("names or metadata are not valid UTF-8: ") + e.what());
  }
  if (header.size() - 8 > kSafetensorsMaxHeader)
    throw Error(ErrorCode::kUnsupported, options.file, "",
                "the safetensors header would be over the format's limit of " + std::to_string(kSafetensorsMaxHeader));
  OutputFile out(options.output, options.overwrite);
  out.write(header);
  Progress progress("export", offset);
  uint64_t done = 0;
  std::vector<std::byte> buf;
  for (size_t i = 0; i < s.size(); ++i) {
    buf.resize(s.leaf(i).byte_length);
    s.read(i, buf);
    out.write(buf);
    done += buf.size();
    progress.update(done);
  }
  progress.finish();
  out.commit();
  std::cout << "wrote " << options.output << ": " << tensors.size() << (tensors.size() == 1 ? " tensor, " : " tensors, ")
            << offset << " data bytes from " << s.files().size() << " shard files, " << out.bytes_written()
            << " file bytes\n";
  return kExitOk;
}

}  // namespace treecask::cli
