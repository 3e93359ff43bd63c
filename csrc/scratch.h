// Per-call scratch memory that keeps its pages between calls (ops.cpp, layers.cpp).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace clover {
namespace {  // (each file its own buffers: a TAG names one call site within a file)

// n uninitialized elements for one call: a fresh std::vector<float>(n) writes n zeros first (3 MB per
// 32-token MoE call of the twin, 1.6% of its time on one thread). Up to KEEP bytes they come from a
// per-thread buffer of the call site (TAG) that keeps its memory between calls; larger requests (long
// prefill chunks) are allocated for the call alone, so no large buffer outlives them.
template <class T, int TAG>
class Scratch {
  public:
    explicit Scratch(size_t n) {
        constexpr size_t KEEP = 8 << 20;
        thread_local std::vector<T> kept;
        if (n * sizeof(T) <= KEEP) {
            if (kept.size() < n) {  // (grown empty: nothing stale copied)
                kept.clear();
                kept.resize(n);
            }
            p_ = kept.data();
        } else {
            own_.reset(new T[n]);
            p_ = own_.get();
        }
    }
    T* get() const { return p_; }

  private:
    T* p_;
    std::unique_ptr<T[]> own_;
};

}  // namespace
}  // namespace clover
