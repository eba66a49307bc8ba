// Prometheus exposition of the daemon's metrics (straggler/common/metric_text.h,
// RenderDaemonMetrics) for one job of 10 000 ranks (issue 6, item 1): with
// per-rank series (per_rank_max_ranks raised to 10 000) and with the default
// (per-rank series only up to 4 096 ranks, so only job-level families here).
// The job is real: a JobRegistry job fed 10 complete iteration rows.
// BM_Collect and BM_Serialize split the per-rank scrape into building
// prometheus-cpp's data model (DaemonCollector) and writing it, with
// common::TextSerializer and, for comparison, prometheus-cpp 1.0.1's own.
// BM_IngestBatchObserve: the ingest path's histogram observation, contended.
//
//   metrics_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>

#include "config/config.h"
#include "registry/job_registry.h"
#include "metrics/daemon_metrics.h"
#include "straggler/common/metric_family.h"
#include "straggler/common/metric_text.h"
#include "metrics/stats.h"
#include "prometheus/text_serializer.h"

namespace {

namespace d = straggler::daemon;
namespace engine = straggler::engine;

class NullSubscriber final : public d::JobSubscriber {
 public:
  void OnMembershipChangedLocked(const d::Job::Locked&) override {}
  void CloseLocked(const absl::Status&) override {}
};

constexpr uint32_t kRanks = 10000;

// A JobRegistry of one job of kRanks ranks fed 10 rows; false (and the
// benchmark skipped) when the job cannot be made.
bool Fill(d::JobRegistry& registry, benchmark::State& state) {
  straggler::common::StreamHello hello;
  hello.job_id = "bench";
  hello.node = "bench";
  hello.world_size = kRanks;
  hello.ranks.resize(kRanks);
  std::iota(hello.ranks.begin(), hello.ranks.end(), 0u);
  engine::Time now{1'700'000'000'000'000'000};
  auto job = registry.Attach(hello, std::make_shared<NullSubscriber>(), now);
  if (!job.ok()) {
    state.SkipWithError(std::string(job.status().message()).c_str());
    return false;
  }
  {
    d::Job::Locked locked(**job);
    for (uint64_t it = 0; it < 10; ++it) {
      for (uint32_t r = 0; r < kRanks; ++r) {
        engine::Report rep;
        rep.rank = r;
        rep.iteration = it;
        rep.compute_seconds = 0.1 + 1e-6 * (r % 97);
        locked->engine.Ingest(rep, now);
      }
      now += std::chrono::milliseconds(100);
    }
    locked->engine.TakeEvents();
  }
  return true;
}

void BM_RenderDaemonMetrics(benchmark::State& state) {
  const bool per_rank = state.range(0) != 0;
  d::DaemonStats stats;
  d::JobRegistry registry(std::make_shared<const d::DaemonConfig>(), stats);
  if (!Fill(registry, state)) return;
  d::MetricsOptions options;
  options.version = "bench";
  if (per_rank) options.per_rank_max_ranks = kRanks;
  size_t bytes = 0;
  for (auto _ : state) {
    std::string text = d::RenderDaemonMetrics(registry, stats, options);
    bytes = text.size();
    benchmark::DoNotOptimize(text.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
  state.counters["bytes_per_scrape"] = static_cast<double>(bytes);
}
BENCHMARK(BM_RenderDaemonMetrics)->ArgName("per_rank")->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond);

d::MetricsOptions PerRank() {
  d::MetricsOptions options;
  options.version = "bench";
  options.per_rank_max_ranks = kRanks;
  return options;
}

void BM_Collect(benchmark::State& state) {
  d::DaemonStats stats;
  d::JobRegistry registry(std::make_shared<const d::DaemonConfig>(), stats);
  if (!Fill(registry, state)) return;
  const d::DaemonCollector collector(registry, stats, PerRank());
  size_t series = 0;
  for (auto _ : state) {
    auto families = collector.Collect();
    series = 0;
    for (const auto& f : families) series += f.metric.size();
    benchmark::DoNotOptimize(families.data());
  }
  state.counters["series"] = static_cast<double>(series);
}
BENCHMARK(BM_Collect)->Unit(benchmark::kMillisecond);

// Arg 0: common::TextSerializer; 1: prometheus::TextSerializer (1.0.1).
void BM_Serialize(benchmark::State& state) {
  d::DaemonStats stats;
  d::JobRegistry registry(std::make_shared<const d::DaemonConfig>(), stats);
  if (!Fill(registry, state)) return;
  const auto families = d::DaemonCollector(registry, stats, PerRank()).Collect();
  const straggler::common::TextSerializer ours;
  const prometheus::TextSerializer library;
  const prometheus::Serializer& serializer =
      state.range(0) == 0 ? static_cast<const prometheus::Serializer&>(ours) : library;
  size_t bytes = 0;
  for (auto _ : state) {
    std::string text = serializer.Serialize(families);
    bytes = text.size();
    benchmark::DoNotOptimize(text.data());
  }
  state.counters["bytes_per_scrape"] = static_cast<double>(bytes);
}
BENCHMARK(BM_Serialize)->ArgName("library")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// The ingest path's one histogram observation per ReportBatch
// (DaemonStats::ingest_batch_duration, IngestSession::Apply), from 1, 2 and
// 4 threads at once (the gRPC threads of several streams) on one shared
// DaemonStats. Durations cycle through 5 us .. 50 ms, crossing the buckets.
void BM_IngestBatchObserve(benchmark::State& state) {
  static d::DaemonStats stats;
  static constexpr double kDurations[] = {5e-6, 2e-5, 8e-5, 3e-4, 1e-3, 4e-3, 2e-2, 5e-2};
  size_t k = static_cast<size_t>(state.thread_index());
  for (auto _ : state) stats.ingest_batch_duration.Observe(kDurations[k++ & 7]);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_IngestBatchObserve)->Threads(1)->Threads(2)->Threads(4)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
