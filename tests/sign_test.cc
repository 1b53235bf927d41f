// Signed checkpoints (include/treecask/signing.h, docs/signing.md): sign and
// verify round trips in both serializations, verified opens and reads of a
// local file and over a Source, and every way a signature must be refused:
// another archive with one leaf changed, a wrong key, a statement for
// another file, shard resources truncated / reordered / overlapping /
// missing, a file appended to after signing, unsupported key types and hash
// algorithms, a sharded directory with a shard file from another step.
// Keys are made at test time with OpenSSL.
#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <thread>

#include "../format/vectors/contents.h"
#include "sign/bundle.h"
#include "sign/shards.h"
#include "sign/signed_source.h"
#include "testutil.h"
#include "treecask/treecask.h"

using namespace treecask;
using tc_test::FlatTree;
using tc_test::TempDir;
namespace fs = std::filesystem;

namespace {

// A fresh key pair as PEM (private, public): "EC" (curve P-256 / P-384 /
// P-521), "ED25519" or "RSA".
struct Keys {
  std::string priv, pub;
};
Keys make_keys(const std::string& type, const char* curve = "P-256") {
  EVP_PKEY* k = nullptr;
  if (type == "EC") k = EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", curve);
  else if (type == "RSA") k = EVP_PKEY_Q_keygen(nullptr, nullptr, "RSA", size_t{2048});
  else k = EVP_PKEY_Q_keygen(nullptr, nullptr, type.c_str());
  REQUIRE(k != nullptr);
  auto pem = [&](bool priv) {
    BIO* b = BIO_new(BIO_s_mem());
    REQUIRE((priv ? PEM_write_bio_PrivateKey(b, k, nullptr, nullptr, 0, nullptr, nullptr)
                  : PEM_write_bio_PUBKEY(b, k)) == 1);
    char* d = nullptr;
    long n = BIO_get_mem_data(b, &d);
    std::string s(d, static_cast<size_t>(n));
    BIO_free(b);
    return s;
  };
  Keys out{pem(true), pem(false)};
  EVP_PKEY_free(k);
  return out;
}

const Keys& ec_keys() {
  static const Keys k = make_keys("EC");
  return k;
}

// An archive of raw and LZ4 leaves, one of 4 MiB, chunks of 64 KiB:
// `changed` flips bytes of leaf "b" (same layout, other bytes).
FlatTree tree(bool changed = false) {
  FlatTree t;
  t.add_random("a", DType::kFloat32, {1000}, 1);
  t.add_random("b", DType::kFloat32, {1 << 20}, 2);  // 4 MiB
  t.add("c", DType::kUInt8, {300000}, tc_test::compressible_bytes(300000, 3));
  t.add_random("d", DType::kInt64, {7}, 4);
  if (changed) t.data[1][12345] ^= std::byte{0x40};
  return t;
}

SaveOptions save_options() {
  SaveOptions o;
  o.chunk_size = 64 << 10;
  o.compression = Compression::kAuto;
  return o;
}

// tree() saved as `path` and signed with 64 KiB shards: the bundle.
std::string save_signed_64k(const fs::path& path) {
  tree().save(path, save_options());
  SignOptions so;
  so.shard_size = 64 << 10;
  return sign(path, ec_keys().priv, so);
}

OpenOptions signed_open(const std::string& bundle, const std::string& pub = ec_keys().pub) {
  OpenOptions o;
  o.signature = SignatureCheck{bundle, pub};
  return o;
}

// Every leaf read back equals what was saved.
void check_reads(const Archive& a, FlatTree& t) {
  REQUIRE(a.size() == t.keys.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const size_t li = a.index_of(t.keys[i]);
    std::vector<std::byte> out(a.leaf(li).byte_length);
    a.read(li, out);
    CHECK(tc_test::same(out, t.data[i]));
  }
}

std::string what_of(const std::function<void()>& fn, ErrorCode code = ErrorCode::kSignature) {
  return tc_test::expect_error(code, fn).what();
}

bool has(const std::string& s, const std::string& part) {
  INFO(s);
  return s.find(part) != std::string::npos;
}

// The bundle's statement, re-signed by `priv` after `edit` changed it.
std::string resigned(const std::string& bundle, const std::function<void(sig::Statement&)>& edit,
                     const std::string& priv = ec_keys().priv) {
  sig::Envelope e = sig::parse_bundle(bundle, "test");
  sig::Statement st = sig::parse_statement(e.payload, "test");
  edit(st);
  return sig::make_bundle(sig::make_statement(st.subject, st.shards, st.shard_size, st.resources, st.ignore_paths),
                           priv);
}

// A local file served as a Source (test://NAME), counting the read() calls
// and the bytes it hands out; flips the byte at `damage_at` in what it
// returns. With `learns_size`, size() is kUnknownSize until the first read,
// which takes {0, head} and a from_end range as an HTTP object does (clipped
// to the object, at the start of `out`: treecask/source.h).
class FileSource final : public Source {
 public:
  explicit FileSource(const fs::path& p, bool learns_size = false) : name_("test://" + p.filename().string()) {
    fd_ = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd_ >= 0);
    file_size_ = static_cast<uint64_t>(::lseek(fd_, 0, SEEK_END));
    size_ = learns_size ? kUnknownSize : file_size_;
  }
  ~FileSource() override { ::close(fd_); }
  const std::string& name() const noexcept override { return name_; }
  uint64_t size() const noexcept override { return size_; }
  void read(std::span<const ReadRange> ranges) const override {
    requests += 1;
    const bool first = size_ == kUnknownSize;
    if (first) REQUIRE((ranges.size() == 2 && ranges[0].offset == 0 && ranges[1].from_end));
    for (const ReadRange& r : ranges) {
      uint64_t off = r.offset, n = r.out.size();
      if (first) {
        n = std::min(n, r.from_end ? file_size_ : file_size_ - std::min(off, file_size_));
        if (r.from_end) off = file_size_ - n;
      } else {
        REQUIRE(!r.from_end);
        REQUIRE(off + n <= size_);
      }
      REQUIRE(::pread(fd_, r.out.data(), n, static_cast<off_t>(off)) == static_cast<ssize_t>(n));
      if (damage_at >= off && damage_at < off + n) r.out[damage_at - off] ^= std::byte{1};
      bytes += n;
    }
    if (first) size_ = file_size_;
  }
  uint64_t damage_at = UINT64_MAX;
  mutable std::atomic<uint64_t> bytes{0}, requests{0};

