// Detection engine cost per report, for each policy, at 8, 1 000 and 100 000
// ranks (issue 6, item 1).
//
// Each benchmark iteration is one JobEngine::Ingest() of a healthy rank. The
// reports form complete iteration rows (every rank reports iteration i, then
// every rank reports i + 1, ...), which is how a synchronous job reports and
// what makes rows complete and get judged: the per-row work (minimum, median,
// counters, membership) is amortized over the row's reports exactly as in the
// daemon. Events are taken once per row, as the daemon does after each batch.
// Compute times are 100 ms with +-5 % deterministic noise, so after the first
// profile every policy judges every row and nobody is excluded (the steady
// state of a healthy job).
//
// BM_EngineRowPlanned: one whole row per benchmark iteration with a withheld
// straggler, so the exclusion is planned at every row (issue 18's planner).
//
//   engine_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine_inputs.h"
#include "peer_steps.h"
#include "straggler/engine/job_engine.h"
#include "straggler/engine/policy.h"

namespace {

using straggler::engine::JobEngine;
using straggler::engine::PolicyConfig;
using straggler::engine::PolicyKind;
using straggler::engine::Report;
using straggler::engine::Time;

using straggler::bench::NoiseTable;
using straggler::bench::Policy;

void BM_EngineIngest(benchmark::State& state, PolicyKind kind) {
  const uint32_t ranks = static_cast<uint32_t>(state.range(0));
  const std::vector<double> noise = NoiseTable();
  const Time start{1'700'000'000'000'000'000};
  JobEngine engine(ranks, Policy(kind), start);

  uint32_t rank = 0;
  uint64_t iteration = 0;
  Time now = start;
  size_t k = 0;
  auto ingest = [&] {
    Report r;
    r.rank = rank;
    r.iteration = iteration;
    r.compute_seconds = noise[k++ & 4095];
    auto result = engine.Ingest(r, now);
    benchmark::DoNotOptimize(result.accepted);
    if (++rank == ranks) {
      rank = 0;
      ++iteration;
      now += std::chrono::milliseconds(100);
      auto events = engine.TakeEvents();
      benchmark::DoNotOptimize(events.data());
    }
  };
  // Warm-up outside the timing: the first rows (profile, first judgements).
  const uint64_t warm_reports = static_cast<uint64_t>(ranks) * 8;
  for (uint64_t i = 0; i < warm_reports; ++i) ingest();

  for (auto _ : state) ingest();

  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
  const auto view = engine.View();
  // Sanity, visible in the output: every report accepted, nobody excluded.
  state.counters["excluded"] = static_cast<double>(view.excluded_ranks);
  state.counters["stragglers"] = static_cast<double>(view.straggler_ranks);
  if (view.reports_total != warm_reports + state.iterations())
    state.SkipWithError("a report was rejected");
}

BENCHMARK_CAPTURE(BM_EngineIngest, dynamic, PolicyKind::kDynamic)->Arg(8)->Arg(1000)->Arg(100000);
BENCHMARK_CAPTURE(BM_EngineIngest, ewma, PolicyKind::kEwma)->Arg(8)->Arg(1000)->Arg(100000);
BENCHMARK_CAPTURE(BM_EngineIngest, static, PolicyKind::kStatic)->Arg(8)->Arg(1000)->Arg(100000);
// The daemon's default policy.
BENCHMARK_CAPTURE(BM_EngineIngest, peer, PolicyKind::kPeer)->Arg(8)->Arg(1000)->Arg(100000);

// One complete row per benchmark iteration while a guard withholds a
// straggler: the engine then plans the exclusion at every row (Evaluate runs
// while anything is blocked), so this measures the per-row planning cost on
// top of the row's reports. Rank 3 reports 3x slower from the start; a
// min_throughput_gain no exclusion can reach keeps it withheld. range(1):
// 0 = pure data parallelism (no topology), 1 = hybrid: replicas of 8 ranks
// (rank / 8) in 8 peer groups "stage<rank % 8>".
void BM_EngineRowPlanned(benchmark::State& state, PolicyKind kind) {
  const uint32_t ranks = static_cast<uint32_t>(state.range(0));
  const bool hybrid = state.range(1) != 0;
  const std::vector<double> noise = NoiseTable();
  const Time start{1'700'000'000'000'000'000};
  PolicyConfig policy = Policy(kind);
  policy.min_throughput_gain = 1e9;
  JobEngine engine(ranks, policy, start);
  if (hybrid) {
    for (uint32_t r = 0; r < ranks; ++r) {
      straggler::engine::RankTopology t;
      t.replica = r / 8;
      t.peer_group = "stage" + std::to_string(r % 8);
      engine.SetTopology(r, t);
    }
  }
  uint64_t iteration = 0;
  Time now = start;
  size_t k = 0;
  auto row = [&] {
    for (uint32_t rank = 0; rank < ranks; ++rank) {
      Report r;
      r.rank = rank;
      r.iteration = iteration;
      r.compute_seconds = noise[k++ & 4095] * (rank == 3 ? 3.0 : 1.0);
      auto result = engine.Ingest(r, now);
      benchmark::DoNotOptimize(result.accepted);
    }
    ++iteration;
    now += std::chrono::milliseconds(100);
    auto events = engine.TakeEvents();
    benchmark::DoNotOptimize(events.data());
  };
  for (int i = 0; i < 40; ++i) row();  // profile, then rank 3 turns straggler

  for (auto _ : state) row();

  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
  const auto view = engine.View();
  state.counters["excluded"] = static_cast<double>(view.excluded_ranks);
  state.counters["stragglers"] = static_cast<double>(view.straggler_ranks);
  if (view.straggler_ranks == 0) state.SkipWithError("no straggler: nothing is withheld, nothing planned");
}

BENCHMARK_CAPTURE(BM_EngineRowPlanned, dynamic, PolicyKind::kDynamic)
    ->ArgNames({"ranks", "hybrid"})->ArgsProduct({{1000, 8000}, {0, 1}})->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_EngineRowPlanned, ewma, PolicyKind::kEwma)
    ->ArgNames({"ranks", "hybrid"})->ArgsProduct({{1000, 8000}, {0, 1}})->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_EngineRowPlanned, peer, PolicyKind::kPeer)
    ->ArgNames({"ranks", "hybrid"})->ArgsProduct({{1000, 8000}, {0, 1}})->Unit(benchmark::kMicrosecond);

