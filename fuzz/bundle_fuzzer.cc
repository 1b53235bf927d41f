// Fuzz target: a model-signing bundle (JSON) -> the sign layer's parser
// (src/sign/bundle.h) and shard tables (src/sign/shards.h).
// Properties: any byte string is either refused with Error(kSignature) or
// parsed; a parsed envelope's signature check under the seeds' public key is
// kSignature or passes (the seeds, real `model_signing sign key` bundles,
// pass); a parsed statement's resources give, for each file, a shard table
// that is kSignature or tiles [0, its signed length) in increasing ranges
// with every shard found by shard_of; and a parsed statement written back
// with make_statement parses to the same resources. An input that starts as
// a PEM block is a public key instead: decoded (OpenSSL's EC decoders,
// then all of them) or refused with kSignature, never anything else.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "sign/bundle.h"
#include "sign/shards.h"

namespace {
// The public key of the EC P-256 key the seeds in corpus/bundle/ were signed
// with (model_signing 1.1.1, `sign key`; fuzz/README.md "Seeds").
constexpr const char* kSeedKey =
    "-----BEGIN PUBLIC KEY-----\n"
    "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEcqQlhj4xuGfkJX0on35JDJIogPHO\n"
    "T/mlXsCCFgZAIX/AMbM5jcB3ts2l1QX6TLeIYJC/foUwzItHPHJSqKRwUQ==\n"
    "-----END PUBLIC KEY-----\n";

// Runs `fn`; any Error but kSignature, or any other exception, is a bug.
template <typename Fn>
bool refused(Fn&& fn) {
  try {
    fn();
    return false;
  } catch (const treecask::Error& e) {
    if (e.code() != treecask::ErrorCode::kSignature) __builtin_trap();
    return true;
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace treecask;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (text.starts_with("-----BEGIN")) {  // a public key, checked against a signature it did not make
    sig::Envelope e;
    e.payload = "{}";
    e.payload_type = std::string(sig::kPayloadType);
    e.signature = std::string("\x30\x06\x02\x01\x01\x02\x01\x01", 8);
    if (!refused([&] { sig::check_envelope(e, text, "fuzz"); })) __builtin_trap();
    return 0;
  }
  sig::Envelope env;
  if (refused([&] { env = sig::parse_bundle(text, "fuzz"); })) return 0;
  refused([&] { sig::check_envelope(env, kSeedKey, "fuzz"); });
  sig::Statement st;
  if (refused([&] { st = sig::parse_statement(env.payload, "fuzz"); })) return 0;
  std::map<std::string, uint64_t> files;  // path -> signed length (shards: the last end)
  for (const sig::Resource& r : st.resources) files[r.path] = std::max(files[r.path], r.end);
  for (const auto& file : files) {
    const std::string& path = file.first;  // (a plain reference: clang 14 captures no structured binding)
    const uint64_t length = st.shards ? file.second : 5000;
    sig::ShardTable t;
    if (refused([&] { t = sig::shard_table(st, path, length, "fuzz"); })) continue;
    if (t.size() != length || t.start.front() != 0 || t.start.size() != t.digest.size() + 1) __builtin_trap();
    for (size_t k = 0; k < t.count(); ++k) {
      if (t.start[k] >= t.start[k + 1]) __builtin_trap();
      if (t.shard_of(t.start[k]) != k || t.shard_of(t.start[k + 1] - 1) != k) __builtin_trap();
    }
    refused([&] { sig::resource_of(st, "dir/" + path, "fuzz"); });
  }
  const std::string again = sig::make_statement(st.subject, st.shards, st.shard_size, st.resources, st.ignore_paths);
  sig::Statement back = sig::parse_statement(again, "fuzz");  // must not throw: it is well formed
  if (back.resources.size() != st.resources.size() || back.subject != st.subject) __builtin_trap();
  for (size_t i = 0; i < st.resources.size(); ++i)
    if (back.resources[i].name != st.resources[i].name || back.resources[i].digest != st.resources[i].digest)
      __builtin_trap();
  return 0;
}
