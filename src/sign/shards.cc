// Shard tables, the verified-shard guard and cache, and the verifying
// Source (shards.h).
#include "sign/shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <unordered_set>

#include "sign/sha256.h"
#include "sign/signed_source.h"
#include "util/parallel.h"

namespace treecask::sig {

namespace {

[[noreturn]] void bad(const std::string& shown, const std::string& what) {
  throw Error(ErrorCode::kSignature, shown, "", what);
}

std::atomic<uint64_t> g_hashed{0};

// The process-wide cache of verified shards of local files: FileId, range
// and digest, as one binary key.
std::mutex g_cache_mu;
std::unordered_set<std::string>& cache() {
  static auto* c = new std::unordered_set<std::string>();  // never destroyed: used until exit
  return *c;
}
std::string cache_key(const FileId& id, uint64_t start, uint64_t end, const Digest& d) {
  std::string k(sizeof(FileId) + 16 + d.size(), '\0');
  std::memcpy(k.data(), &id, sizeof id);
  std::memcpy(k.data() + sizeof id, &start, 8);
  std::memcpy(k.data() + sizeof id + 8, &end, 8);
  std::memcpy(k.data() + sizeof id + 16, d.data(), d.size());
  return k;
}

}  // namespace

std::pair<std::string, std::string> name_and_parent(const std::string& file) {
  std::string s = file;
  if (const size_t scheme = s.find("://"); scheme != std::string::npos) {
    s = s.substr(0, s.find_first_of("?#", scheme + 3));
  } else {
    std::error_code ec;
    std::filesystem::path p = std::filesystem::absolute(s, ec);
    if (!ec) s = p.lexically_normal().string();
  }
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  const size_t slash = s.rfind('/');
  if (slash == std::string::npos) return {s, ""};
  const std::string dir = s.substr(0, slash);
  return {s.substr(slash + 1), dir.substr(dir.rfind('/') == std::string::npos ? 0 : dir.rfind('/') + 1)};
}

size_t ShardTable::shard_of(uint64_t off) const {
  auto it = std::upper_bound(start.begin(), start.end() - 1, off);
  return static_cast<size_t>(it - start.begin()) - 1;
}

std::string ShardTable::describe(size_t k) const {
  const std::string a = std::to_string(start[k]), b = std::to_string(start[k + 1]);
  return "bytes [" + a + ", " + b + ") (signed resource '" + resource + (shards ? ":" + a + ":" + b : "") + "')";
}

std::string resource_of(const Statement& st, const std::string& file, const std::string& shown) {
  auto [name, parent] = name_and_parent(file);
  if (st.file_model()) {
    if (st.subject != name)
      bad(shown, "the signature is for the file '" + st.subject + "', not '" + name + "'");
    return ".";
  }
  if (st.subject != parent)
    bad(shown, "the signature is for the directory '" + st.subject + "', and '" + name +
                   "' is not in it (its directory is '" + parent + "')");
  return name;
}

ShardTable shard_table(const Statement& st, const std::string& resource, uint64_t file_size, const std::string& shown) {
  ShardTable t;
  t.file = shown;
  t.resource = resource;
  t.shards = st.shards;
  std::vector<const Resource*> rs;
  for (const Resource& r : st.resources)
    if (r.path == resource) rs.push_back(&r);
  if (rs.empty())
    bad(shown, "the signature does not cover this file: its statement lists no resource '" + resource + "'");
  if (!st.shards) {
    if (rs.size() != 1) bad(shown, "the statement lists the file '" + resource + "' " + std::to_string(rs.size()) + " times");
    t.start = {0, file_size};
    t.digest = {rs[0]->digest};
    return t;
  }
  std::sort(rs.begin(), rs.end(), [](const Resource* a, const Resource* b) {
    return a->start != b->start ? a->start < b->start : a->end < b->end;
  });
  uint64_t at = 0;
  for (size_t i = 0; i < rs.size(); ++i) {
    const Resource& r = *rs[i];
    if (r.start < at) bad(shown, "signed ranges '" + rs[i - 1]->name + "' and '" + r.name + "' overlap");
    if (r.start > at)
      bad(shown, "the signed ranges of '" + resource + "' leave bytes [" + std::to_string(at) + ", " +
                     std::to_string(r.start) + ") unsigned (a shard resource is missing)");
    const uint64_t len = r.end - r.start;
    const bool last = i + 1 == rs.size();
    if (len == 0 || len > st.shard_size || (!last && len != st.shard_size))
      bad(shown, "signed range '" + r.name + "' is not a shard of " + std::to_string(st.shard_size) + " bytes");
    t.start.push_back(r.start);
    t.digest.push_back(r.digest);
    at = r.end;
  }
  t.start.push_back(at);
  if (at != file_size)
    bad(shown, "the file has " + std::to_string(file_size) + " bytes but the signature covers " +
                   std::to_string(at) + " (" + (file_size > at ? "appended to" : "truncated") + " after signing)");
  return t;
}

uint64_t shards_hashed() { return g_hashed.load(std::memory_order_relaxed); }

FileId file_id(int fd) {
  struct stat st;
  FileId id;
  if (::fstat(fd, &st) == 0) {
    id.dev = static_cast<uint64_t>(st.st_dev);
    id.ino = static_cast<uint64_t>(st.st_ino);
    id.size = static_cast<uint64_t>(st.st_size);
    id.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  }
  return id;
}

ShardGuard::ShardGuard(ShardTable table, int fd, bool use_cache)
    : table_(std::move(table)), use_cache_(use_cache) {
  fd_ = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (fd_ < 0) throw Error(ErrorCode::kIo, table_.file, "", std::string("cannot dup: ") + std::strerror(errno));
  id_ = file_id(fd_);
  state_.reset(new std::atomic<uint8_t>[table_.count()]);
  for (size_t k = 0; k < table_.count(); ++k) state_[k].store(0, std::memory_order_relaxed);
}

ShardGuard::~ShardGuard() {
  if (fd_ >= 0) ::close(fd_);
}

void ShardGuard::verify_shard(size_t k) const { hash_shard(k, /*wait=*/true); }

bool ShardGuard::hash_shard(size_t k, bool wait) const {
  std::atomic<uint8_t>& s = state_[k];
  for (;;) {
    uint8_t v = s.load(std::memory_order_acquire);
    if (v == 2) return true;
    if (v == 1) {
      if (!wait) return false;
      s.wait(1, std::memory_order_acquire);
      continue;
    }
    if (!s.compare_exchange_strong(v, 1, std::memory_order_acq_rel)) continue;
    break;
  }
  const uint64_t a = table_.start[k], b = table_.start[k + 1];
  const std::string key = cache_key(id_, a, b, table_.digest[k]);
  bool ok = false;
  if (use_cache_) {
    std::lock_guard lock(g_cache_mu);
    ok = cache().count(key) != 0;
  }
  if (!ok) {
    try {
      const std::byte* map = map_.load(std::memory_order_acquire);
      if (map) {  // through the reader's map: no copy, and the pages stay mapped for the read that follows
        Sha256 h;
        h.update({map + a, static_cast<size_t>(b - a)});
        ok = h.finish() == table_.digest[k];
      } else {
        ok = sha256_of_file_range(fd_, a, b - a, table_.file) == table_.digest[k];
      }
      hashed_.fetch_add(1, std::memory_order_relaxed);
      g_hashed.fetch_add(1, std::memory_order_relaxed);
    } catch (...) {
      s.store(0, std::memory_order_release);
      s.notify_all();
      throw;
    }
    if (ok) {
      std::lock_guard lock(g_cache_mu);
      cache().insert(key);
    }
  }
  s.store(ok ? 2 : 0, std::memory_order_release);
  s.notify_all();
  if (!ok)
    bad(table_.file, table_.describe(k) + " do not match their signed SHA-256 digest");
  return true;
}

void ShardGuard::ensure(uint64_t off, uint64_t n, unsigned threads) const {
  const std::pair<uint64_t, uint64_t> one{off, n};
  ensure_ranges(std::span(&one, 1), threads);
}

void ShardGuard::ensure_ranges(std::span<const std::pair<uint64_t, uint64_t>> ranges, unsigned threads) const {
  std::vector<size_t> todo;
  for (auto [off, n] : ranges) {
    if (n == 0) continue;
    if (off > table_.size() || n > table_.size() - off)
      bad(table_.file, "bytes [" + std::to_string(off) + ", " + std::to_string(off + n) +
                           ") lie past the signed length " + std::to_string(table_.size()));
    const size_t k0 = table_.shard_of(off), k1 = table_.shard_of(off + n - 1);
    for (size_t k = k0; k <= k1; ++k)
      if (state_[k].load(std::memory_order_acquire) != 2) todo.push_back(k);
  }
  if (todo.empty()) return;
  std::sort(todo.begin(), todo.end());
  todo.erase(std::unique(todo.begin(), todo.end()), todo.end());
  uint64_t bytes = 0;
  for (size_t k : todo) bytes += table_.start[k + 1] - table_.start[k];
  // Below kParallelBytes the caller hashes alone: starting threads would
  // cost more than they save. Alone, it first hashes the shards no other
  // thread is hashing, then waits for the rest: two threads ensuring the
  // same ranges share the work instead of queueing behind each other.
  constexpr uint64_t kParallelBytes = 512 << 10;
  if (todo.size() == 1 || bytes < kParallelBytes || threads == 1) {
    for (size_t k : todo) hash_shard(k, /*wait=*/false);
    for (size_t k : todo) hash_shard(k, /*wait=*/true);
    return;
  }
  parallel_for(todo.size(), std::min<unsigned>(resolve_threads(threads), static_cast<unsigned>(todo.size())),
               [&](size_t i) { verify_shard(todo[i]); });
}

// ---- SignedOpen ----

struct SignedOpen::State {
  SignatureCheck check;
  std::string shown;
  uint64_t size = 0;
  int fd = -1;
  std::mutex mu;
  std::condition_variable cv;

