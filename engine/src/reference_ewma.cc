// The ewma reference (docs/detection.md, "ewma"): at each row, per peer
// group (peer_groups.h), the lower median of the group's ranks' EWMAs; a rank
// is slow when its own EWMA is above ewma_ratio x its group's.
#include <algorithm>

#include "engine_impl.h"
#include "peer_groups.h"
#include "reference.h"

namespace straggler::engine::internal {

class EwmaReference final : public Reference {
 public:
  using Reference::Reference;

  void OnRow(Row& row, Time now) override {
    const PolicyConfig& p = e_.policy;
    if (groups_.Sync(e_.topology, e_.topology_version)) thresholds_.resize(groups_.size(), 0.0);
    groups_.Bucketize(row);
    std::vector<double>& s = e_.scratch;
    size_t shown = 0;
    bool any = false;
    for (uint32_t g = 0; g < groups_.size(); ++g) {
      const auto& bucket = groups_.Bucket(g);
      s.clear();
      for (auto& [rank, t] : bucket)
        if (e_.ranks[rank].samples >= p.ewma_min_samples) s.push_back(e_.ranks[rank].ewma);
      if (s.size() < 2) continue;
      // The group's reference is what evidence and messages of its ranks show.
      e_.baseline = LowerMedian(s);
      e_.threshold = p.ewma_ratio * e_.baseline;
      e_.have_threshold = true;
      thresholds_[g] = e_.threshold;
      if (!any || groups_.Members(g) > groups_.Members(static_cast<uint32_t>(shown))) {
        shown = g;
        shown_baseline_ = e_.baseline;
      }
      any = true;
      for (auto& [rank, t] : bucket) {
        const RankState& r = e_.ranks[rank];
        if (r.samples < p.ewma_min_samples) continue;
        e_.ApplyVerdict(rank, e_.VerdictFor(r.ewma), row.iteration, t, now);
      }
    }
    // Views show the largest group's reference.
    if (any) {
      e_.baseline = shown_baseline_;
      e_.threshold = thresholds_[shown];
    }
  }

  // Against the last reference of the rank's group (ratio x its last median).
  Verdict Single(uint32_t rank, const Report&) const override {
    const RankState& r = e_.ranks[rank];
    if (r.samples < e_.policy.ewma_min_samples) return Verdict::kNone;
    const uint32_t g = groups_.size() > 0 ? groups_.Of(rank) : 0;
    // No reference for its group yet: no verdict (the engine's published
    // threshold is another group's, e.g. another GPU model's).
    if (g >= thresholds_.size() || thresholds_[g] <= 0) return Verdict::kNone;
    return r.ewma > thresholds_[g] ? Verdict::kSlow
           : r.ewma < thresholds_[g] ? Verdict::kFast
                                     : Verdict::kNone;
  }

 private:
  PeerGroups groups_;
  std::vector<double> thresholds_;  // per group, its newest
  double shown_baseline_ = 0.0;
};

std::unique_ptr<Reference> MakeEwmaReference(EngineImpl& e) {
  return std::make_unique<EwmaReference>(e);
}

}  // namespace straggler::engine::internal
