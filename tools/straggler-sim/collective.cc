#include "collective.h"

#include <algorithm>
#include <cstdio>
#include <iostream>

namespace straggler_sim {
namespace {

std::string RankList(const std::vector<uint32_t>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s + "]";
}

// Steps kept after completion. A rank can only be one step behind the step
// that completed last (it has to arrive before the next one completes), so a
// few are plenty; the rest is garbage-collected to keep long runs small.
constexpr uint64_t kKeepSteps = 4;
// Violations printed in full; the count keeps going.
constexpr uint64_t kPrintedViolations = 5;

}  // namespace

Collective::Collective(uint64_t iterations, std::chrono::milliseconds step_timeout)
    : iterations_(iterations), step_timeout_(step_timeout) {}

bool Collective::Complete(const Step& step) const {
  return std::all_of(step.members.begin(), step.members.end(), [&](uint32_t m) {
    return std::find(step.arrived.begin(), step.arrived.end(), m) != step.arrived.end();
  });
}

Collective::Outcome Collective::Arrive(uint64_t iteration, uint32_t rank, uint64_t version,
                                       const std::vector<uint32_t>& members,
                                       double planned_seconds) {
  absl::MutexLock lock(&mu_);
  if (aborted_) return Outcome::kAborted;
  auto [it, fresh] = steps_.try_emplace(iteration);
  Step& step = it->second;
  if (fresh) {
    step.version = version;
    step.members = members;
    step.first_rank = rank;
  } else if (step.members == members && step.version != version) {
    if (++version_splits_ <= kPrintedViolations) {
      std::cerr << "straggler-sim: iteration " << iteration << ": rank " << rank
                << " used membership v" << version << ", rank " << step.first_rank << " v"
                << step.version << ", both " << RankList(members) << '\n';
    }
  } else if (step.members != members) {
    const uint64_t n = ++violations_;
    if (n <= kPrintedViolations) {
      std::cerr << "straggler-sim: AGREEMENT VIOLATION at iteration " << iteration << ": rank "
                << rank << " used membership v" << version << " " << RankList(members)
                << ", rank " << step.first_rank << " used v" << step.version << " "
                << RankList(step.members) << '\n';
    }
  }
  if (std::find(step.arrived.begin(), step.arrived.end(), rank) == step.arrived.end())
    step.arrived.push_back(rank);
  step.slowest_planned = std::max(step.slowest_planned, planned_seconds);

  if (Complete(step)) {
    if (completed_.load() < iteration + 1) {
      // Counted once per step, even if a disagreeing rank "completes" it again.
      critical_path_seconds_ += step.slowest_planned;
      if (on_completed_) on_completed_(iteration, step.members);
      completed_.store(iteration + 1, std::memory_order_release);
    }
    if (completed_.load() >= iterations_) finished_at_ = std::chrono::steady_clock::now();
    if (iteration >= kKeepSteps) steps_.erase(steps_.begin(), steps_.lower_bound(iteration - kKeepSteps));
    return Outcome::kCompleted;  // the waiters' conditions are re-checked as mu_ is released
  }

  const auto step_done = [&] { return aborted_.load() || completed_.load() > iteration; };
  const bool done = mu_.AwaitWithTimeout(absl::Condition(&step_done),
                                         absl::FromChrono(step_timeout_));
  if (aborted_) return Outcome::kAborted;
  if (!done) {
    ++timeouts_;
    // Only reachable when ranks disagree about who takes part (or a rank
    // died): report who was awaited, then stop every rank instead of hanging.
    std::vector<uint32_t> missing;
    auto current = steps_.find(iteration);
    if (current != steps_.end()) {
      for (uint32_t m : current->second.members) {
        const auto& a = current->second.arrived;
        if (std::find(a.begin(), a.end(), m) == a.end()) missing.push_back(m);
      }
    }
    abort_reason_ = "iteration " + std::to_string(iteration) + " did not complete within " +
                    std::to_string(step_timeout_.count()) + " ms; rank " + std::to_string(rank) +
                    " was waiting for ranks " + RankList(missing);
    aborted_ = true;
    return Outcome::kAborted;
  }
  return Outcome::kCompleted;
}

bool Collective::WaitCompleted(uint64_t steps) {
  absl::MutexLock lock(&mu_);
  const auto done = [&] { return aborted_.load() || completed_.load() >= steps; };
  mu_.Await(absl::Condition(&done));
  return !aborted_;
}

bool Collective::WaitCompletedFor(uint64_t steps, std::chrono::milliseconds timeout) {
  absl::MutexLock lock(&mu_);
  const auto done = [&] { return aborted_.load() || completed_.load() >= steps; };
  mu_.AwaitWithTimeout(absl::Condition(&done), absl::FromChrono(timeout));
  return !aborted_ && completed_.load() >= steps;
}

void Collective::Abort(const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (!aborted_) abort_reason_ = why;
  aborted_ = true;
}

std::string Collective::abort_reason() const {
  absl::MutexLock lock(&mu_);
  return abort_reason_;
}

double Collective::critical_path_seconds() const {
  absl::MutexLock lock(&mu_);
  return critical_path_seconds_;
}

std::chrono::steady_clock::time_point Collective::finished_at() const {
  absl::MutexLock lock(&mu_);
  return finished_at_;
}

}  // namespace straggler_sim
