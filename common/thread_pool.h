// ThreadPool: a fixed set of worker threads that runs ParallelFor loops.
//
// Thread-safety: ParallelFor may be called from one thread at a time per pool
// (calls are serialised by an internal mutex; nested calls from inside a task
// run inline on the calling thread). The work split is a pure function of
// (n, grain, thread count) and never of timing, and every index is computed
// by exactly one task, so results that write disjoint outputs are
// deterministic whatever the scheduling.
#ifndef STRATA_COMMON_THREAD_POOL_H_
#define STRATA_COMMON_THREAD_POOL_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace strata {

// The most threads a pool is asked for through a flag or an RPC (engine
// threads of a worker); larger requests are refused where they come in.
inline constexpr int kMaxThreads = 4096;

class ThreadPool {
 public:
  // num_threads == 0 means one per hardware thread. The calling thread also
  // works, so a pool of N runs N - 1 background threads.
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end) over [0, n) in chunks of at least `grain` indices.
  // Returns when every chunk has finished.
  void ParallelFor(int64_t n, int64_t grain,
                   const std::function<void(int64_t, int64_t)>& fn);

  // The process-wide default pool (sized from the machine).
  static ThreadPool& Default();

 private:
  void WorkerLoop(int index);

  const int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex call_mu_;  // serialises ParallelFor calls

  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  // Guarded by mu_.
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 0;
  int64_t num_chunks_ = 0;
  int64_t next_chunk_ = 0;
  int64_t pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace strata

#endif  // STRATA_COMMON_THREAD_POOL_H_
