// Must be refused by layout:mutex_guard (ctest layout:mutex_guard_must_fail):
// exactly two members, `plain_` (a std::mutex, invisible to clang's
// analysis) and `orphan_` (an absl::Mutex that guards nothing annotated).
// The other locks here are as they should be: `mu_` guards `count_`, and a
// local std::mutex is not a member. Never compiled.
#include <cstdint>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace fixture {

class Counter {
 public:
  void Add() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    ++count_;
  }
  void Touch() {
    std::mutex local;  // not a member: not refused
    std::lock_guard lock(local);
  }

 private:
  mutable absl::Mutex mu_;
  uint64_t count_ ABSL_GUARDED_BY(mu_) = 0;
  std::mutex plain_;
  struct Inner {
    absl::Mutex orphan_;
    uint64_t seen = 0;  // "guarded by orphan_" in a comment is not an annotation
  } inner_;
};

}  // namespace fixture