// The daemon's max-throughput case (bench/loadgen_goals.sh `max`: 1 000 ranks
// over 4 streams, batches of 1 000, as fast as possible): each stream's batch
// holds 4 iterations of its 250 ranks, and the streams drift apart, so a row
// is judged once one stream is 3 iterations past it and the other streams'
// reports of it come late - judged alone (JudgeSingle). Here the streams
// report in step for 15 rounds (every rank placed in its group, profiles
// done), then stream s runs 8 (3 - s) iterations ahead: three reports in four
// are late, as the daemon's straggler_job_reports_late_total shows in that
// case (75%).
void BM_EngineLateStreams(benchmark::State& state, PolicyKind kind) {
  constexpr uint32_t kRanks = 1000, kStreams = 4, kPerStream = kRanks / kStreams;
  constexpr uint64_t kSpan = 4, kLag = 8;
  constexpr int kRoundReports = kRanks * kSpan, kWarmRounds = 15;
  const std::vector<double> noise = NoiseTable();
  const Time start{1'700'000'000'000'000'000};
  JobEngine engine(kRanks, Policy(kind), start);
  bool apart = false;
  uint64_t base = 0;  // the round's first iteration, before a stream's lead
  uint32_t stream = 0, rank = 0;
  uint64_t step = 0;  // iteration within the stream's batch
  Time now = start;
  size_t k = 0;
  auto ingest = [&] {
    Report r;
    r.rank = stream * kPerStream + rank;
    r.iteration = base + (apart ? kLag * (kStreams - 1 - stream) : 0) + step;
    r.compute_seconds = noise[k++ & 4095];
    auto result = engine.Ingest(r, now);
    benchmark::DoNotOptimize(result.accepted);
    if (++rank < kPerStream) return;
    rank = 0;
    if (++step < kSpan) return;
    step = 0;
    auto events = engine.TakeEvents();  // after each batch, as the daemon does
    benchmark::DoNotOptimize(events.data());
    if (++stream < kStreams) return;
    stream = 0;
    base += kSpan;
    now += std::chrono::milliseconds(100);
  };
  for (int i = 0; i < kWarmRounds * kRoundReports; ++i) ingest();
  apart = true;
  for (int i = 0; i < 2 * kRoundReports; ++i) ingest();
  const auto before = engine.View();

  for (auto _ : state) ingest();

  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
  const auto view = engine.View();
  const double reports = static_cast<double>(view.reports_total - before.reports_total);
  state.counters["late_share"] =
      static_cast<double>(view.reports_late_total - before.reports_late_total) / reports;
  state.counters["stragglers"] = static_cast<double>(view.straggler_ranks);
  if (view.reports_total - before.reports_total != static_cast<uint64_t>(state.iterations()))
    state.SkipWithError("a report was rejected");
}

BENCHMARK_CAPTURE(BM_EngineLateStreams, dynamic, PolicyKind::kDynamic);
BENCHMARK_CAPTURE(BM_EngineLateStreams, peer, PolicyKind::kPeer);

// A profile's median (10 values: peer_profile_iterations), as the profile's
// end takes two per rank: Median() (a sorting network up to 16 values)
// against the selection it uses above that (SelectMiddle: nth_element).
void BM_Median(benchmark::State& state, bool network) {
  // 2^16 log steps from a generator (not NoiseTable's 4 096, whose profiles
  // recur every 409 draws and let the branch predictor learn nth_element's
  // branches: it then looked faster than it is).
  std::vector<double> logs(size_t{1} << 16);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (double& l : logs) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    l = std::log(0.1 * (0.95 + 0.1 * static_cast<double>(x >> 11) / 9007199254740992.0));
  }
  std::vector<double> v(10);
  size_t k = 0;
  double sum = 0.0;
  for (auto _ : state) {
    // A fresh profile each time (SelectMiddle reorders): 10 of the 4 096.
    std::copy_n(logs.begin() + static_cast<std::ptrdiff_t>(k), v.size(), v.begin());
    k = (k + v.size()) % (logs.size() - v.size());
    sum += network ? straggler::engine::internal::Median(v)
                   : straggler::engine::internal::SelectMiddle(v, v.size() / 2, false);
  }
  benchmark::DoNotOptimize(sum);
}
BENCHMARK_CAPTURE(BM_Median, network, true);
BENCHMARK_CAPTURE(BM_Median, nth_element, false);

// std::log, each one waiting for the last (a report judged alone takes its
// log so) or independent of each other (a row takes its logs in one loop).
void BM_Log(benchmark::State& state, bool dependent) {
  const std::vector<double> noise = NoiseTable();
  double x = 0.1, sum = 0.0;
  size_t k = 0;
  for (auto _ : state) {
    if (dependent) {
      x = std::log(x + 2.0);
    } else {
      sum += std::log(noise[k++ & 4095]);
    }
  }
  benchmark::DoNotOptimize(x);
  benchmark::DoNotOptimize(sum);
}
BENCHMARK_CAPTURE(BM_Log, dependent, true);
BENCHMARK_CAPTURE(BM_Log, independent, false);

}  // namespace

BENCHMARK_MAIN();
