// Per-rank state in chunks of 4 096 ranks, each built when one of its ranks
// is first written: a million-rank job's state is not built (and its pages
// not touched) in the one call that sizes it, but a chunk at a time as the
// ranks' reports are judged in slices (docs/detection.md, "Large rows").
// Plain data, one thread at a time (the engine's).
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <vector>

namespace straggler::engine::internal {

template <typename T>
class RankChunks {
 public:
  static constexpr size_t kShift = 12;
  static constexpr size_t kChunk = size_t{1} << kShift;

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
    std::unique_ptr<T[]>& c = chunks_[i >> kShift];
    if (!c) [[unlikely]]
      Build(c);
    return c[i & (kChunk - 1)];
  }

  // A rank of a chunk never built is in T{}'s state: read from a shared one.
  const T& operator[](size_t i) const {
    const std::unique_ptr<T[]>& c = chunks_[i >> kShift];
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
  [[gnu::noinline]] static void Build(std::unique_ptr<T[]>& c) { c = std::make_unique<T[]>(kChunk); }
  static const T& Default() {
    static const T kDefault{};
    return kDefault;
  }

  std::vector<std::unique_ptr<T[]>> chunks_;
  size_t size_ = 0;
};

}  // namespace straggler::engine::internal
