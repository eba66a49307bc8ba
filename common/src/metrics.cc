#include "straggler/common/metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "registry/job_registry.h"
#include "metrics/stats.h"

namespace straggler::daemon {

std::string_view MetricTypeName(MetricType t) {
  switch (t) {
    case MetricType::kCounter: return "counter";
    case MetricType::kGauge: return "gauge";
    case MetricType::kHistogram: return "histogram";
    case MetricType::kUntyped: return "untyped";
  }
  return "untyped";
}

namespace {

// Debian's abseil has its own string_view: convert explicitly for StrCat.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

bool IsAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

}  // namespace

bool IsValidMetricName(std::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (!(IsAlpha(c) || c == '_' || c == ':' || (i > 0 && IsDigit(c)))) return false;
  }
  return true;
}

bool IsValidLabelName(std::string_view name) {
  if (name.empty() || name.substr(0, 2) == "__") return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (!(IsAlpha(c) || c == '_' || (i > 0 && IsDigit(c)))) return false;
  }
  return true;
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  // Exact integers (every double of magnitude >= 2^52 is one) print as such.
  if (v == std::trunc(v) && std::fabs(v) < 9223372036854775808.0) {
    auto r = std::to_chars(buf, buf + sizeof buf, static_cast<int64_t>(v));
    return std::string(buf, r.ptr);
  }
  // Shortest round-trip digits, laid out as a plain decimal from 1e-4 up to
  // 1e21 and with an exponent outside (see metrics.h).
  auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string_view s(buf, static_cast<size_t>(r.ptr - buf));  // "-d.ddde+XX"
  const size_t e = s.find('e');
  std::string_view mantissa = s.substr(0, e);
  std::string_view exp_text = s.substr(e + 1);
  const bool exp_negative = exp_text.front() == '-';
  exp_text.remove_prefix(1);  // to_chars always writes the sign
  int exp = 0;
  std::from_chars(exp_text.data(), exp_text.data() + exp_text.size(), exp);
  if (exp_negative) exp = -exp;
  std::string out;
  if (mantissa.front() == '-') {
    out = "-";
    mantissa.remove_prefix(1);
  }
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits += c;
  }
  if (exp < -4 || exp >= 21) {
    out += digits[0];
    if (digits.size() > 1) absl::StrAppend(&out, ".", digits.substr(1));
    out += exp < 0 ? "e-" : "e+";
    const int a = std::abs(exp);
    if (a < 10) out += '0';
    absl::StrAppend(&out, a);
  } else if (exp < 0) {
    absl::StrAppend(&out, "0.", std::string(static_cast<size_t>(-exp - 1), '0'), digits);
  } else {
    const size_t int_digits = static_cast<size_t>(exp) + 1;
    if (digits.size() <= int_digits) {
      absl::StrAppend(&out, digits, std::string(int_digits - digits.size(), '0'));
    } else {
      absl::StrAppend(&out, digits.substr(0, int_digits), ".", digits.substr(int_digits));
    }
  }
  return out;
}

std::string EscapeHelp(std::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string EscapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// ------------------------------------------------------------------ Histogram

uint64_t HistogramSnapshot::count() const {
  uint64_t n = 0;
  for (uint64_t c : counts) n += c;
  return n;
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)),
      counts_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {}

