// The Prometheus text exposition (straggler/common/metric_text.h and its neighbours, on prometheus-cpp): value formatting, escaping,
// name validation, histograms (cumulative buckets, +Inf, _sum, _count), a
// full small exposition byte for byte, and the daemon collector's per-rank
// cut-off and one-hot rank state, and the job step-time gauge.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "api/api.h"
#include "config/config.h"
#include "registry/job_registry.h"
#include "metrics/daemon_metrics.h"
#include "straggler/common/atomic_histogram.h"
#include "straggler/common/metric_family.h"
#include "straggler/common/metric_text.h"
#include "straggler/common/process_metrics.h"
#include "metrics/stats.h"
#include "registry_test_util.h"

namespace sd = straggler::daemon;
using straggler::daemon::testutil::IngestLocked;
using straggler::daemon::testutil::RecordingSubscriber;
using straggler::daemon::testutil::RegistryHello;

TEST_CASE("values: exact integers without exponent, specials, shortest round trip") {
  CHECK(straggler::common::FormatValue(0) == "0");
  CHECK(straggler::common::FormatValue(-0.0) == "0");
  CHECK(straggler::common::FormatValue(1) == "1");
  CHECK(straggler::common::FormatValue(-3) == "-3");
  CHECK(straggler::common::FormatValue(1e6) == "1000000");
  CHECK(straggler::common::FormatValue(9007199254740993.0) ==
        "9007199254740992");  // 2^53 + 1 rounds to 2^53
  CHECK(straggler::common::FormatValue(18446744073709551615.0) ==
        "18446744073709552000");  // >= 2^63
  CHECK(straggler::common::FormatValue(1e22) == "1e+22");
  CHECK(straggler::common::FormatValue(0.1) == "0.1");
  CHECK(straggler::common::FormatValue(1.5) == "1.5");
  CHECK(straggler::common::FormatValue(-0.25) == "-0.25");
  CHECK(straggler::common::FormatValue(0.1 + 0.2) == "0.30000000000000004");
  CHECK(straggler::common::FormatValue(123456.789) == "123456.789");
  CHECK(straggler::common::FormatValue(0.0001) == "0.0001");
  CHECK(straggler::common::FormatValue(0.00025) == "0.00025");
  CHECK(straggler::common::FormatValue(1e-5) == "1e-05");
  CHECK(straggler::common::FormatValue(2.5e-5) == "2.5e-05");
  CHECK(straggler::common::FormatValue(-1.25e-7) == "-1.25e-07");
  CHECK(straggler::common::FormatValue(5e-324) == "5e-324");
  CHECK(straggler::common::FormatValue(std::numeric_limits<double>::max()) ==
        "1.7976931348623157e+308");
  CHECK(straggler::common::FormatValue(std::numeric_limits<double>::infinity()) == "+Inf");
  CHECK(straggler::common::FormatValue(-std::numeric_limits<double>::infinity()) == "-Inf");
  CHECK(straggler::common::FormatValue(std::nan("")) == "NaN");

  // Every text reads back as the same double.
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> exponent(-30, 30);
  for (int i = 0; i < 10000; ++i) {
    const double v = std::pow(10.0, exponent(rng)) * (i % 2 ? 1 : -1);
    const std::string text = straggler::common::FormatValue(v);
    INFO(text);
    CHECK(std::strtod(text.c_str(), nullptr) == v);
  }
}

TEST_CASE("HELP and label values are escaped") {
  CHECK(straggler::common::EscapeHelp("a\\b\nc \"q\"") == "a\\\\b\\nc \"q\"");
  CHECK(straggler::common::EscapeLabelValue("a\\b\nc \"q\"") == "a\\\\b\\nc \\\"q\\\"");
  CHECK(straggler::common::EscapeLabelValue("plain-job_1.x") == "plain-job_1.x");
  CHECK(straggler::common::EscapeLabelValue("") == "");
}

TEST_CASE("metric and label names are validated") {
  CHECK(straggler::common::IsValidMetricName("straggler_jobs"));
  CHECK(straggler::common::IsValidMetricName("a:b_c9"));
  CHECK(straggler::common::IsValidMetricName("_x"));
  CHECK_FALSE(straggler::common::IsValidMetricName(""));
  CHECK_FALSE(straggler::common::IsValidMetricName("9x"));
  CHECK_FALSE(straggler::common::IsValidMetricName("a-b"));
  CHECK(straggler::common::IsValidLabelName("job"));
  CHECK(straggler::common::IsValidLabelName("_rank2"));
  CHECK_FALSE(straggler::common::IsValidLabelName(""));
  CHECK_FALSE(straggler::common::IsValidLabelName("__name__"));
  CHECK_FALSE(straggler::common::IsValidLabelName("a:b"));
  CHECK_FALSE(straggler::common::IsValidLabelName("2a"));
}

