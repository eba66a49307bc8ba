// straggler::PartialAllReduce — gradient averaging among the ACTIVE ranks of
// the job's current membership, switched at the same iteration on every rank.
// Backend-neutral: the CPU backend is Gloo (CreateGlooPartialAllReduce in
// straggler/collective_gloo.h, libstraggler_collective), the GPU backend NCCL
// (CreateNcclPartialAllReduce in straggler/collective_nccl.h,
// libstraggler_collective_nccl); each backend's header holds its options.
//
//   auto client = straggler::Client::Create(options);
//   auto reducer = straggler::CreateGlooPartialAllReduce(*client, gloo_options);
//   for (uint64_t it = 0; ...; ++it) {
//     straggler::StepPlan plan = reducer->BeginIteration(it);   // the switch rule
//     if (plan.sync_parameters) reducer->SyncParameters({{params.data(), bytes}});
//     { straggler::ComputeTimer t(*client, epoch, it); compute_gradients(); }
//     if (reducer->AllReduceAverage(std::span<float>(grads)).participated) optimizer_step();
//   }
//
// The agreement rule (docs/collective.md has the full argument):
//  * BeginIteration(i) asks Client::MembershipFor(i, membership_timeout). When it
//    answers in time the membership is certain and the rank proposes it;
//    when it times out (daemon unreachable, directive late) the rank does not
//    guess: it proposes the LAST MEMBERSHIP IT APPLIED (plan.certain = false).
//  * The ranks that took part at their previous iteration then agree in band:
//    one 40-byte all-reduce on the communicator they all hold. Only a
//    membership every one of them proposed is applied; otherwise all of them
//    keep the last applied one at this iteration (plan.deferred_version names
//    the one put off) and propose again at the next. So every participating
//    rank applies version v at effective_iteration(v) when all are certain of
//    it in time, and all at the same later iteration when one was not - a
//    daemon that dies (or restarts) while some ranks have a new version and
//    others do not delays a switch, it never splits the job. While the daemon
//    is down nobody learns a new version, and training goes on with the last.
//  * A readmitted rank has no communicator with the group: it says in the
//    rendezvous store where it waits, the group takes it in only at or after
//    that iteration (part of the agreement), and it takes part from the
//    iteration the group's lowest rank publishes for it, staying out until
//    then.
//  * An excluded rank issues no collective at all: AllReduceAverage returns its
//    buffer unchanged with participated = false. (At the iteration its
//    exclusion is applied it still takes part in that iteration's agreement:
//    it was a member of the previous set.)
//  * What is left to fail is bounded: a member that dies or stops stepping
//    turns its set's collectives into a CollectiveError within
//    collective_timeout naming the iteration and versions - never a hang and
//    never a silently mixed average (each active set has its own context).
//
// Thread safety: a PartialAllReduce is used by one thread (the training
// loop); calls from several threads at once must be serialised by the caller.
// Errors (a collective or rendezvous that timed out, bad arguments) are thrown
// as straggler::CollectiveError; the object stays usable for later iterations.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "straggler/client.h"

namespace gloo::rendezvous {
class Store;  // <gloo/rendezvous/store.h>; only straggler/gloo_store.h includes Gloo.
               // Both backends' options take a trainer's store of this type.
}

