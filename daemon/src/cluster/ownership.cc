#include "cluster/ownership.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "straggler/common/validate.h"

namespace straggler::cluster {
namespace {

std::string RegistrationValue(const Replica::Options& o) {
  return absl::StrCat("grpc=", o.grpc_address, " http=", o.http_address);
}

absl::Status CheckOptions(const Replica::Options& o) {
  if (absl::Status s = CheckKeyPrefix(o.prefix); !s.ok()) return s;
  if (absl::Status s = common::ValidateJobId("replica id", o.id); !s.ok()) return s;
  for (const std::string* address : {&o.grpc_address, &o.http_address}) {
    if (address->find(' ') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("replica '", o.id, "' address '", *address, "' has a space"));
    }
  }
  if (o.ttl_seconds <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("replica '", o.id, "' lease TTL ", o.ttl_seconds, " s must be > 0"));
  }
  if (o.safety_margin.count() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "replica '", o.id, "' safety margin ", o.safety_margin.count(), " ms must be >= 0"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckKeyPrefix(absl::string_view prefix) {
  if (prefix.empty() || prefix.back() != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster key prefix '", prefix, "' must end with '/'"));
  }
  return absl::OkStatus();
}

ReplicaInfo ParseRegistration(absl::string_view id, const KeyValue& kv) {
  ReplicaInfo info{std::string(id), {}, {}, kv.lease};
  for (absl::string_view field : absl::StrSplit(kv.value, ' ', absl::SkipEmpty())) {
    if (absl::ConsumePrefix(&field, "grpc=")) info.grpc_address = std::string(field);
    if (absl::ConsumePrefix(&field, "http=")) info.http_address = std::string(field);
  }
  return info;
}

absl::StatusOr<std::unique_ptr<Replica>> Replica::Join(std::shared_ptr<EtcdClient> etcd,
                                                       Options options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  absl::StatusOr<Lease> lease = etcd->GrantLease(options.ttl_seconds);
  if (!lease.ok()) return lease.status();
  // A margin that eats the whole TTL would never let the replica decide.
  if (options.safety_margin >= std::chrono::seconds(lease->ttl_seconds)) {
    (void)etcd->RevokeLease(lease->id);
    return absl::InvalidArgumentError(absl::StrCat(
        "replica '", options.id, "' safety margin ", options.safety_margin.count(),
        " ms must be below the granted lease TTL ", lease->ttl_seconds, " s"));
  }
  std::unique_ptr<Replica> replica(new Replica(std::move(etcd), std::move(options), *lease));
  if (absl::Status s = replica->Register(); !s.ok()) {
    (void)replica->Leave();
    return s;
  }
  return replica;
}

Replica::Replica(std::shared_ptr<EtcdClient> etcd, Options options, Lease lease)
    : etcd_(std::move(etcd)),
      options_(std::move(options)),
      lease_(lease),
      keeper_(etcd_->KeepAlive(lease_)) {}

Replica::~Replica() = default;

absl::Status Replica::Register() {
  const std::string key = ReplicasPrefix() + options_.id;
  absl::StatusOr<TxnResult> r =
      etcd_->Txn({Compare::Absent(key)},
                 {TxnOp::Put(key, RegistrationValue(options_), lease_.id)}, {TxnOp::Get(key)});
  if (!r.ok()) return r.status();
  if (r->succeeded) return absl::OkStatus();
  // The failure branch's Get runs in the same transaction: the key is there.
  const std::vector<KeyValue>& held = r->results.at(0);
  return absl::AlreadyExistsError(absl::StrCat(
      "replica id '", options_.id, "' is already registered in etcd ", etcd_->endpoint(), " ('",
      held.empty() ? "" : held[0].value, "' on lease ", held.empty() ? 0 : held[0].lease,
      "): another replica has this id, or its previous run's lease has not expired yet"));
}

absl::Status Replica::Leave() { return etcd_->RevokeLease(lease_.id); }

Clock::time_point Replica::DecideUntil() const {
  return keeper_->Deadline() - options_.safety_margin;
}

bool Replica::LeaseLost() const { return keeper_->Lost(); }

bool Replica::MayDecide() const { return !keeper_->Lost() && Clock::now() < DecideUntil(); }

absl::Status Replica::CheckMayDecide(absl::string_view what) const {
  if (keeper_->Lost()) {
    return absl::UnavailableError(absl::StrCat("replica '", options_.id, "' cannot ", what,
                                               ": etcd says its lease ", lease_.id, " is gone"));
  }
  auto late = Clock::now() - DecideUntil();
  if (late >= Clock::duration::zero()) {
    absl::Status last = keeper_->LastError();
    return absl::UnavailableError(absl::StrCat(
        "replica '", options_.id, "' cannot ", what, ": its lease ", lease_.id,
        " was not renewed in time (local deadline passed ",
        std::chrono::duration_cast<std::chrono::milliseconds>(late).count(), " ms ago",
        last.ok() ? std::string(")") : absl::StrCat("; last error: ", last.message(), ")")));
  }
  return absl::OkStatus();
}

std::string Replica::OwnerKey(absl::string_view job_id) const {
  return absl::StrCat(OwnersPrefix(), job_id);
}

std::string Replica::JobKey(absl::string_view job_id, absl::string_view name) const {
  return absl::StrCat(options_.prefix, "jobs/", job_id, "/", name);
}

absl::StatusOr<std::vector<ReplicaInfo>> Replica::Replicas() const {
  const std::string prefix = ReplicasPrefix();
  absl::StatusOr<RangeResult> r = etcd_->GetPrefix(prefix);
  if (!r.ok()) return r.status();
  std::vector<ReplicaInfo> out;
  for (const KeyValue& kv : r->kvs) {
    out.push_back(ParseRegistration(absl::string_view(kv.key).substr(prefix.size()), kv));
  }
  std::sort(out.begin(), out.end(),
            [](const ReplicaInfo& a, const ReplicaInfo& b) { return a.id < b.id; });
  return out;
}

absl::StatusOr<JobClaim> Replica::TakeJob(absl::string_view job_id) {
  if (absl::Status s = common::ValidateJobId("job id", job_id); !s.ok()) return s;
  if (absl::Status s = CheckMayDecide(absl::StrCat("take job '", job_id, "'")); !s.ok()) return s;
  const std::string key = OwnerKey(job_id);
  absl::StatusOr<TxnResult> r = etcd_->Txn(
      {Compare::Absent(key)}, {TxnOp::Put(key, options_.id, lease_.id)}, {TxnOp::Get(key)});
  if (!r.ok()) return r.status();
  JobClaim claim{std::string(job_id), options_.id, true, r->revision, lease_.id};
  if (r->succeeded) return claim;  // the put's revision is the key's create revision
  const std::vector<KeyValue>& held = r->results.at(0);
  if (held.empty()) return absl::InternalError(absl::StrCat("etcd ", etcd_->endpoint(), " Txn on ",
                                                            key, ": neither absent nor present"));
  claim.owner = held[0].value;
  claim.create_revision = held[0].create_revision;
  claim.lease = held[0].lease;
  claim.owned = claim.owner == options_.id && claim.lease == lease_.id;
  return claim;
}

absl::StatusOr<JobClaim> Replica::Owner(absl::string_view job_id) const {
  if (absl::Status s = common::ValidateJobId("job id", job_id); !s.ok()) return s;
  absl::StatusOr<RangeResult> r = etcd_->Get(OwnerKey(job_id));
  if (!r.ok()) return r.status();
  JobClaim claim{std::string(job_id), {}, false, 0, 0};
  if (r->kvs.empty()) return claim;
  claim.owner = r->kvs[0].value;
  claim.create_revision = r->kvs[0].create_revision;
  claim.lease = r->kvs[0].lease;
  claim.owned = claim.owner == options_.id && claim.lease == lease_.id;
  return claim;
}

absl::Status Replica::CheckClaim(const JobClaim& claim) const {
  if (!claim.owned || claim.owner != options_.id || claim.lease != lease_.id) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", claim.job_id, "' is not owned by replica '", options_.id,
                     "' (claim names owner '", claim.owner, "' on lease ", claim.lease, ")"));
  }
  return absl::OkStatus();
}