 private:
  std::string name_;
  int fd_ = -1;
  uint64_t file_size_ = 0;
  mutable uint64_t size_ = 0;
};

// Two steps of a sharded checkpoint (golden vector v3_1 bound) in `dir`/step_1
// and step_2; returns step_1's bundle, signed in 4 KiB shards.
std::string signed_steps(const fs::path& dir) {
  golden::write_sharded(dir / "step_1", "11111111111111111111111111111111", true);
  golden::write_sharded(dir / "step_2", "22222222222222222222222222222222", true);
  SignOptions so;
  so.shard_size = 4096;
  return sign(dir / "step_1", ec_keys().priv, so);
}

std::string b64(const std::string& in) {
  std::string out((in.size() + 2) / 3 * 4 + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

}  // namespace

TEST_SUITE("sign") {

TEST_CASE("sign + verify_signature + a signed open, shard and file serialization") {
  TempDir tmp;
  FlatTree t = tree();
  t.save(tmp / "model.cask", save_options());
  for (bool shards : {true, false}) {
    INFO("shards " << shards);
    SignOptions so;
    so.shards = shards;
    so.shard_size = 64 << 10;
    const std::string bundle = sign(tmp / "model.cask", ec_keys().priv, so);
    const SignatureCheck check{bundle, ec_keys().pub};
    verify_signature(tmp / "model.cask", check);
    verify_signature(tmp / "model.cask", check, 1);
    Archive a = Archive::open(tmp / "model.cask", signed_open(bundle));
    check_reads(a, t);
    CHECK(a.verify().empty());
    // Zero-copy views and view_many, after their shards verified.
    auto v = a.view(a.index_of("b"));
    CHECK(tc_test::same(v, t.data[1]));
    std::vector<size_t> all{0, 1, 2, 3};
    auto views = a.view_many(all);
    CHECK(views[a.index_of("b")].has_value());
    // A slice and a byte range.
    std::vector<std::byte> part(4096);
    a.read_bytes(a.index_of("b"), 100000, part);
    CHECK(tc_test::same(part, std::span(t.data[1]).subspan(100000, 4096)));
    // The default shard size (1 MiB) signs and verifies too.
    SignOptions dflt;
    dflt.shards = shards;
    verify_signature(tmp / "model.cask", {sign(tmp / "model.cask", ec_keys().priv, dflt), ec_keys().pub});
  }
  // P-384 and P-521 keys (SHA-384, SHA-512).
  for (const char* curve : {"P-384", "P-521"}) {
    Keys k = make_keys("EC", curve);
    const std::string b = sign(tmp / "model.cask", k.priv);
    verify_signature(tmp / "model.cask", {b, k.pub});
    check_reads(Archive::open(tmp / "model.cask", signed_open(b, k.pub)), t);
  }
}

TEST_CASE("the default shard size follows the model's bytes: / 1024, a power of two in [256 KiB, 2 MiB]") {
  constexpr uint64_t KiB = 1024, MiB = KiB * KiB, GiB = MiB * KiB;
  CHECK(default_sign_shard_size(0) == 256 * KiB);
  CHECK(default_sign_shard_size(22 * MiB) == 256 * KiB);
  CHECK(default_sign_shard_size(256 * MiB) == 256 * KiB);
  CHECK(default_sign_shard_size(256 * MiB + 1) == 512 * KiB);
  CHECK(default_sign_shard_size(GiB) == MiB);
  CHECK(default_sign_shard_size(3 * GiB) == 2 * MiB);
  CHECK(default_sign_shard_size(100 * GiB) == 2 * MiB);
  SignOptions o;
  o.shard_size = 4096;
  TempDir tmp;
  CHECK(sign_shard_size(tmp.path, o) == 4096);  // given: used as is, the path not even listed
  CHECK_THROWS_AS(sign_shard_size(tmp / "missing.cask"), Error);
}

TEST_CASE("the bundle is model_signing's: media type, key hint, DSSE envelope, statement") {
  TempDir tmp;
  FlatTree t = tree();
  t.save(tmp / "model.cask", save_options());
  const std::string bundle = sign(tmp / "model.cask", ec_keys().priv);
  sig::Envelope e = sig::parse_bundle(bundle, "b");
  CHECK(e.payload_type == "application/vnd.in-toto+json");
  CHECK(e.key_hint.size() == 64);
  sig::Statement st = sig::parse_statement(e.payload, "b");
  CHECK(st.subject == "model.cask");
  CHECK(st.shards);
  const uint64_t size = fs::file_size(tmp / "model.cask");
  CHECK(st.shard_size == default_sign_shard_size(size));
  CHECK(st.shard_size == sign_shard_size(tmp / "model.cask"));
  CHECK(st.resources.size() == (size + st.shard_size - 1) / st.shard_size);
  CHECK(st.resources.front().name == ".:0:" + std::to_string(std::min(size, st.shard_size)));
  CHECK(st.file_model());
  CHECK(has(e.payload, "\"predicateType\": \"https://model_signing/signature/v1.0\""));
  CHECK(has(e.payload, "\"algorithm\": \"sha256-sharded-" + std::to_string(st.shard_size) + "\""));
}

TEST_CASE("a read hashes only the shards under its bytes, each once") {
  TempDir tmp;
  const std::string bundle = save_signed_64k(tmp / "model.cask");
  SignOptions so;
  so.shard_size = 64 << 10;
  const uint64_t size = fs::file_size(tmp / "model.cask");
  const uint64_t before_open = sig::shards_hashed();
  Archive a = Archive::open(tmp / "model.cask", signed_open(bundle));
  const uint64_t at_open = sig::shards_hashed() - before_open;
  CHECK(at_open < size / so.shard_size / 4);  // the open: meta, B-tree and manifest pages only
  const size_t b = a.index_of("b");
  std::vector<std::byte> out(a.leaf(b).byte_length);
  const uint64_t before = sig::shards_hashed();
  a.read(b, out);
  const uint64_t hashed = sig::shards_hashed() - before;
  CHECK(hashed <= out.size() / so.shard_size + 2);  // S + 2 shards at most
  CHECK(hashed + at_open >= out.size() / so.shard_size - 1);
  // Again, and in another Archive of the same file: cached for the process.
  a.read(b, out);
  Archive again = Archive::open(tmp / "model.cask", signed_open(bundle));
  again.read(again.index_of("b"), out);
  CHECK(sig::shards_hashed() - before == hashed);
}

TEST_CASE("a signed open's two threads hash each shard it trusts once, and a mismatch either finds is reported") {
  // The opening thread and SignedOpen's helper share the bundle's check and
  // the hashing, whichever gets to each first (sign/shards.h). Copies of one
  // file (each its own inode: the process-wide cache does not carry over)
  // hash the same shards at open however the two threads split them.
  TempDir tmp;
  const std::string bundle = save_signed_64k(tmp / "model.cask");
  std::vector<uint64_t> at_open;
  for (int i = 0; i < 16; ++i) {
    const fs::path copy = tmp / ("c" + std::to_string(i)) / "model.cask";
    fs::create_directories(copy.parent_path());
    fs::copy_file(tmp / "model.cask", copy);
    const uint64_t before = sig::shards_hashed();
    Archive a = Archive::open(copy, signed_open(bundle));
    at_open.push_back(sig::shards_hashed() - before);
  }
  CHECK(at_open.front() > 0);
  CHECK(std::count(at_open.begin(), at_open.end(), at_open.front()) == 16);
  // Another archive of the same layout: its manifest's shards do not match,
  // whichever thread hashes them; a bundle that does not verify is reported
  // before anything else (and a wrong key too), every time.
  fs::create_directories(tmp / "other");
  tree(/*changed=*/true).save(tmp / "other" / "model.cask", save_options());
  std::string tampered = bundle;  // one letter of the statement's base64 in the other case
  size_t at = bundle.find("\"payload\":\"");
  REQUIRE(at != std::string::npos);
  for (at += 40; !std::isalpha(static_cast<unsigned char>(tampered[at]));) ++at;
  tampered[at] ^= 0x20;
  for (int i = 0; i < 16; ++i) {
    CHECK(has(what_of([&] { Archive::open(tmp / "other" / "model.cask", signed_open(bundle)); }),
              "do not match their signed SHA-256"));
    CHECK(tc_test::expect_error(ErrorCode::kSignature, [&] {
            Archive::open(tmp / "other" / "model.cask", signed_open(tampered));
          }).message().find("do not match") == std::string::npos);
  }
}

TEST_CASE("a signed archive's verify() hashes every shard once, its chunks checked in the same pass") {
  TempDir tmp;
  const std::string bundle = save_signed_64k(tmp / "model.cask");
  const uint64_t shards = (fs::file_size(tmp / "model.cask") + (64 << 10) - 1) / (64 << 10);
  const uint64_t before = sig::shards_hashed();
  Archive a = Archive::open(tmp / "model.cask", signed_open(bundle));
  const auto caller = std::this_thread::get_id();
  std::vector<uint64_t> seen;
  uint64_t total = 0;
  bool other_thread = false;
  CHECK(a.verify([&](uint64_t done, uint64_t all) {
          seen.push_back(done);
          total = all;
          other_thread |= std::this_thread::get_id() != caller;
        }).empty());
  // Every signed byte (pages no read touches too), each shard hashed once.
  CHECK(sig::shards_hashed() - before == shards);
  CHECK(!other_thread);  // progress from the calling thread, in leaf order, up to (total, total)
  REQUIRE(seen.size() == a.size());
  CHECK(std::is_sorted(seen.begin(), seen.end()));
  CHECK(seen.back() == total);
  // Again: every shard is cached as verified for the process.
  CHECK(a.verify().empty());
  CHECK(sig::shards_hashed() - before == shards);
}

TEST_CASE("another archive of the same layout with one leaf changed, given the first's signature") {
  TempDir tmp;
  FlatTree t = tree(), u = tree(/*changed=*/true);
  t.save(tmp / "model.cask", save_options());
  fs::create_directories(tmp / "other");
  u.save(tmp / "other" / "model.cask", save_options());
  SignOptions so;
  so.shard_size = 64 << 10;
  const std::string bundle = sign(tmp / "model.cask", ec_keys().priv, so);
  // Its manifest (the changed leaf's checksum) differs: the open refuses it.
  CHECK(has(what_of([&] { Archive::open(tmp / "other" / "model.cask", signed_open(bundle)); }),
            "do not match their signed SHA-256"));
  CHECK(has(what_of([&] { verify_signature(tmp / "other" / "model.cask", {bundle, ec_keys().pub}); }),
            "do not match their signed SHA-256"));

  // The leaf's bytes changed and nothing else (the XXH3 not even fixed): the
  // signature, checked first, refuses the read, naming the leaf and range;
  // the other leaves still read; no view of it is handed out.
  // (Past the first shards, which also hold the pages the open reads.)
  auto bytes = tc_test::read_file(tmp / "model.cask");
  const auto needle = std::span(t.data[1]).subspan(3 << 20, 64);
  auto it = std::search(bytes.begin(), bytes.end(), needle.begin(), needle.end());
  REQUIRE(it != bytes.end());
  const uint64_t at = static_cast<uint64_t>(it - bytes.begin()) + 345;
  bytes[at] ^= std::byte{0x40};
  fs::create_directories(tmp / "flipped");
  const fs::path flipped = tmp / "flipped" / "model.cask";
  tc_test::write_file(flipped, bytes);
  Archive a = Archive::open(flipped, signed_open(bundle));
  const size_t b = a.index_of("b");
  std::vector<std::byte> out(a.leaf(b).byte_length);
  treecask::Error e = tc_test::expect_error(ErrorCode::kSignature, [&] { a.read(b, out, Verify::kNo); });
  CHECK(e.key_path() == "b");
  const uint64_t shard = at / so.shard_size * so.shard_size;
  CHECK(has(e.message(), "bytes [" + std::to_string(shard) + ", " + std::to_string(shard + so.shard_size) + ")"));
  CHECK(has(e.message(), "'.:" + std::to_string(shard) + ":" + std::to_string(shard + so.shard_size) + "'"));
  tc_test::expect_error(ErrorCode::kSignature, [&] { a.view(b, Verify::kNo); });
  std::vector<size_t> all{0, 1, 2, 3};
  tc_test::expect_error(ErrorCode::kSignature, [&] { a.view_many(all, Verify::kNo); });
  std::vector<std::byte> small(a.leaf(a.index_of("a")).byte_length);
  a.read(a.index_of("a"), small);
  CHECK(tc_test::same(small, t.data[0]));
  // A full verify reports the leaf; verify_signature names the range.
  auto damaged = a.verify();
  REQUIRE(damaged.size() == 1);
  CHECK(damaged[0].code() == ErrorCode::kSignature);
  CHECK(damaged[0].key_path() == "b");
  CHECK(has(what_of([&] { verify_signature(flipped, {bundle, ec_keys().pub}); }),
            "bytes [" + std::to_string(shard) + ", "));
  // The same file unsigned: its XXH3 catches it (the signature is a second, stronger check).
  tc_test::expect_error(ErrorCode::kChecksumMismatch, [&] { Archive::open(flipped).read(b, out); });
}

TEST_CASE("a blob header changed after signing: the read that needs it says the signature, not corruption") {
  // A read does not hash the headers' shard when their check passes (they
  // gate the check and are never handed out); when it fails, it hashes that
  // shard first, so bytes that do not match the signature are reported as such.
  TempDir tmp;
  FlatTree t;  // two 1 MiB leaves: the second's blob header lies in a shard the open does not hash
  t.add_random("x", DType::kFloat32, {1 << 18}, 5);
  t.add_random("b", DType::kFloat32, {1 << 18}, 6);
  t.save(tmp / "model.cask", save_options());
  SignOptions so;
  so.shard_size = 64 << 10;
  const std::string bundle = sign(tmp / "model.cask", ec_keys().priv, so);
  auto bytes = tc_test::read_file(tmp / "model.cask");
  // The header of leaf b's blob: the last magic before b's first bytes.
  const auto needle = std::span(t.data[1]).first(64);
  const auto data = std::search(bytes.begin(), bytes.end(), needle.begin(), needle.end());
  REQUIRE(data != bytes.end());
  const std::string magic = "TCBLOB";
  const auto* m = reinterpret_cast<const std::byte*>(magic.data());
  const auto head = std::find_end(bytes.begin(), data, m, m + magic.size());
  REQUIRE(head != data);
  REQUIRE(head - bytes.begin() > 256 << 10);
  head[1] ^= std::byte{0x20};  // "TcBLOB"
  fs::create_directories(tmp / "h");
  tc_test::write_file(tmp / "h" / "model.cask", bytes);
  Archive a = Archive::open(tmp / "h" / "model.cask", signed_open(bundle));  // no blob header read at open
  const size_t b = a.index_of("b");
  std::vector<std::byte> out(a.leaf(b).byte_length);
  treecask::Error e = tc_test::expect_error(ErrorCode::kSignature, [&] { a.read(b, out); });
  CHECK(e.key_path() == "b");
  CHECK(has(e.message(), "do not match their signed SHA-256 digest"));
  tc_test::expect_error(ErrorCode::kSignature, [&] { a.view(b); });
  // Unsigned, the same file's header check reports the corruption.
  tc_test::expect_error(ErrorCode::kCorruption, [&] { Archive::open(tmp / "h" / "model.cask").read(b, out); });
}

TEST_CASE("a wrong public key, and a bundle changed after signing") {
  TempDir tmp;
  FlatTree t = tree();
  t.save(tmp / "model.cask", save_options());
  const std::string bundle = sign(tmp / "model.cask", ec_keys().priv);
  Keys other = make_keys("EC");
  CHECK(has(what_of([&] { Archive::open(tmp / "model.cask", signed_open(bundle, other.pub)); }),
            "not made with this public key"));
  CHECK(has(what_of([&] { verify_signature(tmp / "model.cask", {bundle, other.pub}); }),
            "not made with this public key"));
  // Without the key hint: the ECDSA check itself refuses.
  std::string no_hint = bundle;
  const size_t h = no_hint.find("\"hint\":\"");
  REQUIRE(h != std::string::npos);
  no_hint.erase(h + 8, 64);
  CHECK(has(what_of([&] { verify_signature(tmp / "model.cask", {no_hint, other.pub}); }),
            "does not verify with this public key"));
  verify_signature(tmp / "model.cask", {no_hint, ec_keys().pub});  // the right key needs no hint
  // A statement edited after signing (one digest changed, the signature kept).
  sig::Envelope e = sig::parse_bundle(bundle, "b");
  std::string forged = bundle;
  std::string payload = e.payload;
  const size_t d = payload.find("\"digest\": \"");
  payload[d + 11] = payload[d + 11] == 'a' ? 'b' : 'a';
  const std::string old_b64 = b64(e.payload), new_b64 = b64(payload);
  forged.replace(forged.find(old_b64), old_b64.size(), new_b64);
  CHECK(has(what_of([&] { verify_signature(tmp / "model.cask", {forged, ec_keys().pub}); }),
            "does not verify"));
  // A signed open checks the signature beside the statement's table and the
  // hashing (sign/shards.h, SignedOpen): an edited statement is reported as
  // the signature's failure, never as what the edit causes (a shard that
  // does not match its digest; a statement for another file; not JSON).
  CHECK(has(what_of([&] { Archive::open(tmp / "model.cask", signed_open(forged)); }), "does not verify"));
  auto edited = [&](std::string from, std::string to) {
    std::string p = e.payload, b = bundle;
    const size_t at = p.find(from);
    REQUIRE(at != std::string::npos);
    p.replace(at, from.size(), to);
    b.replace(b.find(old_b64), old_b64.size(), b64(p));
    return b;
  };
  for (const std::string& b : {edited("\"name\": \"model.cask\"", "\"name\": \"other.cask\""),
                               edited("{", "[")}) {
    const Error err = tc_test::expect_error(ErrorCode::kSignature, [&] {
      Archive::open(tmp / "model.cask", signed_open(b));
    });
    CHECK(has(err.what(), "does not verify"));
  }
  // Not a PEM key; not JSON.
  CHECK(has(what_of([&] { verify_signature(tmp / "model.cask", {bundle, "not a key"}); }), "not a PEM public key"));
  CHECK(has(what_of([&] { verify_signature(tmp / "model.cask", {"{", ec_keys().pub}); }), "not valid JSON"));
}

TEST_CASE("a statement for another file name, and for a directory") {
  TempDir tmp;
  FlatTree t = tree();
  t.save(tmp / "model.cask", save_options());
  const std::string bundle = sign(tmp / "model.cask", ec_keys().priv);
  fs::copy_file(tmp / "model.cask", tmp / "renamed.cask");
  CHECK(has(what_of([&] { Archive::open(tmp / "renamed.cask", signed_open(bundle)); }),
            "the signature is for the file 'model.cask', not 'renamed.cask'"));
  CHECK(has(what_of([&] { verify_signature(tmp / "renamed.cask", {bundle, ec_keys().pub}); }), "'model.cask'"));
  // A directory's signature does not sign a file outside it.
  fs::create_directories(tmp / "dir");
  fs::copy_file(tmp / "model.cask", tmp / "dir" / "model.cask");
  const std::string dir_bundle = sign(tmp / "dir", ec_keys().priv);
  CHECK(has(what_of([&] { Archive::open(tmp / "model.cask", signed_open(dir_bundle)); }),
            "the signature is for the directory 'dir'"));
  // ... and signs the file inside it.
  check_reads(Archive::open(tmp / "dir" / "model.cask", signed_open(dir_bundle)), t);
  CHECK(has(what_of([&] { verify_signature(tmp / "dir", {bundle, ec_keys().pub}); }), "not a directory"));
  // The URL of a signed directory: a clear refusal (its check needs a
  // listing) before any request (nothing listens on port 9).
  try {
    verify_signature("http://127.0.0.1:9/run/dir", {dir_bundle, ec_keys().pub});
    FAIL("a signed directory's URL was verified without a listing");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kUnsupported);
    CHECK(has(e.what(), "the signature is for the directory 'dir'"));
    CHECK(has(e.what(), "treecask.verify"));
  }
  // What each bundle signs, as its statement says (nothing checked).
  const SignedModel file_model = signed_model(bundle), dir_model = signed_model(dir_bundle);
  CHECK((file_model.name == "model.cask" && !file_model.directory));
  CHECK((dir_model.name == "dir" && dir_model.directory));
  try {
    signed_model("{\"mediaType\": 1}");
    FAIL("a malformed bundle was parsed");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kSignature);
  }
}

