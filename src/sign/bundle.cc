// Model-signing bundles: parse, check and make them (bundle.h), with
// OpenSSL's libcrypto for base64, SHA-256, ECDSA and PEM, and nlohmann-json.
#include "sign/bundle.h"

#include <openssl/bio.h>
#include <openssl/core_names.h>
#include <openssl/decoder.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "sign/sha256.h"

namespace treecask::sig {

namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

[[noreturn]] void bad(const std::string& shown, const std::string& what) {
  throw Error(ErrorCode::kSignature, shown, "", what);
}

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct MdCtxFree {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
using Bio = std::unique_ptr<BIO, BioFree>;
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;
using MdCtx = std::unique_ptr<EVP_MD_CTX, MdCtxFree>;

const EVP_MD* sha256_md() {
  static const EVP_MD* md = [] {
    EVP_MD* m = EVP_MD_fetch(nullptr, "SHA256", nullptr);  // fetched once: no per-call lookup
    return m ? static_cast<const EVP_MD*>(m) : EVP_sha256();
  }();
  return md;
}

// Standard or URL-safe base64, padding optional (protobuf's JSON mapping
// accepts both); nullopt-like false when malformed.
bool base64_decode(std::string_view in, std::string* out) {
  std::string s(in);
  for (char& c : s) {
    if (c == '-') c = '+';
    if (c == '_') c = '/';
  }
  if (s.size() % 4 == 1) return false;
  while (s.size() % 4 != 0) s += '=';
  size_t pad = 0;
  if (!s.empty() && s.back() == '=') ++pad;
  if (s.size() >= 2 && s[s.size() - 2] == '=') ++pad;
  for (size_t i = 0; i + pad < s.size(); ++i)  // '=' only at the end
    if (s[i] == '=') return false;
  out->assign(s.size() / 4 * 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out->data()),
                                reinterpret_cast<const unsigned char*>(s.data()), static_cast<int>(s.size()));
  if (n < 0 || static_cast<size_t>(n) < pad) return false;
  out->resize(static_cast<size_t>(n) - pad);
  return true;
}

std::string base64_encode(std::string_view in) {
  std::string out((in.size() + 2) / 3 * 4 + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

bool parse_hex(std::string_view s, Digest* out) {
  if (s.size() != 64) return false;
  auto nib = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < 32; ++i) {
    const int hi = nib(s[2 * i]), lo = nib(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*out)[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return true;
}

// A decimal uint64 of digits only (model_signing writes str(int)).
bool parse_u64(std::string_view s, uint64_t* out) {
  if (s.empty() || s.size() > 20) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

// The string member `key` of object `j`, or why not.
const std::string& str_at(const json& j, const char* key, const std::string& where, const std::string& shown) {
  if (!j.is_object()) bad(shown, where + " is not a JSON object");
  auto it = j.find(key);
  if (it == j.end()) bad(shown, where + " has no \"" + key + "\"");
  if (!it->is_string()) bad(shown, where + "'s \"" + key + "\" is not a string");
  return it->get_ref<const std::string&>();
}

const json& member(const json& j, const char* key, const std::string& where, const std::string& shown) {
  if (!j.is_object()) bad(shown, where + " is not a JSON object");
  auto it = j.find(key);
  if (it == j.end()) bad(shown, where + " has no \"" + key + "\"");
  return *it;
}

json parse_json(std::string_view text, const std::string& what, const std::string& shown) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) bad(shown, what + " is not valid JSON");
  return j;
}

// The key's PEM as model_signing hashes it for the hint (cryptography's
// SubjectPublicKeyInfo PEM, which OpenSSL writes identically).
std::string public_pem_of(EVP_PKEY* key) {
  Bio out(BIO_new(BIO_s_mem()));
  if (!out || PEM_write_bio_PUBKEY(out.get(), key) != 1) throw std::bad_alloc();
  char* data = nullptr;
  const long n = BIO_get_mem_data(out.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

// The hash model_signing pairs with the key's curve, or nullptr with `why`
// naming the key type or curve it does not take.
const EVP_MD* ec_hash_of(EVP_PKEY* key, std::string* why) {
  if (EVP_PKEY_get_base_id(key) != EVP_PKEY_EC) {
    const char* name = EVP_PKEY_get0_type_name(key);
    *why = std::string("unsupported key type ") + (name ? name : "(unknown)") +
           ": model-signing keys are elliptic-curve keys on P-256, P-384 or P-521";
    return nullptr;
  }
  char group[80] = {};
  size_t len = 0;
  if (EVP_PKEY_get_utf8_string_param(key, OSSL_PKEY_PARAM_GROUP_NAME, group, sizeof group, &len) != 1) {
    *why = "unsupported elliptic-curve key: its curve has no name (explicit parameters)";
    return nullptr;
  }
  const std::string g(group, len);
  if (g == "prime256v1" || g == "P-256") return EVP_sha256();
  if (g == "secp384r1" || g == "P-384") return EVP_sha384();
  if (g == "secp521r1" || g == "P-521") return EVP_sha512();
  *why = "unsupported elliptic curve " + g + ": model-signing takes P-256, P-384 or P-521";
  return nullptr;
}

std::span<const std::byte> bytes_of(std::string_view s) { return std::as_bytes(std::span(s.data(), s.size())); }

std::string pae(std::string_view payload) {
  return "DSSEv1 " + std::to_string(kPayloadType.size()) + " " + std::string(kPayloadType) + " " +
         std::to_string(payload.size()) + " " + std::string(payload);
}

}  // namespace

std::string hex(const Digest& d) {
  static const char* k = "0123456789abcdef";
  std::string s(64, '0');
  for (size_t i = 0; i < 32; ++i) {
    s[2 * i] = k[d[i] >> 4];
    s[2 * i + 1] = k[d[i] & 15];
  }
  return s;
}

bool Statement::file_model() const {
  for (const Resource& r : resources)
    if (r.path != ".") return false;
  return !resources.empty();
}

const std::vector<std::string>& default_ignore_paths() {
  static const std::vector<std::string> k = {".gitignore", ".git", ".github", ".gitattributes"};
  return k;
}

Envelope parse_bundle(std::string_view text, const std::string& shown) {
  const json b = parse_json(text, "the signature bundle", shown);
  if (!b.is_object()) bad(shown, "the signature bundle is not a JSON object");
  const std::string& media = str_at(b, "mediaType", "the bundle", shown);
  if (media != kBundleMediaType)
    bad(shown, "unsupported bundle media type '" + media + "' (expected " + std::string(kBundleMediaType) + ")");
  Envelope e;
  if (auto vm = b.find("verificationMaterial"); vm != b.end()) {
    if (!vm->is_object()) bad(shown, "the bundle's verificationMaterial is not a JSON object");
    if (auto pk = vm->find("publicKey"); pk != vm->end()) {
      if (!pk->is_object()) bad(shown, "the bundle's publicKey is not a JSON object");
      if (auto h = pk->find("hint"); h != pk->end() && !h->is_null()) {
        if (!h->is_string()) bad(shown, "the bundle's public key hint is not a string");
        e.key_hint = h->get<std::string>();
      }
    } else if (vm->contains("certificate") || vm->contains("x509CertificateChain")) {
      bad(shown, "the bundle is signed with a certificate (Sigstore keyless or a signing certificate): "
                 "treecask verifies bundles signed with a key; verify this one with model_signing");
    }
  }
  const json& env = member(b, "dsseEnvelope", "the bundle", shown);
  const std::string& payload = str_at(env, "payload", "the DSSE envelope", shown);
  e.payload_type = str_at(env, "payloadType", "the DSSE envelope", shown);
  if (e.payload_type != kPayloadType)
    bad(shown, "unsupported DSSE payload type '" + e.payload_type + "' (expected " + std::string(kPayloadType) + ")");
  if (!base64_decode(payload, &e.payload)) bad(shown, "the DSSE payload is not base64");
  const json& sigs = member(env, "signatures", "the DSSE envelope", shown);
  if (!sigs.is_array() || sigs.empty()) bad(shown, "the DSSE envelope has no signature");
  if (sigs.size() != 1)
    bad(shown, "the DSSE envelope has " + std::to_string(sigs.size()) + " signatures, model-signing writes one");
  if (!base64_decode(str_at(sigs[0], "sig", "the DSSE signature", shown), &e.signature) || e.signature.empty())
    bad(shown, "the DSSE signature is not base64");
  return e;
}

Statement parse_statement(std::string_view payload, const std::string& shown) {
  const json s = parse_json(payload, "the in-toto statement", shown);
  if (!s.is_object()) bad(shown, "the in-toto statement is not a JSON object");
  const std::string& type = str_at(s, "_type", "the statement", shown);
  if (type != kStatementType)
    bad(shown, "unsupported statement type '" + type + "' (expected " + std::string(kStatementType) + ")");
  const std::string& ptype = str_at(s, "predicateType", "the statement", shown);
  if (ptype != kPredicateType)
    bad(shown, "unsupported predicate type '" + ptype + "' (expected " + std::string(kPredicateType) +
                   "; the v0.1 digests of model_signing before 1.0 are not read)");
  Statement st;
  const json& subjects = member(s, "subject", "the statement", shown);
  if (!subjects.is_array() || subjects.size() != 1)
    bad(shown, "the statement must have exactly one subject (the model)");
  st.subject = str_at(subjects[0], "name", "the statement's subject", shown);
  Digest root{};
  if (!parse_hex(str_at(member(subjects[0], "digest", "the statement's subject", shown), "sha256",
                        "the subject's digest", shown),
                 &root))
    bad(shown, "the subject's sha256 digest is not 64 hex digits");

  const json& pred = member(s, "predicate", "the statement", shown);
  const json& ser = member(pred, "serialization", "the predicate", shown);
  const std::string& method = str_at(ser, "method", "the serialization", shown);
  const std::string& hash_type = str_at(ser, "hash_type", "the serialization", shown);
  if (hash_type != "sha256")
    bad(shown, "unsupported hash algorithm '" + hash_type + "' (treecask verifies sha256 signatures)");
  if (method == "shards") {
    st.shards = true;
    const json& sz = member(ser, "shard_size", "the serialization", shown);
    // model_signing writes it as a JSON number (1000000.0 through protobuf's Struct).
    double d = 0;
    if (sz.is_number_unsigned()) {
      st.shard_size = sz.get<uint64_t>();
    } else if (sz.is_number() && (d = sz.get<double>()) >= 1 && d <= 9.0e15 && d == static_cast<double>(static_cast<uint64_t>(d))) {
      st.shard_size = static_cast<uint64_t>(d);
    } else {
      bad(shown, "the serialization's shard_size is not a positive integer");
    }
    if (st.shard_size == 0) bad(shown, "the serialization's shard_size is 0");
  } else if (method != "files") {
    bad(shown, "unsupported serialization method '" + method + "' (model-signing writes files or shards)");
  }
  if (auto ip = ser.find("ignore_paths"); ip != ser.end()) {
    if (!ip->is_array()) bad(shown, "the serialization's ignore_paths is not a list");
    for (const json& p : *ip) {
      if (!p.is_string()) bad(shown, "the serialization's ignore_paths holds a non-string");
      st.ignore_paths.push_back(p.get<std::string>());
    }
  }
  const json& res = member(pred, "resources", "the predicate", shown);
  if (!res.is_array()) bad(shown, "the predicate's resources is not a list");
  Sha256 root_hash;
  st.resources.reserve(res.size());
  for (const json& r : res) {
    Resource x;
    x.name = str_at(r, "name", "a resource", shown);
    const std::string& alg = str_at(r, "algorithm", "resource '" + x.name + "'", shown);
    const bool alg_ok = alg == "sha256" || (st.shards && alg == "sha256-sharded-" + std::to_string(st.shard_size));
    if (!alg_ok) bad(shown, "resource '" + x.name + "': unsupported hash algorithm '" + alg + "'");
    if (!parse_hex(str_at(r, "digest", "resource '" + x.name + "'", shown), &x.digest))
      bad(shown, "resource '" + x.name + "': its digest is not 64 hex digits");
    if (st.shards) {
      const size_t a = x.name.find(':'), b = a == std::string::npos ? a : x.name.find(':', a + 1);
      if (b == std::string::npos || x.name.find(':', b + 1) != std::string::npos ||
          !parse_u64(std::string_view(x.name).substr(a + 1, b - a - 1), &x.start) ||
          !parse_u64(std::string_view(x.name).substr(b + 1), &x.end))
        bad(shown, "resource '" + x.name + "' is not named path:start:end");
      x.path = x.name.substr(0, a);
      if (x.end < x.start) bad(shown, "resource '" + x.name + "' ends before it starts");
    } else {
      x.path = x.name;
      x.whole = true;
    }
    if (x.path.empty()) bad(shown, "a resource has an empty path");
    root_hash.update(std::as_bytes(std::span(x.digest)));
    st.resources.push_back(std::move(x));
  }
  if (root_hash.finish() != root)
    bad(shown, "the statement is inconsistent: its subject's digest is not the SHA-256 of its resources' digests");
  return st;
}

namespace {

// A public key as check_envelope uses it: the key and the hash its curve
// signs with (or why it cannot verify). Decoding a PEM key costs OpenSSL 3 about a
// millisecond (it builds a decoder chain each time), so each process keeps
// the last few keys it decoded, by their PEM text.
struct PublicKey {
  std::shared_ptr<EVP_PKEY> key;
  const EVP_MD* md = nullptr;
  std::string why;  // set when md is null
};

std::shared_ptr<const PublicKey> public_key_of_pem(std::string_view pem, const std::string& shown) {
  static std::mutex mu;
  static std::vector<std::pair<std::string, std::shared_ptr<const PublicKey>>> recent;  // newest last
  constexpr size_t kKeep = 8;
  {
    std::lock_guard lock(mu);
    for (auto& [text, k] : recent)
      if (text == pem) return k;
  }
  // A SubjectPublicKeyInfo in PEM ("-----BEGIN PUBLIC KEY-----"), decoded by
  // OpenSSL: first with its EC decoders only (the keys model-signing signs
  // with; the chain's set-up is about half the full one's, ~0.5 ms of a
  // fresh process), then with every decoder, so that ec_hash_of can name any
  // other key's type.
  EVP_PKEY* raw = nullptr;
  for (const char* key_type : {"EC", static_cast<const char*>(nullptr)}) {
    std::unique_ptr<OSSL_DECODER_CTX, decltype(&OSSL_DECODER_CTX_free)> dec(
        OSSL_DECODER_CTX_new_for_pkey(&raw, "PEM", "SubjectPublicKeyInfo", key_type, EVP_PKEY_PUBLIC_KEY, nullptr,
                                      nullptr),
        &OSSL_DECODER_CTX_free);
    if (!dec) throw std::bad_alloc();
    const auto* data = reinterpret_cast<const unsigned char*>(pem.data());
    size_t left = pem.size();
    if (OSSL_DECODER_from_data(dec.get(), &data, &left) == 1 && raw) break;
    raw = nullptr;
    ERR_clear_error();
  }
  if (!raw) bad(shown, "the public key is not a PEM public key (-----BEGIN PUBLIC KEY-----)");
  auto k = std::make_shared<PublicKey>();
  k->key.reset(raw, &EVP_PKEY_free);
  k->md = ec_hash_of(raw, &k->why);
  std::lock_guard lock(mu);
  if (recent.size() == kKeep) recent.erase(recent.begin());
  recent.emplace_back(std::string(pem), k);
  return k;
}

}  // namespace

void check_envelope(const Envelope& e, std::string_view public_key_pem, const std::string& shown) {
  const auto pk = public_key_of_pem(public_key_pem, shown);
  if (!pk->md) bad(shown, pk->why);
  MdCtx ctx(EVP_MD_CTX_new());
  if (!ctx) throw std::bad_alloc();
  const std::string tbs = pae(e.payload);
  if (EVP_DigestVerifyInit(ctx.get(), nullptr, pk->md, nullptr, pk->key.get()) != 1)
    bad(shown, "OpenSSL cannot verify with this public key");
  const int ok = EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(e.signature.data()),
                                  e.signature.size(), reinterpret_cast<const unsigned char*>(tbs.data()), tbs.size());
  if (ok != 1) {
    // The key hint only words the error: it is computed when the signature fails.
    if (!e.key_hint.empty() && e.key_hint != hex(sha256(bytes_of(public_pem_of(pk->key.get())))))
      bad(shown, "the signature was not made with this public key (the bundle's key hint names another key)");
    bad(shown, "the signature does not verify with this public key (a wrong key, or a bundle "
               "whose statement was changed after signing)");
  }
}

Statement check_bundle(std::string_view json_text, std::string_view public_key_pem, const std::string& shown) {
  const Envelope e = parse_bundle(json_text, shown);
  check_envelope(e, public_key_pem, shown);
  return parse_statement(e.payload, shown);
}

namespace {
// The last 4 statements checked, most recent first, keyed by bundle_key.
std::mutex g_statements_mu;
std::vector<std::pair<Digest, std::shared_ptr<const Statement>>> g_statements;
}  // namespace

Digest bundle_key(std::string_view json_text, std::string_view public_key_pem) {
  Sha256 h;
  const uint64_t n = json_text.size();
  h.update(std::as_bytes(std::span(&n, 1)));
  h.update(bytes_of(json_text));
  h.update(bytes_of(public_key_pem));
  return h.finish();
}

std::shared_ptr<const Statement> cached_statement(const Digest& key) {
  std::lock_guard lock(g_statements_mu);
  for (const auto& [k, st] : g_statements)
    if (k == key) return st;
  return nullptr;
}

void remember_statement(const Digest& key, std::shared_ptr<const Statement> st) {
  std::lock_guard lock(g_statements_mu);
  for (const auto& [k, _] : g_statements)
    if (k == key) return;
  g_statements.insert(g_statements.begin(), {key, std::move(st)});
  if (g_statements.size() > 4) g_statements.pop_back();
}

std::shared_ptr<const Statement> checked_statement(std::string_view json_text, std::string_view public_key_pem,
                                                   const std::string& shown) {
  const Digest key = bundle_key(json_text, public_key_pem);
  if (auto st = cached_statement(key)) return st;
  auto st = std::make_shared<const Statement>(check_bundle(json_text, public_key_pem, shown));
  remember_statement(key, st);
  return st;
}

std::string make_statement(const std::string& subject, bool shards, uint64_t shard_size,
                           const std::vector<Resource>& resources, const std::vector<std::string>& ignore_paths) {
  Sha256 root;
  ordered_json res = ordered_json::array();
  const std::string alg = shards ? "sha256-sharded-" + std::to_string(shard_size) : "sha256";
  for (const Resource& r : resources) {
    root.update(std::as_bytes(std::span(r.digest)));
    res.push_back({{"name", r.name}, {"algorithm", alg}, {"digest", hex(r.digest)}});
  }
  ordered_json ser = {{"method", shards ? "shards" : "files"}, {"hash_type", "sha256"}};
  if (shards) ser["shard_size"] = shard_size;
  ser["allow_symlinks"] = false;
  if (!ignore_paths.empty()) ser["ignore_paths"] = ignore_paths;
  ordered_json s = {
      {"_type", kStatementType},
      {"subject", ordered_json::array({{{"name", subject}, {"digest", {{"sha256", hex(root.finish())}}}}})},
      {"predicateType", kPredicateType},
      {"predicate", {{"serialization", ser}, {"resources", res}}}};
  return s.dump(2);
}

namespace {
// The PEM EC private key `private_key_pem` and the hash model_signing signs
// with on its curve; the errors of make_bundle.
Pkey read_private_key(std::string_view private_key_pem, const EVP_MD** md) {
  Bio in(BIO_new_mem_buf(private_key_pem.data(), static_cast<int>(private_key_pem.size())));
  if (!in) throw std::bad_alloc();
  Pkey key(PEM_read_bio_PrivateKey(in.get(), nullptr, nullptr, nullptr));
  if (!key)
    throw Error(ErrorCode::kInvalidArgument, "", "",
                "the private key is not an unencrypted PEM private key (-----BEGIN EC PRIVATE KEY----- "
                "or -----BEGIN PRIVATE KEY-----)");
  std::string why;
  *md = ec_hash_of(key.get(), &why);
  if (!*md) throw Error(ErrorCode::kUnsupported, "", "", why);
  return key;
}
}  // namespace

std::string public_key_pem_of(std::string_view private_key_pem) {
  const EVP_MD* md = nullptr;
  const Pkey key = read_private_key(private_key_pem, &md);
  return public_pem_of(key.get());
}

std::string make_bundle(const std::string& statement_json, std::string_view private_key_pem) {
  const EVP_MD* md = nullptr;
  const Pkey key = read_private_key(private_key_pem, &md);
  MdCtx ctx(EVP_MD_CTX_new());
  if (!ctx) throw std::bad_alloc();
  const std::string tbs = pae(statement_json);
  size_t n = 0;
  if (EVP_DigestSignInit(ctx.get(), nullptr, md, nullptr, key.get()) != 1 ||
      EVP_DigestSign(ctx.get(), nullptr, &n, reinterpret_cast<const unsigned char*>(tbs.data()), tbs.size()) != 1)
    throw Error(ErrorCode::kInvalidArgument, "", "", "OpenSSL cannot sign with this private key");
  std::string sig(n, '\0');
  if (EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(sig.data()), &n,
                     reinterpret_cast<const unsigned char*>(tbs.data()), tbs.size()) != 1)
    throw Error(ErrorCode::kInvalidArgument, "", "", "OpenSSL cannot sign with this private key");
  sig.resize(n);
  const std::string hint = hex(sha256(bytes_of(public_pem_of(key.get()))));
  ordered_json b = {
      {"mediaType", kBundleMediaType},
      {"verificationMaterial", {{"publicKey", {{"hint", hint}}}, {"tlogEntries", ordered_json::array()}}},
      {"dsseEnvelope",
       {{"payload", base64_encode(statement_json)},
        {"payloadType", kPayloadType},
        {"signatures", ordered_json::array({{{"sig", base64_encode(sig)}, {"keyid", ""}}})}}}};
  return b.dump();
}

// ---- sha256.h ----

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (!ctx_ || EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), sha256_md(), nullptr) != 1) {
    EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_));
    throw std::bad_alloc();
  }
}
Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }
void Sha256::update(std::span<const std::byte> bytes) {
  EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), bytes.data(), bytes.size());
}
Digest Sha256::finish() {
  Digest d{};
  unsigned n = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), d.data(), &n);
  return d;
}

Digest sha256(std::span<const std::byte> bytes) {
  Sha256 h;
  h.update(bytes);
  return h.finish();
}

Digest sha256_of_file_range(int fd, uint64_t offset, uint64_t n, const std::string& shown) {
  thread_local std::unique_ptr<std::byte[]> buf;
  if (!buf) buf.reset(new std::byte[kHashPiece]);
  Sha256 h;
  uint64_t done = 0;
  while (done < n) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(kHashPiece, n - done));
    const ssize_t got = ::pread(fd, buf.get(), want, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw Error(ErrorCode::kIo, shown, "", std::string("cannot read: ") + std::strerror(errno));
    }
    if (got == 0)
      throw Error(ErrorCode::kSignature, shown, "",
                  "the file ends at byte " + std::to_string(offset + done) + ", before the signed bytes [" +
                      std::to_string(offset) + ", " + std::to_string(offset + n) + ") end");
    h.update({buf.get(), static_cast<size_t>(got)});
    done += static_cast<uint64_t>(got);
  }
  return h.finish();
}

}  // namespace treecask::sig