namespace straggler {

// The largest agreement_interval (CollectiveOptions). stragglerd
// bounds what a hello may claim by the job's progress + lead + this
// (engine::JobEngine::kMaxAgreementInterval, the same number).
inline constexpr uint32_t kMaxAgreementInterval = 1024;

class CollectiveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What the collective does on this rank at one iteration.
struct StepPlan {
  uint64_t iteration = 0;
  uint64_t version = 0;              // the membership version applied
  uint64_t effective_iteration = 0;  // of that version
  // true: MembershipFor answered in time (or, between switch slots of
  // agreement_interval > 1, nothing was asked). false: it timed out and the
  // rank proposed the last membership it applied (the agreement rule above).
  bool certain = true;
  // Nonzero: this rank knew a newer membership (this version) but did not
  // apply it here - a rank of its previous active set had not proposed it
  // (not yet certain of it, see the agreement rule above), or it readmits
  // this rank and the group has not taken it in yet. Tried again at the
  // next iteration.
  uint64_t deferred_version = 0;
  bool participating = true;         // this rank is active at `iteration`
  std::vector<uint32_t> active_ranks;  // ascending
  // The active set gained ranks since this rank's previous iteration (a
  // readmission, or the first iteration): every active rank must call
  // SyncParameters at this iteration, before its first AllReduceAverage.
  bool sync_parameters = false;
  uint32_t root = 0;                 // lowest active rank: the source of SyncParameters
  // Set when this rank is not participating and a version that readmits it
  // is known (Client::ReadmissionAfter): the iteration at which it rejoins.
  // A rank that fell behind while excluded should skip its remaining shadow
  // iterations and call BeginIteration(*rejoin_iteration) next: that plan is
  // certain at once and synchronises the group's parameters to it, so the
  // group does not wait at the rejoin for the rank to work through them.
  std::optional<uint64_t> rejoin_iteration;
};

struct AllReduceResult {
  bool participated = false;  // false: excluded, the buffer is untouched
  uint64_t version = 0;
  uint32_t active_ranks = 0;  // the divisor of the average
};

// A caller-owned byte range broadcast by SyncParameters (parameters,
// optimizer state, the step counter...). Same sizes on every rank.
struct ParameterBuffer {
  void* data = nullptr;
  size_t bytes = 0;
};

class PartialAllReduce {
 public:
  virtual ~PartialAllReduce() = default;

  // Applies the switch rule for `iteration` (strictly increasing across
  // calls) and prepares the collective for this rank's active set. Call once
  // per iteration before its first collective.
  virtual StepPlan BeginIteration(uint64_t iteration) = 0;

  // Sums `data` across the active ranks and divides by their number, in
  // place. Excluded: returns at once, `data` unchanged.
  virtual AllReduceResult AllReduceAverage(std::span<float> data) = 0;
  virtual AllReduceResult AllReduceAverage(std::span<double> data) = 0;

  // When the plan says sync_parameters: overwrites `buffers` on every active
  // rank with the root's (a broadcast from plan.root). Returns whether it
  // broadcast (false: nothing to do at this iteration, or excluded).
  virtual bool SyncParameters(const std::vector<ParameterBuffer>& buffers) = 0;

