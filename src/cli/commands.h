// The `treecask` tool's subcommands. Each run_* function prints its output to
// stdout, returns the process exit status, and throws treecask::Error for any
// failure (main() prints it and maps its code with exit_status()).
// docs/cli.md documents every command, its output and the exit statuses.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "treecask/archive.h"
#include "treecask/error.h"

namespace treecask::cli {

// Exit statuses (docs/cli.md "Exit codes"). Stable across releases.
enum ExitStatus : int {
  kExitOk = 0,
  kExitUsage = 1,             // bad command line
  kExitNotFound = 2,          // ErrorCode::kNotFound
  kExitNotAnArchive = 3,      // ErrorCode::kNotAnArchive
  kExitUnsupportedVersion = 4,
  kExitDamaged = 5,           // kCorruption (a damaged archive or import input),
                              // kChecksumMismatch; verify found damage
  kExitKeyNotFound = 6,
  kExitInvalid = 7,           // kInvalidArgument, kShapeMismatch (a bad argument; a
                              // valid input file import does not take)
  kExitIo = 8,
  kExitAlreadyExists = 9,
  kExitUnsupported = 10,      // e.g. a dtype the output format cannot hold
  kExitInternal = 11,         // a bug or out of memory
  kExitSignature = 12,        // ErrorCode::kSignature: a signature that does not verify
};

// The exit status for an error of `code`.
int exit_status(ErrorCode code) noexcept;

// The whole tool: parses `argv` (argv[0] is the program name), runs the
// subcommand, prints any error to stderr as "treecask: <error>" and returns
// the exit status; never throws. main() is this; the Python package calls
// it in-process (treecask._core.run_tool) for URLs it reads through obstore.
int run_tool(int argc, char** argv) noexcept;

// --signature SIG --public-key PUB.pem of verify, get and export: both or
// neither (CLI11 enforces it). open_options() reads the two files into
// OpenOptions::signature (signing.h); kNotFound / kIo naming the file.
struct SignatureArgs {
  std::optional<std::string> signature;
  std::optional<std::string> public_key;
};
OpenOptions open_options(const SignatureArgs& args);

int run_info(const std::string& file, bool json);
int run_ls(const std::string& file, const std::optional<std::string>& prefix, bool json);
// With a signature: verify_signature() first (every signed byte's SHA-256
// on all cores), then the XXH3 check of every chunk through a signed open.
int run_verify(const std::string& file, const SignatureArgs& sig = {});
// Sharded checkpoint directories (SPEC.md "Sharded checkpoints"): run_verify
// hands a directory to this; run_info reads its index, run_ls and run_export
// read either kind through open_reader().
int run_verify_sharded(const std::string& dir, const SignatureArgs& sig = {});

struct SignCliOptions {
  std::string target;       // an archive file or a sharded checkpoint directory
  std::string private_key;  // PEM EC private key file
  std::string output;       // default: target + ".sig"
  uint64_t shard_size = 0;  // 0: default_sign_shard_size of the model's bytes
  bool files = false;       // file serialization
  bool overwrite = false;
};
// treecask::sign, the bundle written to `output` (atomically; kAlreadyExists
// without overwrite).
int run_sign(const SignCliOptions& options);

struct GetOptions {
  std::string file;
  std::string key_path;
  std::string output;
  bool raw = false;
  bool overwrite = false;
  SignatureArgs sig;
};
int run_get(const GetOptions& options);

struct ImportOptions {
  std::string input;
  std::string output;
  std::string format = "auto";       // auto | safetensors | npz
  std::string compression = "auto";  // auto | none | lz4
  uint64_t chunk_size = 0;           // 0: the library default
  bool shuffle = false;              // SaveOptions::shuffle
  bool overwrite = false;
};
// .safetensors (one file, or the Hugging Face sharded layout: a directory or a
// *.safetensors.index.json) through interop::import_safetensors; .npz through
// interop::import_npz (npz.h).
int run_import(const ImportOptions& options);

struct ExportOptions {
  std::string file;    // an archive file or a sharded checkpoint directory
  std::string output;
  bool overwrite = false;
  // Set: write the Hugging Face sharded layout into directory `output`; the
  // Hub's size syntax, interop::parse_size().
  std::optional<std::string> max_shard_size;
  SignatureArgs sig;
};
// interop::export_safetensors of open_reader(options.file).
int run_export(const ExportOptions& options);

}  // namespace treecask::cli