  // The bundle's check in three steps, each run by whichever thread takes
  // it first (share): kParse (the bundle's JSON, or its statement from the
  // cache of checked bundles), then side by side kTable (the statement and
  // this file's shard table, whose shards are then hashed while the
  // signature may still be under check: finish() hands nothing out before
  // it holds) and kSignature (the envelope under the key, where a process
  // pays OpenSSL's one-time set-up).
  enum StepId { kParse, kSignature, kTable, kSteps };
  struct Step {
    bool claimed = false, done = false;
    std::exception_ptr error;
  };
  Step steps[kSteps];
  // Written by the step that makes them, read once it is done (mu orders both).
  Digest key{};                                // kParse: the bundle's key in that cache
  std::shared_ptr<const Statement> statement;  // kParse (from the cache: verified), else kTable
  bool verified = false;                       // kParse found the statement in the cache
  Envelope envelope;                           // kParse, when not verified
  std::shared_ptr<const ShardGuard> guard;     // kTable
  std::optional<Ranges> ranges;
  const std::byte* map = nullptr;
  bool closed = false;  // finish() is over: the helper must not touch the file
  int busy = 0;         // 1 while the helper works (close() waits for it)

  void run(StepId id) {
    switch (id) {
      case kParse:
        key = bundle_key(check.bundle_json, check.public_key_pem);
        if ((statement = cached_statement(key))) {
          verified = true;
        } else {
          envelope = parse_bundle(check.bundle_json, shown);
        }
        break;
      case kSignature:
        if (!verified) check_envelope(envelope, check.public_key_pem, shown);
        break;
      case kTable: {
        if (!verified) statement = std::make_shared<const Statement>(parse_statement(envelope.payload, shown));
        auto g = std::make_shared<const ShardGuard>(
            shard_table(*statement, resource_of(*statement, shown, shown), size, shown), fd);
        std::lock_guard lock(mu);
        if (map) g->use_map(map);
        guard = std::move(g);
        break;
      }
      case kSteps:
        break;
    }
  }

