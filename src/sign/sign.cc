// treecask::sign and treecask::verify_signature (include/treecask/signing.h):
// a model (one file, or a directory as model_signing walks it) hashed on all
// cores, shard by shard.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <set>

#include "sign/bundle.h"
#include "sign/sha256.h"
#include "remote/url.h"
#include "sign/shards.h"
#include "sign/signed_source.h"
#include "treecask/remote.h"
#include "treecask/signing.h"
#include "util/parallel.h"

namespace treecask {

namespace {

namespace fs = std::filesystem;

struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd, o.fd);
    return *this;
  }
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Opens a regular file for hashing; its size in `size`.
Fd open_file(const fs::path& p, uint64_t* size) {
  Fd f(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  if (f.fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) throw Error(ErrorCode::kNotFound, p.string(), "", "no such file");
    throw Error(ErrorCode::kIo, p.string(), "", std::string("cannot open: ") + std::strerror(errno));
  }
  struct stat st;
  if (::fstat(f.fd, &st) != 0) throw Error(ErrorCode::kIo, p.string(), "", "fstat failed");
  if (!S_ISREG(st.st_mode)) throw Error(ErrorCode::kInvalidArgument, p.string(), "", "not a regular file");
  *size = static_cast<uint64_t>(st.st_size);
  return f;
}

// True when `rel` (a POSIX path relative to the model) is or lies under
// one of `ignore` (model_signing's ignore_paths rule).
bool ignored(const std::string& rel, const std::vector<std::string>& ignore) {
  for (const std::string& i : ignore) {
    std::string p = fs::path(i).lexically_normal().generic_string();
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    if (rel == p || (rel.size() > p.size() && rel.compare(0, p.size(), p) == 0 && rel[p.size()] == '/')) return true;
  }
  return false;
}

