// The invariant the PolicyFields() bounds exist for (issue 15), shared by the
// targets that end in an accepted policy (fuzz_config, fuzz_policy): every
// numeric field is finite and inside its range, and the durations convert to
// nanoseconds without saturating.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <variant>

#include "require.h"
#include "straggler/engine/policy.h"

namespace straggler::fuzz {

inline void RequireWithinBounds(const engine::PolicyConfig& p, const char* target) {
  for (const engine::PolicyField& f : engine::PolicyFields()) {
    std::visit(
        [&](auto member) {
          using T = std::remove_cvref_t<decltype(p.*member)>;
          if constexpr (std::is_same_v<T, uint32_t> || std::is_same_v<T, double>) {
            const double v = static_cast<double>(p.*member);
            Require(std::isfinite(v) && v <= f.max && (f.min_exclusive ? v > f.min : v >= f.min),
                    target, "an accepted policy field outside its PolicyFields() range");
          }
        },
        f.member);
  }
  for (double seconds : {p.unresponsive_after_seconds, p.max_compute_seconds,
                         p.static_threshold_seconds}) {
    Require(engine::SaturatingNanoseconds(seconds) < std::chrono::nanoseconds::max(), target,
            "a policy duration overflows int64 nanoseconds");
  }
}

}  // namespace straggler::fuzz
