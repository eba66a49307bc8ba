// Shared helpers for the engine unit tests: a JobEngine driven by a fake,
// monotonically advancing clock, a one-call "feed this iteration row" helper
// and event filters.
//
//   Harness h(4, PolicyConfig{});
//   h.Rows(0, 5, /*epoch=*/0, Uniform(4, 1.0));   // iterations 0..4, all 1.0 s
//   h.Row(5, 0, With(Uniform(4, 1.0), 3, 3.0));   // rank 3 at 3.0 s
//   REQUIRE(h.engine().Worker(3).counter == 1);
//   REQUIRE(h.Count(EventKind::kReprofile) == 0);
//
// Not thread-safe; one Harness per test.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "straggler/engine/job_engine.h"
#include "straggler/engine/policy.h"

namespace straggler::engine {

// The defaults with kind pinned to dynamic: the tests written for the
// paper's rule (the daemon's default is peer since issue 17).
inline PolicyConfig DynamicPolicy() {
  PolicyConfig p;
  p.kind = PolicyKind::kDynamic;
  return p;
}

}  // namespace straggler::engine

namespace straggler::engine::testutil {

using namespace std::chrono_literals;

// A rank whose entry in a row is kSkip does not report that iteration.
inline constexpr double kSkip = -1.0;

inline std::vector<double> Uniform(uint32_t world, double seconds) {
  return std::vector<double>(world, seconds);
}

inline std::vector<double> With(std::vector<double> row, uint32_t rank, double seconds) {
  row.at(rank) = seconds;
  return row;
}

inline Report MakeReport(uint32_t rank, uint64_t epoch, uint64_t iteration, double compute,
                         Time start = Time{0}) {
  Report r;
  r.rank = rank;
  r.epoch = epoch;
  r.iteration = iteration;
  r.compute_seconds = compute;
  r.start_time = start;
  return r;
}

// A policy whose counters are not disturbed by exclusion or cool-down, for
// tests that pin the counter rule itself.
inline PolicyConfig CounterOnlyPolicy(PolicyConfig p = DynamicPolicy()) {
  p.exclusion_enabled = false;
  p.cooldown_iterations = 0;
  return p;
}

class Harness {
 public:
  static constexpr Time kStart = std::chrono::seconds(1'700'000'000);
  static constexpr Time kRowStep = 100ms;

  explicit Harness(uint32_t world, PolicyConfig policy = DynamicPolicy())
      : policy_(policy), now_(kStart), engine_(world, policy, now_) {
    INFO("policy must be valid: " << policy.Validate().ToString());
    REQUIRE(policy.Validate().ok());
  }

  JobEngine& engine() { return engine_; }
  const JobEngine& engine() const { return engine_; }
  Time now() const { return now_; }
  void Advance(Time d) { now_ += d; }

  // One report at the current time, without advancing it; the result is
  // returned unchecked. Events are collected.
  IngestResult Send(uint32_t rank, uint64_t epoch, uint64_t iteration, double compute) {
    auto r = engine_.Ingest(MakeReport(rank, epoch, iteration, compute, now_), now_);
    Collect();
    return r;
  }
  IngestResult Send(const Report& report) {
    auto r = engine_.Ingest(report, now_);
    Collect();
    return r;
  }

  // One report that must be accepted.
  void Feed(uint32_t rank, uint64_t epoch, uint64_t iteration, double compute) {
    auto r = Send(rank, epoch, iteration, compute);
    INFO("rank " << rank << " iteration " << iteration << " compute " << compute << ": "
                 << r.message);
    REQUIRE(r.accepted);
  }

  // Feeds iteration `iteration` of `epoch`: times[r] for every rank r in
  // ascending order (kSkip: rank r does not report). The clock advances by
  // kRowStep first; every report of the row carries the same time.
  void Row(uint64_t iteration, uint64_t epoch, const std::vector<double>& times) {
    now_ += kRowStep;
    for (uint32_t r = 0; r < times.size(); ++r) {
      if (times[r] < 0) continue;
      Feed(r, epoch, iteration, times[r]);
    }
  }

  // Iterations first .. first+count-1, all with the same per-rank times.
  void Rows(uint64_t first, uint64_t count, uint64_t epoch, const std::vector<double>& times) {
    for (uint64_t i = first; i < first + count; ++i) Row(i, epoch, times);
  }

  void Collect() {
    for (auto& e : engine_.TakeEvents()) events.push_back(std::move(e));
  }

  std::vector<Event> Of(EventKind kind, std::optional<uint32_t> rank = std::nullopt) const {
    std::vector<Event> out;
    for (const auto& e : events) {
      if (e.kind != kind) continue;
      if (rank && e.rank != *rank) continue;
      out.push_back(e);
    }
    return out;
  }
  size_t Count(EventKind kind, std::optional<uint32_t> rank = std::nullopt) const {
    return Of(kind, rank).size();
  }
  // State-change events of `rank` into state `to`.
  size_t Transitions(uint32_t rank, WorkerState to) const {
    size_t n = 0;
    for (const auto& e : Of(EventKind::kStateChange, rank)) n += (e.to == to);
    return n;
  }
  // State-change events of `rank` between healthy and straggler, either way
  // (what "flapping" counts).
  size_t Flips(uint32_t rank) const {
    size_t n = 0;
    for (const auto& e : Of(EventKind::kStateChange, rank)) {
      const bool hs = e.from == WorkerState::kHealthy && e.to == WorkerState::kStraggler;
      const bool sh = e.from == WorkerState::kStraggler && e.to == WorkerState::kHealthy;
      n += (hs || sh);
    }
    return n;
  }

  uint32_t Counter(uint32_t rank) const { return engine_.Worker(rank).counter; }
  WorkerState State(uint32_t rank) const { return engine_.Worker(rank).state; }
  bool Excluded(uint32_t rank) const { return engine_.membership().IsExcluded(rank); }

  std::vector<Event> events;  // everything taken from the engine so far

 private:
  PolicyConfig policy_;
  Time now_;
  JobEngine engine_;
};

// Deterministic noise (splitmix64 + Box-Muller): the same rows on every
// platform, no std:: distributions.
class Noise {
 public:
  explicit Noise(uint64_t seed) : s_(seed) {}
  double Uniform() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return static_cast<double>((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
  }
  double Gauss() {
    const double u = std::max(Uniform(), 1e-12), v = Uniform();
    return std::sqrt(-2 * std::log(u)) * std::cos(6.283185307179586 * v);
  }
  // A step of `base` seconds with coefficient of variation `cv`.
  double Step(double base, double cv) { return base * std::max(0.05, 1 + cv * Gauss()); }

 private:
  uint64_t s_;
};

// Iteration of `rank`'s first detection, or nullopt.
inline std::optional<uint64_t> Detected(const Harness& h, uint32_t rank) {
  for (const Event& e : h.Of(EventKind::kStateChange, rank))
    if (e.to == WorkerState::kStraggler) return e.iteration;
  return std::nullopt;
}

inline std::vector<uint32_t> ExcludedRanks(const Membership& m) {
  std::vector<uint32_t> out;
  for (const auto& e : m.excluded) out.push_back(e.rank);
  return out;
}

inline std::optional<ExclusionReason> ReasonOf(const Membership& m, uint32_t rank) {
  for (const auto& e : m.excluded)
    if (e.rank == rank) return e.reason;
  return std::nullopt;
}

inline bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace straggler::engine::testutil

// Readable enum values in Catch2 failure messages: every engine enum with
// an EnumName overload prints its name.
namespace straggler::engine::testutil {
inline std::string_view EnumName(WorkerState v) { return WorkerStateName(v); }
inline std::string_view EnumName(ExclusionReason v) { return ExclusionReasonName(v); }
inline std::string_view EnumName(EventKind v) { return EventKindName(v); }
inline std::string_view EnumName(RejectReason v) { return RejectReasonName(v); }
}  // namespace straggler::engine::testutil

namespace Catch {
template <class T>
struct StringMaker<T, std::void_t<decltype(straggler::engine::testutil::EnumName(std::declval<T>()))>> {
  static std::string convert(T v) { return std::string(straggler::engine::testutil::EnumName(v)); }
};
}  // namespace Catch
