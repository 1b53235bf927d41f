// The sign layer (src/sign/, between format/ and read/ in docs/design.md's
// list): OpenSSF model-signing bundles parsed and checked, statements built
// and signed, SHA-256 over files and byte ranges on all cores, and the
// shard table of one file with its per-process cache of verified shards
// (shards.h). Cryptography is OpenSSL's libcrypto (EVP), JSON nlohmann-json;
// nothing here implements either.
//
// A bundle (model-signing 1.1.1, `model_signing sign key`):
//   {"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
//    "verificationMaterial": {"publicKey": {"hint": <hex SHA-256 of the
//       signer's public key PEM>}, "tlogEntries": []},
//    "dsseEnvelope": {"payload": <base64 statement JSON>,
//       "payloadType": "application/vnd.in-toto+json",
//       "signatures": [{"sig": <base64 DER ECDSA>, "keyid": ""}]}}
// signed over the DSSE pre-authentication encoding
// "DSSEv1 <len type> <type> <len payload> <payload>".
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "treecask/error.h"

namespace treecask::sig {

inline constexpr std::string_view kBundleMediaType = "application/vnd.dev.sigstore.bundle.v0.3+json";
inline constexpr std::string_view kPayloadType = "application/vnd.in-toto+json";
inline constexpr std::string_view kStatementType = "https://in-toto.io/Statement/v1";
inline constexpr std::string_view kPredicateType = "https://model_signing/signature/v1.0";

using Digest = std::array<uint8_t, 32>;

// A bundle's parts, parsed but not yet trusted.
struct Envelope {
  std::string payload;       // the statement JSON (base64-decoded)
  std::string payload_type;
  std::string signature;     // DER ECDSA signature (base64-decoded)
  std::string key_hint;      // hex SHA-256 of the signer's public key PEM, or empty
};

// One resource of a statement: a whole file ("method": "files", start 0,
// end the file's length unknown until checked: whole = true) or the bytes
// [start, end) of one ("shards").
struct Resource {
  std::string name;  // as listed: "path" or "path:start:end"
  std::string path;  // the file, relative to the model ("." for a file model)
  uint64_t start = 0, end = 0;
  bool whole = false;
  Digest digest{};
};

// A statement, parsed (from a verified envelope: trusted).
struct Statement {
  std::string subject;     // the model's name: its file's or directory's last component
  bool shards = false;     // "method": "shards"
  uint64_t shard_size = 0; // bytes per shard (shards only)
  std::vector<std::string> ignore_paths;
  std::vector<Resource> resources;  // as listed
  // True when the model is one file (every resource's path is ".").
  bool file_model() const;
};

// Parses a bundle's JSON. Throws Error(kSignature, `shown`) naming what is
// missing or malformed (media type, envelope, payload type, base64).
Envelope parse_bundle(std::string_view json, const std::string& shown);

// Parses a statement (the envelope's payload). Checks the in-toto type, the
// predicate type, the serialization (method files or shards, hash_type
// sha256: another algorithm is named in the error), every resource's name,
// algorithm ("sha256", or "sha256-sharded-<shard_size>" as model_signing
// writes for shards) and 64-hex-digit digest, and the subject's digest
// (SHA-256 over the resources' digests in order, model_signing's root
// digest). Throws Error(kSignature, `shown`).
Statement parse_statement(std::string_view payload, const std::string& shown);

// Checks the envelope's signature with `public_key_pem` (an EC key on
// P-256/P-384/P-521; another key type or curve is named in the error), and
// the bundle's key hint against that key. Throws Error(kSignature, `shown`):
// "the signature was not made with this public key" for a wrong key.
void check_envelope(const Envelope& envelope, std::string_view public_key_pem, const std::string& shown);

// parse_bundle + check_envelope + parse_statement.
Statement check_bundle(std::string_view json, std::string_view public_key_pem, const std::string& shown);

// check_bundle through a small process-wide cache (the last 4 bundles
// checked, keyed by the SHA-256 of the bundle and the key): a sharded
// checkpoint's files, opened one by one with the directory's bundle, parse
// and check it once. Failures are not cached. Thread-safe.
std::shared_ptr<const Statement> checked_statement(std::string_view json, std::string_view public_key_pem,
                                                   const std::string& shown);

// The cache under checked_statement, for a caller that checks a bundle's
// parts itself (SignedOpen: the signature and the statement on two
// threads). bundle_key: the SHA-256 of the bundle's length, the bundle and
// the key. cached_statement: the statement checked under that key, or null.
// remember_statement: records `statement`, which the caller has parsed from
// an envelope whose signature it checked with that key.
Digest bundle_key(std::string_view json, std::string_view public_key_pem);
std::shared_ptr<const Statement> cached_statement(const Digest& key);
void remember_statement(const Digest& key, std::shared_ptr<const Statement> statement);

// Signs `statement_json` (the payload) with the PEM EC private key and
// returns the bundle JSON. Throws Error(kInvalidArgument) for a PEM that is
// no private key, Error(kUnsupported) for a key type or curve model_signing
// does not sign with (named).
std::string make_bundle(const std::string& statement_json, std::string_view private_key_pem);

// The PEM public key (SubjectPublicKeyInfo) of the PEM EC private key
// `private_key_pem`; the errors of make_bundle for a key it cannot sign with.
std::string public_key_pem_of(std::string_view private_key_pem);

// The statement JSON for `resources` (in the order given) of the model named
// `subject`, with model_signing's serialization record (shards: shard_size;
// ignore_paths: model_signing's defaults).
std::string make_statement(const std::string& subject, bool shards, uint64_t shard_size,
                           const std::vector<Resource>& resources,
                           const std::vector<std::string>& ignore_paths);

// model_signing's default ignore_paths (git metadata at the model's top).
const std::vector<std::string>& default_ignore_paths();

// Lowercase hex of `d`.
std::string hex(const Digest& d);

}  // namespace treecask::sig
