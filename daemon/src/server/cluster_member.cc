#include "server/cluster_member.h"

#include <unistd.h>

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "cluster/cluster_view.h"
#include "cluster/etcd_client.h"
#include "spdlog/spdlog.h"
#include "straggler/common/validate.h"

namespace straggler::daemon {
namespace {

using cluster::ClusterView;
using cluster::EtcdClient;
using cluster::JobClaim;
using cluster::Replica;

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

// "host:port" split at its last colon; unix: addresses have no host part.
std::pair<std::string, std::string> SplitHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return {address, ""};
  return {address.substr(0, colon), address.substr(colon + 1)};
}

// What other replicas and clients dial: `configured` when set, else the
// listen address with a wildcard host replaced by this host's name.
std::string Advertised(const std::string& configured, const std::string& listening) {
  if (!configured.empty()) return configured;
  if (listening.rfind("unix:", 0) == 0) return listening;
  auto [host, port] = SplitHostPort(listening);
  if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::") host = HostName();
  return absl::StrCat(host, ":", port);
}

// jobs/<job>/<name> of a job's membership (SharedJobState).
constexpr char kMembershipName[] = "membership";
// jobs/<job>/<dir>/<key> of a job's rendezvous keys.
constexpr char kRendezvousDir[] = "rendezvous";

// A failed etcd call, or the replica past its deadline: the client should
// try again (here later, or another replica), so UNAVAILABLE whatever gRPC
// code etcd's call ended with; a bad job id stays INVALID_ARGUMENT.
absl::Status AsUnavailable(const absl::Status& s) {
  if (s.ok() || s.code() == absl::StatusCode::kInvalidArgument ||
      s.code() == absl::StatusCode::kUnavailable) {
    return s;
  }
  return absl::UnavailableError(s.message());
}

}  // namespace

absl::StatusOr<std::unique_ptr<ClusterMember>> ClusterMember::Create(const ClusterConfig& config) {
  // The config's own problems are configuration errors (exit 2), as a bad key.
  auto config_error = [](const absl::Status& s) {
    return absl::FailedPreconditionError(absl::StrCat("cluster: ", s.message()));
  };
  if (absl::Status s = cluster::CheckKeyPrefix(config.key_prefix); !s.ok()) {
    return config_error(s);
  }
  if (!config.replica_id.empty()) {
    if (absl::Status s = common::ValidateJobId("cluster.replica_id", config.replica_id); !s.ok()) {
      return config_error(s);
    }
  }
  absl::StatusOr<std::unique_ptr<EtcdClient>> etcd =
      EtcdClient::Connect({.endpoints = config.etcd_endpoints});
  if (!etcd.ok()) return config_error(etcd.status());
  return std::unique_ptr<ClusterMember>(
      new ClusterMember(std::shared_ptr<EtcdClient>(*std::move(etcd)), config, config.replica_id));
}

ClusterMember::ClusterMember(std::shared_ptr<EtcdClient> etcd, ClusterConfig config,
                             std::string id)
    : etcd_(std::move(etcd)), config_(std::move(config)), id_(std::move(id)) {}

// The view first: its watch thread must stop before the replica (and the
// client both share) go.
ClusterMember::~ClusterMember() {
  {
    absl::MutexLock lock(&orphans_mu_);
    stop_adopting_ = true;
  }
  if (adopter_.joinable()) adopter_.join();
  absl::MutexLock lock(&mu_);
  view_.reset();
  replica_.reset();
}

absl::Status ClusterMember::Join(const std::string& grpc_address,
                                 const std::string& http_address) {
  absl::MutexLock lock(&mu_);
  grpc_address_ = Advertised(config_.advertise_grpc_address, grpc_address);
  http_address_ = Advertised(config_.advertise_http_address, http_address);
  if (id_.empty()) {
    // Stable across restarts on one host (a StatefulSet pod keeps its name),
    // distinct for replicas sharing a host on different ports.
    id_ = absl::StrCat(HostName(), "-", SplitHostPort(grpc_address).second);
    if (absl::Status s = common::ValidateJobId("replica id", id_); !s.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cluster: the default replica id (<hostname>-<port>) is not valid: ", s.message(),
          "; set cluster.replica_id"));
    }
  }
  return JoinLocked();
}