namespace {

namespace sc = straggler::common;
using prometheus::MetricFamily;
using prometheus::MetricType;

std::string Write(const std::vector<MetricFamily>& families, absl::Status* status = nullptr) {
  return sc::TextSerializer().Write(families, status);
}

}  // namespace

TEST_CASE("the serializer drops invalid names and repeated families, and says why") {
  std::vector<MetricFamily> bad;
  sc::AddSample(sc::AddFamily(bad, "bad-name", MetricType::Gauge, "x"), {}, 1);
  absl::Status status;
  CHECK(Write(bad, &status).empty());  // dropped with its samples
  CHECK_THAT(std::string(status.message()), Catch::Contains("bad-name"));

  std::vector<MetricFamily> labels;
  auto& ok = sc::AddFamily(labels, "ok_gauge", MetricType::Gauge, "x");
  sc::AddSample(ok, {{"bad label", "v"}}, 1);
  sc::AddSample(ok, {{"job", "a"}, {"job", "b"}}, 1);
  CHECK(Write(labels, &status) == "# HELP ok_gauge x\n# TYPE ok_gauge gauge\n");
  CHECK_THAT(std::string(status.message()), Catch::Contains("bad label"));

  std::vector<MetricFamily> twice;
  sc::AddSample(sc::AddFamily(twice, "x_total", MetricType::Counter, "x"), {}, 1);
  sc::AddSample(sc::AddFamily(twice, "x_total", MetricType::Counter, "x"), {}, 2);
  CHECK(Write(twice, &status) == "# HELP x_total x\n# TYPE x_total counter\nx_total 1\n");
  CHECK_THAT(std::string(status.message()), Catch::Contains("written twice"));

  std::vector<MetricFamily> le;
  sc::AtomicHistogram h{{1.0}};
  sc::AddHistogram(sc::AddFamily(le, "h", MetricType::Histogram, "x"), {{"le", "1"}}, h);
  CHECK(Write(le, &status) == "# HELP h x\n# TYPE h histogram\n");
  CHECK_FALSE(status.ok());

  std::vector<MetricFamily> fine;
  sc::AddSample(sc::AddFamily(fine, "u", MetricType::Untyped, "x"), {}, 2);
  CHECK(Write(fine, &status) == "# HELP u x\n# TYPE u untyped\nu 2\n");
  CHECK(status.ok());
}

TEST_CASE("histogram buckets are inclusive, cumulative and end in +Inf") {
  sc::AtomicHistogram h{{1, 2.5, 10}};
  for (double v : {0.5, 1.0, 1.0001, 2.5, 3.0, 10.0, 11.0, 1e300}) h.Observe(v);
  const prometheus::ClientMetric m = h.Collect();
  REQUIRE(m.histogram.bucket.size() == 4);
  CHECK(m.histogram.bucket[0].cumulative_count == 2);  // 0.5, 1.0 (le is inclusive)
  CHECK(m.histogram.bucket[1].cumulative_count == 4);  // 1.0001, 2.5
  CHECK(m.histogram.bucket[2].cumulative_count == 6);  // 3, 10
  CHECK(m.histogram.bucket[3].cumulative_count == 8);  // 11, 1e300
  CHECK(m.histogram.sample_count == 8);
  CHECK(m.histogram.bucket[3].upper_bound == std::numeric_limits<double>::infinity());
  // A NaN finds no bound: it is counted in +Inf only.
  sc::AtomicHistogram nan{{1}};
  nan.Observe(std::numeric_limits<double>::quiet_NaN());
  const prometheus::ClientMetric n = nan.Collect();
  CHECK(n.histogram.bucket[0].cumulative_count == 0);
  CHECK(n.histogram.bucket[1].cumulative_count == 1);

  std::vector<MetricFamily> out;
  sc::AtomicHistogram small{{0.25, 1}};
  small.Observe(0.25);
  small.Observe(0.5);
  small.Observe(4);
  sc::AddHistogram(sc::AddFamily(out, "lat_seconds", MetricType::Histogram, "Latency."),
                   {{"job", "a"}}, small);
  absl::Status status;
  CHECK(Write(out, &status) ==
        "# HELP lat_seconds Latency.\n"
        "# TYPE lat_seconds histogram\n"
        "lat_seconds_bucket{job=\"a\",le=\"0.25\"} 1\n"
        "lat_seconds_bucket{job=\"a\",le=\"1\"} 2\n"
        "lat_seconds_bucket{job=\"a\",le=\"+Inf\"} 3\n"
        "lat_seconds_sum{job=\"a\"} 4.75\n"
        "lat_seconds_count{job=\"a\"} 3\n");
  CHECK(status.ok());

  // A histogram of the data model without a +Inf bucket still gets one.
  std::vector<MetricFamily> bare;
  auto& f = sc::AddFamily(bare, "b", MetricType::Histogram, "x");
  prometheus::ClientMetric& m2 = f.metric.emplace_back();
  m2.histogram.bucket = {{1, 0.5}};
  m2.histogram.sample_count = 2;
  m2.histogram.sample_sum = 1.25;
  CHECK(Write(bare) ==
        "# HELP b x\n# TYPE b histogram\nb_bucket{le=\"0.5\"} 1\nb_bucket{le=\"+Inf\"} 2\n"
        "b_sum 1.25\nb_count 2\n");
}

