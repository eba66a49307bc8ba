#include "straggler/quality/trace.h"

namespace straggler::quality {

std::vector<Interval> Intervals(const RankMatrix& m) {
  std::vector<Interval> out;
  for (uint32_t r = 0; r < m.ranks(); ++r) {
    uint64_t i = 0;
    while (i < m.iterations()) {
      if (!m.at(r, i)) {
        ++i;
        continue;
      }
      uint64_t j = i;
      while (j < m.iterations() && m.at(r, j)) ++j;
      out.push_back({r, i, j});
      i = j;
    }
  }
  return out;
}

RankMatrix Trace::ReportedMatrix() const {
  RankMatrix m(ranks, iterations);
  for (uint64_t row = 0; row < iterations; ++row)
    for (uint32_t r = 0; r < ranks; ++r) m.set(r, row, Reported(row, r));
  return m;
}

}  // namespace straggler::quality
