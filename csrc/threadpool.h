// A persistent thread pool: workers spin briefly between jobs, then sleep. The calling thread
// takes part in every job, so a pool of n threads starts n - 1 workers.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace clover {

class ThreadPool {
public:
    explicit ThreadPool(int n_threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return n_threads_; }

    // Calls fn(task, thread_index) once for every task in [0, n_tasks), tasks handed out
    // dynamically; returns when all have finished. Calls from several host threads are serialised.
    void run(int64_t n_tasks, const std::function<void(int64_t, int)>& fn);

private:
    void worker(int index);
    void work(int index);

    int n_threads_;
    std::vector<std::thread> workers_;
    std::mutex run_mutex_;  // one job at a time

    std::mutex mutex_;
    std::condition_variable wake_;
    std::atomic<uint64_t> generation_{0};
    std::atomic<bool> stop_{false};

    // The current job. A worker registers in active_ before touching it and leaves it alone if the job
    // is already closed, so run() returns as soon as its tasks are done: it never waits for a worker
    // that was asleep (on a shared core that costs a scheduler tick, 4 ms, per call).
    const std::function<void(int64_t, int)>* fn_ = nullptr;
    int64_t n_tasks_ = 0;
    std::atomic<int64_t> next_{0};
    std::atomic<int64_t> done_{0};
    std::atomic<uint64_t> closed_{0};  // the generation of the last finished job
    std::atomic<int> active_{0};
};

// The process-wide pool used by the kernels (shared so a resize never frees a pool in use).
std::shared_ptr<ThreadPool> pool();
void set_num_threads(int n);  // n <= 0: the default (physical cores available to the process)
int default_num_threads();

}  // namespace clover
