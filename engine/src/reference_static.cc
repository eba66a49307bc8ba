// The static reference (docs/detection.md, "static"): a step is slow when
// its own time (Report::OwnSeconds) > static_threshold_seconds. The baseline shown is the
// row's lower median, for views and slowdown ratios only.
#include <algorithm>

#include "engine_impl.h"
#include "reference.h"

namespace straggler::engine::internal {

class StaticReference final : public Reference {
 public:
  using Reference::Reference;

  void OnRow(Row& row, Time now) override {
    e_.threshold = e_.policy.static_threshold_seconds;
    e_.have_threshold = true;
    std::vector<double>& s = e_.scratch;
    s.clear();
    for (auto& [rank, t] : row.values) s.push_back(t);
    e_.baseline = LowerMedian(s);
    e_.JudgeRow(row, now, /*global_shift_guard=*/false);
  }

  // Against the configured threshold, whether or not a row set it yet.
  Verdict Single(uint32_t, const Report& report) const override {
    const double t = e_.policy.static_threshold_seconds;
    const double own = report.OwnSeconds();
    return own > t ? Verdict::kSlow : own < t ? Verdict::kFast : Verdict::kNone;
  }

};

std::unique_ptr<Reference> MakeStaticReference(EngineImpl& e) {
  return std::make_unique<StaticReference>(e);
}

}  // namespace straggler::engine::internal
