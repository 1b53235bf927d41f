// save_async(): a snapshot of the caller's leaf bytes, then save() on a
// background thread (include/treecask/writer.h).
#include "treecask/writer.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "util/parallel.h"

namespace treecask {
namespace {

constexpr uint64_t kAlign = 64;           // each copied leaf starts 64-byte aligned
constexpr uint64_t kSnapshotPiece = 8 << 20;  // bytes per unit of the parallel snapshot copy

// An anonymous mapping of `bytes` (transparent huge pages requested), or
// throws std::bad_alloc. A mapping rather than operator new so that the memory
// goes back to the OS at once (glibc would keep a large heap block) and can
// use huge pages: a 1 GiB snapshot then takes ~512 page faults, not ~262,000,
// which is most of the cost of copying into fresh memory.
std::byte* map_bytes(uint64_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  if (bytes >= (uint64_t{2} << 20)) ::madvise(p, bytes, MADV_HUGEPAGE);  // advice only
#endif
  return static_cast<std::byte*>(p);
}

}  // namespace

// The pool's state, shared with the snapshots taken from it.
struct SnapshotPool::Impl {
  mutable std::mutex mu;
  std::byte* data = nullptr;  // the idle buffer, or null
  uint64_t size = 0;
  ~Impl() {
    if (data) ::munmap(data, size);
  }
};

SnapshotPool::SnapshotPool() : impl_(std::make_shared<Impl>()) {}
SnapshotPool::~SnapshotPool() = default;

uint64_t SnapshotPool::held_bytes() const {
  std::lock_guard lock(impl_->mu);
  return impl_->data ? impl_->size : 0;
}

void SnapshotPool::clear() {
  std::lock_guard lock(impl_->mu);
  if (impl_->data) ::munmap(impl_->data, impl_->size);
  impl_->data = nullptr;
  impl_->size = 0;
}

namespace {

// The snapshot buffer of one save: mapped for it, or taken from a pool and
// given back to it when released.
class Snapshot {
 public:
  Snapshot(uint64_t bytes, std::shared_ptr<SnapshotPool::Impl> pool) : pool_(std::move(pool)) {
    if (bytes == 0) return;
    if (pool_) {
      std::lock_guard lock(pool_->mu);
      if (pool_->data && pool_->size >= bytes) {
        data_ = std::exchange(pool_->data, nullptr);
        size_ = std::exchange(pool_->size, 0);
        return;
      }
      if (pool_->data) ::munmap(pool_->data, pool_->size);  // too small: replaced below
      pool_->data = nullptr;
      pool_->size = 0;
    }
    size_ = bytes;
    data_ = map_bytes(bytes);
  }
  Snapshot(const Snapshot&) = delete;
  Snapshot& operator=(const Snapshot&) = delete;
  ~Snapshot() {
    if (!data_) return;
    if (pool_) {
      std::lock_guard lock(pool_->mu);
      if (!pool_->data) {  // back to the pool, which keeps one buffer
        pool_->data = data_;
        pool_->size = size_;
        return;
      }
    }
    ::munmap(data_, size_);
  }
  std::byte* data() const { return data_; }

 private:
  std::shared_ptr<SnapshotPool::Impl> pool_;
  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
};

struct Piece {
  const std::byte* src;
  std::byte* dst;
  uint64_t size;
};

// Copies every piece, on up to `threads` threads (the calling one included).
void copy_pieces(const std::vector<Piece>& pieces, unsigned threads) {
  parallel_for(pieces.size(), threads, [&](size_t i) { std::memcpy(pieces[i].dst, pieces[i].src, pieces[i].size); });
}

struct Task {
  std::filesystem::path path;
  TreeDef treedef;
  std::vector<LeafInput> leaves;
  SaveOptions options;
  std::unique_ptr<Snapshot> snapshot;
};

}  // namespace

std::future<SaveStats> save_async(const std::filesystem::path& path, const TreeDef& treedef,
                                  std::span<const LeafInput> leaves, const SaveOptions& options,
                                  std::span<const bool> borrowed, SnapshotPool* pool) {
  if (!borrowed.empty() && borrowed.size() != leaves.size())
    throw Error(ErrorCode::kInvalidArgument, path.string(), "",
                "borrowed has " + std::to_string(borrowed.size()) + " entries for " +
                    std::to_string(leaves.size()) + " leaves (give one per leaf, or none)");
  auto task = std::make_unique<Task>();
  task->path = path;
  task->treedef = treedef;
  task->leaves.assign(leaves.begin(), leaves.end());
  task->options = options;

  // Lay the copied leaves out in one buffer, each 64-byte aligned.
  uint64_t total = 0;
  std::vector<uint64_t> offset(leaves.size(), 0);
  for (size_t i = 0; i < leaves.size(); ++i) {
    if (!borrowed.empty() && borrowed[i]) continue;
    offset[i] = total;
    total += (leaves[i].data.size() + kAlign - 1) / kAlign * kAlign;
  }
  task->snapshot = std::make_unique<Snapshot>(total, pool ? pool->impl_ : nullptr);
  std::vector<Piece> pieces;
  for (size_t i = 0; i < leaves.size(); ++i) {
    if (!borrowed.empty() && borrowed[i]) continue;
    std::span<const std::byte> src = leaves[i].data;
    std::byte* dst = task->snapshot->data() + offset[i];
    for (uint64_t at = 0; at < src.size(); at += kSnapshotPiece)
      pieces.push_back({src.data() + at, dst + at, std::min<uint64_t>(kSnapshotPiece, src.size() - at)});
    task->leaves[i].data = {dst, src.size()};
  }
  copy_pieces(pieces, resolve_threads(options.threads));

  // The task (and its snapshot) is a local of the thread's function, so it is
  // freed when save() returns or throws, before the future becomes ready.
  return std::async(std::launch::async, [task = std::move(task)]() mutable -> SaveStats {
    std::unique_ptr<Task> t = std::move(task);
    return save(t->path, t->treedef, t->leaves, t->options);
  });
}

}  // namespace treecask