  // This thread's share of the steps: the first one no thread has taken
  // (kParse, then kTable before kSignature, so that the hashing can start),
  // waiting only when none is left to take and the one it needs is not
  // done. Returns once every step is taken and the table is done (true),
  // or once kParse has failed (false).
  bool share() {
    std::unique_lock lock(mu);
    for (;;) {
      StepId next = kSteps;
      if (!steps[kParse].claimed)
        next = kParse;
      else if (steps[kParse].done && steps[kParse].error)
        return false;
      else if (steps[kParse].done && !steps[kTable].claimed)
        next = kTable;
      else if (steps[kParse].done && !steps[kSignature].claimed)
        next = kSignature;
      else if (steps[kTable].done)
        return true;
      if (next == kSteps) {
        cv.wait(lock);
        continue;
      }
      steps[next].claimed = true;
      lock.unlock();
      std::exception_ptr e;
      try {
        run(next);
      } catch (...) {
        e = std::current_exception();
      }
      lock.lock();
      steps[next].error = e;
      steps[next].done = true;
      cv.notify_all();
    }
  }

  // Step `id`'s error, taken out of the state (which the helper may be the
  // last to hold) so that only this thread rethrows it; null if none.
  std::exception_ptr error_of(StepId id) {
    std::lock_guard lock(mu);
    return std::exchange(steps[id].error, nullptr);
  }

