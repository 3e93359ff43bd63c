#include "threadpool.h"

#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <utility>

#if defined(__linux__)
#include <sched.h>
#endif
#if defined(__APPLE__)
#include <sys/sysctl.h>
#endif
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define CLOVER_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define CLOVER_PAUSE() __asm__ __volatile__("yield")
#else
#define CLOVER_PAUSE() ((void)0)
#endif

namespace clover {

namespace {
constexpr int SPIN_ROUNDS = 1 << 16;  // ~100 us of polling before a worker sleeps
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
    for (int i = 1; i < n_threads_; i++) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_.store(true);
        generation_.fetch_add(1);
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
}

void ThreadPool::work(int index) {
    const int64_t n = n_tasks_;
    for (int64_t task = next_.fetch_add(1); task < n; task = next_.fetch_add(1)) {
        (*fn_)(task, index);
        done_.fetch_add(1);
    }
}

void ThreadPool::worker(int index) {
    uint64_t seen = 0;
    for (;;) {
        int spins = 0;
        while (generation_.load(std::memory_order_acquire) == seen && spins < SPIN_ROUNDS) {
            CLOVER_PAUSE();
            spins++;
        }
        if (generation_.load(std::memory_order_acquire) == seen) {
            std::unique_lock<std::mutex> lock(mutex_);
            wake_.wait(lock, [&] { return generation_.load() != seen; });
        }
        seen = generation_.load();
        if (stop_.load()) return;
        active_.fetch_add(1);
        if (closed_.load() != seen) work(index);  // else the job finished without us: do not touch it
        active_.fetch_sub(1);
    }
}

void ThreadPool::run(int64_t n_tasks, const std::function<void(int64_t, int)>& fn) {
    if (n_tasks <= 0) return;
    std::lock_guard<std::mutex> job(run_mutex_);
    if (n_threads_ == 1 || n_tasks == 1) {
        for (int64_t t = 0; t < n_tasks; t++) fn(t, 0);
        return;
    }
    fn_ = &fn;
    n_tasks_ = n_tasks;
    next_.store(0);
    done_.store(0);
    uint64_t gen;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        gen = generation_.fetch_add(1) + 1;
    }
    wake_.notify_all();
    work(0);
    while (done_.load() != n_tasks) CLOVER_PAUSE();
    // close the job, then wait only for workers that registered before the close (they are running)
    closed_.store(gen);
    while (active_.load() != 0) CLOVER_PAUSE();
    fn_ = nullptr;
}

int default_num_threads() {
#if defined(__linux__)
    // Physical cores among the CPUs this process may run on (hyperthreads do not help GEMM).
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        std::set<std::pair<std::string, std::string>> cores;
        int n_cpus = 0;
        for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
            if (!CPU_ISSET(cpu, &set)) continue;
            n_cpus++;
            const std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
            std::ifstream pkg(base + "physical_package_id"), core(base + "core_id");
            std::string p, c;
            if (pkg >> p && core >> c) cores.insert({p, c});
        }
        if (!cores.empty()) return (int)cores.size();
        if (n_cpus > 0) return n_cpus;
    }
#elif defined(__APPLE__)
    int n = 0;
    size_t len = sizeof(n);
    if (sysctlbyname("hw.perflevel0.physicalcpu", &n, &len, nullptr, 0) == 0 && n > 0) return n;
    if (sysctlbyname("hw.physicalcpu", &n, &len, nullptr, 0) == 0 && n > 0) return n;
#endif
    const unsigned hc = std::thread::hardware_concurrency();
    return hc > 0 ? (int)hc : 1;
}

namespace {
std::mutex g_pool_mutex;
std::shared_ptr<ThreadPool> g_pool;
}  // namespace

std::shared_ptr<ThreadPool> pool() {
    std::lock_guard<std::mutex> lock(g_pool_mutex);
    if (!g_pool) g_pool = std::make_shared<ThreadPool>(default_num_threads());
    return g_pool;
}

void set_num_threads(int n) {
    std::lock_guard<std::mutex> lock(g_pool_mutex);
    const int want = n > 0 ? n : default_num_threads();
    if (g_pool && g_pool->size() == want) return;
    g_pool = std::make_shared<ThreadPool>(want);
}

}  // namespace clover
