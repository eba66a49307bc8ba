// Must NOT pass the thread-safety check (ctest layout:thread_safety_must_fail):
// a field guarded by an absl::Mutex, touched without the mutex, the way the
// project's annotated classes would be misused. If this ever compiles
// cleanly under the pass, the pass checks nothing (annotations compiled
// out, a flag lost) and the test says so.
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace {

class Counter {
 public:
  void Add() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    ++count_;
  }
  // The mistake: reads count_ without mu_.
  uint64_t Peek() const { return count_; }

 private:
  mutable absl::Mutex mu_;
  uint64_t count_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

uint64_t MustFailUnguarded() {
  Counter c;
  c.Add();
  return c.Peek();
}