  // The plan of the current iteration (after BeginIteration).
  virtual const StepPlan& Plan() const = 0;
};

// What every backend's options share (GlooOptions, NcclOptions derive from
// it): where the rendezvous is, which rank of which launch this is, the
// bounds on waiting, and the switch cadence. Plain data; Validate() of the
// derived options checks these fields too.
struct CollectiveOptions {
  // The daemon serving RendezvousService (stragglerd's gRPC address; the
  // rendezvous goes to the daemon even when reports go through an agent), or
  // several replicas comma-separated: the store follows the job's owner
  // (DaemonStore, gloo_store.h; docs/cluster.md).
  std::string rendezvous_endpoint = "127.0.0.1:7070";
  std::string job_id;
  uint32_t rank = 0;
  uint32_t world_size = 0;
  // Bound on building a context (communicator) and on each collective: a
  // peer that does not take part within it turns into a CollectiveError,
  // not a hang.
  std::chrono::milliseconds collective_timeout{30000};
  // Bound on BeginIteration's wait for the membership (Client::MembershipFor).
  std::chrono::milliseconds membership_timeout{5000};
  // Iterations between membership switches: the in-band agreement (one
  // 40-byte all-reduce, see the agreement rule) runs, and the active set may
  // change, only at iterations that are multiples of it (and at a rank's
  // first). 1: every iteration, so a version applies at its effective
  // iteration. N > 1 divides the agreement's cost by N and puts each switch
  // off to the next multiple of N. Must be the same on every rank.
  uint32_t agreement_interval = 1;
  // Names this run of the job in the rendezvous keys. Versions are unique
  // within a job, except version 0 of a job id that is reused: set a fresh
  // run_id per launch (the same on every rank) when a job id is reused
  // within key_ttl, or stale keys of the earlier run may be read. Give it
  // the client's ClientOptions::run_id (straggler.PartialAllReduce does):
  // the daemon starts the new run fresh under that same id.
  std::string run_id;
  // Expiry of this rank's rendezvous keys on the daemon.
  std::chrono::milliseconds key_ttl{std::chrono::minutes(10)};
};


// The rendezvous endpoint that goes with a client configured by `client`:
// $STRAGGLER_RENDEZVOUS_ENDPOINT when set; else the client's own endpoint,
// unless that is a unix:// socket (the node agent, which serves no
// rendezvous); else "" - GlooOptions::Validate (collective_gloo.h) then says
// what to set rather than a default pointing at a daemon that is not there. Reads the
// environment: call it before starting threads that change it.
std::string RendezvousEndpointFor(const ClientOptions& client);

// ---------------------------------------------------------------------------
// Hybrid parallel jobs (docs/hybrid.md): one PartialAllReduce per
// data-parallel group, all following the one job membership.
//
//   auto job = straggler::CreateGlooPartialAllReduce(client, world_options);   // the whole job
//   auto sw = straggler::JobSwitch::Create(std::move(job), replica_of_rank, &error);
//   auto dp = straggler::CreateGlooGroupPartialAllReduce(client, sw, group, group_options);
//   ... per step: dp->BeginIteration(it) (runs the job's agreement once per
//   iteration for all groups of this process), then dp->SyncParameters /
//   dp->AllReduceAverage as with a flat reducer.
// ---------------------------------------------------------------------------

// One data-parallel group: the global ranks that hold the same slice of the
// model (one pipeline stage / model chunk, one tensor-parallel position), one
// per replica. Plain data.
struct DataParallelGroup {
  // Names the group in rendezvous keys and errors ("stage0", "chunk1.tp0"):
  // 1 to 64 bytes of A-Z a-z 0-9 . _ -, unique among the job's groups.
  std::string name;
  std::vector<uint32_t> ranks;     // global ranks, any order, distinct
  std::vector<uint32_t> replicas;  // replicas[k] is ranks[k]'s replica; distinct
  // Empty when `rank` may hold this group in a job of `world_size` ranks,
  // else what is wrong, naming the value.
  std::string Validate(uint32_t rank, uint32_t world_size) const;
};

// The job-wide half of a hybrid job's collective layer: the switch rule and
// in-band agreement run ONCE per iteration over the whole job (on `job`, a
// PartialAllReduce of every rank), and every data-parallel group of the
// process derives its active set from that one decision. So every group of
// the job applies a version at the same iteration, and a switch one rank is
// uncertain of is put off in every group (docs/hybrid.md has the argument).
//
// A group leaves out whole replicas: a group member is active when no rank
// of its replica is excluded at the applied version (with an engine that
// excludes whole replicas this is exactly "not excluded"; with one that
// excludes single ranks, e.g. an operator's override of one rank, it keeps
// the replica's other stages out of their groups too, which would otherwise
// average gradients computed on a stale slice of the model).
//
// Thread safety: used by the one training thread of the process, like the
// PartialAllReduce objects that share it.
class JobSwitch {
 public:
  // `job`: a PartialAllReduce over the whole job (this rank's world).
  // `replica_of`: the replica of every global rank (size world_size), or
  // empty: every rank its own replica (pure data parallelism). nullptr and
  // *error (naming the value) when `job` is null or the sizes disagree.
  static std::shared_ptr<JobSwitch> Create(std::unique_ptr<PartialAllReduce> job,
                                           std::vector<uint32_t> replica_of, uint32_t world_size,
                                           std::string* error = nullptr);

  // The job's plan of `iteration`: the first call for an iteration runs
  // job->BeginIteration(iteration) (the agreement); later calls for the same
  // iteration return the same plan, or rethrow its CollectiveError without
  // waiting again. Throws CollectiveError for an iteration below the last.
  const StepPlan& Begin(uint64_t iteration);

  // The replica of global rank `rank` (the rank itself without a map).
  uint32_t ReplicaOf(uint32_t rank) const;
  uint32_t world_size() const { return world_size_; }
  // The job-wide reducer (its collectives span every active rank).
  PartialAllReduce& job() { return *job_; }

 private:
  JobSwitch(std::unique_ptr<PartialAllReduce> job, std::vector<uint32_t> replica_of, uint32_t world_size);
  std::unique_ptr<PartialAllReduce> job_;
  std::vector<uint32_t> replica_of_;
  uint32_t world_size_;
  std::optional<uint64_t> last_;  // the last iteration Begin was called for
  std::string failure_;           // its CollectiveError, "" when it succeeded
};

}  // namespace straggler