absl::Status ClusterMember::JoinLocked() {
  const Replica::Options options{.prefix = config_.key_prefix,
                                 .id = id_,
                                 .grpc_address = grpc_address_,
                                 .http_address = http_address_,
                                 .ttl_seconds = config_.lease_ttl_seconds};
  // A previous run of this id (a restart on the same host) holds the
  // registration until its lease expires: wait that out, at most two TTLs
  // (etcd may have raised the TTL it granted).
  const auto give_up = std::chrono::steady_clock::now() +
                       std::chrono::seconds(2 * config_.lease_ttl_seconds + 2);
  absl::StatusOr<std::unique_ptr<Replica>> joined;
  while (true) {
    joined = Replica::Join(etcd_, options);
    if (joined.ok() || joined.status().code() != absl::StatusCode::kAlreadyExists ||
        std::chrono::steady_clock::now() > give_up) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  if (!joined.ok()) {
    const absl::Status& s = joined.status();
    return s.code() == absl::StatusCode::kInvalidArgument
               ? absl::FailedPreconditionError(absl::StrCat("cluster: ", s.message()))
               : absl::UnavailableError(absl::StrCat("cluster: cannot join: ", s.message()));
  }
  absl::StatusOr<std::unique_ptr<ClusterView>> view = StartView();
  if (!view.ok()) {
    (void)(*joined)->Leave();
    return absl::UnavailableError(
        absl::StrCat("cluster: cannot watch ", config_.key_prefix, ": ", view.status().message()));
  }
  replica_ = std::shared_ptr<Replica>(*std::move(joined));
  view_ = std::shared_ptr<ClusterView>(*std::move(view));
  if (!adopter_.joinable()) adopter_ = std::thread([this] { AdoptLoop(); });
  spdlog::info("joined the cluster on etcd {} as replica '{}' (grpc={} http={}, lease {} with a "
               "TTL of {} s granted)",
               etcd_->endpoint(), id_, grpc_address_, http_address_, replica_->lease_id(),
               replica_->ttl_seconds());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ClusterView>> ClusterMember::StartView() {
  return ClusterView::Start(etcd_, config_.key_prefix,
                            [this](std::vector<std::string> jobs) { NoteOrphans(std::move(jobs)); });
}

void ClusterMember::NoteOrphans(std::vector<std::string> jobs) {
  absl::MutexLock lock(&orphans_mu_);
  orphans_.insert(orphans_.end(), std::make_move_iterator(jobs.begin()),
                  std::make_move_iterator(jobs.end()));
}

void ClusterMember::AdoptLoop() {
  for (;;) {
    std::vector<std::string> jobs;
    {
      absl::MutexLock lock(&orphans_mu_);
      orphans_mu_.Await(absl::Condition(
          +[](ClusterMember* m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(m->orphans_mu_) {
            return m->stop_adopting_ || !m->orphans_.empty();
          },
          this));
      if (stop_adopting_) return;
      jobs.swap(orphans_);
    }
    for (const std::string& job : jobs) {
      // Every replica tries; etcd's create-if-absent gives the job to one,
      // the others get a redirect (or a refusal while they may not decide).
      const absl::Status s = Serve(job, /*take=*/true);
      if (s.ok()) {
        adopted_.fetch_add(1, std::memory_order_relaxed);
        spdlog::info("job={} taken over by this replica ('{}'): its owner's lease is gone", job,
                     id_);
      } else {
        spdlog::debug("job={} not taken over here: {}", job, std::string(s.message()));
      }
    }
  }
}

absl::Status ClusterMember::Redirect(absl::string_view job_id, const std::string& owner_id) const {
  std::shared_ptr<ClusterView> view;
  {
    absl::MutexLock lock(&mu_);
    view = view_;
  }
  std::optional<cluster::ReplicaInfo> owner =
      view ? view->ReplicaById(owner_id) : std::optional<cluster::ReplicaInfo>();
  absl::Status s = absl::UnavailableError(absl::StrCat(
      "job '", job_id, "' is owned by stragglerd replica '", owner_id, "'",
      owner ? absl::StrCat(" at ", owner->grpc_address, " (trailing metadata ",
                           kOwnerGrpcMetadata, ")")
            : std::string(" (its address not known here yet; retry)")));
  if (!owner) return s;
  return WithOwner(std::move(s), {owner_id, owner->grpc_address, owner->http_address});
}

absl::Status ClusterMember::Serve(absl::string_view job_id, bool take) {
  std::shared_ptr<Replica> replica;
  std::shared_ptr<ClusterView> view;
  {
    absl::MutexLock lock(&mu_);
    if (leaving_) {
      return absl::UnavailableError(
          absl::StrCat("stragglerd replica '", id_, "' is leaving the cluster"));
    }
    if (!replica_) {
      return absl::UnavailableError("this stragglerd replica has not joined the cluster yet");
    }
    replica = replica_;
    view = view_;
    if (claims_.find(job_id) != claims_.end()) {
      return replica->CheckMayDecide(absl::StrCat("serve job '", job_id, "'"));
    }
  }
  // Another owner in the view: redirect without a round trip to etcd. The
  // view may lag; a stale answer sends the client to a replica that
  // redirects it again or refuses until the key is gone.
  if (std::optional<std::string> owner = view->OwnerOf(job_id); owner && *owner != id_) {
    return Redirect(job_id, *owner);
  }
  absl::StatusOr<JobClaim> claim = take ? replica->TakeJob(job_id) : replica->Owner(job_id);
  if (!claim.ok()) return AsUnavailable(claim.status());
  if (claim->owned) {
    // The job's rendezvous keys in before any call about it is served: a
    // call that finds the claim finds the keys. Racing first calls may both
    // load them; Restore keeps what is already here.
    if (on_take_) {
      bool first;
      {
        absl::MutexLock lock(&mu_);
        first = claims_.find(job_id) == claims_.end();
      }
      if (first) on_take_(std::string(job_id));
    }
    {
      absl::MutexLock lock(&mu_);
      if (leaving_ || replica_ != replica) {
        return absl::UnavailableError(absl::StrCat("stragglerd replica '", id_,
                                                   "' lost its lease while taking job '", job_id,
                                                   "'"));
      }
      if (claims_.emplace(std::string(job_id), *claim).second) {
        ++jobs_taken_;
        spdlog::info("job={} owned by this replica ('{}', ownership key created at revision {})",
                     std::string(job_id), id_, claim->create_revision);
      }
    }
    return replica->CheckMayDecide(absl::StrCat("serve job '", job_id, "'"));
  }
  if (claim->owner.empty()) return absl::OkStatus();  // nobody owns it, and not taken
  return Redirect(job_id, claim->owner);
}

bool ClusterMember::MayDecide() const {
  absl::MutexLock lock(&mu_);
  return !leaving_ && replica_ && replica_->MayDecide();
}

std::vector<std::pair<std::string, absl::Status>> ClusterMember::TakeLostJobs() {
  std::vector<std::pair<std::string, absl::Status>> lost;
  std::vector<std::pair<std::string, std::string>> taken;  // job, new owner
  {
    absl::MutexLock lock(&mu_);
    if (leaving_ || !replica_) return lost;
    if (replica_->LeaseLost()) {
      // etcd deleted the lease with every key on it: all jobs are free and
      // may already be another's. Serve again only under a new lease.
      spdlog::error("replica '{}': etcd says its lease {} is gone; dropping its {} jobs and "
                    "joining again",
                    id_, replica_->lease_id(), claims_.size());
      for (auto& [job, claim] : claims_) {
        lost.emplace_back(job, absl::UnavailableError(absl::StrCat(
                                   "stragglerd replica '", id_, "' lost its etcd lease; job '",
                                   job, "' is free for another replica")));
      }
      jobs_lost_ += claims_.size();
      claims_.clear();
      view_.reset();
      replica_.reset();
      if (absl::Status s = JoinLocked(); !s.ok()) {
        spdlog::error("replica '{}': {} (next try at the next tick)", id_,
                      std::string(s.message()));
      }
      return lost;
    }
    if (!view_->Status().ok()) {
      // etcd cancelled the watch (its revision compacted away): read afresh.
      spdlog::warn("replica '{}': cluster watch ended ({}); reading the cluster again", id_,
                   std::string(view_->Status().message()));
      absl::StatusOr<std::unique_ptr<ClusterView>> view = StartView();
      if (!view.ok()) return lost;
      view_ = std::shared_ptr<ClusterView>(*std::move(view));
    }
    const int64_t seen = view_->Revision();
    for (auto it = claims_.begin(); it != claims_.end();) {
      // The view has not caught up with the take yet: nothing to judge.
      if (seen < it->second.create_revision) {
        ++it;
        continue;
      }
      std::optional<std::string> owner = view_->OwnerOf(it->first);
      if (owner == id_) {
        ++it;
        continue;
      }
      taken.emplace_back(it->first, owner.value_or(""));
      ++jobs_lost_;
      it = claims_.erase(it);
    }
  }
  for (auto& [job, owner] : taken) {
    spdlog::warn("job={} no longer owned by this replica ('{}'): {}", job, id_,
                 owner.empty() ? std::string("its ownership key is gone")
                               : absl::StrCat("replica '", owner, "' owns it"));
    lost.emplace_back(job, owner.empty()
                               ? absl::UnavailableError(absl::StrCat(
                                     "job '", job, "' is no longer owned by stragglerd replica '",
                                     id_, "'"))
                               : Redirect(job, owner));
  }
  return lost;
}

void ClusterMember::Leave() {
  std::shared_ptr<Replica> replica;
  {
    absl::MutexLock lock(&mu_);
    if (leaving_) return;
    leaving_ = true;
    claims_.clear();
    replica = replica_;
  }
  if (!replica) return;
  if (absl::Status s = replica->Leave(); !s.ok()) {
    spdlog::warn("replica '{}' could not revoke its lease ({}): its jobs are free once it expires",
                 id_, std::string(s.message()));
  } else {
    spdlog::info("replica '{}' left the cluster: its jobs are free", id_);
  }
}

absl::Status ClusterMember::CheckMayDecide(absl::string_view job_id) const {
  std::shared_ptr<Replica> replica;
  {
    absl::MutexLock lock(&mu_);
    if (leaving_ || !replica_) {
      return absl::UnavailableError(absl::StrCat("stragglerd replica '", id_,
                                                 "' does not serve job '", job_id, "' now"));
    }
    replica = replica_;
  }
  // Every ingest batch asks: the refusal's message only when refusing.
  if (replica->MayDecide()) return absl::OkStatus();
  return replica->CheckMayDecide(absl::StrCat("serve job '", job_id, "'"));
}

absl::StatusOr<std::pair<std::shared_ptr<Replica>, JobClaim>> ClusterMember::ClaimFor(
    const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  if (leaving_ || !replica_) {
    return absl::UnavailableError(
        absl::StrCat("stragglerd replica '", id_, "' does not serve job '", job_id, "' now"));
  }
  auto it = claims_.find(job_id);
  if (it == claims_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", job_id, "' is not owned by stragglerd replica '", id_, "'"));
  }
  return std::make_pair(replica_, it->second);
}

absl::Status ClusterMember::SaveMembership(const v1::Job& state) {
  auto claim = ClaimFor(state.job_id());
  if (!claim.ok()) return claim.status();
  auto& [replica, job_claim] = *claim;
  return replica->FencedPut(job_claim, kMembershipName, state.SerializeAsString()).status();
}

absl::Status ClusterMember::SaveRendezvousKey(const std::string& job_id, const std::string& key,
                                              const std::string& value,
                                              std::chrono::milliseconds ttl) {
  auto claim = ClaimFor(job_id);
  if (!claim.ok()) return AsUnavailable(claim.status());
  auto& [replica, job_claim] = *claim;
  // Whole seconds, rounded up: etcd's key outlives the store's copy, never
  // the reverse (etcd raises a TTL below its minimum anyway).
  const int64_t seconds = std::max<int64_t>(1, (ttl.count() + 999) / 1000);
  const auto now = std::chrono::steady_clock::now();
  int64_t lease = 0;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = rendezvous_leases_.begin(); it != rendezvous_leases_.end();) {
      it = now - it->second.granted > std::chrono::seconds(1) ? rendezvous_leases_.erase(it)
                                                              : std::next(it);
    }
    if (auto it = rendezvous_leases_.find({job_id, seconds}); it != rendezvous_leases_.end()) {
      lease = it->second.id;
    }
  }
  if (lease == 0) {
    // Two racing Sets may both grant: one lease is then unused, and etcd
    // drops it after its TTL.
    absl::StatusOr<cluster::Lease> granted = etcd_->GrantLease(seconds + 1);
    if (!granted.ok()) return AsUnavailable(granted.status());
    lease = granted->id;
    absl::MutexLock lock(&mu_);
    rendezvous_leases_[{job_id, seconds}] = {lease, now};
  }
  return AsUnavailable(
      replica->FencedPutEntry(job_claim, kRendezvousDir, key, value, lease).status());
}

absl::StatusOr<std::vector<ClusterMember::RendezvousEntry>> ClusterMember::LoadRendezvousKeys(
    const std::string& job_id) {
  std::shared_ptr<Replica> replica = CurrentReplica();
  if (!replica) return absl::UnavailableError("not joined to the cluster");
  const std::string prefix = absl::StrCat(replica->JobKey(job_id, kRendezvousDir), "/");
  absl::StatusOr<cluster::RangeResult> r = etcd_->GetPrefix(prefix);
  if (!r.ok()) return r.status();
  // What is left of each lease (keys set within a second share one).
  std::map<int64_t, int64_t> left;
  std::vector<RendezvousEntry> out;
  for (cluster::KeyValue& kv : r->kvs) {
    auto it = left.find(kv.lease);
    if (it == left.end()) {
      absl::StatusOr<cluster::LeaseStatus> ttl = etcd_->TimeToLive(kv.lease);
      if (!ttl.ok()) return ttl.status();
      it = left.emplace(kv.lease, ttl->ttl_seconds).first;
    }
    if (it->second <= 0) continue;  // expired since the read
    out.push_back({kv.key.substr(prefix.size()), std::move(kv.value),
                   std::chrono::seconds(it->second)});
  }
  return out;
}

void ClusterMember::SetOnTake(std::function<void(const std::string&)> on_take) {
  on_take_ = std::move(on_take);
}

std::shared_ptr<Replica> ClusterMember::CurrentReplica() const {
  absl::MutexLock lock(&mu_);
  return replica_;
}

absl::StatusOr<std::optional<v1::Job>> ClusterMember::LoadMembership(const std::string& job_id) {
  std::shared_ptr<Replica> replica = CurrentReplica();
  if (!replica) return absl::UnavailableError("not joined to the cluster");
  const std::string key = replica->JobKey(job_id, kMembershipName);
  absl::StatusOr<cluster::RangeResult> r = etcd_->Get(key);
  if (!r.ok()) return r.status();
  if (r->kvs.empty()) return std::optional<v1::Job>();
  v1::Job state;
  if (!state.ParseFromString(r->kvs[0].value) || state.job_id() != job_id) {
    return absl::DataLossError(absl::StrCat("etcd ", etcd_->endpoint(), " ", key,
                                            " does not hold a straggler.v1.Job of job '", job_id,
                                            "'"));
  }
  return std::optional<v1::Job>(std::move(state));
}

int64_t ClusterMember::ttl_seconds() const {
  absl::MutexLock lock(&mu_);
  return replica_ ? replica_->ttl_seconds() : 0;
}

std::vector<std::string> ClusterMember::OwnedJobs() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [job, claim] : claims_) out.push_back(job);
  return out;
}

