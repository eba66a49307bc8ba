// The `data` note of the peer policy (docs/detection.md, "Own time and
// work"): a rank of a group judged per unit of work that is healthy there
// but slow on time alone drew more work than its peers (longer sequences, a
// shard of larger samples). That is the data's doing, not the rank's: no
// straggler, but worth showing where it decided (WorkerView::data, the
// daemon's likely cause `data`). Plain data, one thread at a time (the
// engine's).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "straggler/engine/job_engine.h"

namespace straggler::engine::internal {

class DataNotes {
 public:
  // A member's step in a judged row of a group judged per unit of work: `x`
  // its log ratio per unit of work, `y` on time alone (both to the group's
  // row), into exponentially weighted levels with weight `alpha` (those of
  // the long window's kLong steps). Storage is taken on the first call: a
  // job that reports no work pays nothing.
  void Step(uint32_t rank, uint32_t world, double x, double y, double alpha);
  // After the step's verdict: the note holds while the rank is `healthy`
  // and its level on time alone is at `threshold` (a log ratio: the group's
  // threshold for its noise on time alone) or above, and leaves below half
  // of it (hysteresis, as a straggler's way back).
  void Decide(uint32_t rank, bool healthy, double threshold);
  // The rank left its group or was restarted: its levels start over.
  void Clear(uint32_t rank);

  std::optional<DataNote> Of(uint32_t rank) const;

 private:
  struct Levels {
    float x = 0.0f, y = 0.0f;       // log ratios, weighted
    float threshold = 0.0f;         // the threshold on time alone when last decided
    uint16_t steps = 0;             // held at kMinSteps
    bool on = false;
  };
  // Steps before a note may be taken: a level of a few steps is noise.
  static constexpr uint16_t kMinSteps = 10;
  std::vector<Levels> levels_;  // per rank, once a group judged per unit of work
};

}  // namespace straggler::engine::internal
