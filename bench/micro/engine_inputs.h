// The inputs engine_bench and engine_instructions feed the engine, in one
// place so that their nanoseconds and instruction counts measure the same
// work.
#pragma once

#include <cstdint>
#include <vector>

#include "straggler/engine/policy.h"

namespace straggler::bench {

// 4096 deterministic compute times around 100 ms (+-5 %), from a 64-bit LCG.
inline std::vector<double> NoiseTable() {
  std::vector<double> t(4096);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (double& v : t) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const double u = static_cast<double>(x >> 11) / static_cast<double>(uint64_t{1} << 53);
    v = 0.100 * (0.95 + 0.10 * u);
  }
  return t;
}

// The policy of `kind` with the daemon's defaults (static needs a threshold).
inline engine::PolicyConfig Policy(engine::PolicyKind kind) {
  engine::PolicyConfig p;
  p.kind = kind;
  if (kind == engine::PolicyKind::kStatic) p.static_threshold_seconds = 0.5;
  return p;
}

}  // namespace straggler::bench