TEST_CASE("shard resources truncated, reordered, overlapping, missing, swapped") {
  TempDir tmp;
  FlatTree t = tree();
  t.save(tmp / "model.cask", save_options());
  SignOptions so;
  so.shard_size = 64 << 10;
  const std::string bundle = sign(tmp / "model.cask", ec_keys().priv, so);
  const auto path = tmp / "model.cask";
  auto both = [&](const std::string& b, const std::string& part) {
    CHECK(has(what_of([&] { verify_signature(path, {b, ec_keys().pub}); }), part));
    CHECK(has(what_of([&] { Archive::open(path, signed_open(b)); }), part));
  };
  // Truncated: the last shard left out.
  both(resigned(bundle, [](sig::Statement& s) { s.resources.pop_back(); }), "(appended to after signing)");
  // Missing: a middle shard left out.
  both(resigned(bundle, [](sig::Statement& s) { s.resources.erase(s.resources.begin() + 3); }),
       "unsigned (a shard resource is missing)");
  // Overlapping: one shard starts inside the one before.
  both(resigned(bundle,
                [](sig::Statement& s) {
                  sig::Resource& r = s.resources[2];
                  r.start -= 10;
                  r.name = ".:" + std::to_string(r.start) + ":" + std::to_string(r.end);
                }),
       "overlap");
  // A shard of another size than the statement's.
  both(resigned(bundle, [](sig::Statement& s) { s.shard_size *= 2; }), "is not a shard of");
  // Reordered: the same resources in another order is the same statement
  // (model_signing compares them as a set).
  const std::string reordered =
      resigned(bundle, [](sig::Statement& s) { std::reverse(s.resources.begin(), s.resources.end()); });
  verify_signature(path, {reordered, ec_keys().pub});
  check_reads(Archive::open(path, signed_open(reordered)), t);
  // Digests swapped between two shards: those shards' bytes no longer match.
  const std::string swapped = resigned(bundle, [](sig::Statement& s) {
    std::swap(s.resources[5].digest, s.resources[6].digest);
  });
  CHECK(has(what_of([&] { verify_signature(path, {swapped, ec_keys().pub}); }), "do not match"));
  Archive a = Archive::open(path, signed_open(swapped));
  auto damaged = a.verify();
  CHECK(!damaged.empty());
  for (const Error& e : damaged) CHECK(e.code() == ErrorCode::kSignature);
}

