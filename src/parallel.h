// parallel_for: the writer's and reader's only concurrency primitive.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace treecask {

// Number of worker threads to use: `requested`, or all cores when 0.
inline unsigned resolve_threads(unsigned requested) {
  if (requested) return requested;
  unsigned hw = std::thread::hardware_concurrency();
  return hw ? hw : 1;
}

// Calls fn(i) for every i in [0, n) on up to `threads` threads (the calling
// thread is one of them). The first exception thrown by any fn is rethrown
// after all threads finish; remaining indices are skipped once one failed.
template <typename Fn>
void parallel_for(size_t n, unsigned threads, Fn&& fn) {
  threads = static_cast<unsigned>(std::min<size_t>(std::max(threads, 1u), n));
  if (threads <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mu;
  auto work = [&] {
    for (;;) {
      size_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= n || failed.load(std::memory_order_relaxed)) return;
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (unsigned t = 1; t < threads; ++t) {
    // A thread that cannot start (std::system_error on EAGAIN, std::bad_alloc)
    // must not escape here: the vector would destroy joinable threads, which is
    // std::terminate. Run on the threads that did start instead.
    try {
      pool.emplace_back(work);
    } catch (...) {
      break;
    }
  }
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace treecask
