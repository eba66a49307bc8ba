// Where a job's state goes so that another daemon can take the job over
// (issue 30, docs/cluster.md "Job state in etcd"): the registry writes each
// new membership through it before publishing it, and a job made here
// starts from what it holds. stragglerd's cluster member implements it on
// etcd (server/cluster_member.h); without a cluster the registry has none.
//
// Thread safety: implementations are called from any thread, under a job's
// lock (SaveMembership, SaveAdmin) or jobs_mu_ (LoadMembership, LoadAdmin):
// they must not call back into the registry.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "persist/store.h"  // StoredOverride
#include "straggler/v1/straggler.pb.h"

namespace straggler::daemon {

// A job's operator settings: its admin policy and rank overrides, for the
// run they were made in (docs/cluster.md, "Job state in etcd").
struct SharedAdminState {
  std::string run_id;
  std::string policy_json;                // v1.PolicyConfig as JSON; "" = no admin policy
  std::vector<StoredOverride> overrides;  // ranks with an override other than none
};

class SharedJobState {
 public:
  virtual ~SharedJobState() = default;
  // Before `job` (job_id, run_id, world_size and its newest membership) is
  // published. Not OK: this daemon may no longer publish the job's
  // memberships (it lost the job, or cannot prove it still owns it); the
  // caller stops serving the job.
  virtual absl::Status SaveMembership(const v1::Job& job) = 0;
  // What the job's last owner saved (nullopt: nothing). An error (etcd
  // unreachable) is logged by the caller, which then starts the job afresh.
  virtual absl::StatusOr<std::optional<v1::Job>> LoadMembership(const std::string& job_id) = 0;
  // After an admin call changed the job (policy, override, reset), before
  // its membership is published. Not OK as SaveMembership.
  virtual absl::Status SaveAdmin(const std::string& job_id, const SharedAdminState& state) = 0;
  // What the job's last owner saved (nullopt: nothing).
  virtual absl::StatusOr<std::optional<SharedAdminState>> LoadAdmin(const std::string& job_id) = 0;
};

}  // namespace straggler::daemon
