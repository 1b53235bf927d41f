// The library's one concurrency primitive: WorkQueue, work shared by the
// calling thread and helper threads, each item claimed by whichever thread
// reaches it first. The manifest parse's two-thread pass uses it directly;
// parallel_for, the fan-out of the writer, the bulk and partial reads and
// save_async's snapshot copy, is a one-job WorkQueue. Each thread of a queue
// has a worker number (the owner 0, helpers 1, 2, ...) that an item may take
// as its second argument, to index state of its own (scratch buffers) that
// no other thread touches meanwhile. resolve_threads is the one thread-count
// policy. (save_async's background save is a thread of its own: it runs
// save(), which fans out here.)
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace treecask {

// Number of worker threads to use: `requested`, or all cores when 0.
inline unsigned resolve_threads(unsigned requested) {
  if (requested) return requested;
  unsigned hw = std::thread::hardware_concurrency();
  return hw ? hw : 1;
}

namespace detail {

// How many times a waiting thread yields before it sleeps.
inline constexpr int kSpins = 2000;

// One submitted job: fn(i, worker) for every i in [0, n), each i claimed once,
// `worker` the number of the thread that claimed it.
struct Job {
  std::function<void(size_t, unsigned)> fn;
  size_t n = 0;
  std::shared_ptr<Job> after;       // a job that must be complete before an item runs, or null
  std::atomic<size_t> next{0};      // the next unclaimed item (may run past n)
  std::atomic<size_t> finished{0};  // items run or skipped
  std::atomic<uint32_t> complete{0};  // 1 once finished == n (what wait() sleeps on)
  std::atomic<bool> failed{false};
  std::mutex error_mu;
  std::exception_ptr error;  // the first exception an item threw

  bool has_unclaimed() const { return next.load(std::memory_order_relaxed) < n; }

  void count_finished(size_t k) {
    if (finished.fetch_add(k, std::memory_order_acq_rel) + k == n) {
      complete.store(1, std::memory_order_release);
      complete.notify_all();
    }
  }

  // Claims and runs items on thread `worker` until none is left unclaimed.
  // Items claimed after one failed are skipped. Never throws.
  void run(unsigned worker) {
    for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) {
      if (after) after->wait_complete();
      if (!failed.load(std::memory_order_relaxed) && !(after && after->failed.load(std::memory_order_relaxed))) {
        try {
          fn(i, worker);
        } catch (...) {
          std::lock_guard<std::mutex> lock(error_mu);
          if (!error) error = std::current_exception();
          failed.store(true, std::memory_order_relaxed);
        }
      }
      count_finished(1);
    }
  }

  // Claims every item no thread has claimed yet, without running it (the job
  // then counts as failed for the jobs that come after it).
  void cancel() {
    size_t first = next.exchange(n, std::memory_order_relaxed);
    if (first < n) {
      failed.store(true, std::memory_order_relaxed);
      count_finished(n - first);
    }
  }

  // Blocks until every item has finished (run or skipped). Yields for a while
  // first: the items left are usually a helper's last one, and on a busy VM a
  // thread that sleeps can wait a scheduler tick to run again.
  void wait_complete() const {
    for (int spins = 0; spins < kSpins; ++spins) {
      if (complete.load(std::memory_order_acquire) != 0) return;
      std::this_thread::yield();
    }
    while (complete.load(std::memory_order_acquire) == 0) complete.wait(0, std::memory_order_acquire);
  }
};

}  // namespace detail

// Work shared by the calling thread (worker 0) and up to `helpers` threads
// started for it (workers 1 ... helpers). submit() queues a job of n items; wait() runs the job's unclaimed items
// on the calling thread, waits for those another thread claimed, and rethrows
// the first exception any item threw (items not yet begun when one failed are
// skipped). Each item runs at most once, on whichever thread claims it first,
// and jobs are taken in the order submitted. So a helper that starts late
// (starting a thread costs 50-100 us on a VM) takes only what is left, and
// the caller never waits for a thread to start, only for items already
// running. With 0 helpers, or when no thread can be started (EAGAIN), every
// item runs on the caller, in wait().
//
// Lifetime: helpers are detached and hold the queue's shared state, so it
// outlives whichever ends last. A job's function runs only for claimed items,
// and wait() (or the destructor) returns only once every claimed item has
// finished, so the function may refer to the caller's stack. The destructor
// cancels the items of unwaited jobs that no thread has claimed, waits for
// the running ones, and tells the helpers to exit; it never waits for a
// helper to start or to exit.
//
// Thread-safety: submit(), wait() and the destructor belong to the thread
// that made the queue; the helpers only run items.
class WorkQueue {
 public:
  using Ticket = std::shared_ptr<detail::Job>;