TEST_CASE("a file appended to after signing") {
  TempDir tmp;
  FlatTree t = tree();
  t.save(tmp / "model.cask", save_options());
  const std::string bundle = sign(tmp / "model.cask", ec_keys().priv);
  {
    std::ofstream f(tmp / "model.cask", std::ios::binary | std::ios::app);
    f << "appended";
  }
  CHECK(has(what_of([&] { Archive::open(tmp / "model.cask", signed_open(bundle)); }), "appended to after signing"));
  CHECK(has(what_of([&] { verify_signature(tmp / "model.cask", {bundle, ec_keys().pub}); }), "appended to"));
  SignOptions files;
  files.shards = false;
  const std::string fb = sign(tmp / "model.cask", ec_keys().priv, files);
  {
    std::ofstream f(tmp / "model.cask", std::ios::binary | std::ios::app);
    f << "more";
  }
  CHECK(has(what_of([&] { verify_signature(tmp / "model.cask", {fb, ec_keys().pub}); }), "do not match"));
}

TEST_CASE("unsupported key types and hash algorithms are named") {
  TempDir tmp;
  FlatTree t = tree();
  t.save(tmp / "model.cask", save_options());
  const std::string bundle = sign(tmp / "model.cask", ec_keys().priv);
  Keys ed = make_keys("ED25519"), rsa = make_keys("RSA");
  CHECK(has(what_of([&] { verify_signature(tmp / "model.cask", {bundle, ed.pub}); }), "unsupported key type ED25519"));
  CHECK(has(what_of([&] { Archive::open(tmp / "model.cask", signed_open(bundle, rsa.pub)); }),
            "unsupported key type RSA"));
  CHECK(has(what_of([&] { sign(tmp / "model.cask", ed.priv); }, ErrorCode::kUnsupported), "ED25519"));
  CHECK(has(what_of([&] { sign(tmp / "model.cask", rsa.priv); }, ErrorCode::kUnsupported), "RSA"));
  Keys k1 = make_keys("EC", "secp256k1");
  CHECK(has(what_of([&] { sign(tmp / "model.cask", k1.priv); }, ErrorCode::kUnsupported), "secp256k1"));
  CHECK(has(what_of([&] { verify_signature(tmp / "model.cask", {bundle, k1.pub}); }),
            "unsupported elliptic curve secp256k1"));
  // A P-256 public key whose point is not on the curve (one base64 letter of
  // its last line in the other case), and text that is no key: refused, named.
  std::string off_curve = ec_keys().pub;
  size_t at = off_curve.rfind("-----END") - 6;
  while (!std::isalpha(static_cast<unsigned char>(off_curve[at]))) --at;
  off_curve[at] ^= 0x20;
  for (const std::string& pub : {off_curve, std::string("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")})
    CHECK(has(what_of([&] { verify_signature(tmp / "model.cask", {bundle, pub}); }),
              "the public key is not a PEM public key"));
  // A statement hashed with another algorithm (signed, so only the algorithm is wrong).
  sig::Envelope e = sig::parse_bundle(bundle, "b");
  for (const char* alg : {"blake2", "blake3"}) {
    std::string payload = e.payload;
    const std::string from = "\"hash_type\": \"sha256\"";
    payload.replace(payload.find(from), from.size(), std::string("\"hash_type\": \"") + alg + "\"");
    const std::string b = sig::make_bundle(payload, ec_keys().priv);
    CHECK(has(what_of([&] { verify_signature(tmp / "model.cask", {b, ec_keys().pub}); }),
              std::string("unsupported hash algorithm '") + alg + "'"));
  }
}

