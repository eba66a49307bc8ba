// straggler-loadgen's pieces (main.cc says what the tool does):
//   flags.cc   the command line: Options, their checks, the ready file
//   stream.h   one ingest stream: its ranks, writer pacing, acknowledgements
//   run.cc     the runs: one rate, the saturation search, the soak
//   report.cc  measurements as numbers and text: percentiles, VmRSS, the
//              printed table and summary, --json
// Everything here runs in one process; Stream says what its threads share.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace straggler::loadgen {

using Clock = std::chrono::steady_clock;

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;
constexpr uint32_t kMaxBatch = 10000;  // the daemon's default limits.max_batch_reports
constexpr int kMaxStreams = 256;
constexpr auto kConnectTimeout = std::chrono::seconds(10);
constexpr auto kDrainTimeout = std::chrono::seconds(5);
// p99 "explodes" above 10x the first saturation step's p99, and at least this.
constexpr double kExplodedFloorMs = 5.0;

struct Options {
  std::string daemon;
  std::string ready_file;
  int64_t daemon_pid = 0;
  uint32_t ranks = 1000;
  uint32_t streams = 8;
  double rate = 0;  // reports/s over all streams; 0 = as fast as possible
  uint32_t batch = 256;
  double duration = 10;
  std::string job;
  bool find_saturation = false;
  double soak_minutes = 0;    // 0 = no soak
  double soak_interval = 60;  // seconds per soak sample
  double step_duration = 3;
  double step_factor = 2;
  uint32_t max_steps = 10;
  uint32_t window = 8;  // unacknowledged batches per stream
  // Date reports the way a 0.1 client did (a Timestamp sub-message), to
  // measure what a daemon pays for older clients (docs/api.md).
  bool timestamp_start = false;
  // Every report carries work and both phases (IterationReport fields 9-11):
  // the daemon's cost of a job that reports them, against one that does not.
  bool work_fields = false;
  std::string json_file;
  bool quiet = false;
  // From STRAGGLER_TLS_CA/_CERT/_KEY (plaintext when none is set).
  std::shared_ptr<grpc::ChannelCredentials> credentials;
};

// Parses and checks the command line into `o` (the ready file read, the
// TLS credentials made); nullopt to go on, else the exit status (0 for
// --help, kExitUsage for bad flags, with the error printed).
std::optional<int> ParseFlags(int argc, char** argv, Options& o);

// Runs what `o` asks for and prints (or writes) the results; the exit status.
int Run(Options o);

// One measured phase at one offered rate, over every stream.
struct StepResult {
  double offered_rate = 0;  // 0 = as fast as possible
  double seconds = 0;
  uint64_t accepted = 0, rejected = 0, duplicates = 0, batches = 0;
  uint64_t rate_limited_batches = 0;  // not in the JSON: stop_reason says it
  double accepted_per_s = 0;
  double p50_ms = 0, p99_ms = 0, max_ms = 0;
};

struct SoakSample {
  double elapsed_s;                 // since the soak began, at the end of the sample
  std::optional<uint64_t> rss_kib;  // the daemon's VmRSS then
};

// What a run measured, for the summary and --json.
struct Results {
  std::vector<SoakSample> soak;  // one per soak step, parallel to steps
  std::vector<StepResult> steps;
  std::optional<size_t> knee;
  double saturation = 0;
  std::string stop_reason;
  bool rate_limited_stop = false;  // the search ended at the daemon's rate limit
  std::optional<uint64_t> rss_before, rss_after;
};

// report.cc: measurements and their text.
// VmRSS of a process in KiB; nullopt when unreadable.
std::optional<uint64_t> RssKiB(int64_t pid);
double Percentile(std::vector<double> v, double p);
// "UNAVAILABLE: connection refused": gRPC's codes are absl's, absl names them.
std::string StatusText(const grpc::Status& status);
// The daemon's per-stream rate limit, with its value when `message` (a
// rate_limited rejection) names it.
std::string RateLimitText(const std::string& message, uint32_t streams);
// What to do about it (docs/security.md#limits-and-input-validation).
constexpr const char* kRateLimitHint =
    "run the daemon with limits.stream_reports_per_second: 0 to measure past it";

// The table of steps: its header once (`header_printed`), then a row.
void PrintStep(const Options& o, const StepResult& s, bool& header_printed);
void PrintSummary(const Options& o, const Results& r);
// --json; false when the file cannot be written.
bool WriteJson(const Options& o, const Results& r);

}  // namespace straggler::loadgen