  explicit WorkQueue(unsigned helpers) : shared_(std::make_shared<Shared>()) {
    for (unsigned t = 0; t < helpers; ++t) {
      // A thread that cannot start (std::system_error on EAGAIN,
      // std::bad_alloc) leaves the work to the threads that did.
      try {
        std::thread(helper_main, shared_, t + 1).detach();
      } catch (...) {
        break;
      }
    }
  }
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  ~WorkQueue() {
    std::vector<Ticket> jobs;  // (a vector: unlike a deque, it is made and swapped without allocating)
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      shared_->closed = true;
      jobs.swap(shared_->jobs);
      shared_->version.fetch_add(1, std::memory_order_release);
    }
    shared_->cv.notify_all();
    for (auto& j : jobs) {
      j->cancel();
      j->wait_complete();
    }
  }

  // Says that no job will be submitted any more: a helper that finds nothing
  // left to claim exits then, instead of waiting for the next job or for the
  // destructor. Jobs already queued still run. REQUIRES: no submit() after.
  void close() {
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      shared_->closed = true;
      shared_->version.fetch_add(1, std::memory_order_release);
    }
    shared_->cv.notify_all();
  }

  // Queues fn(i) (or fn(i, worker), when `fn` takes two arguments: the
  // number of the thread running item i) for every i in [0, n). `fn` is
  // copied into the job. With
  // `after`, an earlier job of this queue, each item waits until `after` is
  // complete before it runs: a helper can take the next stage as soon as it
  // has nothing left of the current one, and start it the moment the current
  // one ends; its items are skipped when an item of `after` threw or `after`
  // was cancelled. (No deadlock: whoever waits for `after` with wait() runs
  // its unclaimed items.) Throws std::bad_alloc as is (nothing is queued then).
  template <typename Fn>
  Ticket submit(size_t n, Fn&& fn, Ticket after = nullptr) {
    auto job = std::make_shared<detail::Job>();
    if constexpr (std::is_invocable_v<Fn&, size_t, unsigned>)
      job->fn = std::forward<Fn>(fn);
    else
      job->fn = [f = std::forward<Fn>(fn)](size_t i, unsigned) mutable { f(i); };
    job->n = n;
    job->after = std::move(after);
    if (n == 0) {
      job->complete.store(1, std::memory_order_relaxed);
      return job;
    }
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      shared_->jobs.push_back(job);
      shared_->version.fetch_add(1, std::memory_order_release);
    }
    shared_->cv.notify_one();
    return job;
  }

  // Runs `job`'s unclaimed items here, waits for the rest, and rethrows the
  // first exception an item threw.
  void wait(const Ticket& job) {
    job->run(0);
    job->wait_complete();
    if (job->error) std::rethrow_exception(job->error);
  }

 private:
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<Ticket> jobs;  // front: the oldest job that may have unclaimed items
    bool closed = false;
    std::atomic<uint64_t> version{0};  // bumped on every submit and on close
  };

  // The oldest job with unclaimed items, or null once the queue is closed and
  // none is left.
  // Waits for one: yields for a while first (a job often follows soon: the
  // parse hands over its next stage within microseconds), then sleeps.
  static Ticket take(Shared& s) {
    for (int spins = 0;;) {
      uint64_t seen = s.version.load(std::memory_order_acquire);
      {
        std::unique_lock<std::mutex> lock(s.mu);
        auto live = std::find_if(s.jobs.begin(), s.jobs.end(), [](const Ticket& j) { return j->has_unclaimed(); });
        s.jobs.erase(s.jobs.begin(), live);
        if (!s.jobs.empty()) return s.jobs.front();
        if (s.closed) return nullptr;
        if (spins >= detail::kSpins) {
          s.cv.wait(lock, [&] { return s.version.load(std::memory_order_acquire) != seen; });
          continue;
        }
      }
      while (s.version.load(std::memory_order_acquire) == seen && spins++ < detail::kSpins) std::this_thread::yield();
    }
  }

  static void helper_main(std::shared_ptr<Shared> s, unsigned worker) {
    while (Ticket job = take(*s)) job->run(worker);
  }

  std::shared_ptr<Shared> shared_;
};

// Calls fn(i) for every i in [0, n) on the calling thread and up to
// `threads` - 1 helper threads of a WorkQueue made for the call: the writer's,
// the reads' and the snapshot copy's fan-out. An `fn` of two arguments is
// called fn(i, worker), worker < max(threads, 1) the number of the thread
// running it (the caller 0): an array of max(threads, 1) per-thread states
// indexed by it needs no lock. Each i runs at most once, on whichever thread
// claims it first, so the caller starts on item 0 at once instead of waiting
// for a helper to start (50-100 us on a VM), and returns as soon as every
// claimed item has finished (helpers exit on their own; WorkQueue's lifetime
// rules make that safe, so fn may refer to the caller's stack). The first
// exception thrown by any fn is rethrown; items not yet begun when one
// failed are skipped. With threads <= 1, or n <= 1, everything runs here.
template <typename Fn>
void parallel_for(size_t n, unsigned threads, Fn&& fn) {
  threads = static_cast<unsigned>(std::min<size_t>(std::max(threads, 1u), n));
  auto call = [&fn](size_t i, unsigned worker) {
    if constexpr (std::is_invocable_v<Fn&, size_t, unsigned>)
      fn(i, worker);
    else
      fn(i);
  };
  if (threads <= 1) {
    for (size_t i = 0; i < n; ++i) call(i, 0);
    return;
  }
  WorkQueue queue(threads - 1);
  auto job = queue.submit(n, call);
  queue.close();
  queue.wait(job);
}

}  // namespace treecask
