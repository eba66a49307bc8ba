#include "straggler/common/directive.h"

#include <algorithm>
#include <utility>

#include "straggler/engine/job_engine.h"

namespace straggler::common {

void MergeDirective(v1::Directive& pending, v1::Directive&& newer) {
  // Runs under the job's lock whenever a peer reads slower than we write, and
  // nearly every newer directive is a plain acknowledgement: no membership,
  // a few ranks of progress. Both lists are ascending (by version, by rank),
  // so merge them linearly instead of rebuilding them through maps.
  if (newer.memberships_size() > 0) {
    auto* mine = pending.mutable_memberships();
    google::protobuf::RepeatedPtrField<v1::Membership> merged;
    int i = 0, j = 0;
    auto* theirs = newer.mutable_memberships();
    while (i < mine->size() || j < theirs->size()) {
      if (j == theirs->size() ||
          (i < mine->size() && mine->Get(i).version() < theirs->Get(j).version())) {
        *merged.Add() = std::move(*mine->Mutable(i++));
      } else {
        if (i < mine->size() && mine->Get(i).version() == theirs->Get(j).version()) ++i;
        *merged.Add() = std::move(*theirs->Mutable(j++));  // the newer copy wins
      }
    }
    const int excess = merged.size() - static_cast<int>(engine::JobEngine::kMembershipHistory);
    if (excess > 0) merged.DeleteSubrange(0, excess);
    mine->Swap(&merged);
  }

  pending.set_acked_sequence(newer.acked_sequence());
  if (pending.progress_size() == 0) {
    *pending.mutable_progress() = std::move(*newer.mutable_progress());
  } else if (newer.progress_size() > 0) {
    const auto& a = pending.progress();
    const auto& b = newer.progress();
    google::protobuf::RepeatedPtrField<v1::RankProgress> merged;
    int i = 0, j = 0;
    while (i < a.size() || j < b.size()) {
      v1::RankProgress* rp = merged.Add();
      if (j == b.size() || (i < a.size() && a.Get(i).rank() < b.Get(j).rank())) {
        *rp = a.Get(i++);
      } else if (i == a.size() || b.Get(j).rank() < a.Get(i).rank()) {
        *rp = b.Get(j++);
      } else {  // same rank: the higher iteration
        rp->set_rank(a.Get(i).rank());
        rp->set_iteration(std::max(a.Get(i++).iteration(), b.Get(j++).iteration()));
      }
    }
    pending.mutable_progress()->Swap(&merged);
  }
  pending.set_accepted(pending.accepted() + newer.accepted());
  pending.set_rejected(pending.rejected() + newer.rejected());
  pending.set_duplicates(pending.duplicates() + newer.duplicates());
  for (auto& r : *newer.mutable_rejections()) {
    if (pending.rejections_size() >= kMaxDirectiveRejections) break;
    *pending.add_rejections() = std::move(r);
  }
  // The agent's upstream state: the newer word is the current one.
  if (newer.has_upstream_unavailable()) {
    pending.set_upstream_unavailable(newer.upstream_unavailable());
  }
}

}  // namespace straggler::common