// The regular files of directory `dir` as model_signing's directory model
// lists them: relative POSIX paths, sorted, ignored paths left out.
// Throws kUnsupported for a symbolic link (model_signing refuses them
// unless allow_symlinks), kIo.
std::vector<std::string> model_files(const fs::path& dir, const std::vector<std::string>& ignore) {
  std::vector<std::string> out;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, fs::directory_options::none, ec), end;
  if (ec) throw Error(ErrorCode::kIo, dir.string(), "", "cannot list: " + ec.message());
  for (; it != end; it.increment(ec)) {
    if (ec) throw Error(ErrorCode::kIo, dir.string(), "", "cannot list: " + ec.message());
    const std::string rel = it->path().lexically_relative(dir).generic_string();
    if (ignored(rel, ignore)) {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (it->is_symlink())
      throw Error(ErrorCode::kUnsupported, it->path().string(), "",
                  "a symbolic link in a signed directory (model_signing refuses them without allow_symlinks)");
    if (it->is_regular_file()) out.push_back(rel);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// One shard to hash: file `file` (an index into the caller's files), bytes [start, end).
struct Job {
  size_t file;
  uint64_t start, end;
};

// The files sign() hashes: relative names ("." for a file model) in `rel`,
// their paths in `paths`. Throws kNotFound, and what model_files throws.
void signed_files(const fs::path& target, std::vector<std::string>* rel, std::vector<fs::path>* paths) {
  std::error_code ec;
  const bool is_dir = fs::is_directory(target, ec);
  if (!is_dir && !fs::exists(target, ec)) throw Error(ErrorCode::kNotFound, target.string(), "", "no such file or directory");
  if (is_dir) {
    *rel = model_files(target, sig::default_ignore_paths());
    for (const std::string& r : *rel) paths->push_back(target / r);
  } else {
    *rel = {"."};
    *paths = {target};
  }
}

// The files of the directory named `name` (shown as `shown`) that the
// directory model `st` signs, of `present` (its files: relative POSIX paths,
// sorted, the ignored ones left out), as model_signing checks them: the
// statement is a directory's of that name, it lists every present file (an
// empty one it may omit: model_signing lists no shard for it; `empty` tells)
// and no other. Throws Error(kSignature) naming the directory or the file.
std::vector<std::string> directory_files(const sig::Statement& st, const std::string& name, const std::string& shown,
                                         const std::vector<std::string>& present,
                                         const std::function<bool(const std::string&)>& empty) {
  if (st.file_model())
    throw Error(ErrorCode::kSignature, shown, "", "the signature is for the file '" + st.subject + "', not a directory");
  if (st.subject != name)
    throw Error(ErrorCode::kSignature, shown, "",
                "the signature is for the directory '" + st.subject + "', not '" + name + "'");
  std::set<std::string> listed;
  for (const sig::Resource& r : st.resources) listed.insert(r.path);
  const std::string dir = shown.empty() || shown.back() == '/' ? shown : shown + "/";
  std::vector<std::string> out;
  for (const std::string& f : present) {
    if (listed.count(f)) {
      out.push_back(f);
    } else if (!(st.shards && empty(f))) {
      throw Error(ErrorCode::kSignature, dir + f, "",
                  "the file is not covered by the signature (its statement does not list it)");
    }
  }
  for (const std::string& l : listed)
    if (!std::binary_search(present.begin(), present.end(), l))
      throw Error(ErrorCode::kSignature, dir + l, "", "the signature lists this file and it is missing");
  return out;
}

}  // namespace

uint64_t default_sign_shard_size(uint64_t model_bytes) {
  constexpr uint64_t kMin = uint64_t{256} << 10, kMax = uint64_t{2} << 20;
  return std::clamp<uint64_t>(std::bit_ceil(std::max<uint64_t>((model_bytes + 1023) / 1024, 1)), kMin, kMax);
}

uint64_t sign_shard_size(const std::filesystem::path& target, const SignOptions& options) {
  if (options.shard_size) return options.shard_size;
  std::vector<std::string> rel;
  std::vector<fs::path> paths;
  signed_files(target, &rel, &paths);
  uint64_t bytes = 0;
  for (const fs::path& p : paths) {
    std::error_code ec;
    const uint64_t n = fs::file_size(p, ec);
    if (!ec) bytes += n;
  }
  return default_sign_shard_size(bytes);
}

std::string sign(const std::filesystem::path& target, std::string_view private_key_pem, const SignOptions& options) {
  std::vector<std::string> rel;  // the files, relative ("." for a file model)
  std::vector<fs::path> paths;
  signed_files(target, &rel, &paths);
  std::vector<Fd> fds;
  std::vector<uint64_t> sizes(paths.size());
  for (size_t f = 0; f < paths.size(); ++f) fds.push_back(open_file(paths[f], &sizes[f]));
  uint64_t model_bytes = 0;
  for (uint64_t n : sizes) model_bytes += n;
  const uint64_t shard_size = options.shard_size ? options.shard_size : default_sign_shard_size(model_bytes);
  std::vector<Job> jobs;
  for (size_t f = 0; f < paths.size(); ++f) {
    if (!options.shards) {
      jobs.push_back({f, 0, sizes[f]});
      continue;
    }
    // Shards: an empty file has none (model_signing lists no resource for it).
    for (uint64_t a = 0; a < sizes[f]; a += shard_size) jobs.push_back({f, a, std::min(sizes[f], a + shard_size)});
  }
  std::vector<sig::Resource> res(jobs.size());
  parallel_for(jobs.size(), std::min<unsigned>(resolve_threads(options.threads), std::max<size_t>(jobs.size(), 1)),
               [&](size_t j) {
                 const Job& jb = jobs[j];
                 sig::Resource& r = res[j];
                 r.path = rel[jb.file];
                 r.start = jb.start;
                 r.end = jb.end;
                 r.name = options.shards ? r.path + ":" + std::to_string(jb.start) + ":" + std::to_string(jb.end) : r.path;
                 r.digest = sig::sha256_of_file_range(fds[jb.file].fd, jb.start, jb.end - jb.start, paths[jb.file].string());
               });
  // A file that changed size while it was hashed would be signed torn.
  for (size_t f = 0; f < paths.size(); ++f) {
    uint64_t size = 0;
    Fd again = open_file(paths[f], &size);
    const uint64_t hashed = [&] {
      uint64_t e = 0;
      for (const sig::Resource& r : res)
        if (r.path == rel[f]) e = std::max(e, r.end);
      return e;
    }();
    if (size != hashed)
      throw Error(ErrorCode::kIo, paths[f].string(), "", "the file changed size while it was signed");
  }
  const std::string statement =
      sig::make_statement(sig::name_and_parent(target.string()).first, options.shards, shard_size, res, sig::default_ignore_paths());
  try {
    return sig::make_bundle(statement, private_key_pem);
  } catch (const Error& e) {
    throw Error(e.code(), target.string(), "", e.message());
  }
}

std::string public_key_of(std::string_view private_key_pem) { return sig::public_key_pem_of(private_key_pem); }

SignedModel signed_model(std::string_view bundle_json) {
  const sig::Statement st = sig::parse_statement(sig::parse_bundle(bundle_json, "signature").payload, "signature");
  return {st.subject, !st.file_model()};
}

void verify_signature(std::shared_ptr<const Source> source, const SignatureCheck& check, unsigned threads) {
  // every signed byte fetched through the verifying source, hashed as it arrives
  sig::verify_all(*sig::signed_source(std::move(source), check), threads);
}

void verify_signature(const std::string& shown, const std::vector<std::pair<std::string, uint64_t>>& files,
                      const SourceOpener& open, const SignatureCheck& check, unsigned threads) {
  const sig::Statement st = sig::check_bundle(check.bundle_json, check.public_key_pem, shown);
  std::map<std::string, uint64_t> size_of;
  std::vector<std::string> present;
  for (const auto& [f, size] : files)
    if (!ignored(f, st.ignore_paths)) {
      present.push_back(f);
      size_of[f] = size;
    }
  std::sort(present.begin(), present.end());
  for (const std::string& f : directory_files(st, sig::name_and_parent(shown).first, shown, present,
                                              [&](const std::string& f) { return size_of[f] == 0; }))
    sig::verify_all(*sig::signed_source(open(f), st, f), threads);
}

void verify_signature(const std::filesystem::path& target, const SignatureCheck& check, unsigned threads) {
  const std::string shown = target.string();
  if (is_url(shown)) {
    // A URL naming the signed directory itself: its check needs a listing
    // (every file signed, none added), which a URL cannot give here. (The
    // bundle checked once: signed_source finds it in the cache.)
    const auto st = sig::checked_statement(check.bundle_json, check.public_key_pem, shown);
    if (!st->file_model() && sig::name_and_parent(shown).first == st->subject)
      throw Error(ErrorCode::kUnsupported, shown, "",
                  "the signature is for the directory '" + st->subject +
                      "': a signed directory in an object store is verified against a listing of it, which "
                      "a URL alone does not give; verify it with the Python package's treecask.verify(url, "
                      "signature=, public_key=), which lists it, or verify one of its files by its URL");
    return verify_signature(remote::open_object(shown), check, threads);
  }
  std::error_code ec;
  const bool is_dir = fs::is_directory(target, ec);
  if (!is_dir && !fs::exists(target, ec)) throw Error(ErrorCode::kNotFound, shown, "", "no such file or directory");
  const sig::Statement st = sig::check_bundle(check.bundle_json, check.public_key_pem, shown);
  std::vector<std::unique_ptr<sig::ShardGuard>> guards;
  if (is_dir) {
    const auto empty = [&](const std::string& f) {
      std::error_code size_ec;
      return fs::file_size(target / f, size_ec) == 0 && !size_ec;
    };
    for (const std::string& f :
         directory_files(st, sig::name_and_parent(shown).first, shown, model_files(target, st.ignore_paths), empty)) {
      uint64_t size = 0;
      Fd fd = open_file(target / f, &size);
      guards.push_back(std::make_unique<sig::ShardGuard>(
          sig::shard_table(st, f, size, (target / f).string()), fd.fd, /*use_cache=*/false));
    }
  } else {
    uint64_t size = 0;
    Fd fd = open_file(target, &size);
    const std::string resource = sig::resource_of(st, shown, shown);
    guards.push_back(std::make_unique<sig::ShardGuard>(sig::shard_table(st, resource, size, shown), fd.fd,
                                                        /*use_cache=*/false));
  }
  std::vector<std::pair<size_t, size_t>> jobs;  // (guard, shard)
  for (size_t g = 0; g < guards.size(); ++g)
    for (size_t k = 0; k < guards[g]->table().count(); ++k) jobs.emplace_back(g, k);
  parallel_for(jobs.size(), std::min<unsigned>(resolve_threads(threads), std::max<size_t>(jobs.size(), 1)),
               [&](size_t j) { guards[jobs[j].first]->verify_shard(jobs[j].second); });
}

}  // namespace treecask
