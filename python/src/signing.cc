// treecask._core's signing calls (include/treecask/signing.h; docs/signing.md):
// sign and verify_signature, and the SignatureCheck the readers' open calls
// take (signature_check). Conversions only: every rule (the bundle, the keys,
// the hashing) is the core's.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

#include "binding.h"

namespace treecask_py {

std::optional<treecask::SignatureCheck> signature_check(const std::optional<std::tuple<std::string, std::string>>& sig) {
  if (!sig) return std::nullopt;
  return treecask::SignatureCheck{std::get<0>(*sig), std::get<1>(*sig)};
}

void register_signing(nb::module_& m) {
  using namespace nb::literals;
  m.def("default_sign_shard_size", &treecask::default_sign_shard_size, "model_bytes"_a,
        "treecask::default_sign_shard_size: sign()'s shard size in bytes for a model of `model_bytes` "
        "bytes (model_bytes / 1024 as a power of two in [256 KiB, 2 MiB]; include/treecask/signing.h).");
  m.def(
      "sign_shard_size",
      [](const std::string& path, uint64_t shard_size) {
        treecask::SignOptions o;
        o.shard_size = shard_size;
        return treecask::sign_shard_size(path, o);
      },
      "path"_a, "shard_size"_a = 0,
      "treecask::sign_shard_size: the shard size in bytes sign() uses for the archive or directory "
      "`path` (`shard_size`, else the default for its bytes). Raises what sign() raises for a path.");
  m.def(
      "sign",
      [](const std::string& path, const std::string& private_key_pem, bool shards, uint64_t shard_size,
         unsigned threads) {
        treecask::SignOptions o;
        o.shards = shards;
        o.shard_size = shard_size;
        o.threads = threads;
        nb::gil_scoped_release release;
        return treecask::sign(path, private_key_pem, o);
      },
      "path"_a, "private_key_pem"_a, "shards"_a = true, "shard_size"_a = 0, "threads"_a = 0,
      "treecask::sign: the model-signing bundle JSON (str) of the archive file or sharded "
      "checkpoint directory `path`, signed with the PEM EC private key; shards of `shard_size` "
      "bytes (0: default_sign_shard_size of the model's bytes) or, shards=False, one digest per file. Hashes on "
      "`threads` threads (0: all cores), GIL released.");
  m.def(
      "verify_signature",
      [](const std::string& path, const std::string& bundle_json, const std::string& public_key_pem,
         unsigned threads) {
        treecask::SignatureCheck check{bundle_json, public_key_pem};
        nb::gil_scoped_release release;
        treecask::verify_signature(path, check, threads);
      },
      "path"_a, "bundle_json"_a, "public_key_pem"_a, "threads"_a = 0,
      "treecask::verify_signature: checks every signed byte of the archive file or sharded "
      "checkpoint directory `path` against the bundle (SHA-256 on `threads` threads, 0: all "
      "cores), GIL released; raises SignatureError naming the file and what failed.");
  m.def(
      "verify_signature_source",
      [](nb::object source, const std::string& bundle_json, const std::string& public_key_pem, unsigned threads) {
        std::shared_ptr<const treecask::Source> src = source_from_python(std::move(source));
        treecask::SignatureCheck check{bundle_json, public_key_pem};
        nb::gil_scoped_release release;
        treecask::verify_signature(std::move(src), check, threads);
      },
      "source"_a, "bundle_json"_a, "public_key_pem"_a, "threads"_a = 0,
      "treecask::verify_signature of one archive object read through `source` (a store's "
      "Source: Store.source), every signed byte fetched and hashed as it arrives, GIL released; "
      "raises SignatureError naming the object and what failed.");
  m.def(
      "verify_signature_directory",
      [](const std::string& shown, const std::vector<std::pair<std::string, uint64_t>>& files, nb::object opener,
         const std::string& bundle_json, const std::string& public_key_pem, unsigned threads) {
        // Made and destroyed with the GIL held; each call of it takes the GIL.
        treecask::SourceOpener open = opener_from_python(std::move(opener));
        treecask::SignatureCheck check{bundle_json, public_key_pem};
        nb::gil_scoped_release release;
        treecask::verify_signature(shown, files, open, check, threads);
      },
      "shown"_a, "files"_a, "opener"_a, "bundle_json"_a, "public_key_pem"_a, "threads"_a = 0,
      "treecask::verify_signature of a signed directory in a store, named `shown`: `files` its "
      "(relative path, size in bytes) pairs as listed, `opener(path)` a store's Source of one; "
      "every signed byte fetched and hashed, GIL released; SignatureError naming the file and "
      "what failed.");
  m.def(
      "signed_model",
      [](const std::string& bundle_json) {
        const treecask::SignedModel m = treecask::signed_model(bundle_json);
        return std::make_tuple(m.name, m.directory);
      },
      "bundle_json"_a,
      "treecask::signed_model: (the model's name, whether it is a directory) as the bundle's statement "
      "says, nothing checked; SignatureError for a bundle that cannot be parsed.");
  m.def("public_key_of", [](const std::string& pem) { return treecask::public_key_of(pem); }, "private_key_pem"_a,
        "treecask::public_key_of: the PEM public key of the PEM EC private key (what a verified "
        "open takes); InvalidArgumentError / UnsupportedError as sign.");
}

}  // namespace treecask_py
