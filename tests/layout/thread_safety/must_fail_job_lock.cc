// Must NOT pass the thread-safety check (ctest layout:thread_safety_must_fail):
// the daemon's own Job::Locked (registry/job.h) taken twice in one scope,
// which would deadlock. The analysis sees it only through the annotations
// on Job::Locked, so this proves those annotations are live in the pass.
#include "registry/job.h"

void MustFailJobLockedTwice(straggler::daemon::Job& job) {
  straggler::daemon::Job::Locked first(job);
  straggler::daemon::Job::Locked second(job);  // the mistake: already held
  second->streams = first->streams;
}
