// Per-rank state in chunks of 4 096 ranks, each built when one of its ranks
// is first written: a million-rank job's state is not built (and its pages
// not touched) in the one call that sizes it, but a chunk at a time as the
// ranks' reports are judged in slices (docs/detection.md, "Large rows").
// Plain data, one thread at a time (the engine's).
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <new>
#include <vector>

#include <sys/mman.h>

namespace straggler::engine::internal {

template <typename T>
class RankChunks {
 public:
  static constexpr size_t kShift = 12;
  static constexpr size_t kChunk = size_t{1} << kShift;

 private:
  struct Unmap;
  using Chunk = std::unique_ptr<T[], Unmap>;

 public:

  size_t size() const { return size_; }

  // Ranks past `n` are dropped; grown again, they start from T{} (as a
  // std::vector's would).
  void resize(size_t n) {
    if (n < size_ && (n & (kChunk - 1)) != 0 && chunks_[n >> kShift]) {
      T* c = chunks_[n >> kShift].get();
      for (size_t i = n & (kChunk - 1); i < kChunk; ++i) c[i] = T{};
    }
    chunks_.resize((n + kChunk - 1) >> kShift);
    size_ = n;
  }

  // Builds the rank's chunk on first use (out of line: the lookup itself
  // inlines into every verdict).
  T& operator[](size_t i) {
    Chunk& c = chunks_[i >> kShift];
    if (!c) [[unlikely]]
      Build(c);
    return c[i & (kChunk - 1)];
  }

  // A rank of a chunk never built is in T{}'s state: read from a shared one.
  const T& operator[](size_t i) const {
    const Chunk& c = chunks_[i >> kShift];
    return c ? c[i & (kChunk - 1)] : Default();
  }

  // The rank's state if its chunk was built, else nullptr (it is in T{}'s
  // state): for passes over every rank that would build them all.
  T* Find(size_t i) {
    T* c = chunks_[i >> kShift].get();
    return c != nullptr ? c + (i & (kChunk - 1)) : nullptr;
  }

  // f(T&) for every rank of every built chunk (the others are in T{}'s state).
  template <typename F>
  void ForEachBuilt(F&& f) {
    for (size_t k = 0; k < chunks_.size(); ++k) {
      if (!chunks_[k]) continue;
      const size_t end = std::min(kChunk, size_ - (k << kShift));
      for (size_t i = 0; i < end; ++i) f(chunks_[k][i]);
    }
  }

 private:
  // A chunk's pages come faulted in by the one mmap call that maps them
  // (MAP_POPULATE), not one page fault each as it is first written: a
  // million-rank job builds 232 MB of them in its first judged row, and a
  // fault per 4 KB page was most of that second's CPU (BENCHMARKS.md).
  static constexpr size_t kBytes = sizeof(T) * kChunk;
  struct Unmap {
    void operator()(T* p) const {
      std::destroy_n(p, kChunk);
      munmap(p, kBytes);
    }
  };
  [[gnu::noinline]] static void Build(Chunk& c) {
    void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    T* t = static_cast<T*>(p);
    std::uninitialized_value_construct_n(t, kChunk);
    c.reset(t);
  }
  static const T& Default() {
    static const T kDefault{};
    return kDefault;
  }

  std::vector<Chunk> chunks_;
  size_t size_ = 0;
};

}  // namespace straggler::engine::internal