std::vector<Compare> Replica::Fence(const JobClaim& claim) const {
  const std::string key = OwnerKey(claim.job_id);
  // The create revision alone names the key this claim created; the lease
  // and value compares also refuse a key some other writer overwrote in place.
  return {Compare::CreateRevisionIs(key, claim.create_revision), Compare::LeaseIs(key, lease_.id),
          Compare::ValueIs(key, options_.id)};
}

absl::Status Replica::FenceFailed(const JobClaim& claim, const TxnResult& result) const {
  const std::vector<KeyValue>& now = result.results.at(0);
  return absl::FailedPreconditionError(absl::StrCat(
      "job '", claim.job_id, "' is no longer owned by replica '", options_.id,
      "' (its claim: key created at revision ", claim.create_revision, " on lease ", claim.lease,
      "); now ",
      now.empty() ? std::string("no owner")
                  : absl::StrCat("owned by '", now[0].value, "' since revision ",
                                 now[0].create_revision, " on lease ", now[0].lease)));
}

absl::StatusOr<int64_t> Replica::FencedPut(const JobClaim& claim, absl::string_view name,
                                           absl::string_view value) {
  if (absl::Status s = CheckClaim(claim); !s.ok()) return s;
  if (name.empty() || name.find('/') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("job '", claim.job_id, "' state name '", name, "' must be one non-empty "
                     "path segment"));
  }
  return PutFenced(claim, JobKey(claim.job_id, name), name, value, /*lease=*/0);
}

