// info, ls, verify, get: the commands that read an archive.
#include "commands.h"

#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>

#include "files.h"
#include "npy.h"
#include "util.h"
#include "treecask/treecask.h"

namespace treecask::cli {
namespace {

using Json = nlohmann::ordered_json;

// Prints `j` with 2-space indent; invalid UTF-8 in strings becomes U+FFFD.
void print_json(const Json& j) {
  std::cout << j.dump(2, ' ', false, Json::error_handler_t::replace) << '\n';
}

Json key_values_json(const KeyValues& kvs) {
  Json out = Json::object();
  for (const auto& [k, v] : kvs) out[k] = v;
  return out;
}

// The codec column of `ls`: the codec, preceded by the filter when there is one.
std::string codec_label(const LeafInfo& info) {
  // A leaf of a sharded checkpoint: its saved boxes live in the shard files.
  if (!info.shards.empty()) return "shards:" + std::to_string(info.shards.size());
  std::string label(codec_name(info.codec));
  if (info.filter != Filter::kNone) label += "+" + std::string(filter_name(info.filter));
  return label;
}

Json leaf_json(const LeafInfo& info) {
  Json j = Json::object();
  j["index"] = info.index;
  j["key_path"] = info.key_path;
  j["kind"] = value_kind_name(info.value_kind);
  j["dtype"] = dtype_name(info.dtype);
  j["shape"] = info.shape;
  j["bytes"] = info.byte_length;
  j["stored_bytes"] = info.stored_bytes;
  j["codec"] = codec_name(info.codec);
  j["chunk_size"] = info.chunk_size;
  j["num_chunks"] = info.num_chunks;
  j["logical_axes"] = info.logical_axes;
  if (info.sharding) {
    Json s = Json::object();
    s["mesh_axis_names"] = info.sharding->mesh_axis_names;
    s["mesh_axis_sizes"] = info.sharding->mesh_axis_sizes;
    s["spec"] = info.sharding->spec;
    j["sharding"] = std::move(s);
  } else {
    j["sharding"] = nullptr;
  }
  j["metadata"] = key_values_json(info.metadata);
  j["filter"] = filter_name(info.filter);  // appended in 0.2 (format 2.0)
  if (!info.shards.empty()) {  // a sharded checkpoint's leaf (format 3.0)
    Json refs = Json::array();
    for (const auto& r : info.shards)
      refs.push_back(Json{{"file", r.file}, {"key_path", r.key_path}, {"start", r.start}, {"stop", r.stop}});
    j["shards"] = std::move(refs);
  }
  return j;
}

std::string display_key(const std::string& key_path) {
  return key_path.empty() ? std::string("(root)") : escape_for_terminal(key_path);
}

// "axes=(batch,embed)", "mesh=(data:2,model:4) spec=(data,(x,y),None)".
std::string leaf_extras(const LeafInfo& info) {
  std::string out;
  auto add = [&](const std::string& s) {
    if (!out.empty()) out += ' ';
    out += s;
  };
  if (info.value_kind != ValueKind::kArray) {
    add("kind=" + std::string(value_kind_name(info.value_kind)));
  }
  if (!info.logical_axes.empty()) {
    std::string s = "axes=(";
    for (size_t i = 0; i < info.logical_axes.size(); ++i) {
      if (i > 0) s += ',';
      s += info.logical_axes[i].empty() ? "_" : escape_for_terminal(info.logical_axes[i]);
    }
    add(s + ")");
  }
  if (info.sharding) {
    const Sharding& sh = *info.sharding;
    std::string s = "mesh=(";
    for (size_t i = 0; i < sh.mesh_axis_names.size(); ++i) {
      if (i > 0) s += ',';
      s += escape_for_terminal(sh.mesh_axis_names[i]);
      if (i < sh.mesh_axis_sizes.size()) s += ':' + std::to_string(sh.mesh_axis_sizes[i]);
    }
    s += ") spec=(";
    for (size_t i = 0; i < sh.spec.size(); ++i) {
      if (i > 0) s += ',';
      const auto& axes = sh.spec[i];
      if (axes.empty()) {
        s += "None";
      } else if (axes.size() == 1) {
        s += escape_for_terminal(axes[0]);
      } else {
        s += '(';
        for (size_t k = 0; k < axes.size(); ++k) {
          if (k > 0) s += ',';
          s += escape_for_terminal(axes[k]);
        }
        s += ')';
      }
    }
    add(s + ")");
  }
  return out;
}

}  // namespace

int run_info(const std::string& file, bool json) {
  refuse_manager_directory(file);
  std::optional<ShardedArchive> sharded;
  if (ShardedArchive::is_sharded(file)) sharded = ShardedArchive::open(file);
  Archive archive = sharded ? sharded->index() : Archive::open(file);
  uint64_t raw = 0;
  uint64_t stored = 0;
  for (size_t i = 0; i < archive.size(); ++i) {
    LeafInfo info = sharded ? sharded->leaf(i) : archive.leaf(i);
    raw += info.byte_length;
    stored += info.stored_bytes;
  }
  const std::string version =
      std::to_string(archive.format_major()) + "." + std::to_string(archive.format_minor());
  const double ratio = stored == 0 ? 0.0 : static_cast<double>(raw) / static_cast<double>(stored);
  if (json) {
    Json j = Json::object();
    j["file"] = archive.path();
    j["format_version"] = version;
    j["writer_library_version"] = archive.library_version();
    j["reader_library_version"] = library_version();
    j["created_unix_ns"] = archive.created_unix_ns();
    j["created"] = format_unix_ns(archive.created_unix_ns());
    j["leaves"] = archive.size();
    j["raw_bytes"] = raw;
    j["stored_bytes"] = stored;
    j["file_bytes"] = archive.file_size();
    if (stored == 0) {
      j["compression_ratio"] = nullptr;
    } else {
      j["compression_ratio"] = ratio;
    }
    j["metadata"] = key_values_json(archive.metadata());
    print_json(j);
    return kExitOk;
  }
  char ratio_text[64];
  if (stored == 0) {
    std::snprintf(ratio_text, sizeof ratio_text, "n/a (no stored bytes)");
  } else {
    std::snprintf(ratio_text, sizeof ratio_text, "%.3f (raw bytes / stored bytes)", ratio);
  }
  std::cout << "file:              " << archive.path() << '\n'
            << "format version:    " << version << '\n'
            << "writer library:    " << archive.library_version() << '\n'
            << "reader library:    " << library_version() << '\n'
            << "created:           " << format_unix_ns(archive.created_unix_ns()) << '\n'
            << "leaves:            " << archive.size() << '\n'
            << "raw bytes:         " << format_bytes(raw) << '\n'
            << "stored bytes:      " << format_bytes(stored) << '\n'
            << "file size:         " << format_bytes(archive.file_size()) << '\n'
            << "compression ratio: " << ratio_text << '\n';
  const KeyValues& meta = archive.metadata();
  if (meta.empty()) {
    std::cout << "metadata:          (none)\n";
  } else {
    std::cout << "metadata:          " << meta.size() << (meta.size() == 1 ? " entry" : " entries")
              << '\n';
    for (const auto& [k, v] : meta) {
      std::cout << "  " << escape_for_terminal(k) << ": " << escape_for_terminal(v) << '\n';
    }
  }
  return kExitOk;
}

int run_ls(const std::string& file, const std::optional<std::string>& prefix, bool json) {
  refuse_manager_directory(file);
  // A sharded checkpoint directory lists its global leaves (shape of the
  // whole array; stored bytes summed over the shard files).
  const std::unique_ptr<Reader> reader = open_reader(file);
  std::vector<size_t> indices;
  if (prefix && !prefix->empty()) {
    indices = reader->subtree(*prefix);
  } else {
    indices.resize(reader->size());
    for (size_t i = 0; i < indices.size(); ++i) indices[i] = i;
  }
  std::vector<LeafInfo> leaves;
  leaves.reserve(indices.size());
  for (size_t i : indices) leaves.push_back(reader->leaf(i));

  if (json) {
    Json j = Json::array();
    for (const LeafInfo& info : leaves) j.push_back(leaf_json(info));
    print_json(j);
    return kExitOk;
  }
  struct Row {
    std::string cells[6];
    std::string extras;
  };
  std::vector<Row> rows;
  size_t width[6] = {};
  for (const LeafInfo& info : leaves) {
    Row r{{display_key(info.key_path), std::string(dtype_name(info.dtype)),
           format_shape(info.shape), std::to_string(info.byte_length),
           std::to_string(info.stored_bytes), codec_label(info)},
          leaf_extras(info)};
    for (int c = 0; c < 6; ++c) width[c] = std::max(width[c], r.cells[c].size());
    rows.push_back(std::move(r));
  }
  for (const Row& r : rows) {
    std::string line;
    for (int c = 0; c < 6; ++c) {
      const std::string& cell = r.cells[c];
      const bool right = c == 3 || c == 4;  // byte counts
      if (c > 0) line += "  ";
      if (right) line.append(width[c] - cell.size(), ' ');
      line += cell;
      if (!right && (c < 5 || !r.extras.empty())) line.append(width[c] - cell.size(), ' ');
    }
    if (!r.extras.empty()) line += "  " + r.extras;
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::cout << line << '\n';
  }
  return kExitOk;
}

// Checks every chunk of every shard file of `s`, then prints the report of
// `verify DIR` (DAMAGED lines, OK / FAILED; `shown` names it on stderr).
int report_sharded(const ShardedArchive& s, const std::string& shown);

OpenOptions open_options(const SignatureArgs& args) {
  OpenOptions o;
  if (!args.signature || !args.public_key) return o;
  auto slurp = [](const std::string& path) {
    const interop::MappedFile in = interop::MappedFile::open(path);
    return std::string(reinterpret_cast<const char*>(in.bytes().data()), in.bytes().size());
  };
  o.signature = SignatureCheck{slurp(*args.signature), slurp(*args.public_key)};
  return o;
}

namespace {
constexpr const char* kSignatureOk = "signature OK: every signed byte matches its SHA-256 in the statement\n";

// verify --signature of a directory, an index or a URL: every signed byte
// hashed (all cores; a directory must hold exactly the files signed) before
// the chunks are checked through the signed open (its shards then cached).
void verify_signed(const std::string& target, const OpenOptions& options) {
  if (!options.signature) return;
  verify_signature(target, *options.signature);
  std::cout << kSignatureOk;
}
}  // namespace

int run_verify(const std::string& file, const SignatureArgs& sig) {
  refuse_manager_directory(file);
  if (ShardedArchive::is_sharded(file)) return run_verify_sharded(file, sig);
  const OpenOptions options = open_options(sig);
  // A signed local archive: its verify() checks every signed byte and every
  // chunk in one pass on all cores (docs/signing.md "What is verified when").
  const bool local_signed = options.signature && !is_url(file);
  if (!local_signed) verify_signed(file, options);
  Archive archive = Archive::open(file, options);
  // The index of a sharded checkpoint holds no leaf bytes: verifying it is
  // verifying the checkpoint, with the shard files beside it.
  if (ShardedArchive::is_index(archive)) {
    if (local_signed) verify_signed(file, options);
    return report_sharded(ShardedArchive::open_index(archive, options), file);
  }
  uint64_t raw = 0;
  for (size_t i = 0; i < archive.size(); ++i) raw += archive.leaf(i).byte_length;
  std::vector<Error> damaged;
  {
    Progress bar("verify", raw);
    damaged = archive.verify([&](uint64_t done, uint64_t) { bar.update(done); });
    bar.finish();
  }
  // Bytes that do not match the signature: a signature failure (exit 12),
  // as when the open finds them, naming the first leaf and byte range.
  if (local_signed)
    for (const Error& e : damaged)
      if (e.code() == ErrorCode::kSignature) throw e;
  for (const Error& e : damaged) {
    std::cout << "DAMAGED " << display_key(e.key_path()) << ": " << error_code_name(e.code())
              << ": " << escape_for_terminal(e.message()) << '\n';
  }
  if (damaged.empty()) {
    if (local_signed) std::cout << kSignatureOk;
    std::cout << "OK: " << archive.size() << " leaves, " << raw << " raw bytes verified\n";
    return kExitOk;
  }
  std::cout << "FAILED: " << damaged.size() << " of " << archive.size() << " leaves damaged\n";
  std::cout.flush();
  std::cerr << "treecask: " << file << ": " << damaged.size() << " of " << archive.size()
            << " leaves damaged\n";
  return kExitDamaged;
}

int run_get(const GetOptions& options) {
  refuse_manager_directory(options.file);
  Archive archive = Archive::open(options.file, open_options(options.sig));
  const size_t index = archive.index_of(options.key_path);
  const LeafInfo info = archive.leaf(index);
  std::string descr;
  std::vector<int64_t> shape;
  if (options.raw) {
    descr = "|u1";
    shape = {static_cast<int64_t>(info.byte_length)};
  } else if (auto d = interop::npy_descr(info.dtype)) {
    descr = std::string(*d);
    shape = info.shape;
  } else {
    throw Error(ErrorCode::kUnsupported, options.file, info.key_path,
                "dtype " + std::string(dtype_name(info.dtype)) +
                    " has no NumPy .npy descr; pass --raw to write its bytes as a 1-D uint8 "
                    "array (then e.g. np.load(f).view(ml_dtypes." +
                    std::string(dtype_name(info.dtype)) + ").reshape(shape))");
  }
  interop::OutputFile out(options.output, options.overwrite);
  out.write(interop::npy_header(descr, shape));
  Progress progress("get", info.byte_length);
  uint64_t done = 0;
  interop::for_each_leaf_piece(archive, index, [&](std::span<const std::byte> piece) {
    out.write(piece);
    done += piece.size();
    progress.update(done);
  });
  progress.finish();
  out.commit();
  std::cout << "wrote " << options.output << ": " << descr << ' ' << format_shape(shape) << ", "
            << out.bytes_written() << " bytes (" << info.byte_length << " data bytes)\n";
  return kExitOk;
}

// `verify DIR` of a sharded checkpoint: opening it checks that every shard
// file exists, is the one a bound index names, and holds every box the index
// names, with the right dtype and shape, and that the boxes tile each leaf
// exactly (SPEC.md "Sharded checkpoints" R1-R7, R9); then every chunk of
// every shard file is checked. `verify DIR/index.cask` runs the same checks
// through ShardedArchive::open_index.
int run_verify_sharded(const std::string& dir, const SignatureArgs& sig) {
  const OpenOptions options = open_options(sig);
  verify_signed(dir, options);
  return report_sharded(ShardedArchive::open(dir, options), dir);
}

int report_sharded(const ShardedArchive& s, const std::string& shown) {
  uint64_t raw = 0;
  for (const auto& f : s.files())
    for (size_t i = 0; i < s.file(f).size(); ++i) raw += s.file(f).leaf(i).byte_length;
  std::vector<Error> damaged;
  {
    Progress bar("verify", raw);
    damaged = s.verify([&](uint64_t done, uint64_t) { bar.update(done); });
    bar.finish();
  }
  for (const Error& e : damaged)
    std::cout << "DAMAGED " << escape_for_terminal(e.file()) << ": " << display_key(e.key_path()) << ": "
              << error_code_name(e.code()) << ": " << escape_for_terminal(e.message()) << '\n';
  if (damaged.empty()) {
    std::cout << "OK: " << s.size() << " leaves in " << s.files().size() << " shard files, shards tile every leaf, "
              << raw << " raw bytes verified\n";
    return kExitOk;
  }
  std::cout << "FAILED: " << damaged.size() << " damaged shard leaves\n";
  std::cout.flush();
  std::cerr << "treecask: " << shown << ": " << damaged.size() << " damaged shard leaves\n";
  return kExitDamaged;
}

int run_sign(const SignCliOptions& options) {
  std::string target = options.target;
  while (target.size() > 1 && target.back() == '/') target.pop_back();
  const std::string output = options.output.empty() ? target + ".sig" : options.output;
  const interop::MappedFile key = interop::MappedFile::open(options.private_key);
  const auto key_bytes = key.bytes();
  SignOptions so;
  so.shards = !options.files;
  so.shard_size = options.shard_size;
  std::string bundle;
  bundle = sign(target, std::string_view(reinterpret_cast<const char*>(key_bytes.data()), key_bytes.size()), so);
  interop::OutputFile out(output, options.overwrite);
  out.write(std::as_bytes(std::span(bundle.data(), bundle.size())));
  out.commit();
  std::cout << "wrote " << output << ": signed " << target << " ("
            << (options.files ? std::string("file serialization")
                              : "shards of " + std::to_string(sign_shard_size(target, so)) +
                                    " bytes")
            << ", " << bundle.size() << " bytes)\n";
  return kExitOk;
}

}  // namespace treecask::cli