  // The helper thread's work: its share of the steps, then the trusted
  // ranges' shards no other thread is hashing. Its failures are not
  // reported here: finish() reports each step's error, waits for every
  // shard and hashes a failed one again, reporting it.
  static void help(const std::shared_ptr<State>& s) {
    {
      std::lock_guard lock(s->mu);
      if (s->closed) return;
      ++s->busy;
    }
    struct Done {
      State& s;
      ~Done() {
        std::lock_guard lock(s.mu);
        --s.busy;
        s.cv.notify_all();
      }
    } done{*s};
    if (!s->share()) return;
    std::shared_ptr<const ShardGuard> g;
    Ranges rs;
    {
      std::unique_lock lock(s->mu);
      s->cv.wait(lock, [&] { return s->closed || s->ranges; });
      if (s->closed || !s->guard) return;
      g = s->guard;
      rs = *s->ranges;
    }
    try {
      g->ensure_ranges(rs, 1);
    } catch (...) {
    }
  }

  // Stops the helper's use of the file and the map: after it, the helper
  // has returned or will return without touching them.
  void close() {
    std::unique_lock lock(mu);
    closed = true;
    cv.notify_all();
    cv.wait(lock, [&] { return busy == 0; });
  }
};

SignedOpen::SignedOpen(const SignatureCheck& check, std::string shown, uint64_t size, int fd)
    : state_(std::make_shared<State>()) {
  state_->check = check;
  state_->shown = std::move(shown);
  state_->size = size;
  state_->fd = fd;
  try {
    std::thread([s = state_] {
      try {
        State::help(s);
      } catch (...) {  // std::bad_alloc: finish() does what is left
      }
    }).detach();
  } catch (const std::system_error&) {
    // No thread: finish() does it all on the opening thread.
  }
}

SignedOpen::~SignedOpen() { state_->close(); }

void SignedOpen::trust(Ranges ranges) {
  std::lock_guard lock(state_->mu);
  state_->ranges = std::move(ranges);
  state_->cv.notify_all();
}

void SignedOpen::use_map(const std::byte* base) {
#ifdef MADV_POPULATE_READ
  // The trusted ranges' pages, mapped in one call (Linux 5.14; advice only):
  // the two threads hashing them and the open reading them then fault on
  // none of them (10% off a fresh process's signed open at 10,000 leaves,
  // bench/signing.py's C++ row, 2026-11-29).
  Ranges rs;
  {
    std::lock_guard lock(state_->mu);
    if (state_->ranges) rs = *state_->ranges;
  }
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  for (const auto& [off, n] : rs) {
    const uint64_t a = off / page * page, b = std::min(state_->size, off + n);
    if (b > a) (void)::madvise(const_cast<std::byte*>(base) + a, b - a, MADV_POPULATE_READ);
  }
#endif
  std::lock_guard lock(state_->mu);
  state_->map = base;
  if (state_->guard) state_->guard->use_map(base);
}

std::shared_ptr<const ShardGuard> SignedOpen::finish() {
  State& s = *state_;
  struct Closer {
    State& s;
    ~Closer() { s.close(); }
  } closer{s};
  if (!s.share()) std::rethrow_exception(s.error_of(State::kParse));
  // The shards under the trusted ranges, beside the helper (on those it has
  // not taken), while one of the two may still check the signature: a
  // mismatch is reported after the signature's and the statement's errors.
  std::exception_ptr mismatch;
  std::shared_ptr<const ShardGuard> g;
  Ranges rs;
  {
    std::lock_guard lock(s.mu);
    g = s.guard;
    if (s.ranges) rs = *s.ranges;
  }
  if (g) {
    try {
      g->ensure_ranges(rs, 1);
    } catch (...) {
      mismatch = std::current_exception();
    }
  }
  {
    std::unique_lock lock(s.mu);
    s.cv.wait(lock, [&] { return s.steps[State::kSignature].done; });
  }
  for (const auto id : {State::kSignature, State::kTable})
    if (auto e = s.error_of(id)) std::rethrow_exception(e);
  if (mismatch) std::rethrow_exception(mismatch);
  if (!s.verified) remember_statement(s.key, s.statement);
  return g;
}

// ---- verified_source ----

namespace {

class VerifiedSource final : public Source {
 public:
  VerifiedSource(std::shared_ptr<const Source> inner, ShardTable table)
      : inner_(std::move(inner)), table_(std::move(table)) {}
  const std::string& name() const noexcept override { return inner_->name(); }
  uint64_t size() const noexcept override { return table_.size(); }
  unsigned concurrency() const noexcept override { return inner_->concurrency(); }

