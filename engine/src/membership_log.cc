#include "membership_log.h"

#include <algorithm>
#include <utility>

namespace straggler::engine {

bool Membership::IsExcluded(uint32_t rank) const { return internal::Excludes(*this, rank); }

namespace internal {

MembershipLog::MembershipLog(uint32_t world_size, uint32_t lead_iterations, Time now) {
  Version v0;
  v0.m.world_size = world_size;
  v0.m.lead_iterations = lead_iterations;
  v0.m.created_at = now;
  versions_.push_back(std::move(v0));
  history_.push_back(versions_.back().m);
}

std::vector<Membership> MembershipLog::From(uint64_t iteration) const {
  size_t start = 0;
  for (size_t i = 0; i < history_.size(); ++i)
    if (history_[i].effective_iteration <= iteration) start = i;
  return {history_.begin() + static_cast<std::ptrdiff_t>(start), history_.end()};
}

void MembershipLog::Push(Version v) {
  versions_.push_back(std::move(v));
  history_.push_back(versions_.back().m);
  while (versions_.size() > JobEngine::kMembershipHistory) {
    versions_.pop_front();
    history_.pop_front();
  }
}

void MembershipLog::DropBeyond(uint64_t limit) {
  while (versions_.size() > 1 && versions_.back().m.effective_iteration > limit) {
    versions_.pop_back();
    history_.pop_back();
  }
  if (versions_.back().m.effective_iteration > limit) {
    versions_.front().m.effective_iteration = 0;
    history_.front().effective_iteration = 0;
  }
}

void MembershipLog::ResetTo(Membership m) {
  versions_.clear();
  history_.clear();
  Version v;
  v.m = std::move(m);
  versions_.push_back(std::move(v));
  history_.push_back(versions_.back().m);
}

void MembershipLog::CountExcluded(uint32_t rank, int delta) {
  for (auto& v : versions_)
    if (Excludes(v.m, rank)) v.excluded_counted += delta;
}

void MembershipLog::ClearCounts() {
  for (auto& v : versions_) v.excluded_counted = 0;
}

}  // namespace internal
}  // namespace straggler::engine