absl::StatusOr<int64_t> Replica::FencedPutEntry(const JobClaim& claim, absl::string_view dir,
                                                absl::string_view key, absl::string_view value,
                                                int64_t lease) {
  if (absl::Status s = CheckClaim(claim); !s.ok()) return s;
  if (dir.empty() || dir.find('/') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("job '", claim.job_id, "' state directory '", dir,
                     "' must be one non-empty path segment"));
  }
  return PutFenced(claim, absl::StrCat(JobKey(claim.job_id, dir), "/", key),
                   absl::StrCat(dir, " key '", key, "'"), value, lease);
}

absl::StatusOr<int64_t> Replica::PutFenced(const JobClaim& claim, std::string key,
                                           absl::string_view what, absl::string_view value,
                                           int64_t lease) {
  if (absl::Status s = CheckMayDecide(absl::StrCat("write ", what, " of job '", claim.job_id, "'"));
      !s.ok()) {
    return s;
  }
  absl::StatusOr<TxnResult> r =
      etcd_->Txn(Fence(claim), {TxnOp::Put(std::move(key), std::string(value), lease)},
                 {TxnOp::Get(OwnerKey(claim.job_id))});
  if (!r.ok()) return r.status();
  if (!r->succeeded) return FenceFailed(claim, *r);
  return r->revision;
}

absl::Status Replica::Release(const JobClaim& claim) {
  if (absl::Status s = CheckClaim(claim); !s.ok()) return s;
  absl::StatusOr<TxnResult> r = etcd_->Txn(Fence(claim), {TxnOp::Delete(OwnerKey(claim.job_id))},
                                           {TxnOp::Get(OwnerKey(claim.job_id))});
  if (!r.ok()) return r.status();
  if (!r->succeeded) return FenceFailed(claim, *r);
  return absl::OkStatus();
}

}  // namespace straggler::cluster
