// The rank lifecycle (docs/detection.md, "Unresponsive", "Membership gate",
// "Finished"): which ranks rows wait for, which can hear new versions,
// liveness, and Reset, which forgets every rank's state.
#include <algorithm>

#include "absl/strings/str_format.h"
#include "engine_impl.h"
#include "events.h"

namespace straggler::engine::internal {

namespace {
double Seconds(Time t) { return std::chrono::duration<double>(t).count(); }
}  // namespace

// Keeps the per-version counts of excluded counted ranks right.
void EngineImpl::SetCounted(uint32_t rank, bool counted) {
  RankState& r = ranks[rank];
  if (r.counted == counted) return;
  r.counted = counted;
  const int delta = counted ? 1 : -1;
  counted_ranks += delta;
  log.CountExcluded(rank, delta);
}

void EngineImpl::Attach(RankState& r) {
  if (r.attached) return;
  r.attached = true;
  if (withheld) dirty = true;
}

bool EngineImpl::Finished() const {
  return std::all_of(ranks.begin(), ranks.end(),
                     [](const RankState& r) { return r.state == WorkerState::kFinished; });
}

void EngineImpl::TickOrWait(Time now) {
  // The ranks' own clock runs on while a row is judged in slices: the tick
  // can wait for the row's end (paced to come within the next row), and a
  // million-rank job's stream is not held while the tick finishes the row
  // at once. A later tick that finds no slice judged since (no reports
  // come to end the row) finishes it.
  if (sliced.active && (!sliced.tick || sliced.slices != sliced.tick_slices)) {
    sliced.tick = now;
    sliced.tick_slices = sliced.slices;
    return;
  }
  sliced.tick.reset();
  FinishRow();
  Tick(now);
}

void EngineImpl::Tick(Time now) {
  if (lost) return;  // the job ended: nothing of it is expected any more
  const Time timeout = SaturatingNanoseconds(policy.unresponsive_after_seconds);
  if (now - tick_earliest <= timeout) return;  // nobody's last report is that old
  bool any = false;
  Time earliest = Time::max();
  for (uint32_t i = 0; i < world_size; ++i) {
    RankState& r = ranks[i];
    if (r.state == WorkerState::kUnresponsive || r.state == WorkerState::kFinished) continue;
    const bool pending = r.state == WorkerState::kPending;
    const Time last = pending ? std::max(created_at, r.announced_at) : r.last_report_time;
    if (now - last <= timeout) {
      earliest = std::min(earliest, last);
      continue;
    }
    r.straggler_when_silent = r.state == WorkerState::kStraggler;
    ChangeState(i, WorkerState::kUnresponsive, r.last_iteration, r.last_compute, now,
                pending ? absl::StrFormat("no report %.3gs after the job started",
                                          Seconds(now - last))
                        : absl::StrFormat("no report for %.3gs (last at iteration %u)",
                                          Seconds(now - last), r.last_iteration));
    SetCounted(i, false);
    any = true;
  }
  tick_earliest = earliest;
  if (any) {
    DrainRows(now);
    Evaluate(now);
  }
}

void EngineImpl::Announce(uint32_t rank, Time now) {
  if (rank >= world_size) return;
  RankState& r = ranks[rank];
  Attach(r);
  lost = false;  // a stream speaks for the job again: it resumes
  if (r.state == WorkerState::kPending) {
    r.announced_at = now;
    NoteSeen(now);
    SetCounted(rank, true);
  }
  if (dirty) Evaluate(now);
}

void EngineImpl::Finish(uint32_t rank, Time now) {
  if (rank >= world_size) return;
  RankState& r = ranks[rank];
  if (r.state == WorkerState::kPending || r.state == WorkerState::kFinished) return;
  ChangeState(rank, WorkerState::kFinished, r.last_iteration, r.last_compute, now,
              "its trainer closed cleanly");
  SetCounted(rank, false);
  DrainRows(now);
  Evaluate(now);
}

void EngineImpl::Reset(Time now) {
  for (auto& r : ranks) {
    const bool has = r.has_progress;
    const uint64_t last = r.last_iteration;
    const bool attached = r.attached;
    r = RankState{};
    r.has_progress = has;  // keep deduplication across the reset
    r.last_iteration = last;
    r.attached = attached;  // streams are not part of the forgotten state
  }
  counted_ranks = 0;
  top_stale = true;  // a rank that was ahead counts its last iteration now
  created_at = now;
  NoteSeen(now);  // every rank pending again: timed from here
  log.ClearCounts();
  rows.Clear();  // rows start afresh with the next reports
  have_epoch = false;
  reference = MakeReference(*this);
  ahead_ranks = 0;
  have_threshold = false;
  threshold = baseline = 0;
  probation_active = false;
  blocked = 0;
  Emit(JobEvent(EventKind::kReset, now, Highest(), Newest().version,
                "job reset: every rank included, state forgotten"));
  // A working lineage: no floor a hello claimed, no version far ahead.
  hello_reported.reset();
  Rebase(now, "reset: the newest version took effect implausibly far ahead");
  // Through the membership gate like every change (Evaluate): with a rank no
  // stream speaks for, the release of the excluded ranks waits for it.
  const bool all_attached =
      std::all_of(ranks.begin(), ranks.end(), [](const RankState& r) { return r.attached; });
  if (all_attached) {
    withheld = false;
    Publish({}, now, "reset");
  } else {
    dirty = true;
    Evaluate(now);
  }
}

}  // namespace straggler::engine::internal
