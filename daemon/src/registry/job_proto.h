// A job of the registry as straggler.v1 messages: the job, its workers, its
// memberships and its journal's events (the value conversions they use:
// wire/convert.h). Apart from convert.h so that the registry can use those
// value conversions without a cycle (convert.h knows no Job).
//
//   v1::Membership m;
//   ToProto(job->engine.membership(), job, &m);   // job: a Job::Locked
//
// Pure functions; no shared state (those that read a job's guarded state
// take its Job::Locked).
#pragma once

#include "registry/job_registry.h"
#include "straggler/v1/straggler.pb.h"

namespace straggler::daemon {

namespace v1 = ::straggler::v1;

// `job` supplies the id and the daemon incarnation stamped on the version.
void ToProto(const engine::Membership& m, const Job& job, v1::Membership* out);
inline void ToProto(const engine::Membership& m, const Job::Locked& job, v1::Membership* out) {
  ToProto(m, job.job(), out);
}
void ToProto(const engine::WorkerView& w, const Job::Locked& job, v1::Worker* out);
void ToProto(const Job::Locked& job, v1::Job* out);
void ToProto(const JournalEntry& e, v1::Event* out);

}  // namespace straggler::daemon