TEST_CASE("a sharded checkpoint directory: signed, verified, one shard file swapped for another step's") {
  TempDir tmp;
  const std::string bundle = signed_steps(tmp.path);
  const SignatureCheck check{bundle, ec_keys().pub};
  verify_signature(tmp / "step_1", check);
  ShardedArchive s = ShardedArchive::open(tmp / "step_1", signed_open(bundle));
  CHECK(s.verify().empty());
  golden::ShardedVector v = golden::sharded_vector();
  for (size_t i = 0; i < v.leaves.size(); ++i) {
    std::vector<std::byte> out(s.leaf(i).byte_length);
    s.read(i, out);
    CHECK(tc_test::same(out, v.global_bytes(i)));
  }
  // The other step's directory: another name.
  CHECK(has(what_of([&] { verify_signature(tmp / "step_2", check); }), "'step_1', not 'step_2'"));
  // A shard file swapped for step 2's.
  fs::copy_file(tmp / "step_1" / "process_1.cask", tmp / "process_1.keep");
  fs::copy_file(tmp / "step_2" / "process_1.cask", tmp / "step_1" / "process_1.cask",
                fs::copy_options::overwrite_existing);
  treecask::Error e = tc_test::expect_error(ErrorCode::kSignature, [&] { verify_signature(tmp / "step_1", check); });
  CHECK(e.file() == (tmp / "step_1" / "process_1.cask").string());
  CHECK(has(e.message(), "'process_1.cask:"));
  tc_test::expect_error(ErrorCode::kSignature, [&] { ShardedArchive::open(tmp / "step_1", signed_open(bundle)); });
  // A file added, a file removed.
  fs::copy_file(tmp / "process_1.keep", tmp / "step_1" / "process_1.cask", fs::copy_options::overwrite_existing);
  verify_signature(tmp / "step_1", check);
  fs::copy_file(tmp / "step_2" / "index.cask", tmp / "step_1" / "extra.cask");
  CHECK(has(what_of([&] { verify_signature(tmp / "step_1", check); }), "not covered by the signature"));
  fs::remove(tmp / "step_1" / "extra.cask");
  fs::remove(tmp / "step_1" / "process_0.cask");
  CHECK(has(what_of([&] { verify_signature(tmp / "step_1", check); }), "lists this file and it is missing"));
}

