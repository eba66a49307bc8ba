// DataNotes (peer_data.h): who is slow on time alone but not per unit of work.
#include "peer_data.h"

#include <cmath>

namespace straggler::engine::internal {

void DataNotes::Step(uint32_t rank, uint32_t world, double x, double y, double alpha) {
  if (levels_.size() < world) levels_.resize(world);
  Levels& l = levels_[rank];
  if (l.steps == 0) {
    l.x = static_cast<float>(x);
    l.y = static_cast<float>(y);
  } else {
    l.x = static_cast<float>(l.x + alpha * (x - l.x));
    l.y = static_cast<float>(l.y + alpha * (y - l.y));
  }
  if (l.steps < kMinSteps) ++l.steps;
}

void DataNotes::Decide(uint32_t rank, bool healthy, double threshold) {
  if (rank >= levels_.size()) return;
  Levels& l = levels_[rank];
  if (!healthy || l.steps < kMinSteps || !(threshold > 0)) {
    l.on = false;
    return;
  }
  l.threshold = static_cast<float>(threshold);
  l.on = l.on ? l.y >= 0.5 * threshold : l.y >= threshold;
}

void DataNotes::Clear(uint32_t rank) {
  if (rank < levels_.size()) levels_[rank] = Levels{};
}

std::optional<DataNote> DataNotes::Of(uint32_t rank) const {
  if (rank >= levels_.size() || !levels_[rank].on) return std::nullopt;
  const Levels& l = levels_[rank];
  return DataNote{std::exp(static_cast<double>(l.y)), std::exp(static_cast<double>(l.threshold)),
                  std::exp(static_cast<double>(l.x)), std::exp(static_cast<double>(l.y - l.x))};
}

}  // namespace straggler::engine::internal