void Histogram::Observe(double v) {
  if (std::isnan(v)) return;
  const size_t i =
      static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

HistogramSnapshot Histogram::Snapshot() const {
  HistogramSnapshot s;
  s.upper_bounds = bounds_;
  s.counts.resize(bounds_.size() + 1);
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    s.counts[i] = counts_[i].load(std::memory_order_relaxed);
  }
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

const std::vector<double>& IngestBatchDurationBuckets() {
  static const std::vector<double> buckets = {1e-5,   2.5e-5, 5e-5,   1e-4, 2.5e-4,
                                              5e-4,   1e-3,   2.5e-3, 5e-3, 1e-2,
                                              2.5e-2, 5e-2,   1e-1};
  return buckets;
}

const std::vector<double>& DetectionLatencyBuckets() {
  static const std::vector<double> buckets = {1, 2, 3, 5, 8, 13, 21, 34, 55, 89};
  return buckets;
}

// ----------------------------------------------------------------- Exposition

void Exposition::Error(absl::Status s) {
  if (status_.ok()) status_ = std::move(s);
}

void Exposition::Family(std::string_view name, MetricType type, std::string_view help) {
  family_.clear();
  if (!IsValidMetricName(name)) {
    Error(absl::InvalidArgumentError(absl::StrCat("invalid metric name '", Sv(name), "'")));
    return;
  }
  if (std::find(seen_.begin(), seen_.end(), name) != seen_.end()) {
    Error(absl::InvalidArgumentError(absl::StrCat("metric family '", Sv(name), "' written twice")));
    return;
  }
  seen_.emplace_back(name);
  family_ = std::string(name);
  type_ = type;
  absl::StrAppend(&out_, "# HELP ", Sv(name), " ", EscapeHelp(help), "\n", "# TYPE ", Sv(name),
                  " ", Sv(MetricTypeName(type)), "\n");
}

bool Exposition::Open(MetricType want) {
  if (family_.empty()) {
    Error(absl::FailedPreconditionError("sample written outside a (valid) metric family"));
    return false;
  }
  if ((want == MetricType::kHistogram) != (type_ == MetricType::kHistogram)) {
    Error(absl::FailedPreconditionError(
        absl::StrCat("family '", family_, "' is a ", Sv(MetricTypeName(type_)),
                     want == MetricType::kHistogram ? ": not a histogram" : ": needs Histogram()")));
    return false;
  }
  return true;
}

bool Exposition::ValidLabels(const Labels& labels) {
  for (size_t i = 0; i < labels.size(); ++i) {
    const std::string_view name = labels[i].first;
    // `le` belongs to the histogram's buckets.
    if (!IsValidLabelName(name) || (name == "le" && type_ == MetricType::kHistogram)) {
      Error(absl::InvalidArgumentError(
          absl::StrCat("invalid label name '", Sv(name), "' in family '", family_, "'")));
      return false;
    }
    for (size_t k = 0; k < i; ++k) {
      if (labels[k].first == name) {
        Error(absl::InvalidArgumentError(
            absl::StrCat("label '", Sv(name), "' repeated in family '", family_, "'")));
        return false;
      }
    }
  }
  return true;
}

void Exposition::Line(std::string_view suffix, const Labels& labels, const Label* extra,
                      const std::string& value) {
  absl::StrAppend(&out_, family_, Sv(suffix));
  if (!labels.empty() || extra != nullptr) {
    out_ += '{';
    bool first = true;
    auto put = [&](const Label& l) {
      if (!first) out_ += ',';
      first = false;
      absl::StrAppend(&out_, Sv(l.first), "=\"", EscapeLabelValue(l.second), "\"");
    };
    for (const auto& l : labels) put(l);
    if (extra != nullptr) put(*extra);
    out_ += '}';
  }
  absl::StrAppend(&out_, " ", value, "\n");
}

void Exposition::Sample(const Labels& labels, double value) {
  if (!Open(MetricType::kGauge) || !ValidLabels(labels)) return;
  Line("", labels, nullptr, FormatValue(value));
}

void Exposition::Histogram(const Labels& labels, const HistogramSnapshot& h) {
  if (!Open(MetricType::kHistogram) || !ValidLabels(labels)) return;
  uint64_t cumulative = 0;
  for (size_t i = 0; i < h.upper_bounds.size(); ++i) {
    cumulative += i < h.counts.size() ? h.counts[i] : 0;
    const std::string le = FormatValue(h.upper_bounds[i]);
    const Label extra{"le", le};
    Line("_bucket", labels, &extra, absl::StrCat(cumulative));
  }
  if (h.counts.size() > h.upper_bounds.size()) cumulative += h.counts[h.upper_bounds.size()];
  const Label inf{"le", "+Inf"};
  Line("_bucket", labels, &inf, absl::StrCat(cumulative));
  Line("_sum", labels, nullptr, FormatValue(h.sum));
  Line("_count", labels, nullptr, absl::StrCat(cumulative));
}

// -------------------------------------------------------------------- process

namespace {

std::optional<std::string> ReadFile(const char* path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// "VmRSS:     1234 kB" -> 1234 * 1024.
std::optional<double> StatusKb(const std::string& status, std::string_view key) {
  size_t pos = 0;
  while (pos < status.size()) {
    size_t end = status.find('\n', pos);
    if (end == std::string::npos) end = status.size();
    std::string_view line(status.data() + pos, end - pos);
    if (line.substr(0, key.size()) == key && line.size() > key.size() &&
        line[key.size()] == ':') {
      std::istringstream in{std::string(line.substr(key.size() + 1))};
      double kb = 0;
      if (in >> kb) return kb * 1024.0;
      return std::nullopt;
    }
    pos = end + 1;
  }
  return std::nullopt;
}

}  // namespace

ProcessStats ReadProcessStats() {
  ProcessStats p;
  const long ticks = sysconf(_SC_CLK_TCK);
  if (auto stat = ReadFile("/proc/self/stat"); stat && ticks > 0) {
    // Fields after "(comm)", which may itself hold spaces and parentheses.
    const size_t close = stat->rfind(')');
    if (close != std::string::npos) {
      std::istringstream in(stat->substr(close + 1));
      std::vector<std::string> f;
      for (std::string field; in >> field;) f.push_back(field);
      // f[0] is field 3 (state): utime = field 14, stime = 15, starttime = 22.
      if (f.size() > 19) {
        double utime = 0, stime = 0, start = 0;
        if (absl::SimpleAtod(f[11], &utime) && absl::SimpleAtod(f[12], &stime)) {
          p.cpu_seconds = (utime + stime) / static_cast<double>(ticks);
        }
        if (absl::SimpleAtod(f[19], &start)) {
          if (auto proc_stat = ReadFile("/proc/stat")) {
            const size_t at = proc_stat->find("\nbtime ");
            double btime = 0;
            if (at != std::string::npos) {
              std::istringstream b(proc_stat->substr(at + 7));
              if (b >> btime) p.start_time_seconds = btime + start / static_cast<double>(ticks);
            }
          }
        }
      }
    }
  }
  if (auto status = ReadFile("/proc/self/status")) {
    p.resident_memory_bytes = StatusKb(*status, "VmRSS");
    p.virtual_memory_bytes = StatusKb(*status, "VmSize");
  }
  if (DIR* dir = opendir("/proc/self/fd")) {
    double n = 0;
    while (const dirent* e = readdir(dir)) {
      if (e->d_name[0] != '.') ++n;
    }
    closedir(dir);
    p.open_fds = n - 1;  // not counting the descriptor of the listing itself
  }
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    p.max_fds = static_cast<double>(limit.rlim_cur);
  }
  return p;
}

void WriteProcessMetrics(const ProcessStats& p, Exposition& out) {
  auto one = [&](const char* name, MetricType type, const char* help,
                 const std::optional<double>& v) {
    if (!v) return;
    out.Family(name, type, help);
    out.Sample({}, *v);
  };
  one("process_cpu_seconds_total", MetricType::kCounter,
      "Total user and system CPU time spent in seconds.", p.cpu_seconds);
  one("process_resident_memory_bytes", MetricType::kGauge, "Resident memory size in bytes.",
      p.resident_memory_bytes);
  one("process_virtual_memory_bytes", MetricType::kGauge, "Virtual memory size in bytes.",
      p.virtual_memory_bytes);
  one("process_open_fds", MetricType::kGauge, "Number of open file descriptors.", p.open_fds);
  one("process_max_fds", MetricType::kGauge, "Maximum number of open file descriptors.",
      p.max_fds);
  one("process_start_time_seconds", MetricType::kGauge,
      "Start time of the process since unix epoch in seconds.", p.start_time_seconds);
}

// --------------------------------------------------------------------- daemon

namespace {

constexpr engine::WorkerState kAllStates[] = {
    engine::WorkerState::kPending, engine::WorkerState::kHealthy,
    engine::WorkerState::kStraggler, engine::WorkerState::kUnresponsive,
    engine::WorkerState::kFinished};

constexpr engine::EventKind kAllEventKinds[] = {
    engine::EventKind::kStateChange,   engine::EventKind::kMembership,
    engine::EventKind::kGuardBlocked,  engine::EventKind::kPolicyChanged,
    engine::EventKind::kOverride,      engine::EventKind::kReset,
    engine::EventKind::kReprofile,     engine::EventKind::kMembershipWithheld};

struct RankRow {
  std::string rank;  // label text
  std::string node;
  engine::WorkerView w;
  std::optional<v1::GpuTelemetry> gpu;  // fresh telemetry only
  std::string gpu_label;                // NVML index of that GPU
};

struct JobRow {
  std::string id;
  engine::JobView view;
  uint64_t membership_version = 0;
  uint32_t streams = 0;
  HistogramSnapshot latency;
  std::vector<RankRow> ranks;  // empty above per_rank_max_ranks
};

// Copies one job's numbers; the only place the renderer holds a job's mutex.
std::optional<JobRow> Copy(const Job& job, uint32_t per_rank_max_ranks) {
  const engine::Time now = WallNow();
  JobRow row;
  row.id = job.id;
  const bool per_rank = job.world_size <= per_rank_max_ranks;
  if (per_rank) row.ranks.resize(job.world_size);
  std::lock_guard lock(job.mu);
  if (job.removed.load()) return std::nullopt;
  row.view = job.engine.View();
  row.membership_version = job.engine.membership().version;
  row.streams = job.streams;
  row.latency = job.detection_latency.Snapshot();
  if (per_rank) {
    for (uint32_t r = 0; r < job.world_size; ++r) {
      row.ranks[r].w = job.engine.Worker(r);
      row.ranks[r].node = job.nodes[r];
      // Stale telemetry is left out: a GPU whose agent went silent must not
      // keep an alert firing on its last reading.
      if (const v1::GpuTelemetry* t = job.FreshTelemetryLocked(r, now)) row.ranks[r].gpu = *t;
    }
  }
  return row;
}

}  // namespace

std::string RenderDaemonMetrics(const JobRegistry& registry, const DaemonStats& stats,
                                const MetricsOptions& options) {
  std::vector<JobRow> jobs;
  for (const auto& job : registry.Jobs()) {
    if (auto row = Copy(*job, options.per_rank_max_ranks)) jobs.push_back(*std::move(row));
  }
  // No lock from here on.
  for (JobRow& j : jobs) {
    for (size_t r = 0; r < j.ranks.size(); ++r) {
      j.ranks[r].rank = absl::StrCat(r);
      if (j.ranks[r].gpu) j.ranks[r].gpu_label = absl::StrCat(j.ranks[r].gpu->gpu_index());
    }
  }

  Exposition out;
  out.Family("straggler_build_info", MetricType::kGauge,
             "Always 1; the version label names the stragglerd build.");
  out.Sample({{"version", options.version}}, 1);
  out.Family("straggler_jobs", MetricType::kGauge, "Jobs tracked.");
  out.Sample({}, static_cast<double>(jobs.size()));
  out.Family("straggler_active_streams", MetricType::kGauge, "Open ingest streams.");
  out.Sample({}, static_cast<double>(stats.active_streams.load(std::memory_order_relaxed)));
  // The family always (its TYPE says what it is, as the GPU families do); a
  // sample only with TLS, where there is a certificate.
  out.Family("straggler_tls_certificate_expiry_seconds", MetricType::kGauge,
             "Unix time at which the serving certificate (tls.cert_file's leaf) expires; "
             "no sample without TLS.");
  if (const int64_t not_after = stats.tls_certificate_not_after.load(std::memory_order_relaxed);
      not_after != 0) {
    out.Sample({}, static_cast<double>(not_after));
  }
  out.Family("straggler_http_rejected_total", MetricType::kCounter,
             "HTTP requests answered with a status >= 400, by status.");
  for (size_t i = 0; i < stats.http_rejected.size(); ++i) {
    out.Sample({{"code", i < kHttpRejectStatuses.size() ? std::to_string(kHttpRejectStatuses[i])
                                                         : std::string("other")}},
               static_cast<double>(stats.http_rejected[i].load(std::memory_order_relaxed)));
  }
  out.Family("straggler_http_slow_clients_total", MetricType::kCounter,
             "HTTP connections closed for a request or response slower than the timeouts.");
  out.Sample({{"phase", "request"}},
             static_cast<double>(stats.http_slow_clients[0].load(std::memory_order_relaxed)));
  out.Sample({{"phase", "response"}},
             static_cast<double>(stats.http_slow_clients[1].load(std::memory_order_relaxed)));
  out.Family("straggler_streams_refused_total", MetricType::kCounter,
             "Ingest streams ended before taking a report, by reason.");
  for (size_t i = 0; i < kStreamRefuseReasons; ++i) {
    out.Sample({{"reason", StreamRefuseReasonName(static_cast<StreamRefuseReason>(i))}},
               static_cast<double>(stats.streams_refused[i].load(std::memory_order_relaxed)));
  }
  out.Family("straggler_hello_claims_dropped_total", MetricType::kCounter,
             "Hellos whose reported_iteration the stream's first reports showed false.");
  out.Sample({}, static_cast<double>(stats.hello_claims_dropped.load(std::memory_order_relaxed)));
  out.Family("straggler_reports_accepted_total", MetricType::kCounter,
             "Reports taken, all jobs.");
  out.Sample({}, static_cast<double>(stats.reports_accepted.load(std::memory_order_relaxed)));

  out.Family("straggler_reports_rejected_total", MetricType::kCounter,
             "Reports refused, by reason (duplicate and stale are replays, not sender errors).");
  for (size_t i = 1; i < kEngineRejectReasons; ++i) {  // 0 is kNone
    const auto reason = static_cast<engine::RejectReason>(i);
    out.Sample({{"reason", engine::RejectReasonName(reason)}},
               static_cast<double>(stats.reports_rejected[i].load(std::memory_order_relaxed)));
  }
  for (size_t i = 0; i < kStreamRejectReasons; ++i) {
    const auto reason = static_cast<StreamRejectReason>(i);
    out.Sample({{"reason", StreamRejectReasonName(reason)}},
               static_cast<double>(
                   stats.reports_rejected_stream[i].load(std::memory_order_relaxed)));
  }

  out.Family("straggler_events_total", MetricType::kCounter, "Events journaled, by kind.");
  for (engine::EventKind kind : kAllEventKinds) {
    out.Sample({{"kind", engine::EventKindName(kind)}},
               static_cast<double>(stats.events_by_kind[static_cast<size_t>(kind)].load(
                   std::memory_order_relaxed)));
  }

  // Always present (0 without persistence), so an alert needs no absent().
  out.Family("straggler_state_db_events_dropped_total", MetricType::kCounter,
             "Events not persisted because the state database writer's queue was full.");
  out.Sample({}, static_cast<double>(stats.state_db_events_dropped.load(std::memory_order_relaxed)));
  out.Family("straggler_state_db_errors_total", MetricType::kCounter,
             "State database writes or reads that failed (event batches, memberships, "
             "overrides, sequence reservations, retention).");
  out.Sample({}, static_cast<double>(stats.state_db_errors.load(std::memory_order_relaxed) +
                                     registry.state_db_writer_errors()));

  out.Family("straggler_active_watches", MetricType::kGauge, "Open WatchMembership streams.");
  out.Sample({}, static_cast<double>(stats.active_watches.load(std::memory_order_relaxed)));
  out.Family("straggler_watch_versions_skipped_total", MetricType::kCounter,
             "Membership versions a WatchMembership stream never sent: a newer one replaced "
             "them while the watcher was not reading.");
  out.Sample({}, static_cast<double>(stats.watch_versions_skipped.load(std::memory_order_relaxed)));
  out.Family("straggler_grpc_refused_total", MetricType::kCounter,
             "Unary gRPC calls (query, admin, rendezvous) ended with an error, by service and "
             "status code; a series appears with its first refusal.");
  for (size_t i = 0; i < stats.grpc_refused.size(); ++i) {
    const uint64_t n = stats.grpc_refused[i].load(std::memory_order_relaxed);
    if (n == 0) continue;  // 3 x 16 series of zeros would say nothing
    out.Sample({{"service", GrpcServiceName(static_cast<GrpcService>(i / kGrpcCodes))},
                {"code", absl::StatusCodeToString(static_cast<absl::StatusCode>(i % kGrpcCodes))}},
               static_cast<double>(n));
  }
  out.Family("straggler_auth_rejected_total", MetricType::kCounter,
             "gRPC calls and HTTP requests refused for a missing or wrong bearer token.");
  out.Sample({}, static_cast<double>(stats.auth_rejected.load(std::memory_order_relaxed)));

  out.Family("straggler_ingest_batch_duration_seconds", MetricType::kHistogram,
             "Time to process one ReportBatch, under the job's lock.");
  out.Histogram({}, stats.ingest_batch_duration.Snapshot());

  // Per job.
  auto per_job = [&](const char* name, MetricType type, const char* help, auto value) {
    out.Family(name, type, help);
    for (const JobRow& j : jobs) out.Sample({{"job", j.id}}, static_cast<double>(value(j)));
  };
  per_job("straggler_job_ranks", MetricType::kGauge, "World size.",
          [](const JobRow& j) { return j.view.world_size; });
  // Alert rules join on it (`and on(job) straggler_job_running == 1`) so a
  // job that ended does not keep alerting until it is removed as idle.
  per_job("straggler_job_running", MetricType::kGauge,
          "1 while the job's current run has a rank that has not finished cleanly, else 0.",
          [](const JobRow& j) { return j.view.finished_ranks < j.view.world_size ? 1 : 0; });
  per_job("straggler_job_finished_ranks", MetricType::kGauge,
          "Ranks whose trainer closed cleanly (state finished).",
          [](const JobRow& j) { return j.view.finished_ranks; });
  per_job("straggler_job_active_ranks", MetricType::kGauge,
          "Ranks taking part in the collective (newest membership).",
          [](const JobRow& j) { return j.view.active_ranks; });
  per_job("straggler_job_excluded_ranks", MetricType::kGauge,
          "Ranks left out (newest membership).",
          [](const JobRow& j) { return j.view.excluded_ranks; });
  per_job("straggler_job_straggler_ranks", MetricType::kGauge,
          "Ranks classified straggler (excluded or withheld by a guard).",
          [](const JobRow& j) { return j.view.straggler_ranks; });
  per_job("straggler_job_unresponsive_ranks", MetricType::kGauge,
          "Ranks that stopped reporting.",
          [](const JobRow& j) { return j.view.unresponsive_ranks; });
  per_job("straggler_job_detached_ranks", MetricType::kGauge,
          "Ranks no report stream speaks for (not yet connected, or gone).",
          [](const JobRow& j) { return j.view.detached_ranks; });
  per_job("straggler_job_membership_withheld", MetricType::kGauge,
          "1 while a change of the excluded set waits for detached ranks.",
          [](const JobRow& j) { return j.view.membership_withheld ? 1 : 0; });
  per_job("straggler_job_threshold_seconds", MetricType::kGauge,
          "Current judging threshold (0 before the first profile).",
          [](const JobRow& j) { return j.view.threshold_seconds; });
  per_job("straggler_job_baseline_seconds", MetricType::kGauge,
          "Reference speed (profiled fastest-rank mean, or median EWMA).",
          [](const JobRow& j) { return j.view.baseline_seconds; });
  per_job("straggler_job_step_seconds", MetricType::kGauge,
          "Step time of the newest judged iteration: the slowest active rank's step_seconds "
          "(compute_seconds where no step time is reported). The job steps at this speed; "
          "against straggler_job_baseline_seconds it shows the time a straggler costs.",
          [](const JobRow& j) { return j.view.step_seconds; });
  per_job("straggler_job_membership_version", MetricType::kGauge, "Newest membership version.",
          [](const JobRow& j) { return j.membership_version; });
  per_job("straggler_job_streams", MetricType::kGauge, "Open report streams.",
          [](const JobRow& j) { return j.streams; });
  per_job("straggler_job_reports_total", MetricType::kCounter, "Reports accepted.",
          [](const JobRow& j) { return j.view.reports_total; });
  per_job("straggler_job_detections_total", MetricType::kCounter,
          "Healthy to straggler transitions.",
          [](const JobRow& j) { return j.view.detections_total; });
  per_job("straggler_job_recoveries_total", MetricType::kCounter,
          "Straggler to healthy transitions.",
          [](const JobRow& j) { return j.view.recoveries_total; });
  per_job("straggler_job_guard_blocks_total", MetricType::kCounter,
          "Exclusions withheld by a guard.",
          [](const JobRow& j) { return j.view.guard_blocks_total; });
  out.Family("straggler_job_detection_latency_iterations", MetricType::kHistogram,
             "Iterations from the first slow step of an episode to the detection.");
  for (const JobRow& j : jobs) out.Histogram({{"job", j.id}}, j.latency);

  // Per rank, for jobs up to metrics.per_rank_max_ranks.
  auto per_rank = [&](const char* name, const char* help, auto value) {
    out.Family(name, MetricType::kGauge, help);
    for (const JobRow& j : jobs) {
      for (const RankRow& r : j.ranks) {
        out.Sample({{"job", j.id}, {"rank", r.rank}, {"node", r.node}},
                   static_cast<double>(value(r.w)));
      }
    }
  };
  per_rank("straggler_rank_compute_seconds", "Last reported compute time.",
           [](const engine::WorkerView& w) { return w.last_compute_seconds; });
  per_rank("straggler_rank_ewma_compute_seconds", "EWMA of the compute time.",
           [](const engine::WorkerView& w) { return w.ewma_compute_seconds; });
  per_rank("straggler_rank_slow_score", "The bounded counter (recent slow steps).",
           [](const engine::WorkerView& w) { return w.counter; });
  per_rank("straggler_rank_slow_score_limit",
           "The counter's limit: the rank is a straggler at this value.",
           [](const engine::WorkerView& w) { return w.limit; });
  per_rank("straggler_rank_slowdown_ratio", "EWMA over the job baseline (0 before a baseline).",
           [](const engine::WorkerView& w) { return w.slowdown_ratio; });
  per_rank("straggler_rank_excluded", "1 when left out of the newest membership.",
           [](const engine::WorkerView& w) { return w.excluded ? 1 : 0; });
  out.Family("straggler_rank_state", MetricType::kGauge,
             "1 for the rank's state (pending, healthy, straggler, unresponsive), 0 for the "
             "others.");
  for (const JobRow& j : jobs) {
    for (const RankRow& r : j.ranks) {
      for (engine::WorkerState s : kAllStates) {
        out.Sample({{"job", j.id}, {"rank", r.rank}, {"node", r.node},
                    {"state", engine::WorkerStateName(s)}},
                   r.w.state == s ? 1 : 0);
      }
    }
  }

  // GPU telemetry per rank (agent, NVML): only ranks with a fresh sample,
  // only the values the GPU measures; labels job, rank, node, gpu.
  auto per_gpu = [&](const char* name, const char* help, auto value) {
    out.Family(name, MetricType::kGauge, help);
    for (const JobRow& j : jobs) {
      for (const RankRow& r : j.ranks) {
        if (!r.gpu) continue;
        if (std::optional<double> v = value(*r.gpu)) {
          out.Sample({{"job", j.id}, {"rank", r.rank}, {"node", r.node}, {"gpu", r.gpu_label}}, *v);
        }
      }
    }
  };
  using T = v1::GpuTelemetry;
  auto field = [](bool has, double v) { return has ? std::optional<double>(v) : std::nullopt; };
  auto reason = [](const T& t, uint64_t bits) {
    return t.has_clock_event_reasons()
               ? std::optional<double>((t.clock_event_reasons() & bits) != 0 ? 1 : 0)
               : std::nullopt;
  };
  per_gpu("straggler_rank_gpu_sm_clock_hertz", "SM clock of the rank's GPU.",
          [&](const T& t) { return field(t.has_sm_clock_hertz(), t.sm_clock_hertz()); });
  per_gpu("straggler_rank_gpu_max_sm_clock_hertz", "Maximum SM clock of the rank's GPU.",
          [&](const T& t) { return field(t.has_max_sm_clock_hertz(), t.max_sm_clock_hertz()); });
  per_gpu("straggler_rank_gpu_memory_clock_hertz", "Memory clock of the rank's GPU.",
          [&](const T& t) { return field(t.has_memory_clock_hertz(), t.memory_clock_hertz()); });
  per_gpu("straggler_rank_gpu_temperature_celsius", "Temperature of the rank's GPU.",
          [&](const T& t) { return field(t.has_temperature_celsius(), t.temperature_celsius()); });
  per_gpu("straggler_rank_gpu_power_watts", "Power draw of the rank's GPU.",
          [&](const T& t) { return field(t.has_power_watts(), t.power_watts()); });
  per_gpu("straggler_rank_gpu_power_limit_watts", "Enforced power limit of the rank's GPU.",
          [&](const T& t) { return field(t.has_power_limit_watts(), t.power_limit_watts()); });
  per_gpu("straggler_rank_gpu_utilization_ratio",
          "Share of the last sample period with a kernel running on the rank's GPU (0..1).",
          [&](const T& t) { return field(t.has_gpu_utilization(), t.gpu_utilization()); });
  per_gpu("straggler_rank_gpu_memory_utilization_ratio",
          "Share of the last sample period with the rank's GPU memory read or written (0..1).",
          [&](const T& t) { return field(t.has_memory_utilization(), t.memory_utilization()); });
  per_gpu("straggler_rank_gpu_throttle_thermal",
          "1 while the rank's GPU reports a thermal slowdown reason (SW or HW), else 0.",
          [&](const T& t) { return reason(t, 0x20 | 0x40); });
  per_gpu("straggler_rank_gpu_throttle_power",
          "1 while the rank's GPU reports a power cap or power brake reason, else 0.",
          [&](const T& t) { return reason(t, 0x4 | 0x80); });

  out.Family("straggler_telemetry_samples_total", MetricType::kCounter,
             "GPU telemetry samples kept (ReportBatch.telemetry).");
  out.Sample({}, static_cast<double>(stats.telemetry_accepted.load(std::memory_order_relaxed)));
  out.Family("straggler_telemetry_rejected_total", MetricType::kCounter,
             "GPU telemetry samples refused, by reason.");
  out.Sample({{"reason", "rank_not_in_stream"}},
             static_cast<double>(stats.telemetry_rejected_rank.load(std::memory_order_relaxed)));
  out.Sample({{"reason", "invalid_value"}},
             static_cast<double>(stats.telemetry_rejected_invalid.load(std::memory_order_relaxed)));

  WriteProcessMetrics(ReadProcessStats(), out);
  return out.Take();
}

}  // namespace straggler::daemon