TEST_CASE("a small exposition, byte for byte") {
  std::vector<MetricFamily> out;
  sc::AddSample(sc::AddFamily(out, "straggler_build_info", MetricType::Gauge, "Always 1."),
                {{"version", "0.1.0"}}, 1);
  auto& rejected = sc::AddFamily(out, "straggler_reports_rejected_total", MetricType::Counter,
                                 "Reports refused,\nby reason \\ kind.");
  sc::AddSample(rejected, {{"reason", "stale"}}, 3);
  sc::AddSample(rejected, {{"reason", "invalid_value"}}, 0);
  auto& compute =
      sc::AddFamily(out, "straggler_rank_compute_seconds", MetricType::Gauge, "Last compute time.");
  sc::AddSample(compute, {{"job", "we\"ird\\job\nx"}, {"rank", "0"}, {"node", ""}}, 0.125);
  sc::AddSample(compute, {{"job", "b"}, {"rank", "1"}, {"node", "n1"}},
                std::numeric_limits<double>::quiet_NaN());
  sc::AtomicHistogram h{{1e-5, 1e-4}};
  h.Observe(5e-6);
  h.Observe(5e-5);
  sc::AddHistogram(sc::AddFamily(out, "straggler_ingest_batch_duration_seconds",
                                 MetricType::Histogram, "Batch time."),
                   {}, h);
  sc::AddSample(sc::AddFamily(out, "process_start_time_seconds", MetricType::Gauge, "Start."), {},
                1700000000.5);
  absl::Status status;
  const std::string text = Write(out, &status);
  REQUIRE(status.ok());
  CHECK(text ==
        "# HELP straggler_build_info Always 1.\n"
        "# TYPE straggler_build_info gauge\n"
        "straggler_build_info{version=\"0.1.0\"} 1\n"
        "# HELP straggler_reports_rejected_total Reports refused,\\nby reason \\\\ kind.\n"
        "# TYPE straggler_reports_rejected_total counter\n"
        "straggler_reports_rejected_total{reason=\"stale\"} 3\n"
        "straggler_reports_rejected_total{reason=\"invalid_value\"} 0\n"
        "# HELP straggler_rank_compute_seconds Last compute time.\n"
        "# TYPE straggler_rank_compute_seconds gauge\n"
        "straggler_rank_compute_seconds{job=\"we\\\"ird\\\\job\\nx\",rank=\"0\",node=\"\"} 0.125\n"
        "straggler_rank_compute_seconds{job=\"b\",rank=\"1\",node=\"n1\"} NaN\n"
        "# HELP straggler_ingest_batch_duration_seconds Batch time.\n"
        "# TYPE straggler_ingest_batch_duration_seconds histogram\n"
        "straggler_ingest_batch_duration_seconds_bucket{le=\"1e-05\"} 1\n"
        "straggler_ingest_batch_duration_seconds_bucket{le=\"0.0001\"} 2\n"
        "straggler_ingest_batch_duration_seconds_bucket{le=\"+Inf\"} 2\n"
        "straggler_ingest_batch_duration_seconds_sum 5.5e-05\n"
        "straggler_ingest_batch_duration_seconds_count 2\n"
        "# HELP process_start_time_seconds Start.\n"
        "# TYPE process_start_time_seconds gauge\n"
        "process_start_time_seconds 1700000000.5\n");
  // The ostream overload of prometheus::Serializer writes the same text.
  std::ostringstream stream;
  static_cast<const prometheus::Serializer&>(sc::TextSerializer()).Serialize(stream, out);
  CHECK(stream.str() == text);
}

