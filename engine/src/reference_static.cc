// The static reference (docs/detection.md, "static"): a step is slow when
// compute_seconds > static_threshold_seconds. The baseline shown is the
// row's lower median, for views and slowdown ratios only.
#include <algorithm>

#include "engine_impl.h"
#include "reference.h"

namespace straggler::engine::internal {
namespace {

class StaticReference final : public Reference {
 public:
  explicit StaticReference(EngineImpl& engine) : e_(engine) {}

  void OnRow(Row& row, Time now) override {
    e_.threshold = e_.policy.static_threshold_seconds;
    e_.have_threshold = true;
    std::vector<double>& s = e_.scratch;
    s.clear();
    for (auto& [rank, t] : row.values) s.push_back(t);
    if (!s.empty()) {
      auto mid = s.begin() + (s.size() - 1) / 2;
      std::nth_element(s.begin(), mid, s.end());
      e_.baseline = *mid;
    } else {
      e_.baseline = 0.0;
    }
    e_.JudgeRow(row, now, /*global_shift_guard=*/false);
  }

  // Against the configured threshold, whether or not a row set it yet.
  Verdict Single(uint32_t, double compute_seconds) const override {
    const double t = e_.policy.static_threshold_seconds;
    return compute_seconds > t ? Verdict::kSlow
           : compute_seconds < t ? Verdict::kFast
                                 : Verdict::kNone;
  }

 private:
  EngineImpl& e_;
};

}  // namespace

std::unique_ptr<Reference> MakeStaticReference(EngineImpl& engine) {
  return std::make_unique<StaticReference>(engine);
}

}  // namespace straggler::engine::internal
