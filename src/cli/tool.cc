// The `treecask` tool's command line (run_tool, commands.h): inspect, verify,
// import and export treecask archives. docs/cli.md is the manual; the help
// texts below are its summary.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <new>

#include "commands.h"
#include "treecask/treecask.h"

namespace treecask::cli {

int exit_status(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kNotFound: return kExitNotFound;
    case ErrorCode::kNotAnArchive: return kExitNotAnArchive;
    case ErrorCode::kUnsupportedVersion: return kExitUnsupportedVersion;
    case ErrorCode::kCorruption: return kExitDamaged;
    case ErrorCode::kChecksumMismatch: return kExitDamaged;
    case ErrorCode::kKeyNotFound: return kExitKeyNotFound;
    case ErrorCode::kInvalidArgument: return kExitInvalid;
    case ErrorCode::kShapeMismatch: return kExitInvalid;
    case ErrorCode::kIo: return kExitIo;
    case ErrorCode::kAlreadyExists: return kExitAlreadyExists;
    case ErrorCode::kUnsupported: return kExitUnsupported;
    case ErrorCode::kSignature: return kExitSignature;
  }
  return kExitInternal;
}

namespace {

constexpr const char* kExitCodes =
    "Installed with the Python package (pip install), `treecask import-orbax` and\n"
    "`treecask import-flax` convert Orbax and legacy Flax checkpoints (python -m treecask).\n"
    "Exit status:\n"
    "  0 success            1 usage error          2 file not found\n"
    "  3 not an archive     4 unsupported version  5 corruption / checksum mismatch\n"
    "  6 key not found      7 invalid argument or unsupported input file\n"
    "  8 I/O error          9 output exists (no --overwrite)\n"
    " 10 unsupported (e.g. dtype the output format lacks)   11 internal error\n"
    " 12 signature does not verify (wrong key, another file, a signed range changed)\n"
    "Errors go to stderr as \"treecask: <file>: [<key path>: ]<error>: <message>\".\n"
    "Sizes are in bytes. Manual: docs/cli.md\n";

// --signature / --public-key on a subcommand: both or neither.
void add_signature_options(CLI::App* cmd, SignatureArgs& sig) {
  CLI::Option* s = cmd->add_option("--signature", sig.signature,
                                   "model-signing bundle (treecask sign, model_signing sign key) to verify "
                                   "every byte read against (docs/signing.md)");
  CLI::Option* k = cmd->add_option("--public-key", sig.public_key, "PEM public key of the EC key that signed it");
  s->needs(k);
  k->needs(s);
}

int run(int argc, char** argv) {
  CLI::App app{"treecask " + std::string(library_version()) +
               ": inspect, verify, import and export treecask checkpoint archives"};
  app.name("treecask");
  app.set_version_flag("--version",
                       std::string("treecask ") + library_version() + " (format " +
                           std::to_string(kFormatMajor) + "." + std::to_string(kFormatMinor) +
                           ")");
  app.require_subcommand(1);
  app.footer(kExitCodes);

  // ---- info
  std::string info_file;
  bool info_json = false;
  CLI::App* info = app.add_subcommand(
      "info", "Print the archive's format version, writer library version, creation time, "
              "leaf count, raw/stored/file bytes, compression ratio and metadata");
  info->add_option("FILE", info_file, "archive file")->required();
  info->add_flag("--json", info_json,
                 "print one JSON object: file, format_version, writer_library_version, "
                 "reader_library_version, created_unix_ns, created, leaves, raw_bytes, "
                 "stored_bytes, file_bytes, compression_ratio (null if nothing stored), metadata");
  info->footer(
      "Sizes in bytes: raw = sum of leaf sizes; stored = sum of stored chunk sizes (after\n"
      "LZ4); file = size of the file. Compression ratio = raw / stored.\n"
      "Exit status: 0 ok; 2 missing file; 3 not an archive; 4 newer format major version;\n"
      "5 damaged manifest; 8 I/O error.\n");

  // ---- ls
  std::string ls_file;
  std::string ls_prefix;
  bool ls_json = false;
  CLI::App* ls = app.add_subcommand("ls", "List the leaves, one line each, in tree order");
  ls->add_option("FILE", ls_file, "archive file")->required();
  CLI::Option* ls_prefix_opt = ls->add_option(
      "PREFIX", ls_prefix,
      "only leaves at or under this key path (whole components: \"enc\" does not match "
      "\"encoder/w\"); \"/\" separates components, \"~1\" is a literal \"/\", \"~0\" a \"~\"");
  ls->add_flag("--json", ls_json,
               "print a JSON array of objects with index, key_path, kind, dtype, shape, bytes, "
               "stored_bytes, codec, chunk_size, num_chunks, logical_axes, sharding, metadata");
  ls->footer(
      "Columns: KEY_PATH DTYPE SHAPE BYTES STORED_BYTES CODEC, then when present\n"
      "kind=<int|float|bool|str>, axes=(<logical axes>), mesh=(<axis>:<size>,...) spec=(...).\n"
      "BYTES is the raw size, STORED_BYTES the size in the file (after LZ4), both in bytes.\n"
      "The root leaf of a single-array archive shows as (root). Use --json for scripts.\n"
      "Exit status: 0 ok; 2 missing file; 3 not an archive; 6 no leaf under PREFIX.\n");

  // ---- verify
  std::string verify_file;
  CLI::App* verify = app.add_subcommand(
      "verify", "Check every chunk of every leaf (checksums, LZ4 decoding, padding)");
  verify->add_option("FILE", verify_file, "archive file, or a sharded checkpoint directory")->required();
  SignatureArgs verify_sig;
  add_signature_options(verify, verify_sig);
  verify->footer(
      "Prints \"DAMAGED <key path>: <error>: <message>\" for each damaged leaf, then\n"
      "\"OK: <n> leaves, <bytes> raw bytes verified\" or \"FAILED: <k> of <n> leaves damaged\".\n"
      "With --signature: \"signature OK: ...\" once every signed byte matches its SHA-256; an\n"
      "archive file's signed bytes and chunks are checked in one pass on all cores, a directory's\n"
      "or URL's signed bytes first (all cores), then the chunks through the signed open.\n"
      "Exit status: 0 intact; 5 damaged leaves or manifest; 12 the signature does not verify;\n"
      "2, 3, 4, 8 as for info.\n");

  // ---- get
  GetOptions get_options;
  CLI::App* get = app.add_subcommand("get", "Write one leaf as a NumPy .npy file");
  get->add_option("FILE", get_options.file, "archive file")->required();
  get->add_option("KEY_PATH", get_options.key_path, "the leaf's key path (see `ls`)")
      ->required();
  get->add_option("-o,--output", get_options.output, "output .npy file")->required();
  get->add_flag("--raw", get_options.raw,
                "write the leaf's bytes as a 1-D uint8 array instead (any dtype)");
  get->add_flag("--overwrite", get_options.overwrite, "replace OUTPUT if it exists");
  add_signature_options(get, get_options.sig);
  get->footer(
      "Writes .npy format 1.0 (2.0 if the header exceeds 64 KiB), descr '<f4', '|b1', '<c16'...\n"
      "bfloat16, float8_*, float4/float6_*, int2/uint2 and int4/uint4 have no NumPy descr and need\n"
      "--raw (view the result with ml_dtypes). Prints\n"
      "\"wrote OUTPUT: <descr> <shape>, <file bytes> bytes (<data bytes> data bytes)\".\n"
      "With --signature, only the shards holding the leaf (and the open's pages) are hashed.\n"
      "Exit status: 0 ok; 6 no such key path; 9 OUTPUT exists; 10 dtype needs --raw;\n"
      "5 checksum mismatch; 12 the signature does not verify; 2, 3, 8 as for info.\n");

  // ---- import
  ImportOptions import_options;
  CLI::App* import_cmd = app.add_subcommand(
      "import", "Convert a .safetensors or .npz file, or a Hugging Face sharded checkpoint "
              "(directory or *.safetensors.index.json), into an archive (a flat dict, tensors "
              "in file order)");
  import_cmd->add_option("INPUT", import_options.input,
                         ".safetensors or .npz file, *.safetensors.index.json, or a directory")
      ->required();
  import_cmd->add_option("OUTPUT", import_options.output, "archive to write")->required();
  import_cmd->add_option("--format", import_options.format,
                     "input format; auto: by extension, else a zip is .npz")
      ->check(CLI::IsMember({"auto", "safetensors", "npz"}))
      ->capture_default_str();
  import_cmd->add_option("--compression", import_options.compression,
                     "auto: LZ4 where it saves >= 10%; none: raw (zero-copy); lz4: always")
      ->check(CLI::IsMember({"auto", "none", "lz4"}))
      ->capture_default_str();
  import_cmd->add_option("--chunk-size", import_options.chunk_size,
                     "bytes per chunk, a multiple of 64 in [4096, 67108864]; "
                     "default 1048576");
  import_cmd->add_flag("--shuffle", import_options.shuffle,
                       "byte-shuffle LZ4-coded leaves of 2/4/8/16-byte dtypes before compressing "
                       "(bf16/fp32 weights compress; writes format 2.0, which 1.x readers refuse)");
  import_cmd->add_flag("--overwrite", import_options.overwrite, "replace OUTPUT if it exists");
  import_cmd->footer(
      "safetensors: memory-mapped and validated as the reference implementation does (header\n"
      "<= 100000000 bytes; tensors tile the data exactly: no overlap, no hole); __metadata__\n"
      "becomes the archive metadata unchanged. npz: member NAME.npy becomes leaf NAME.\n"
      "Sharded (Hugging Face): an index or a directory (its model.safetensors.index.json, else\n"
      "its only index, else model.safetensors); every shard's tensors, names as in the index;\n"
      "the shards' __metadata__ and the index's \"metadata\" kept (treecask.hf.* keys). Refused,\n"
      "naming the file: a missing shard (2), a tensor in two shards or in another shard than\n"
      "the index says, a shard tensor missing from the index (7). Prints\n"
      "\"wrote OUTPUT from <format>[ (<index>, <k> shards)]: <n> leaves, <raw> raw bytes,\n"
      "<stored> stored bytes, <file> file bytes\".\n"
      "Exit status: 0 ok; 2 INPUT or a shard missing; 5 a damaged or malformed .safetensors\n"
      "file; 7 a malformed .npz or index, or a bad option value; 9 OUTPUT exists; 8 I/O error.\n"
      "F4, F6_*, F8_E8M0 and the FNUZ float8s make a format 4.0 archive.\n");

  // ---- export
  ExportOptions export_options;
  CLI::App* export_cmd = app.add_subcommand(
      "export", "Write an archive as a .safetensors file, or as a Hugging Face sharded "
                "checkpoint directory (--max-shard-size)");
  export_cmd->add_option("FILE", export_options.file,
                         "archive file, or a sharded checkpoint directory (index.cask)")
      ->required();
  export_cmd->add_option("OUTPUT", export_options.output,
                         ".safetensors file to write; with --max-shard-size, a directory")
      ->required();
  export_cmd->add_option("--max-shard-size", export_options.max_shard_size,
                         "write OUTPUT/model-00001-of-000NN.safetensors shards of at most SIZE "
                         "data bytes each and OUTPUT/model.safetensors.index.json; SIZE as "
                         "transformers takes it: bytes, 5GB, 100KB, 500MB (10^3n), 1GiB (2^10n)");
  export_cmd->add_flag("--overwrite", export_options.overwrite, "replace OUTPUT if it exists");
  add_signature_options(export_cmd, export_options.sig);
  export_cmd->footer(
      "Tensors in leaf order, named by the dict key in a flat dict archive, else by key path;\n"
      "the archive metadata becomes __metadata__. The header is compact JSON padded with\n"
      "spaces to a multiple of 8 bytes, as the reference writer makes it: an imported\n"
      "safetensors file exports byte-for-byte identical. Prints\n"
      "\"wrote OUTPUT: <n> tensors, <data> data bytes, <file> file bytes\".\n"
      "--max-shard-size: tensors packed greedily in leaf order, never split (a larger tensor\n"
      "gets its own shard); every file written under a temporary name, the index renamed last;\n"
      "an imported sharded checkpoint's metadata is written back. Prints \"wrote OUTPUT:\n"
      "<k> shards, <n> tensors, <data> data bytes (max shard size <bytes> bytes), index <path>\".\n"
      "Exit status: 0 ok; 10 a leaf safetensors cannot hold (complex128, int2/uint2, int4/uint4,\n"
      "float8_e3m4/e4m3/e4m3b11fnuz, Python scalar/str leaves); 5 checksum mismatch; 9 OUTPUT exists;\n"
      "12 the signature (--signature) does not verify; 2, 3, 8 as for info.\n");

  // ---- sign
  SignCliOptions sign_options;
  CLI::App* sign_cmd = app.add_subcommand(
      "sign", "Sign an archive or a sharded checkpoint directory with an EC private key: an OpenSSF "
              "model-signing bundle (docs/signing.md)");
  sign_cmd->add_option("ARCHIVE", sign_options.target, "archive file, or a sharded checkpoint directory")
      ->required();
  sign_cmd->add_option("--private-key", sign_options.private_key,
                       "PEM EC private key (P-256, P-384 or P-521), unencrypted")
      ->required();
  sign_cmd->add_option("--signature", sign_options.output, "bundle to write; default ARCHIVE.sig");
  sign_cmd->add_option("--shard-size", sign_options.shard_size,
                       "bytes per signed shard; default: the model's bytes / 1024 as a power of two in "
                       "[262144, 2097152] (a read hashes the shards it touches)");
  sign_cmd->add_flag("--files", sign_options.files,
                     "file serialization: one digest per file (a signed open then hashes the whole file)");
  sign_cmd->add_flag("--overwrite", sign_options.overwrite, "replace the signature file if it exists");
  sign_cmd->footer(
      "Hashes every byte with SHA-256 on all cores and signs the in-toto statement (DSSE, ECDSA)\n"
      "as `model_signing sign key` does; `model_signing verify key` accepts the bundle (--files; its\n"
      "CLI hashes by files), model_signing's Python API both. Prints \"wrote SIG: signed ARCHIVE\n"
      "(shards of <n> bytes | file serialization, <bundle bytes> bytes)\".\n"
      "Exit status: 0 ok; 2 ARCHIVE or the key missing; 7 not a PEM private key; 9 SIG exists;\n"
      "10 a key type or curve model-signing does not take; 8 I/O error.\n");

  // A first word that names no subcommand: say so, rather than CLI11's "A
  // subcommand is required". import-orbax / import-flax are the Python
  // package's (python -m treecask; the `treecask` command pip installs runs them).
  bool known = argc < 2 || argv[1][0] == '-';
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    known = known || sub->check_name(argv[1]);
  }
  if (!known) {
    const std::string word = argv[1];
    std::cerr << "treecask: usage: unknown subcommand '" << word
              << "'; the subcommands are info, ls, verify, get, import, export\n";
    if (word == "import-orbax" || word == "import-flax") {
      std::cerr << "'" << word << "' is a command of the Python package: run 'python -m treecask "
                << word << " --help' (the `treecask` command that pip installs with the package runs it too)\n";
    }
    std::cerr << "Run 'treecask --help' for more information.\n";
    return kExitUsage;
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::cerr << "treecask: usage: " << e.what()
              << "\nRun 'treecask --help' or 'treecask SUBCOMMAND --help' for more information.\n";
    return kExitUsage;
  }