  void read(std::span<const ReadRange> ranges) const override {
    const uint64_t size = table_.size();
    // Absolute ranges, in order of offset.
    std::vector<ReadRange> rs(ranges.begin(), ranges.end());
    for (ReadRange& r : rs) {
      if (r.from_end) {  // the last out.size() bytes, written at the start of `out`
        const uint64_t n = std::min<uint64_t>(r.out.size(), size);
        r = {size - n, r.out.first(static_cast<size_t>(n)), false};
      } else if (r.offset > size || r.out.size() > size - r.offset) {
        bad(name(), "bytes [" + std::to_string(r.offset) + ", " + std::to_string(r.offset + r.out.size()) +
                        ") lie past the signed length " + std::to_string(size));
      }
    }
    std::erase_if(rs, [](const ReadRange& r) { return r.out.empty(); });
    if (rs.empty()) return;
    std::sort(rs.begin(), rs.end(), [](const ReadRange& a, const ReadRange& b) { return a.offset < b.offset; });
    // Stretches of whole shards [k0, k1], merged where they touch.
    struct Stretch {
      size_t k0, k1;
      std::vector<std::byte> bytes;
    };
    std::vector<Stretch> st;
    for (const ReadRange& r : rs) {
      const size_t k0 = table_.shard_of(r.offset), k1 = table_.shard_of(r.offset + r.out.size() - 1);
      if (!st.empty() && k0 <= st.back().k1 + 1) {
        st.back().k1 = std::max(st.back().k1, k1);
        continue;
      }
      st.push_back({k0, k1, {}});
    }
    std::vector<ReadRange> fetch;
    std::vector<std::pair<size_t, size_t>> shards;  // (stretch, shard)
    for (size_t i = 0; i < st.size(); ++i) {
      Stretch& s = st[i];
      s.bytes.resize(table_.start[s.k1 + 1] - table_.start[s.k0]);
      fetch.push_back({table_.start[s.k0], s.bytes});
      for (size_t k = s.k0; k <= s.k1; ++k) shards.emplace_back(i, k);
    }
    bool fetched = false;
    std::call_once(sized_, [&] {
      if (inner_->size() == kUnknownSize) {
        // The source learns its size from its first read, which must be
        // {0, head} and a from_end range (treecask/source.h). The open's
        // first read, widened to shards, is fetched in that form when it
        // starts at 0 and ends at the signed length (its head and tail
        // stretches apart, or one stretch split in two): that read learns
        // the size, with no extra round trip. Any other first read is
        // preceded by a read of the first and last shards.
        std::vector<std::byte> a, b;
        ReadRange r[2] = {{0, a}, {0, b, /*from_end=*/true}};
        if (fetch.front().offset == 0 && fetch.back().offset + fetch.back().out.size() == size && size >= 2 &&
            fetch.size() <= 2) {
          if (fetch.size() == 2) {
            r[0].out = fetch[0].out;
            r[1].out = fetch[1].out;
          } else {  // [0, size): the first shard (or half of one), then the rest from the end
            const size_t cut = static_cast<size_t>(table_.count() > 1 ? table_.start[1] : size / 2);
            r[0].out = fetch[0].out.first(cut);
            r[1].out = fetch[0].out.subspan(cut);
          }
          fetched = true;
        } else {
          a.resize(std::max<uint64_t>(table_.start[1] - table_.start[0], 1));
          b.resize(std::max<uint64_t>(table_.start.back() - table_.start[table_.count() - 1], 1));
          r[0].out = a;
          r[1].out = b;
        }
        inner_->read(r);
      }
      if (inner_->size() != size)
        bad(name(), "the object has " + std::to_string(inner_->size()) + " bytes but the signature covers " +
                        std::to_string(size) + " (" + (inner_->size() > size ? "appended to" : "truncated") +
                        " after signing)");
    });
    if (!fetched) inner_->read(fetch);
    auto check = [&](size_t j) {
      const auto [i, k] = shards[j];
      const Stretch& s = st[i];
      const uint64_t from = table_.start[k] - table_.start[s.k0];
      if (sha256(std::span(s.bytes).subspan(from, table_.start[k + 1] - table_.start[k])) != table_.digest[k])
        bad(name(), table_.describe(k) + " do not match their signed SHA-256 digest");
    };
    if (shards.size() <= 2) {
      for (size_t j = 0; j < shards.size(); ++j) check(j);
    } else {
      parallel_for(shards.size(), std::min<unsigned>(resolve_threads(0), static_cast<unsigned>(shards.size())), check);
    }
    size_t i = 0;
    for (const ReadRange& r : rs) {
      while (table_.start[st[i].k1 + 1] <= r.offset) ++i;
      std::memcpy(r.out.data(), st[i].bytes.data() + (r.offset - table_.start[st[i].k0]), r.out.size());
    }
  }