TEST_CASE("process metrics are read from /proc") {
  const sc::ProcessStats p = sc::ReadProcessStats();
  REQUIRE(p.cpu_seconds);
  REQUIRE(p.resident_memory_bytes);
  REQUIRE(p.virtual_memory_bytes);
  REQUIRE(p.open_fds);
  REQUIRE(p.start_time_seconds);
  CHECK(*p.resident_memory_bytes > 0);
  CHECK(*p.virtual_memory_bytes >= *p.resident_memory_bytes);
  CHECK(*p.open_fds >= 3);
  CHECK(*p.start_time_seconds > 1.6e9);  // after 2020
  absl::Status status;
  const std::string text = Write(sc::ProcessCollector().Collect(), &status);
  CHECK(status.ok());
  CHECK_THAT(text, Catch::Contains("# TYPE process_cpu_seconds_total counter\n"));
  CHECK_THAT(text, Catch::Contains("# TYPE process_open_fds gauge\n"));
}

TEST_CASE("the daemon collector: per-rank series up to per_rank_max_ranks, one-hot state") {
  sd::DaemonStats stats;
  sd::JobRegistry registry(std::make_shared<const sd::DaemonConfig>(), stats);
  const auto now = sd::WallNow();
  auto small = registry.Attach(RegistryHello("small", 2, {0, 1}, "n0"),
                               std::make_shared<RecordingSubscriber>(), now);
  REQUIRE(small.ok());
  IngestLocked(**small, /*rank=*/1, /*iteration=*/1, /*compute_seconds=*/0.5, now);
  REQUIRE(registry.Attach(RegistryHello("big", 3, {0}, "n0"),
                          std::make_shared<RecordingSubscriber>(), now)
              .ok());

  sd::MetricsOptions options;
  options.version = "9.9.9";
  options.per_rank_max_ranks = 2;
  const std::string text = sd::RenderDaemonMetrics(registry, stats, options);
  CHECK_THAT(text, Catch::Contains("straggler_build_info{version=\"9.9.9\"} 1\n"));
  CHECK_THAT(text, Catch::Contains("straggler_jobs 2\n"));
  CHECK_THAT(text, Catch::Contains("straggler_job_ranks{job=\"big\"} 3\n"));
  CHECK_THAT(text, Catch::Contains("straggler_job_ranks{job=\"small\"} 2\n"));
  CHECK_THAT(text, Catch::Contains(
                       "straggler_job_detection_latency_iterations_bucket{job=\"small\",le=\"89\"} 0\n"));
  CHECK_THAT(text, Catch::Contains(
                       "straggler_rank_compute_seconds{job=\"small\",rank=\"1\",node=\"n0\",peer_group=\"\",replica=\"\"} 0.5\n"));
  CHECK_THAT(text, Catch::Contains(
                       "straggler_rank_state{job=\"small\",rank=\"1\",node=\"n0\",peer_group=\"\",replica=\"\",state=\"pending\"} 0\n"
                       "straggler_rank_state{job=\"small\",rank=\"1\",node=\"n0\",peer_group=\"\",replica=\"\",state=\"healthy\"} 1\n"
                       "straggler_rank_state{job=\"small\",rank=\"1\",node=\"n0\",peer_group=\"\",replica=\"\",state=\"straggler\"} 0\n"
                       "straggler_rank_state{job=\"small\",rank=\"1\",node=\"n0\",peer_group=\"\",replica=\"\",state=\"unresponsive\"} 0\n"));
  // "big" (3 ranks > 2) keeps its job series only.
  CHECK_THAT(text, !Catch::Contains("straggler_rank_compute_seconds{job=\"big\""));
  CHECK_THAT(text, !Catch::Contains("straggler_rank_state{job=\"big\""));
  // Every reason and kind is there from the start.
  CHECK_THAT(text, Catch::Contains("straggler_reports_rejected_total{reason=\"batch_too_large\"} 0\n"));
  CHECK_THAT(text, Catch::Contains("straggler_events_total{kind=\"reprofile\"} 0\n"));

  options.per_rank_max_ranks = 0;
  CHECK_THAT(sd::RenderDaemonMetrics(registry, stats, options),
             !Catch::Contains("straggler_rank_compute_seconds{"));
}