  if (info->parsed()) return run_info(info_file, info_json);
  if (ls->parsed()) {
    return run_ls(ls_file, ls_prefix_opt->count() > 0 ? std::optional(ls_prefix) : std::nullopt,
                  ls_json);
  }
  if (verify->parsed()) return run_verify(verify_file, verify_sig);
  if (sign_cmd->parsed()) return run_sign(sign_options);
  if (get->parsed()) return run_get(get_options);
  if (import_cmd->parsed()) return run_import(import_options);
  if (export_cmd->parsed()) return run_export(export_options);
  return kExitUsage;  // unreachable: require_subcommand(1)
}

}  // namespace

int run_tool(int argc, char** argv) noexcept {
  try {
    int status = run(argc, argv);
    std::cout.flush();
    if (!std::cout) {
      std::fputs("treecask: cannot write to stdout\n", stderr);
      return kExitIo;
    }
    return status;
  } catch (const Error& e) {
    std::cout.flush();
    std::cerr << "treecask: " << e.what() << '\n';
    return exit_status(e.code());
  } catch (const std::bad_alloc&) {
    std::cerr << "treecask: out of memory\n";
    return kExitInternal;
  } catch (const std::exception& e) {
    std::cerr << "treecask: internal error: " << e.what() << '\n';
    return kExitInternal;
  }
}

}  // namespace treecask::cli
