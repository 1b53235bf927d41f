// save_async(): a snapshot of the caller's leaf bytes, then save() on a
// background thread (include/treecask/writer.h).
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <future>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "treecask/writer.h"

namespace treecask {
namespace {

constexpr uint64_t kAlign = 64;           // each copied leaf starts 64-byte aligned
constexpr uint64_t kCopyPiece = 8 << 20;  // bytes per unit of parallel copying

// One anonymous mapping holding the snapshot; unmapped when the save ends.
// A mapping rather than operator new so that the memory goes back to the OS at
// once (glibc would keep a large heap block for reuse) and can ask for
// transparent huge pages: a 1 GiB snapshot then takes ~512 page faults, not
// ~262,000, which is most of the cost of copying into fresh memory.
class Snapshot {
 public:
  explicit Snapshot(uint64_t bytes) : size_(bytes) {
    if (bytes == 0) return;
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
    if (bytes >= (uint64_t{2} << 20)) ::madvise(p, bytes, MADV_HUGEPAGE);  // advice only
#endif
    data_ = static_cast<std::byte*>(p);
  }
  Snapshot(const Snapshot&) = delete;
  Snapshot& operator=(const Snapshot&) = delete;
  ~Snapshot() { release(); }
  void release() {
    if (data_) ::munmap(data_, size_);
    data_ = nullptr;
  }
  std::byte* data() const { return data_; }

 private:
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
  if (pieces.empty()) return;
  threads = std::max(1u, std::min<unsigned>(threads, static_cast<unsigned>(pieces.size())));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < pieces.size();)
      std::memcpy(pieces[i].dst, pieces[i].src, pieces[i].size);
  };
  std::vector<std::jthread> helpers;
  helpers.reserve(threads - 1);
  for (unsigned t = 1; t < threads; ++t) helpers.emplace_back(work);
  work();
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
                                  std::span<const bool> borrowed) {
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
  task->snapshot = std::make_unique<Snapshot>(total);
  std::vector<Piece> pieces;
  for (size_t i = 0; i < leaves.size(); ++i) {
    if (!borrowed.empty() && borrowed[i]) continue;
    std::span<const std::byte> src = leaves[i].data;
    std::byte* dst = task->snapshot->data() + offset[i];
    for (uint64_t at = 0; at < src.size(); at += kCopyPiece)
      pieces.push_back({src.data() + at, dst + at, std::min<uint64_t>(kCopyPiece, src.size() - at)});
    task->leaves[i].data = {dst, src.size()};
  }
  unsigned threads = options.threads ? options.threads : std::max(1u, std::thread::hardware_concurrency());
  copy_pieces(pieces, threads);

  // The task (and its snapshot) is a local of the thread's function, so it is
  // freed when save() returns or throws, before the future becomes ready.
  return std::async(std::launch::async, [task = std::move(task)]() mutable -> SaveStats {
    std::unique_ptr<Task> t = std::move(task);
    return save(t->path, t->treedef, t->leaves, t->options);
  });
}

}  // namespace treecask
