// The reference a policy judges steps against (docs/detection.md,
// "Policies"): one implementation per PolicyKind, behind this interface. A
// new policy is one reference_<name>.cc defining Make<Name>Reference, and its
// rows in straggler/engine/policy_table.inc (docs/detection.md, "Adding a
// policy").
//
// A reference owns its own bookkeeping (profiles, windows) and publishes the
// threshold and baseline it judges with in the engine's `judge` state
// (EngineImpl::judge), which views, evidence and guard details read. It
// gives verdicts through EngineImpl::ApplyVerdict. Not thread-safe: called
// by the engine's thread only.
#pragma once

#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "rows.h"
#include "straggler/engine/job_engine.h"

namespace straggler::engine::internal {

struct EngineImpl;

enum class Verdict { kNone, kSlow, kFast };

// The lower median of `values` (reordered); 0 when empty.
inline double LowerMedian(std::vector<double>& values) {
  if (values.empty()) return 0.0;
  auto mid = values.begin() + (values.size() - 1) / 2;
  std::nth_element(values.begin(), mid, values.end());
  return *mid;
}

class Reference {
 public:
  explicit Reference(EngineImpl& engine) : e_(engine) {}
  virtual ~Reference() = default;
  // A new epoch started with `row` (not the job's first).
  virtual void OnEpoch(const Row& row, Time now) { (void)row, (void)now; }
  // Judges a completed row of ranks taking part in the collective.
  virtual void OnRow(Row& row, Time now) = 0;
  // A large row judged in slices (docs/detection.md, "Large rows"), so that
  // the ingest call completing it does not hold the job for the whole row:
  // BeginRow plans the row, JudgeSlice does up to `budget` units of its work
  // (a unit: about one rank's step or verdict), EndRow finishes it (the same
  // `row`, untouched in between). Both return nonzero while work is left;
  // BeginRow returns at most how many units the row takes (the engine paces
  // the slices by it), JudgeSlice only whether any are left.
  // Together they do what OnRow does. The default judges the whole row in
  // BeginRow.
  virtual size_t BeginRow(Row& row, Time now) {
    OnRow(row, now);
    return 0;
  }
  virtual size_t JudgeSlice(size_t budget) {
    (void)budget;
    return 0;
  }
  virtual void EndRow(Row& row, Time now) { (void)row, (void)now; }
  // The verdict on one report judged alone: an excluded rank in shadow
  // recovery, or a report whose row was judged without it. Its time is
  // report.OwnSeconds().
  virtual Verdict Single(uint32_t rank, const Report& report) const = 0;
  // A reference that judges such a report with its own evidence (peer: the
  // rank's window) does so here and returns true; Single is then not asked.
  virtual bool JudgeAlone(uint32_t rank, const Report& report, Time now) {
    (void)rank, (void)report, (void)now;
    return false;
  }
  // The seconds a step of `rank` is compared with, where it differs from the
  // published baseline (peer: its own group's median, or its own baseline in
  // a small group); 0: the published one. WorkerView.slowdown_ratio divides
  // by it.
  // The rank's `data` note (WorkerView::data): the peer policy's, where it
  // judges per unit of work.
  virtual std::optional<DataNote> DataNoteOf(uint32_t rank) const {
    (void)rank;
    return std::nullopt;
  }
  virtual double BaselineOf(uint32_t rank) const {
    (void)rank;
    return 0.0;
  }
  // SetPolicy changed the judging rule: the engine dropped its threshold;
  // `next_iteration` is where judging resumes.
  virtual void OnRuleChanged(uint64_t next_iteration, Time now) {
    (void)next_iteration, (void)now;
  }

 protected:
  EngineImpl& e_;
};

// The reference of engine.policy.kind, reading engine.policy live (a
// changed parameter applies from the next row).
std::unique_ptr<Reference> MakeReference(EngineImpl& engine);
// Each kind's, defined in its reference_<name>.cc.
#define STRAGGLER_POLICY_KIND(Name, name) \
  std::unique_ptr<Reference> Make##Name##Reference(EngineImpl& engine);
#include "straggler/engine/policy_table.inc"

}  // namespace straggler::engine::internal
