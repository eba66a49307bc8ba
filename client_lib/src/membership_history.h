// The client's record of the job's membership versions and the switch rule
// that picks the one in force at an iteration. A pure core (no threads, no
// clock, no gRPC) so the rule can be tested on its own.
//
//   MembershipHistory h(MembershipView{...version 0...});
//   if (const MembershipView* v = h.Add(view_from_daemon)) callbacks(*v);
//   const MembershipView& m = h.InForce(iteration);
//   bool certain = h.Certain(iteration, rank, progress_of_rank);
//   if (auto back = h.ReadmissionAfter(iteration, rank)) skip_to(back->effective_iteration);
//
// Snapshots are immutable and never freed before the history is destroyed,
// so a pointer handed out (e.g. published through an atomic) stays valid for
// the history's lifetime. Memberships change rarely (a handful per job-hour),
// so keeping every version costs little.
//
// Thread safety: none; the owner serialises access (Client uses a mutex for
// writers and publishes Newest() through an atomic pointer for readers).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "straggler/client.h"

namespace straggler::detail {

// The lead a client assumes until the daemon has said its own (its version 0
// arrives with the stream's first directive), or when a membership carries
// none: the smallest lead a daemon may be configured with (the policy's
// lead_iterations is in [1, 1000]). Assuming more would make iterations
// below it certain by rule (see IsCertain) though a daemon running with a
// smaller lead can have a version in force there; assuming less only makes
// a client wait for the stream at its first iterations.
inline constexpr uint32_t kAssumedLeadIterations = 1;

// Whether the membership in force at `iteration` is known for certain, given
// the highest iteration of this rank the daemon has processed (nullopt:
// none yet) and the daemon's lead L.
//
// Why: the engine makes each new version with
//   effective_iteration = max(highest iteration reported by an active rank + L,
//                             previous effective_iteration + 1),
// under the same per-job lock that processes (and acknowledges) reports, and
// pushes every new version on the stream before later acknowledgements. So
// once the daemon has processed our report of iteration p, every version not
// yet received has effective_iteration >= p + L. The version in force at
// `iteration` is therefore final once p + L > iteration, i.e.
// p >= iteration + 1 - L. Every version has effective_iteration >= L (the
// highest iteration is >= 0), so for iteration < L version 0 is certain at
// once.
//
// An excluded rank's reports do not raise "highest iteration reported by an
// active rank", so an excluded rank that runs ahead of the active group can be
// "certain" beyond what that bound covers. That matters only for a version
// that readmits it (an excluded rank takes no part in the collectives
// otherwise): the daemon puts a readmission at or after the readmitted rank's
// own last reported iteration + lead (JobEngine, Evaluate), so its answer
// holds there too.
inline bool IsCertain(uint64_t iteration, uint32_t lead, std::optional<uint64_t> progress) {
  if (lead == 0) lead = kAssumedLeadIterations;
  if (iteration < lead) return true;
  return progress.has_value() && *progress + lead > iteration;
}

class MembershipHistory {
 public:
  explicit MembershipHistory(MembershipView initial) {
    initial.ok = true;
    owned_.push_back(std::make_unique<const MembershipView>(std::move(initial)));
    by_version_.push_back(owned_.back().get());
  }

  // Records `view`. Returns the stored snapshot when it is newer than every
  // version known so far (the caller announces it), nullptr otherwise. An
  // older version not yet known is recorded (it can still be in force for an
  // earlier iteration) but not returned, so announcements stay ascending. A
  // version already known is replaced only when it was the local placeholder
  // for version 0 (`replaceable_initial`), since the daemon's copy carries its
  // real lead and world size.
  const MembershipView* Add(MembershipView view) {
    view.ok = true;
    auto it = std::lower_bound(by_version_.begin(), by_version_.end(), view.version,
                               [](const MembershipView* m, uint64_t v) { return m->version < v; });
    if (it != by_version_.end() && (*it)->version == view.version) {
      if (view.version == 0 && initial_is_placeholder_) {
        initial_is_placeholder_ = false;
        owned_.push_back(std::make_unique<const MembershipView>(std::move(view)));
        *it = owned_.back().get();
        // Not a new version for callbacks, but readers of Newest() must see it.
        return nullptr;
      }
      return nullptr;
    }
    const bool newest = it == by_version_.end();
    owned_.push_back(std::make_unique<const MembershipView>(std::move(view)));
    by_version_.insert(it, owned_.back().get());
    return newest ? owned_.back().get() : nullptr;
  }

