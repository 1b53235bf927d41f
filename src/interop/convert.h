// Conversions between treecask checkpoints and Hugging Face safetensors: one
// import routine (a .safetensors file, or the Hub's sharded layout: a
// `*.safetensors.index.json` with {"metadata": {...}, "weight_map": {tensor:
// shard file}} beside `model-00001-of-000NN.safetensors` shards, as
// transformers' save_pretrained writes it and from_pretrained reads it) and
// one export routine (one file, or that sharded layout), from an archive file
// or a sharded checkpoint directory.
//
// Part of the treecask_interop library (src/interop/CMakeLists.txt), which
// the `treecask` tool (import / export, docs/cli.md) and the Python extension
// (treecask.import_safetensors / export_safetensors, docs/python.md) both
// call. Nothing here prints; every failure is a treecask::Error naming the
// file (and the tensor, where there is one).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "treecask/treecask.h"

namespace treecask::interop {

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

// What import_safetensors read and wrote.
struct SafetensorsImport {
  std::string kind;                // "safetensors" (one file) or "sharded safetensors"
  std::string index;               // the index file read ("" for one file)
  std::vector<std::string> files;  // the .safetensors files read, in leaf order
  SaveStats stats;                 // of the archive written
};

// Writes every tensor of `input` into the archive `output` (a flat dict, see
// treecask::flat_dict_treedef), with treecask::save and `options` (its
// metadata is replaced). `input` is one of:
//  - a .safetensors file: tensors in data order (parse_safetensors);
//    __metadata__ becomes the archive metadata unchanged;
//  - a `*.safetensors.index.json`: the shards it names (relative to its
//    directory), in file name order, each's tensors in data order; names as in
//    the index. Archive metadata: the shards' common __metadata__ (when all
//    shards carry the same one), else kHfShardMetadataKey; and the index's
//    "metadata" object, less "total_size", under kHfIndexMetadataKey;
//  - a directory: its `model.safetensors.index.json`, else its only
//    `*.safetensors.index.json`, else `model.safetensors`, else its only
//    `*.safetensors` file.
// Every .safetensors file is memory-mapped (the tensor bytes go from the map
// to the writer) and validated by parse_safetensors(); the index (at most
// kSafetensorsMaxHeader bytes) must be a JSON object whose "weight_map" maps
// names to plain file names in its directory.
// Throws Error(kNotFound) for a missing input or a shard the index names that
// does not exist (naming that shard); Error(kCorruption) naming the file and
// tensor for damaged input: a damaged or malformed .safetensors file
// (parse_safetensors), a malformed index (over the size cap, not JSON, no
// "weight_map" object, a value that is not a plain file name), a tensor found
// in two shards, a tensor in a shard other than the one the index names, a
// shard tensor the index lacks, or an index entry no shard holds;
// Error(kInvalidArgument) naming the directory for one with several
// candidates, or the index when a shard's __metadata__ uses a key treecask
// reserves; what treecask::save throws (e.g. kAlreadyExists,
// kInvalidArgument for a bad option, kUnsupported). Nothing is written when
// it throws.
SafetensorsImport import_safetensors(const std::string& input, const std::string& output,
                                     const SaveOptions& options);

struct SafetensorsExportOptions {
  // Unset: one .safetensors file at `output`. Set: the Hub's sharded layout in
  // directory `output`, each shard holding at most this many bytes of tensor
  // data (headers not counted, as in transformers); >= 1 (parse_size()).
  std::optional<uint64_t> max_shard_size;
  // Replace files that exist (else Error(kAlreadyExists), nothing written).
  bool overwrite = false;
  // When set, called with (tensor data bytes written, total) as the export goes.
  std::function<void(uint64_t, uint64_t)> progress;
};

// What export_safetensors wrote.
struct SafetensorsExport {
  std::string index;               // the index written; "" for one file
  std::vector<std::string> files;  // the .safetensors files written, in order
  size_t num_tensors = 0;
  uint64_t total_size = 0;         // tensor data bytes (the index's metadata.total_size)
  uint64_t file_bytes = 0;         // bytes of the .safetensors files written (headers included)
};

// Writes every leaf of `source` (an Archive, or a ShardedArchive whose global
// arrays are assembled from their boxes; open_reader() opens either) as
// safetensors tensors, each streamed by for_each_leaf_piece (files.h).
//
// Names and refusals (one rule for both layouts): a flat dict archive (one
// dict whose children are all leaves, as every import writes) names tensors
// by its dict keys verbatim, any other tree by canonical key paths (SPEC.md
// "Key paths"). Refused with
// Error(kUnsupported, source.path(), leaf key path): a leaf safetensors cannot
// hold (safetensors_refusal: no safetensors dtype, or sub-byte elements that
// do not fill whole bytes), a Python scalar/str leaf, an unnamed single-array
// archive, a tensor named "__metadata__", a duplicate name; duplicate metadata
// keys, names or metadata that are not valid UTF-8, or a header over
// kSafetensorsMaxHeader bytes. Headers are written as safetensors_header()
// writes them (the reference writer's bytes).
//
// One file (options.max_shard_size unset): tensors in leaf order, the archive
// metadata (all of it, in stored order) as __metadata__ (omitted when empty),
// written to `output` through OutputFile (atomic commit).
//
// Sharded (max_shard_size set): into directory `output` (created if missing),
// `model-00001-of-000NN.safetensors` shards (5-digit numbers, as transformers
// names them) and `model.safetensors.index.json` ({"metadata": {...,
// "total_size": N}, "weight_map": {name: shard}}, keys sorted, 2-space indent,
// as transformers writes it). An index is written even for one shard
// (transformers would name that one `model.safetensors`), so that the index
// metadata survives a round trip. Tensors are packed greedily in leaf order:
// a shard takes tensors while its data bytes stay <= max_shard_size; a tensor
// larger than that gets a shard of its own (as transformers does), after the
// shard being filled is closed, so that leaf order is kept across shards.
// Each shard's __metadata__ is the archive metadata without the "treecask.hf."
// keys (or, when kHfShardMetadataKey is present and names exactly the shard
// files written, each shard's own); the index's metadata is kHfIndexMetadataKey
// (when present) with "total_size" set to the bytes written. Commit: every
// file is written under a temporary name and fsynced; then an existing index
// is removed (with overwrite), the shards are renamed into place, and the
// index last, so a reader that starts from an index never sees one paired
// with a partial or mixed set of shards. Files from an earlier export with
// other shard names are left alone. Throws Error(kInvalidArgument) for
// max_shard_size 0 or a treecask.hf. metadata value that is not a JSON object
// of strings.
//
// Throws, besides the above: Error(kAlreadyExists) naming the first output
// file that exists when !overwrite (nothing is written); what reading
// `source` throws (kChecksumMismatch, kCorruption: no output file is left);
// Error(kIo).
SafetensorsExport export_safetensors(const Reader& source, const std::string& output,
                                     const SafetensorsExportOptions& options);

}  // namespace treecask::interop