TEST_CASE("a signed sharded checkpoint directory in a store: its listing and its files read as Sources") {
  TempDir tmp;
  const SignatureCheck check{signed_steps(tmp.path), ec_keys().pub};
  // What a listing of the "directory" gives, and the opener of its objects (sizes learned from
  // the first read, as an HTTP object's are).
  auto listing = [&](const fs::path& dir) {
    std::vector<std::pair<std::string, uint64_t>> files;
    for (const auto& e : fs::directory_iterator(dir)) files.emplace_back(e.path().filename().string(), e.file_size());
    return files;
  };
  std::atomic<uint64_t> fetched{0};
  std::vector<std::shared_ptr<FileSource>> opened;
  SourceOpener open = [&](const std::string& name) {
    opened.push_back(std::make_shared<FileSource>(tmp / "step_1" / name, /*learns_size=*/true));
    return opened.back();
  };
  verify_signature("s3://b/step_1", listing(tmp / "step_1"), open, check);
  for (const auto& f : opened) fetched += f->bytes.load();
  uint64_t total = 0;
  for (const auto& [name, size] : listing(tmp / "step_1")) total += size;
  CHECK(fetched.load() == total);  // every signed byte, once
  // Another directory's name; a file added; a file missing; a file swapped for step 2's.
  CHECK(has(what_of([&] { verify_signature("s3://b/step_2", listing(tmp / "step_1"), open, check); }),
            "'step_1', not 'step_2'"));
  auto more = listing(tmp / "step_1");
  more.emplace_back("extra.cask", 10);
  CHECK(has(what_of([&] { verify_signature("s3://b/step_1", more, open, check); }), "s3://b/step_1/extra.cask"));
  more.back().second = 0;  // an empty file the statement omits, as model_signing does
  verify_signature("s3://b/step_1", more, open, check);
  auto fewer = listing(tmp / "step_1");
  std::erase_if(fewer, [](const auto& f) { return f.first == "process_0.cask"; });
  CHECK(has(what_of([&] { verify_signature("s3://b/step_1", fewer, open, check); }), "and it is missing"));
  fs::copy_file(tmp / "step_2" / "process_1.cask", tmp / "step_1" / "process_1.cask",
                fs::copy_options::overwrite_existing);
  CHECK(has(what_of([&] { verify_signature("s3://b/step_1", listing(tmp / "step_1"), open, check); }),
            "'process_1.cask:"));
}

