// Hugging Face safetensors layouts <-> one treecask archive: a single
// .safetensors file, or the Hub's sharded layout (a `*.safetensors.index.json`
// with {"metadata": {...}, "weight_map": {tensor: shard file}} beside
// `model-00001-of-000NN.safetensors` shards), as transformers'
// save_pretrained writes it and from_pretrained reads it.
//
// Part of the treecask_interop library, which the `treecask` tool (import /
// export) and the Python extension (treecask.import_safetensors /
// export_safetensors) both link: the product code lives here once.
// Nothing here prints; every failure is a treecask::Error naming the file.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "treecask/treecask.h"

namespace treecask::cli {

// Archive metadata keys written by a sharded import and read back by a
// sharded export (docs/cli.md "Hugging Face sharded checkpoints").
// The index's "metadata" object without "total_size" (which an export
// recomputes), as compact JSON in the index's key order; absent when nothing
// else is there.
inline constexpr std::string_view kHfIndexMetadataKey = "treecask.hf.index_metadata";
// Only when the shards' __metadata__ differ: {"<shard file>": {..} | null, ...} as JSON.
inline constexpr std::string_view kHfShardMetadataKey = "treecask.hf.shard_metadata";

// Bytes for a Hub size string, following transformers'
// `convert_file_size_to_int`: a plain integer is bytes; "KiB", "MiB", "GiB",
// "TiB", "PiB" are binary (2^10..2^50) and "KB", "MB", "GB", "TB", "PB"
// decimal (10^3..10^15), units case-insensitive; a decimal unit written with a
// lowercase final "b" ("5Gb") means bits (divided by 8) as transformers does.
// The number may have a fraction ("1.5GB", as huggingface_hub's
// parse_size_to_int allows); the result is rounded down.
// Throws Error(kInvalidArgument) for anything else or a result of 0 bytes or
// over 2^63.
uint64_t parse_size(std::string_view text);

struct SafetensorsImport {
  std::string kind;                // "safetensors" (one file) or "sharded safetensors"
  std::string index;               // the index file read ("" for one file)
  std::vector<std::string> files;  // the .safetensors files read, in leaf order
  SaveStats stats;
};

// Writes every tensor of `input` into the archive `output` (a flat dict, see
// treecask::flat_dict_treedef), with `options` (its metadata is replaced).
// `input` is one of:
//  - a .safetensors file: tensors in file order; __metadata__ becomes the
//    archive metadata unchanged;
//  - a `*.safetensors.index.json`: the shards it names (relative to its
//    directory), in file name order, each's tensors in file order; names as in
//    the index. Archive metadata: the shards' common __metadata__ (when all
//    shards carry the same one), else kHfShardMetadataKey; and the index's
//    "metadata" object, less "total_size", under kHfIndexMetadataKey;
//  - a directory: its `model.safetensors.index.json`, else its only
//    `*.safetensors.index.json`, else `model.safetensors`, else its only
//    `*.safetensors` file.
// Each shard is validated as parse_safetensors() does; the index (at most
// kSafetensorsMaxHeader bytes) must be a JSON object whose "weight_map" maps
// names to plain file names in its directory.
// Throws Error(kNotFound) for a missing input or a shard the index names that
// does not exist (naming that shard); Error(kInvalidArgument) naming the file
// for a malformed index or shard, a tensor found in two shards, a tensor in a
// shard other than the one the index names, a shard tensor the index lacks, or
// an index entry no shard holds; Error(kUnsupported) for a dtype treecask
// lacks; what treecask::save throws (e.g. kAlreadyExists).
SafetensorsImport import_safetensors(const std::string& input, const std::string& output,
                                     const SaveOptions& options);

struct ShardedExport {
  std::string index;                // path of the index written
  std::vector<std::string> shards;  // paths of the shard files written, in order
  size_t num_tensors = 0;
  uint64_t total_size = 0;          // sum of tensor data bytes (metadata.total_size)
};

// Writes the archive `file` into directory `dir` (created if missing) as the
// Hub's sharded layout: `model-00001-of-000NN.safetensors` shards (5-digit
// numbers, as transformers names them) and `model.safetensors.index.json`
// ({"metadata": {..., "total_size": N}, "weight_map": {name: shard}}, keys
// sorted, 2-space indent, as transformers writes it). An index is written even
// for one shard (transformers would name that one `model.safetensors`), so that
// the index metadata survives a round trip.
//
// Tensors are named as `treecask export` names them (dict keys of a flat dict
// archive, else key paths) and packed greedily in leaf order: a shard takes
// tensors while its data bytes stay <= max_shard_size; a tensor larger than
// max_shard_size gets a shard of its own (as transformers does), after the
// shard being filled is closed, so that leaf order is kept across shards.
// Each shard's __metadata__ is the archive metadata without the "treecask.hf."
// keys (or, when kHfShardMetadataKey is present and names exactly the shard
// files written, each shard's own); the index's metadata is kHfIndexMetadataKey
// (when present) with "total_size" set to the bytes written.
//
// Commit: every file is written under a temporary name and fsynced; then an
// existing index is removed (with overwrite), the shards are renamed into
// place, and the index last, so a reader that starts from an index never sees
// one paired with a partial or mixed set of shards. Files from an earlier
// export with other shard names are left alone.
// Throws Error(kAlreadyExists) naming the first file that exists when
// !overwrite (nothing is written); Error(kUnsupported) naming the leaf for a
// leaf safetensors cannot hold; Error(kInvalidArgument) for max_shard_size 0;
// archive read errors; Error(kIo).
// `progress`, when set, is called with (bytes done, bytes total) of tensor data.
ShardedExport export_safetensors_sharded(
    const std::string& file, const std::string& dir, uint64_t max_shard_size, bool overwrite,
    const std::function<void(uint64_t, uint64_t)>& progress = {});

}  // namespace treecask::cli