  const MembershipView* Newest() const { return by_version_.back(); }

  // The newest version whose effective_iteration <= iteration (version 0,
  // effective at 0, always qualifies).
  const MembershipView& InForce(uint64_t iteration) const {
    for (auto it = by_version_.rbegin(); it != by_version_.rend(); ++it)
      if ((*it)->effective_iteration <= iteration) return **it;
    return *by_version_.front();
  }

  // Whether InForce(iteration) is final for `rank`: by its progress at the
  // daemon (IsCertain), or, for the iteration at which a held version
  // readmits `rank`, at once. Why the latter is sound: effective iterations
  // grow strictly with the version (the engine makes each one at least the
  // previous + 1; a restarted daemon publishes above every version its
  // clients hold, in force after it), so a version taking effect exactly at
  // `iteration` is the one in force there whatever else is unknown. This lets
  // a rank that was excluded and fell far behind jump straight to the
  // iteration that readmits it: it sent no report near that iteration, so
  // IsCertain cannot hold.
  //
  // Only for the readmitted rank, on purpose. Were every rank certain at a
  // version's effective iteration as soon as it holds it, a daemon dying
  // inside the lead after publishing a change would make the whole group
  // switch to a set whose communicator it cannot build without the daemon,
  // instead of keeping the last applied membership (the agreement rule). The
  // group still waits for its own progress; in that outage only the
  // readmitted rank applies the version, and its rejoin fails (bounded, a
  // CollectiveError) without touching the group's collectives.
  bool Certain(uint64_t iteration, uint32_t rank, std::optional<uint64_t> progress) const {
    if (IsCertain(iteration, Newest()->lead_iterations, progress)) return true;
    for (size_t i = by_version_.size(); i-- > 1;) {
      const MembershipView& v = *by_version_[i];
      if (v.effective_iteration < iteration) break;  // ascending with the version
      if (v.effective_iteration == iteration)
        return !v.IsExcluded(rank) && by_version_[i - 1]->IsExcluded(rank);
    }
    return false;
  }

  // For a rank excluded at `iteration`: the first held version after the one
  // in force there that includes `rank` again, i.e. the membership, certain
  // at its effective_iteration E (see Certain), at which the rank rejoins.
  // Not simply the newest: when a readmission was quickly followed by another
  // exclusion, the group still counts on the rank from E on. nullopt when
  // `rank` is not excluded at `iteration` or no held version readmits it.
  // A client holds every version the daemon made after the one in force at
  // its progress (Directive.memberships), so no earlier readmission can be
  // missing between `iteration` and E.
  std::optional<MembershipView> ReadmissionAfter(uint64_t iteration, uint32_t rank) const {
    const MembershipView& now = InForce(iteration);
    if (!now.IsExcluded(rank)) return std::nullopt;
    auto it = std::upper_bound(by_version_.begin(), by_version_.end(), now.version,
                               [](uint64_t v, const MembershipView* m) { return v < m->version; });
    for (; it != by_version_.end(); ++it)
      if (!(*it)->IsExcluded(rank)) return **it;
    return std::nullopt;
  }

  size_t size() const { return by_version_.size(); }

 private:
  bool initial_is_placeholder_ = true;
  std::vector<std::unique_ptr<const MembershipView>> owned_;  // every snapshot ever made
  std::vector<const MembershipView*> by_version_;             // ascending, one per version
};

}  // namespace straggler::detail
