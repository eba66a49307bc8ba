#include "membership_tracker.h"

#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <utility>

#include "absl/time/time.h"
#include "clamp_timeout.h"
#include "straggler/stream/stream_session.h"

namespace straggler::detail {

namespace {

namespace pb = ::straggler::v1;

// The daemon's exclusion reasons and the names MembershipView carries.
constexpr std::pair<pb::ExclusionReason, std::string_view> kReasonNames[] = {
    {pb::EXCLUSION_REASON_STRAGGLER, "straggler"},
    {pb::EXCLUSION_REASON_UNRESPONSIVE, "unresponsive"},
    {pb::EXCLUSION_REASON_FORCED, "forced"},
    {pb::EXCLUSION_REASON_PROBATION_END, "probation_end"},
    {pb::EXCLUSION_REASON_REPLICA, "replica"},
};

std::string ReasonName(pb::ExclusionReason r) {
  for (const auto& [reason, name] : kReasonNames)
    if (reason == r) return std::string(name);
  return "unspecified";
}

pb::ExclusionReason ReasonFromName(std::string_view n) {
  for (const auto& [reason, name] : kReasonNames)
    if (name == n) return reason;
  return pb::EXCLUSION_REASON_UNSPECIFIED;
}

MembershipView ToView(const pb::Membership& m, uint32_t fallback_world_size) {
  MembershipView v;
  v.ok = true;
  v.version = m.version();
  v.effective_iteration = m.effective_iteration();
  v.incarnation = m.incarnation();
  v.world_size = m.world_size() != 0 ? m.world_size() : fallback_world_size;
  v.lead_iterations = m.lead_iterations() != 0 ? m.lead_iterations() : kAssumedLeadIterations;
  v.excluded.reserve(m.excluded_size());
  for (const pb::ExcludedRank& e : m.excluded()) {
    ExcludedRankInfo x{e.rank(), ReasonName(e.reason()), e.detail()};
    if (e.has_culprit_rank()) x.culprit = e.culprit_rank();
    x.culprit_group = e.culprit_peer_group();
    if (e.has_replica()) x.replica = e.replica();
    v.excluded.push_back(std::move(x));
  }
  std::sort(v.excluded.begin(), v.excluded.end(),
            [](const ExcludedRankInfo& a, const ExcludedRankInfo& b) { return a.rank < b.rank; });
  return v;
}

MembershipView InitialMembership(uint32_t world_size) {
  MembershipView v;
  v.version = 0;
  v.effective_iteration = 0;
  v.world_size = world_size;
  v.lead_iterations = kAssumedLeadIterations;
  return v;
}

std::vector<uint32_t> Sorted(std::vector<uint32_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace

MembershipTracker::MembershipTracker(uint32_t world_size, std::vector<uint32_t> served)
    : world_size_(world_size),
      served_(Sorted(std::move(served))),
      history_(InitialMembership(world_size)),
      progress_(served_.size()) {
  current_.store(history_.Newest(), std::memory_order_release);
}

MembershipView MembershipTracker::For(uint64_t iteration, std::chrono::milliseconds timeout,
                                      uint32_t rank, StreamSession& session) {
  const int slot = SlotOf(rank);
  absl::MutexLock lock(&state_mu_);
  // Only called with slot >= 0.
  auto certain = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_) {
    return history_.Certain(iteration, rank, progress_[slot]);
  };
  bool ok = slot >= 0 && certain();
  if (!ok && slot >= 0) {
    // The report that makes us certain is usually still in the queue
    // (Report() does not wake the sender): send it now, not at the next poll.
    session.Wake();
    // Once a wait has timed out while the stream was down, later calls do
    // not wait again until a new connection reached the daemon: no
    // acknowledgement can arrive meanwhile, so waiting would only stall
    // every step of a job whose daemon is gone by `timeout`. This never
    // makes an answer certain that is not, so the switch rule holds; the
    // caller treats ok = false as "keep the membership you applied".
    // Behind an agent the stream stays up while the daemon is gone; the
    // agent says so (upstream_unavailable) and that counts as disconnected.
    const bool known_unreachable =
        session.Unreachable() && gave_up_on_connection_ == session.Connections();
    if (!known_unreachable) {
      // As std::condition_variable::wait_for with a predicate: spurious
      // wake-ups wait again for what is left of the timeout.
      const auto deadline = std::chrono::steady_clock::now() + ClampTimeout(timeout);
      ok = certain() || session.Stopping();
      while (!ok) {
        const auto left = deadline - std::chrono::steady_clock::now();
        if (left <= std::chrono::steady_clock::duration::zero()) break;
        state_cv_.WaitWithTimeout(&state_mu_, absl::FromChrono(left));
        ok = certain() || session.Stopping();
      }
      if (ok && session.Stopping()) ok = certain();
      if (!ok && session.Unreachable()) gave_up_on_connection_ = session.Connections();
    }
  }
  MembershipView v = history_.InForce(iteration);
  v.ok = ok;
  return v;
}

std::optional<MembershipView> MembershipTracker::ReadmissionAfter(uint64_t iteration,
                                                                  uint32_t rank) {
  absl::MutexLock lock(&state_mu_);
  return history_.ReadmissionAfter(iteration, rank);
}

void MembershipTracker::OnChange(Client::MembershipCallback callback) {
  if (!callback) return;
  absl::MutexLock lock(&callbacks_mu_);
  callbacks_.push_back(std::make_shared<Client::MembershipCallback>(std::move(callback)));
}

std::vector<const MembershipView*> MembershipTracker::Apply(const pb::Directive& d) {
  // Memberships first: a For() waiter woken by the progress below must
  // already see every version this directive carries.
  std::vector<const MembershipView*> announced;
  {
    absl::MutexLock lock(&state_mu_);
    for (const pb::Membership& m : d.memberships())
      if (const MembershipView* v = history_.Add(ToView(m, world_size_))) announced.push_back(v);
    current_.store(history_.Newest(), std::memory_order_release);
    for (const pb::RankProgress& p : d.progress()) {
      const int slot = SlotOf(p.rank());
      if (slot < 0) continue;
      std::optional<uint64_t>& mine = progress_[slot];
      if (!mine || *mine < p.iteration()) mine = p.iteration();
    }
  }
  state_cv_.SignalAll();
  return announced;
}

void MembershipTracker::RunCallbacks(const std::vector<const MembershipView*>& announced) {
  if (announced.empty()) return;
  std::vector<std::shared_ptr<Client::MembershipCallback>> callbacks;
  {
    absl::MutexLock lock(&callbacks_mu_);
    callbacks = callbacks_;
  }
  for (const MembershipView* v : announced) {
    for (const auto& cb : callbacks) {
      try {
        (*cb)(*v);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "straggler client: membership callback threw: %s\n", e.what());
      } catch (...) {
        std::fprintf(stderr, "straggler client: membership callback threw\n");
      }
    }
  }
}

void MembershipTracker::FillKnown(pb::StreamHello* h) const {
  // current_ is history_.Newest(); snapshots live as long as the history.
  const MembershipView* newest = current_.load(std::memory_order_acquire);
  if (newest == nullptr || newest->version == 0) return;
  h->set_known_membership_version(newest->version);
  h->set_known_effective_iteration(newest->effective_iteration);
  h->set_known_incarnation(newest->incarnation);
  // Its excluded ranks: a daemon restarted without its state database
  // republishes them rather than "everyone", so ranks that take up its
  // first version at different iterations still agree on who takes part.
  for (const ExcludedRankInfo& e : newest->excluded) {
    pb::ExcludedRank* x = h->add_known_excluded();
    x->set_rank(e.rank);
    x->set_reason(ReasonFromName(e.reason));
    x->set_detail(e.detail);
    // Who took the replica out: a daemon restarted without its database
    // keeps a culprit's mates with it (docs/hybrid.md).
    if (e.culprit) x->set_culprit_rank(*e.culprit);
    x->set_culprit_peer_group(e.culprit_group);
    if (e.replica) x->set_replica(*e.replica);
  }
}

}  // namespace straggler::detail

namespace straggler {

bool MembershipView::IsExcluded(uint32_t rank) const {
  return std::binary_search(
      excluded.begin(), excluded.end(), ExcludedRankInfo{rank, {}, {}},
      [](const ExcludedRankInfo& a, const ExcludedRankInfo& b) { return a.rank < b.rank; });
}

std::vector<uint32_t> MembershipView::ActiveRanks() const {
  std::vector<uint32_t> active;
  active.reserve(world_size);
  for (uint32_t r = 0; r < world_size; ++r)
    if (!IsExcluded(r)) active.push_back(r);
  return active;
}

}  // namespace straggler