 private:
  std::shared_ptr<const Source> inner_;
  ShardTable table_;
  mutable std::once_flag sized_;  // the inner object's length checked against the signed one
};

}  // namespace

std::shared_ptr<const Source> verified_source(std::shared_ptr<const Source> inner, ShardTable table) {
  return std::make_shared<VerifiedSource>(std::move(inner), std::move(table));
}

std::shared_ptr<const Source> signed_source(std::shared_ptr<const Source> source, const SignatureCheck& check) {
  const std::string& shown = source->name();
  const auto stp = checked_statement(check.bundle_json, check.public_key_pem, shown);
  return signed_source(std::move(source), *stp, resource_of(*stp, shown, shown));
}

std::shared_ptr<const Source> signed_source(std::shared_ptr<const Source> source, const Statement& st,
                                            const std::string& resource) {
  const std::string& shown = source->name();
  uint64_t size = 0;
  bool listed = false;
  for (const Resource& r : st.resources)
    if (r.path == resource) {
      size = std::max(size, r.end);
      listed = true;
    }
  if (listed && !st.shards) {
    if (source->size() == kUnknownSize) {
      std::byte a[1], b[1];
      ReadRange r[2] = {{0, a}, {0, b, /*from_end=*/true}};
      source->read(r);
    }
    size = source->size();
  }
  return verified_source(source, shard_table(st, resource, size, shown));
}

void verify_all(const Source& source, unsigned threads) {
  constexpr uint64_t kStretch = uint64_t{16} << 20;  // at most 8 in memory at once
  const uint64_t size = source.size();
  const size_t n = static_cast<size_t>((size + kStretch - 1) / kStretch);
  const unsigned workers = std::max(1u, std::min({source.concurrency(), 8u, resolve_threads(threads),
                                                  static_cast<unsigned>(std::max<size_t>(n, 1))}));
  std::vector<std::vector<std::byte>> bufs(workers);
  parallel_for(n, workers, [&](size_t i, unsigned w) {
    const uint64_t at = i * kStretch, len = std::min(kStretch, size - at);
    bufs[w].resize(static_cast<size_t>(len));
    ReadRange r{at, bufs[w]};
    source.read(std::span<const ReadRange>(&r, 1));
  });
}

}  // namespace treecask::sig
