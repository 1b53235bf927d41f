// Signed checkpoints: OpenSSF model-signing bundles (docs/signing.md).
//
// A signature is an external file, never part of the archive (format/SPEC.md
// is unchanged): the Sigstore bundle JSON that `model_signing sign key`
// (model-signing 1.1.1, PyPI) writes for an EC private key. It holds a DSSE
// envelope whose in-toto statement (predicateType
// https://model_signing/signature/v1.0) lists the SHA-256 digest of every
// file of the model ("method": "files") or of every fixed-size shard of
// each file ("method": "shards", resources named "path:start:end", byte
// offsets, end excluded). A single file signed as the model is named "."
// (model_signing's name for it), the statement's subject naming the file;
// a directory's files are named by their paths in it, the subject naming
// the directory.
//
// treecask checks such a bundle itself: the envelope once (DSSE
// pre-authentication encoding, ECDSA through OpenSSL's EVP interface with
// the hash the curve implies: P-256 SHA-256, P-384 SHA-384, P-521
// SHA-512), then the SHA-256 of the signed ranges the reads use, each range
// once per process (OpenOptions::signature, archive.h). Errors are
// Error(kSignature) naming the file and what failed; bad JSON in a bundle is
// also kSignature (an unverifiable signature), never a crash.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "treecask/export.h"

namespace treecask {

// What a verified open checks against (OpenOptions::signature): a
// model-signing bundle (its JSON text, as the file holds it) and the PEM
// public key (SubjectPublicKeyInfo, "-----BEGIN PUBLIC KEY-----") of the EC
// key that signed it.
struct SignatureCheck {
  std::string bundle_json;
  std::string public_key_pem;
};

// The default shard size of sign(): 1 MiB (1048576 bytes). A verified read
// hashes the shards that cover its bytes, so a read of S bytes hashes at
// most S + 2 shards: a 4 MiB leaf costs at most 6 MiB of SHA-256 (1.5x;
// docs/signing.md "Cost"), while a 100 GB checkpoint's statement lists
// ~95,000 shards (~15 MB of JSON, parsed once per open).
inline constexpr uint64_t kDefaultSignShardSize = uint64_t{1} << 20;

struct SignOptions {
  // Shard serialization ("method": "shards"), which lets a read verify only
  // the shards it touches; false: file serialization ("method": "files"),
  // one digest per file, so a verified open hashes the whole file.
  bool shards = true;
  // Bytes per shard; 0 = kDefaultSignShardSize. Ignored without `shards`.
  uint64_t shard_size = 0;
  // Threads that hash (0 = all cores).
  unsigned threads = 0;
};

// Signs `archive_or_directory`: an archive file (the model is that file,
// resource "."), or a directory (a sharded checkpoint: index.cask and its
// shard files; model_signing's directory model: every regular file under
// it, by its relative POSIX path, except .git, .gitattributes, .github and
// .gitignore at its top, which model_signing ignores by default). Every byte
// is hashed with SHA-256 on `options.threads` threads. `private_key_pem` is
// an unencrypted PEM EC private key on P-256, P-384 or P-521 (what
// `model_signing sign key` takes). Returns the bundle JSON, which
// `model_signing verify key` accepts for file serialization, and
// model_signing's Python API (verifying.Config().use_elliptic_key_verifier)
// for both (its CLI hashes by files whatever the bundle says). Write it
// next to the archive (`treecask sign` writes ARCHIVE.sig).
// Throws Error: kNotFound (no such path), kIo, kInvalidArgument (not a PEM
// private key, shard_size 0 after defaulting is impossible), kUnsupported
// (a key that is not EC, or a curve model_signing does not take, named),
// kUnsupported for a symbolic link inside a directory (model_signing refuses
// them without --allow_symlinks).
TREECASK_API std::string sign(const std::filesystem::path& archive_or_directory,
                              std::string_view private_key_pem, const SignOptions& options = {});

// Checks `archive_or_directory` against `check` as `model_signing verify
// key` does, hashing every signed byte on `threads` threads (0 = all
// cores). A URL (is_url, remote.h: s3://, gs://, http(s)://) is an archive
// read by range: every signed byte fetched (16 MiB at a time, concurrently)
// and hashed as it arrives. Checked: the envelope's signature under the public key, the statement's
// subject (the file's or directory's name), and the SHA-256 of every
// resource; for a directory also that it holds exactly the files the
// statement lists (none missing, none extra, the ignored names aside).
// Returns when everything verifies. Throws Error(kSignature) naming the file
// and what failed (wrong key, a statement for another file or directory, a
// digest mismatch naming the file and byte range, a file longer or shorter
// than signed, a file the statement lists missing from the directory or one
// it does not list present, an unsupported key type or hash algorithm
// named), kNotFound (no such path), kIo (and what a URL's source throws).
TREECASK_API void verify_signature(const std::filesystem::path& archive_or_directory,
                                   const SignatureCheck& check, unsigned threads = 0);

// The PEM public key (SubjectPublicKeyInfo, -----BEGIN PUBLIC KEY-----) of
// the unencrypted PEM EC private key `private_key_pem`: what a verified open
// of an archive that key signed takes (SignatureCheck::public_key_pem).
// Throws Error: kInvalidArgument (not a PEM private key), kUnsupported (a key
// that is not EC, or a curve model_signing does not take, named), as sign().
TREECASK_API std::string public_key_of(std::string_view private_key_pem);

}  // namespace treecask
