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
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "treecask/export.h"
#include "treecask/source.h"

namespace treecask {

// What a verified open checks against (OpenOptions::signature): a
// model-signing bundle (its JSON text, as the file holds it) and the PEM
// public key (SubjectPublicKeyInfo, "-----BEGIN PUBLIC KEY-----") of the EC
// key that signed it.
struct SignatureCheck {
  std::string bundle_json;
  std::string public_key_pem;
};

// The default shard size of sign() for a model of `model_bytes` bytes (a
// file's size, or a directory's files together): model_bytes / 1024 rounded
// up to a power of two, kept in [256 KiB, 2 MiB]. A verified read hashes the
// shards that cover its bytes, so a read of S bytes hashes at most S + 2
// shards: a 4 MiB leaf costs at most 8 MiB of SHA-256 (2x; the bound
// is 3x); a verified open hashes the shards under the pages it trusts (the
// manifest, the B-tree) and parses the statement, ~250 bytes of JSON per
// shard: up to 256 MiB the shards are 256 KiB (a small archive's open
// hashes little beyond its manifest), from 2 GiB they are 2 MiB (a 100 GB
// checkpoint's statement lists ~48,000 shards, ~12 MB of JSON). Measured in
// docs/signing.md "Performance".
TREECASK_API uint64_t default_sign_shard_size(uint64_t model_bytes);

struct SignOptions {
  // Shard serialization ("method": "shards"), which lets a read verify only
  // the shards it touches; false: file serialization ("method": "files"),
  // one digest per file, so a verified open hashes the whole file.
  bool shards = true;
  // Bytes per shard; 0 = default_sign_shard_size(the model's bytes).
  // Ignored without `shards`.
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

// The shard size sign() uses for `archive_or_directory` with `options`:
// options.shard_size, else default_sign_shard_size of the bytes of the files
// sign() hashes (the file; a directory's files, the ignored ones aside).
// Throws what sign() throws for a path it cannot list (kNotFound, kIo,
// kUnsupported).
TREECASK_API uint64_t sign_shard_size(const std::filesystem::path& archive_or_directory,
                                      const SignOptions& options = {});

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
// named), kNotFound (no such path), kIo (and what a URL's source throws),
// kUnsupported for a URL naming a directory the statement signs (a store's
// directory needs its listing: the overload with `files` below).
TREECASK_API void verify_signature(const std::filesystem::path& archive_or_directory,
                                   const SignatureCheck& check, unsigned threads = 0);

// verify_signature of one archive object read through `source` (a store's
// reader: remote.h open_object, or a caller's Source), named by
// source->name(): every signed byte fetched (16 MiB at a time, up to
// min(source->concurrency(), 8, threads) at once) and hashed as it arrives.
// Throws as verify_signature does for a URL.
TREECASK_API void verify_signature(std::shared_ptr<const Source> source, const SignatureCheck& check,
                                   unsigned threads = 0);

// verify_signature of a signed directory (a sharded checkpoint) in a store,
// named `shown` (its last component is the directory's name): `files` are
// the directory's files as a listing of it gives them (POSIX paths relative
// to it, with their sizes in bytes), `open` reads one by that path. The
// checks of a local directory (the statement is this directory's, it lists
// exactly these files, the ignored ones aside), then every signed byte of
// each file fetched through open() and hashed as it arrives, as for a URL.
// Throws as verify_signature does for a directory, and what `open` and its
// sources throw.
TREECASK_API void verify_signature(const std::string& shown, const std::vector<std::pair<std::string, uint64_t>>& files,
                                   const SourceOpener& open, const SignatureCheck& check, unsigned threads = 0);

// What a bundle signs, read from its statement without checking anything
// else (the envelope's signature included): the model's name (the
// statement's subject) and whether the model is a directory (a sharded
// checkpoint) or one file. For choosing how to open a name that may be
// either (an object store's key: the Python package's open); the open then
// checks the bundle itself. Throws Error(kSignature) for a bundle or
// statement that cannot be parsed, as a verified open does.
struct SignedModel {
  std::string name;
  bool directory = false;
};
TREECASK_API SignedModel signed_model(std::string_view bundle_json);

// The PEM public key (SubjectPublicKeyInfo, -----BEGIN PUBLIC KEY-----) of
// the unencrypted PEM EC private key `private_key_pem`: what a verified open
// of an archive that key signed takes (SignatureCheck::public_key_pem).
// Throws Error: kInvalidArgument (not a PEM private key), kUnsupported (a key
// that is not EC, or a curve model_signing does not take, named), as sign().
TREECASK_API std::string public_key_of(std::string_view private_key_pem);

}  // namespace treecask