std::optional<OwnerAddress> ClusterMember::OwnerElsewhere(absl::string_view job_id) const {
  std::shared_ptr<ClusterView> view;
  {
    absl::MutexLock lock(&mu_);
    if (claims_.find(job_id) != claims_.end()) return std::nullopt;
    view = view_;
  }
  if (!view) return std::nullopt;
  std::optional<std::string> owner = view->OwnerOf(job_id);
  if (!owner || *owner == id_) return std::nullopt;
  std::optional<cluster::ReplicaInfo> r = view->ReplicaById(*owner);
  if (!r) return std::nullopt;
  return OwnerAddress{*owner, r->grpc_address, r->http_address};
}

std::vector<OwnerAddress> ClusterMember::OtherReplicas() const {
  std::shared_ptr<ClusterView> view;
  {
    absl::MutexLock lock(&mu_);
    view = view_;
  }
  std::vector<OwnerAddress> out;
  if (!view) return out;
  for (const cluster::ReplicaInfo& r : view->Replicas()) {
    if (r.id != id_) out.push_back({r.id, r.grpc_address, r.http_address});
  }
  return out;
}

OwnerAddress ClusterMember::Self() const {
  absl::MutexLock lock(&mu_);
  return {replica_ ? id_ : std::string(), grpc_address_, http_address_};
}

ClusterMetrics ClusterMember::Metrics() const {
  ClusterMetrics m;
  m.etcd = &etcd_->stats();
  absl::MutexLock lock(&mu_);
  m.replica_id = id_;
  m.replicas = view_ ? view_->Replicas().size() : 0;
  m.jobs_owned = claims_.size();
  m.jobs_taken = jobs_taken_;
  m.jobs_lost = jobs_lost_;
  m.may_decide = !leaving_ && replica_ && replica_->MayDecide();
  return m;
}

}  // namespace straggler::daemon
