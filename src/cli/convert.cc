// import (.safetensors / Hugging Face sharded / .npz -> archive) and export
// (archive or sharded checkpoint directory -> .safetensors, one file or
// sharded): options in, the treecask_interop routines (convert.h, npz.h), a
// result line out.
#include "commands.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>

#include "convert.h"
#include "files.h"
#include "npz.h"
#include "util.h"
#include "treecask/treecask.h"

namespace treecask::cli {
namespace {

Compression parse_compression(const std::string& name) {
  for (Compression c : {Compression::kAuto, Compression::kNone, Compression::kLZ4})
    if (compression_name(c) == name) return c;
  throw Error(ErrorCode::kInvalidArgument, "", "",
              "--compression must be auto, none or lz4, not \"" + name + "\"");
}

std::string lower_extension(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext;
}

// "safetensors" or "npz": by --format; else a directory or a
// *.safetensors.index.json is safetensors (the Hugging Face layout); else by
// extension; else by content (a zip file starts with "PK\3\4", or "PK\5\6"
// when empty). Throws Error(kNotFound) for a missing file it must read.
std::string detect_format(const ImportOptions& options) {
  if (options.format == "safetensors" || options.format == "npz") return options.format;
  if (options.format != "auto") {
    throw Error(ErrorCode::kInvalidArgument, options.input, "",
                "--format must be auto, safetensors or npz, not \"" + options.format + "\"");
  }
  constexpr std::string_view kIndexSuffix = ".safetensors.index.json";
  std::error_code ec;
  if (std::filesystem::is_directory(options.input, ec) ||
      std::string_view(options.input).ends_with(kIndexSuffix)) {
    return "safetensors";
  }
  const std::string ext = lower_extension(options.input);
  if (ext == ".safetensors") return "safetensors";
  if (ext == ".npz") return "npz";
  const interop::MappedFile input = interop::MappedFile::open(options.input);
  const std::span<const std::byte> head = input.bytes();
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

void print_stats(const SaveStats& stats) {
  std::cout << stats.num_leaves << (stats.num_leaves == 1 ? " leaf, " : " leaves, ")
            << stats.raw_bytes << " raw bytes, " << stats.stored_bytes << " stored bytes, "
            << stats.file_bytes << " file bytes\n";
}

}  // namespace

int run_import(const ImportOptions& options) {
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
  const std::string format = detect_format(options);
  if (format == "npz") {
    const SaveStats stats = interop::import_npz(options.input, options.output, save_options);
    if (progress) progress->finish();
    std::cout << "wrote " << options.output << " from npz: ";
    print_stats(stats);
    return kExitOk;
  }
  const interop::SafetensorsImport r =
      interop::import_safetensors(options.input, options.output, save_options);
  if (progress) progress->finish();
  std::cout << "wrote " << options.output << " from " << r.kind;
  if (!r.index.empty()) {
    std::cout << " (" << r.index << ", " << r.files.size()
              << (r.files.size() == 1 ? " shard)" : " shards)");
  }
  std::cout << ": ";
  print_stats(r.stats);
  return kExitOk;
}

int run_export(const ExportOptions& options) {
  interop::SafetensorsExportOptions export_options;
  if (options.max_shard_size) export_options.max_shard_size = interop::parse_size(*options.max_shard_size);
  export_options.overwrite = options.overwrite;
  std::optional<Progress> progress;
  export_options.progress = [&](uint64_t done, uint64_t total) {
    if (!progress) progress.emplace("export", total);
    progress->update(done);
  };
  refuse_manager_directory(options.file);
  const std::unique_ptr<Reader> source = open_reader(options.file, open_options(options.sig));
  const interop::SafetensorsExport r = interop::export_safetensors(*source, options.output, export_options);
  if (progress) progress->finish();
  const char* tensors = r.num_tensors == 1 ? " tensor, " : " tensors, ";
  if (export_options.max_shard_size) {
    std::cout << "wrote " << options.output << ": " << r.files.size()
              << (r.files.size() == 1 ? " shard, " : " shards, ") << r.num_tensors << tensors
              << r.total_size << " data bytes (max shard size " << *export_options.max_shard_size
              << " bytes), index " << r.index << "\n";
  } else {
    std::cout << "wrote " << options.output << ": " << r.num_tensors << tensors << r.total_size
              << " data bytes";
    if (const auto* sharded = dynamic_cast<const ShardedArchive*>(source.get()))
      std::cout << " from " << sharded->files().size() << " shard files";
    std::cout << ", " << r.file_bytes << " file bytes\n";
  }
  return kExitOk;
}

}  // namespace treecask::cli
