#include "cluster/cluster_view.h"

#include <algorithm>
#include <utility>

#include "absl/strings/strip.h"

namespace straggler::cluster {

absl::StatusOr<std::unique_ptr<ClusterView>> ClusterView::Start(std::shared_ptr<EtcdClient> etcd,
                                                                std::string prefix,
                                                                OnOwnersGone owners_gone) {
  if (absl::Status s = CheckKeyPrefix(prefix); !s.ok()) return s;
  absl::StatusOr<RangeResult> read = etcd->GetPrefix(prefix);
  if (!read.ok()) return read.status();
  std::unique_ptr<ClusterView> view(new ClusterView(std::move(prefix)));
  {
    absl::MutexLock lock(&view->mu_);
    for (const KeyValue& kv : read->kvs) view->ApplyLocked(kv, false);
    view->revision_ = read->revision;
  }
  ClusterView* self = view.get();
  absl::StatusOr<std::unique_ptr<Watch>> watch = etcd->WatchPrefix(
      view->prefix_, read->revision + 1,
      [self, owners_gone = std::move(owners_gone)](int64_t revision,
                                                   const std::vector<WatchEvent>& events) {
        std::vector<std::string> orphans;
        {
          absl::MutexLock lock(&self->mu_);
          std::vector<std::pair<std::string, std::string>> gone;
          for (const WatchEvent& e : events) {
            self->ApplyLocked(e.kv, e.type == WatchEvent::Type::kDelete, &gone);
          }
          self->revision_ = std::max(self->revision_, revision);
          // Judged after the whole batch: the registration goes in the same
          // revision as the ownership keys on its lease, in any order.
          for (auto& [job, owner] : gone) {
            if (self->replicas_.count(owner) == 0 && self->owners_.count(job) == 0) {
              orphans.push_back(std::move(job));
            }
          }
        }
        if (owners_gone && !orphans.empty()) owners_gone(std::move(orphans));
      },
      [self](const absl::Status& reason) {
        absl::MutexLock lock(&self->mu_);
        self->status_ = reason;
      });
  if (!watch.ok()) return watch.status();
  view->watch_ = *std::move(watch);
  return view;
}

ClusterView::~ClusterView() { watch_.reset(); }

void ClusterView::ApplyLocked(const KeyValue& kv, bool deleted,
                              std::vector<std::pair<std::string, std::string>>* gone) {
  absl::string_view key = kv.key;
  if (!absl::ConsumePrefix(&key, prefix_)) return;
  if (absl::ConsumePrefix(&key, "replicas/")) {
    if (deleted) {
      replicas_.erase(std::string(key));
    } else {
      replicas_[std::string(key)] = ParseRegistration(key, kv);
    }
  } else if (absl::ConsumePrefix(&key, "owners/")) {
    if (deleted) {
      auto it = owners_.find(key);
      if (it == owners_.end()) return;
      if (gone != nullptr) gone->emplace_back(it->first, it->second);
      owners_.erase(it);
    } else {
      owners_[std::string(key)] = kv.value;
    }
  }
  // jobs/<job>/...: the owner's state, not routing.
}

std::optional<std::string> ClusterView::OwnerOf(absl::string_view job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = owners_.find(job_id);
  if (it == owners_.end()) return std::nullopt;
  return it->second;
}

std::optional<ReplicaInfo> ClusterView::ReplicaById(absl::string_view replica_id) const {
  absl::MutexLock lock(&mu_);
  auto it = replicas_.find(replica_id);
  if (it == replicas_.end()) return std::nullopt;
  return it->second;
}

std::vector<ReplicaInfo> ClusterView::Replicas() const {
  absl::MutexLock lock(&mu_);
  std::vector<ReplicaInfo> out;
  for (const auto& [id, info] : replicas_) out.push_back(info);
  return out;
}

std::map<std::string, std::string> ClusterView::Owners() const {
  absl::MutexLock lock(&mu_);
  return std::map<std::string, std::string>(owners_.begin(), owners_.end());
}

int64_t ClusterView::Revision() const {
  absl::MutexLock lock(&mu_);
  return revision_;
}

absl::Status ClusterView::Status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

}  // namespace straggler::cluster
