// ClusterMember as the registry's SharedJobState for a job's operator
// settings (docs/cluster.md, "Job state in etcd"): the admin policy and the
// rank overrides under jobs/<job>/admin, written by a fenced put.
//
// The value is text, one record a line, so `etcdctl get` shows it:
//   run <run id>
//   policy <v1.PolicyConfig as one-line JSON>      (only with an admin policy)
//   override <rank> include|exclude <reason>       (one per overridden rank)
// Run ids are job-id characters and reasons have no control characters
// (common::ValidateReason), so neither holds a line break.
#include <charconv>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cluster/etcd_client.h"
#include "server/cluster_member.h"

namespace straggler::daemon {
namespace {

constexpr char kAdminName[] = "admin";

std::string Encode(const SharedAdminState& state) {
  std::string out = absl::StrCat("run ", state.run_id, "\n");
  if (!state.policy_json.empty()) absl::StrAppend(&out, "policy ", state.policy_json, "\n");
  for (const StoredOverride& o : state.overrides) {
    absl::StrAppend(&out, "override ", o.rank, " ",
                    o.override == engine::RankOverride::kForceInclude ? "include" : "exclude", " ",
                    o.reason, "\n");
  }
  return out;
}

absl::StatusOr<SharedAdminState> Decode(absl::string_view text, absl::string_view key) {
  auto bad = [&](absl::string_view line) {
    return absl::DataLossError(absl::StrCat("etcd ", key, ": cannot read the line '", line, "'"));
  };
  SharedAdminState state;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (absl::ConsumePrefix(&line, "run ")) {
      state.run_id = std::string(line);
    } else if (absl::ConsumePrefix(&line, "policy ")) {
      state.policy_json = std::string(line);
    } else if (absl::string_view rest = line; absl::ConsumePrefix(&rest, "override ")) {
      std::vector<absl::string_view> f = absl::StrSplit(rest, absl::MaxSplits(' ', 2));
      StoredOverride o;
      if (f.size() < 2 ||
          std::from_chars(f[0].data(), f[0].data() + f[0].size(), o.rank).ec != std::errc()) {
        return bad(line);
      }
      if (f[1] == "include") {
        o.override = engine::RankOverride::kForceInclude;
      } else if (f[1] == "exclude") {
        o.override = engine::RankOverride::kForceExclude;
      } else {
        return bad(line);
      }
      if (f.size() == 3) o.reason = std::string(f[2]);
      state.overrides.push_back(std::move(o));
    } else {
      return bad(line);
    }
  }
  return state;
}

}  // namespace

absl::Status ClusterMember::SaveAdmin(const std::string& job_id, const SharedAdminState& state) {
  auto claim = ClaimFor(job_id);
  if (!claim.ok()) return claim.status();
  auto& [replica, job_claim] = *claim;
  return replica->FencedPut(job_claim, kAdminName, Encode(state)).status();
}

absl::StatusOr<std::optional<SharedAdminState>> ClusterMember::LoadAdmin(
    const std::string& job_id) {
  std::shared_ptr<cluster::Replica> replica = CurrentReplica();
  if (!replica) return absl::UnavailableError("not joined to the cluster");
  const std::string key = replica->JobKey(job_id, kAdminName);
  absl::StatusOr<cluster::RangeResult> r = etcd_->Get(key);
  if (!r.ok()) return r.status();
  if (r->kvs.empty()) return std::optional<SharedAdminState>();
  absl::StatusOr<SharedAdminState> state = Decode(r->kvs[0].value, key);
  if (!state.ok()) return state.status();
  return std::optional<SharedAdminState>(*std::move(state));
}

}  // namespace straggler::daemon