TEST_CASE("the daemon collector: the job's step time is its slowest active rank's step") {
  sd::DaemonStats stats;
  sd::JobRegistry registry(std::make_shared<const sd::DaemonConfig>(), stats);
  const auto now = sd::WallNow();
  auto job = registry.Attach(RegistryHello("steps", 2, {0, 1}, "n0"),
                             std::make_shared<RecordingSubscriber>(), now);
  REQUIRE(job.ok());
  auto ingest = [&](uint32_t rank, uint64_t iteration, double compute, std::optional<double> step) {
    IngestLocked(**job, rank, iteration, compute, now, step);
  };
  sd::MetricsOptions options;
  // Nothing judged yet.
  CHECK_THAT(sd::RenderDaemonMetrics(registry, stats, options),
             Catch::Contains("straggler_job_step_seconds{job=\"steps\"} 0\n"));
  // Iteration 1: rank 0's step time (0.25) is above rank 1's compute (0.2).
  ingest(0, 1, 0.1, 0.25);
  ingest(1, 1, 0.2, std::nullopt);
  CHECK_THAT(sd::RenderDaemonMetrics(registry, stats, options),
             Catch::Contains("straggler_job_step_seconds{job=\"steps\"} 0.25\n"));
  // Iteration 2: rank 1 reports no step time; its compute (0.5) is the slowest.
  ingest(0, 2, 0.1, 0.3);
  ingest(1, 2, 0.5, std::nullopt);
  CHECK_THAT(sd::RenderDaemonMetrics(registry, stats, options),
             Catch::Contains("straggler_job_step_seconds{job=\"steps\"} 0.5\n"));
  // The same number through GetJob (gRPC and REST).
  straggler::v1::GetJobRequest request;
  request.set_job_id("steps");
  auto status = sd::api::GetJob(registry, request);
  REQUIRE(status.ok());
  CHECK(status->step_seconds() == 0.5);
}

TEST_CASE("the daemon collector: a rank in the gray zone is mild with its ratio and no straggler") {
  // Issue 33: rank 6 of 16 runs 1.15x its peers for good (no noise: the
  // group's threshold is peer_enter_ratio, 1.12x, below it; the straggler
  // ratio, 1.25x, above it). The daemon's default policy calls it mild.
  sd::DaemonStats stats;
  sd::JobRegistry registry(std::make_shared<const sd::DaemonConfig>(), stats);
  const auto now = sd::WallNow();
  std::vector<uint32_t> all(16);
  for (uint32_t r = 0; r < 16; ++r) all[r] = r;
  auto job = registry.Attach(RegistryHello("gray", 16, all, "n0"),
                             std::make_shared<RecordingSubscriber>(), now);
  REQUIRE(job.ok());
  for (uint64_t i = 1; i <= 60; ++i)
    for (uint32_t r = 0; r < 16; ++r) IngestLocked(**job, r, i, r == 6 ? 0.23 : 0.2, now);

  const std::string text = sd::RenderDaemonMetrics(registry, stats, sd::MetricsOptions{});
  CHECK_THAT(text, Catch::Contains("straggler_job_mild_ranks{job=\"gray\"} 1\n"));
  CHECK_THAT(text, Catch::Contains("straggler_job_straggler_ranks{job=\"gray\"} 0\n"));
  CHECK_THAT(text, Catch::Contains("straggler_rank_state{job=\"gray\",rank=\"6\",node=\"n0\","
                                   "peer_group=\"\",replica=\"\",state=\"mild\"} 1\n"));
  CHECK_THAT(text, Catch::Contains("straggler_rank_state{job=\"gray\",rank=\"6\",node=\"n0\","
                                   "peer_group=\"\",replica=\"\",state=\"straggler\"} 0\n"));
  CHECK_THAT(text, Catch::Contains("straggler_rank_state{job=\"gray\",rank=\"5\",node=\"n0\","
                                   "peer_group=\"\",replica=\"\",state=\"mild\"} 0\n"));
  CHECK_THAT(text, Catch::Contains("straggler_rank_slowdown_ratio{job=\"gray\",rank=\"6\""));

  // The same through the API (gRPC and REST): the state and the ratio.
  straggler::v1::GetJobRequest get_job;
  get_job.set_job_id("gray");
  const auto j = sd::api::GetJob(registry, get_job);
  REQUIRE(j.ok());
  CHECK(j->mild_ranks() == 1);
  CHECK(j->straggler_ranks() == 0);
  CHECK(j->excluded_ranks() == 0);
  straggler::v1::GetWorkerRequest get_worker;
  get_worker.set_job_id("gray");
  get_worker.set_rank(6);
  const auto w = sd::api::GetWorker(registry, get_worker);
  REQUIRE(w.ok());
  CHECK(w->state() == straggler::v1::WORKER_STATE_MILD);
  CHECK_FALSE(w->excluded());
  CHECK(w->slowdown_ratio() == Approx(1.15).margin(0.01));
}