TEST_CASE("a signed open over a Source fetches and hashes whole shards, and refuses altered bytes") {
  TempDir tmp;
  FlatTree t = tree();
  t.add_random("big", DType::kFloat32, {4 << 20}, 7);  // 16 MiB: more than the open's first read
  t.save(tmp / "model.cask", save_options());
  SignOptions so;
  so.shard_size = 64 << 10;
  const std::string bundle = sign(tmp / "model.cask", ec_keys().priv, so);
  auto src = std::make_shared<FileSource>(tmp / "model.cask");
  Archive a = Archive::open(src, signed_open(bundle));
  const uint64_t at_open = src->bytes.load();
  check_reads(a, t);
  const size_t b = a.index_of("b");
  std::vector<std::byte> out(a.leaf(b).byte_length);
  const uint64_t before = src->bytes.load();
  a.read(b, out);
  CHECK(src->bytes.load() - before <= out.size() + 2 * so.shard_size);
  CHECK(at_open <= kOpenHeadBytes + kOpenTailBytes + 2 * so.shard_size);
  // A byte altered in transit, inside leaf b: that read fails; the open
  // and other leaves do not.
  auto bytes = tc_test::read_file(tmp / "model.cask");
  const auto needle = std::span(t.data[4]).subspan(2 << 20, 64);
  auto it = std::search(bytes.begin(), bytes.end(), needle.begin(), needle.end());
  REQUIRE(it != bytes.end());
  auto bad = std::make_shared<FileSource>(tmp / "model.cask");
  bad->damage_at = static_cast<uint64_t>(it - bytes.begin());
  REQUIRE(bad->damage_at >= kOpenHeadBytes);
  REQUIRE(bad->damage_at < fs::file_size(tmp / "model.cask") - kOpenTailBytes);
  Archive c = Archive::open(bad, signed_open(bundle));
  std::vector<std::byte> big(c.leaf(c.index_of("big")).byte_length);
  CHECK(has(what_of([&] { c.read(c.index_of("big"), big); }), "do not match their signed SHA-256"));
  std::vector<std::byte> small(c.leaf(c.index_of("a")).byte_length);
  c.read(c.index_of("a"), small);
  CHECK(tc_test::same(small, t.data[0]));
  // A full verify of the object (verify_signature of a URL): every signed byte fetched and hashed.
  const SignatureCheck check{bundle, ec_keys().pub};
  auto whole = std::make_shared<FileSource>(tmp / "model.cask");
  sig::verify_all(*sig::signed_source(whole, check), 0);
  CHECK(whole->bytes.load() == fs::file_size(tmp / "model.cask"));
  auto damaged = std::make_shared<FileSource>(tmp / "model.cask");
  damaged->damage_at = bad->damage_at;
  CHECK(has(what_of([&] { sig::verify_all(*sig::signed_source(damaged, check), 1); }), "do not match"));
  // A source that learns its size from its first read: the open's own
  // first read (head and tail, widened to shards) is that read, so the
  // signed open costs the requests an unsigned one does.
  auto learns = std::make_shared<FileSource>(tmp / "model.cask", /*learns_size=*/true);
  auto learns_plain = std::make_shared<FileSource>(tmp / "model.cask", /*learns_size=*/true);
  Archive d = Archive::open(learns, signed_open(bundle));
  Archive::open(learns_plain, OpenOptions{});
  CHECK(learns->requests.load() == learns_plain->requests.load());
  check_reads(d, t);
  {  // A small archive: its head and tail are one stretch, the whole object, split in two.
    FlatTree small = tree();
    fs::create_directories(tmp / "small");
    small.save(tmp / "small" / "model.cask", save_options());
    const std::string sb = sign(tmp / "small" / "model.cask", ec_keys().priv, so);
    auto s1 = std::make_shared<FileSource>(tmp / "small" / "model.cask", true);
    auto s0 = std::make_shared<FileSource>(tmp / "small" / "model.cask", true);
    Archive e = Archive::open(s1, signed_open(sb));
    Archive::open(s0, OpenOptions{});
    CHECK(s1->requests.load() == s0->requests.load());
    CHECK(s1->bytes.load() == fs::file_size(tmp / "small" / "model.cask"));
    check_reads(e, small);
  }
  // Its size must be the signed one before any byte is used.
  for (const auto& [edit, said] : {std::pair<int, const char*>{+1, "appended to after signing"}, {-1, "truncated"}}) {
    auto resized = tmp / "resized" / "model.cask";
    fs::create_directories(resized.parent_path());
    auto bytes2 = tc_test::read_file(tmp / "model.cask");
    bytes2.resize(edit > 0 ? bytes2.size() + 100 : bytes2.size() - 100);
    tc_test::write_file(resized, bytes2);
    CHECK(has(what_of([&] { Archive::open(std::make_shared<FileSource>(resized, true), signed_open(bundle)); }),
              said));
  }
  // The object's name is checked as a file's.
  fs::copy_file(tmp / "model.cask", tmp / "x.cask");
  CHECK(has(what_of([&] { Archive::open(std::make_shared<FileSource>(tmp / "x.cask"), signed_open(bundle)); }),
            "'model.cask', not 'x.cask'"));
}

TEST_CASE("bundle parsing refuses malformed input with kSignature, never a crash") {
  for (const char* j : {"", "null", "[]", "{}", "{\"mediaType\": 1}",
                        "{\"mediaType\": \"application/vnd.dev.sigstore.bundle.v0.3+json\"}",
                        "{\"mediaType\": \"application/vnd.dev.sigstore.bundle.v0.3+json\", \"dsseEnvelope\": "
                        "{\"payload\": \"!!\", \"payloadType\": \"application/vnd.in-toto+json\", \"signatures\": []}}"}) {
    INFO(j);
    tc_test::expect_error(ErrorCode::kSignature, [&] { sig::parse_bundle(j, "x"); });
  }
  for (const char* p : {"{}", "{\"_type\": \"https://in-toto.io/Statement/v1\"}", "[1]",
                        "{\"_type\": \"https://in-toto.io/Statement/v1\", \"predicateType\": "
                        "\"https://model_signing/signature/v1.0\", \"subject\": []}"}) {
    INFO(p);
    tc_test::expect_error(ErrorCode::kSignature, [&] { sig::parse_statement(p, "x"); });
  }
}

}  // TEST_SUITE
