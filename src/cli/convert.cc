// import (.safetensors / .npz -> archive) and export (archive -> .safetensors).
#include "commands.h"

#include <algorithm>
#include <cctype>
#include <iostream>
#include <optional>
#include <set>
#include <nlohmann/json.hpp>

#include "hf.h"
#include "npz.h"
#include "safetensors.h"
#include "util.h"
#include "treecask/treecask.h"

namespace treecask::cli {
namespace {

Compression parse_compression(const std::string& name) {
  if (name == "auto") return Compression::kAuto;
  if (name == "none") return Compression::kNone;
  if (name == "lz4") return Compression::kLZ4;
  throw Error(ErrorCode::kInvalidArgument, "", "",
              "--compression must be auto, none or lz4, not \"" + name + "\"");
}

std::string lower_extension(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext;
}

// "safetensors" or "npz": by --format, else by extension, else by content
// (a zip file starts with "PK\3\4", or "PK\5\6" when empty).
std::string detect_format(const ImportOptions& options, std::span<const std::byte> head) {
  if (options.format == "safetensors" || options.format == "npz") return options.format;
  if (options.format != "auto") {
    throw Error(ErrorCode::kInvalidArgument, options.input, "",
                "--format must be auto, safetensors or npz, not \"" + options.format + "\"");
  }
  const std::string ext = lower_extension(options.input);
  if (ext == ".safetensors") return "safetensors";
  if (ext == ".npz") return "npz";
  auto starts = [&](std::string_view magic) {
    return head.size() >= magic.size() &&
           std::equal(magic.begin(), magic.end(), head.begin(),
                      [](char a, std::byte b) { return static_cast<std::byte>(a) == b; });
  };
  if (starts(std::string_view("PK\3\4", 4)) || starts(std::string_view("PK\5\6", 4))) {
    return "npz";
  }
  return "safetensors";
}

struct Imported {
  std::vector<std::string> keys;
  std::vector<LeafInput> leaves;
  KeyValues metadata;
};

Imported from_safetensors(const MappedFile& file) {
  const SafetensorsHeader header = parse_safetensors(file.bytes(), file.path());
  Imported out;
  out.metadata = header.metadata;
  for (const SafetensorsTensor& t : header.tensors) {
    out.keys.push_back(t.name);
    LeafInput leaf;
    leaf.meta.dtype = t.dtype;
    leaf.meta.shape = t.shape;
    leaf.data = file.bytes().subspan(header.data_start + t.begin, t.end - t.begin);
    out.leaves.push_back(std::move(leaf));
  }
  return out;
}

Imported from_npz(const NpzFile& npz) {
  Imported out;
  for (const NpzMember& m : npz.members()) {
    out.keys.push_back(m.key);
    LeafInput leaf;
    leaf.meta.dtype = m.array.dtype;
    leaf.meta.shape = m.array.shape;
    leaf.data = m.array.data;
    out.leaves.push_back(std::move(leaf));
  }
  return out;
}

}  // namespace

int run_import(const ImportOptions& options) {
  const Compression compression = parse_compression(options.compression);
  if (options.format != "npz" && is_hf_input(options.input)) return run_import_hf(options);
  MappedFile input = MappedFile::open(options.input);
  const std::string format = detect_format(options, input.bytes());

  std::optional<NpzFile> npz;
  Imported imported;
  if (format == "safetensors") {
    imported = from_safetensors(input);
  } else {
    input = MappedFile();  // not needed: libzip reads the file itself
    npz = NpzFile::read(options.input);
    imported = from_npz(*npz);
  }

  SaveOptions save_options;
  save_options.compression = compression;
  save_options.shuffle = options.shuffle;
  if (options.chunk_size != 0) save_options.chunk_size = options.chunk_size;
  save_options.overwrite = options.overwrite;
  save_options.metadata = imported.metadata;
  uint64_t total = 0;
  for (const LeafInput& leaf : imported.leaves) total += leaf.data.size();
  Progress progress("import", total);
  save_options.progress = [&](uint64_t done, uint64_t) { progress.update(done); };

  const SaveStats stats = save(options.output, flat_dict_treedef(imported.keys),
                               imported.leaves, save_options);
  progress.finish();
  std::cout << "wrote " << options.output << " from " << format << ": " << stats.num_leaves
            << (stats.num_leaves == 1 ? " leaf, " : " leaves, ") << stats.raw_bytes << " raw bytes, " << stats.stored_bytes
            << " stored bytes, " << stats.file_bytes << " file bytes\n";
  return kExitOk;
}

namespace {

// Writes leaves 0..n-1 of `reader` (an Archive, or the ShardedArchive of a
// checkpoint directory: both have size(), leaf(i)) as the one safetensors file
// options.output, committed atomically: names are the flat dict's keys or the
// key paths, the archive metadata becomes __metadata__. `stream(i, sink)`
// hands leaf i's bytes to sink in order. Throws Error(kUnsupported) for
// scalar/str leaves, dtypes safetensors lacks, bad names or metadata (SPEC of
// safetensors: unique names, header <= 100 MB); what the reader throws.
template <class Reader, class Stream>
int export_safetensors_file(const ExportOptions& options, const Reader& reader, const TreeDef& def,
                            const KeyValues& metadata, Stream stream, const std::string& source) {
  const bool flat = is_flat_dict(def);
  std::vector<SafetensorsTensor> tensors;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (size_t i = 0; i < reader.size(); ++i) {
    const LeafInfo info = reader.leaf(i);
    auto unsupported = [&](const std::string& why) {
      return Error(ErrorCode::kUnsupported, options.file, info.key_path, why);
    };
    if (info.value_kind != ValueKind::kArray) {
      throw unsupported("a Python scalar/str leaf; safetensors holds array leaves only");
    }
    if (std::string why = safetensors_refusal(info.dtype, info.shape); !why.empty()) {
      throw unsupported(why);
    }
    SafetensorsTensor t;
    t.name = flat ? def[0].keys[i] : info.key_path;
    if (t.name.empty()) {
      throw unsupported("the archive is a single unnamed array; safetensors needs tensor names");
    }
    if (t.name == "__metadata__") {
      throw unsupported("a tensor cannot be named \"__metadata__\" in safetensors");
    }
    if (!names.insert(t.name).second) throw unsupported("duplicate tensor name \"" + t.name + "\"");
    t.dtype = info.dtype;
    t.shape = info.shape;
    t.begin = offset;
    t.end = offset + info.byte_length;
    offset = t.end;
    tensors.push_back(std::move(t));
  }
  std::set<std::string> meta_keys;
  for (const auto& kv : metadata) {
    if (!meta_keys.insert(kv.first).second) {
      throw Error(ErrorCode::kUnsupported, options.file, "",
                  "metadata key \"" + kv.first + "\" appears twice; safetensors keys are unique");
    }
  }
  std::string header;
  try {
    header = safetensors_header(!metadata.empty(), metadata, tensors);
  } catch (const nlohmann::ordered_json::exception& e) {
    throw Error(ErrorCode::kUnsupported, options.file, "",
                std::string("names or metadata are not valid UTF-8: ") + e.what());
  }
  if (header.size() - 8 > kSafetensorsMaxHeader) {
    throw Error(ErrorCode::kUnsupported, options.file, "",
                "the safetensors header would be " + std::to_string(header.size() - 8) +
                    " bytes, over the format's limit of " + std::to_string(kSafetensorsMaxHeader));
  }

  OutputFile out(options.output, options.overwrite);
  out.write(header);
  Progress progress("export", offset);
  uint64_t done = 0;
  for (size_t i = 0; i < reader.size(); ++i) {
    stream(i, [&](std::span<const std::byte> piece) {
      out.write(piece);
      done += piece.size();
      progress.update(done);
    });
  }
  progress.finish();
  out.commit();
  std::cout << "wrote " << options.output << ": " << tensors.size()
            << (tensors.size() == 1 ? " tensor, " : " tensors, ") << offset << " data bytes" << source
            << ", " << out.bytes_written() << " file bytes\n";
  return kExitOk;
}

}  // namespace

int run_export(const ExportOptions& options) {
  if (options.max_shard_size) return run_export_hf(options);
  if (ShardedArchive::is_sharded(options.file)) {
    // A checkpoint directory (SPEC.md "Sharded checkpoints"): each global
    // array is assembled from its boxes, one leaf at a time, so peak memory
    // is the largest leaf.
    ShardedArchive s = ShardedArchive::open(options.file);
    std::vector<std::byte> buf;
    const std::string source = " from " + std::to_string(s.files().size()) + " shard files";
    return export_safetensors_file(
        options, s, s.index().treedef(), s.index().metadata(),
        [&](size_t i, auto&& sink) {
          buf.resize(s.leaf(i).byte_length);
          s.read(i, buf);
          sink(std::span<const std::byte>(buf));
        },
        source);
  }
  Archive archive = Archive::open(options.file);
  return export_safetensors_file(
      options, archive, archive.treedef(), archive.metadata(),
      [&](size_t i, auto&& sink) { for_each_leaf_piece(archive, i, sink); }, "");
}

// ---- Hugging Face layouts (hf.h): a directory or *.safetensors.index.json in,
// a sharded directory out.

bool is_hf_input(const std::string& input) {
  std::error_code ec;
  return std::filesystem::is_directory(input, ec) ||
         (input.size() >= 23 && input.compare(input.size() - 23, 23, ".safetensors.index.json") == 0);
}

int run_import_hf(const ImportOptions& options) {
  SaveOptions save_options;
  save_options.compression = parse_compression(options.compression);
  save_options.shuffle = options.shuffle;
  if (options.chunk_size != 0) save_options.chunk_size = options.chunk_size;
  save_options.overwrite = options.overwrite;
  std::optional<Progress> progress;
  save_options.progress = [&](uint64_t done, uint64_t total) {
    if (!progress) progress.emplace("import", total);
    progress->update(done);
  };
  const SafetensorsImport r = import_safetensors(options.input, options.output, save_options);
  if (progress) progress->finish();
  const SaveStats& stats = r.stats;
  std::cout << "wrote " << options.output << " from " << r.kind;
  if (!r.index.empty()) {
    std::cout << " (" << r.index << ", " << r.files.size()
              << (r.files.size() == 1 ? " shard)" : " shards)");
  }
  std::cout << ": " << stats.num_leaves << (stats.num_leaves == 1 ? " leaf, " : " leaves, ")
            << stats.raw_bytes << " raw bytes, " << stats.stored_bytes << " stored bytes, "
            << stats.file_bytes << " file bytes\n";
  return kExitOk;
}

int run_export_hf(const ExportOptions& options) {
  const uint64_t max = parse_size(*options.max_shard_size);
  std::optional<Progress> progress;
  const ShardedExport r = export_safetensors_sharded(
      options.file, options.output, max, options.overwrite, [&](uint64_t done, uint64_t total) {
        if (!progress) progress.emplace("export", total);
        progress->update(done);
      });
  if (progress) progress->finish();
  std::cout << "wrote " << options.output << ": " << r.shards.size()
            << (r.shards.size() == 1 ? " shard, " : " shards, ") << r.num_tensors
            << (r.num_tensors == 1 ? " tensor, " : " tensors, ") << r.total_size
            << " data bytes (max shard size " << max << " bytes), index " << r.index << "\n";
  return kExitOk;
}

}  // namespace treecask::cli
