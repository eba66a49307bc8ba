// The ewma reference (docs/detection.md, "ewma"): at each row, the lower
// median of the row ranks' EWMAs; a rank is slow when its own EWMA is above
// ewma_ratio x that.
#include <algorithm>

#include "engine_impl.h"
#include "reference.h"

namespace straggler::engine::internal {

class EwmaReference final : public Reference {
 public:
  using Reference::Reference;

  void OnRow(Row& row, Time now) override {
    const PolicyConfig& p = e_.policy;
    std::vector<double>& s = e_.scratch;
    s.clear();
    for (auto& [rank, t] : row.values)
      if (e_.ranks[rank].samples >= p.ewma_min_samples) s.push_back(e_.ranks[rank].ewma);
    if (s.size() < 2) return;
    e_.baseline = LowerMedian(s);
    e_.threshold = p.ewma_ratio * e_.baseline;
    e_.have_threshold = true;
    for (auto& [rank, t] : row.values) {
      const RankState& r = e_.ranks[rank];
      if (r.samples < p.ewma_min_samples) continue;
      e_.ApplyVerdict(rank, e_.VerdictFor(r.ewma), row.iteration, t, now);
    }
  }

  // Against the last reference (ratio x the last row's median).
  Verdict Single(uint32_t rank, double) const override {
    const RankState& r = e_.ranks[rank];
    return r.samples >= e_.policy.ewma_min_samples ? e_.VerdictFor(r.ewma) : Verdict::kNone;
  }

};

std::unique_ptr<Reference> MakeEwmaReference(EngineImpl& e) {
  return std::make_unique<EwmaReference>(e);
}

}  // namespace straggler::engine::internal
