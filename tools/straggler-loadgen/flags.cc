#include <unistd.h>

#include <fstream>
#include <iostream>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "loadgen.h"
#include "straggler/common/channel_security.h"

namespace straggler::loadgen {
namespace {

using nlohmann::json;

bool IsLoopback(const std::string& address) {
  std::string a = address;
  for (const char* prefix : {"dns:///", "ipv4:", "ipv6:"}) {
    if (a.rfind(prefix, 0) == 0) a = a.substr(std::string(prefix).size());
  }
  if (a.rfind("unix:", 0) == 0) return true;
  if (a.rfind("127.", 0) == 0) return true;
  if (a.rfind("localhost:", 0) == 0 || a == "localhost") return true;
  if (a.rfind("[::1]", 0) == 0) return true;
  return false;
}

// The daemon's ready file: {"grpc_address": "...", "pid": N}.
bool ReadReadyFile(Options& o, std::string* error) {
  std::ifstream in(o.ready_file);
  if (!in) {
    *error = "--ready-file " + o.ready_file + " cannot be read";
    return false;
  }
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    *error = "--ready-file " + o.ready_file + " is not a JSON object";
    return false;
  }
  if (o.daemon.empty() && j.contains("grpc_address") && j["grpc_address"].is_string())
    o.daemon = j["grpc_address"].get<std::string>();
  if (o.daemon_pid == 0 && j.contains("pid") && j["pid"].is_number_integer())
    o.daemon_pid = j["pid"].get<int64_t>();
  return true;
}

}  // namespace

std::optional<int> ParseFlags(int argc, char** argv, Options& o) {
  CLI::App app{"straggler-loadgen - drives a real stragglerd over gRPC with simulated ranks and\n"
               "reports sustained accepted reports/s, report-to-directive latency and the\n"
               "daemon's resident memory per rank. Loopback only. TLS from STRAGGLER_TLS_CA,\n"
               "STRAGGLER_TLS_CERT and STRAGGLER_TLS_KEY.",
               "straggler-loadgen"};
  app.add_option("--daemon", o.daemon, "daemon gRPC address (loopback), e.g. 127.0.0.1:7070");
  app.add_option("--ready-file", o.ready_file,
                 "the daemon's --ready-file: address (when --daemon is not given) and pid");
  app.add_option("--daemon-pid", o.daemon_pid, "daemon pid, for VmRSS")->check(CLI::PositiveNumber);
  // Defaults shown in --help come from the Options members themselves
  // (capture_default_str), so the help cannot drift from them.
  app.add_option("--ranks", o.ranks, "simulated ranks (world size)")
      ->check(CLI::Range(1u, 1u << 20))
      ->capture_default_str();
  app.add_option("--streams", o.streams, "ingest streams the ranks are split across")
      ->check(CLI::Range(1, kMaxStreams))
      ->capture_default_str();
  app.add_option("--rate", o.rate,
                 "offered reports/s over all streams; 0 = as fast as possible (with "
                 "--find-saturation: the first step's rate, 0 = 50000)")
      ->check(CLI::Range(0.0, 1e9))
      ->capture_default_str();
  app.add_option("--batch", o.batch, "reports per ReportBatch")
      ->check(CLI::Range(1u, kMaxBatch))
      ->capture_default_str();
  auto* duration =
      app.add_option("--duration", o.duration, "seconds to run (without --find-saturation)")
          ->check(CLI::Range(0.1, 3600.0))
          ->capture_default_str();
  app.add_option("--job", o.job, "job id (default: loadgen-<pid>)");
  auto* saturation =
      app.add_flag("--find-saturation", o.find_saturation,
                   "step the offered rate up until accepted/s stops growing, p99 explodes or the "
                   "daemon's per-stream rate limit rejects reports");
  app.add_option("--soak-minutes", o.soak_minutes,
                 "soak: run this many minutes at --rate, printing the daemon's VmRSS, "
                 "accepted/s and p99 every --soak-interval seconds")
      ->check(CLI::Range(0.001, 10080.0))
      ->excludes(duration)
      ->excludes(saturation);
  app.add_option("--soak-interval", o.soak_interval, "seconds per soak sample")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  app.add_option("--step-duration", o.step_duration, "seconds per saturation step")
      ->check(CLI::Range(0.1, 600.0))
      ->capture_default_str();
  app.add_option("--step-factor", o.step_factor, "offered-rate multiplier per saturation step")
      ->check(CLI::Range(1.05, 10.0))
      ->capture_default_str();
  app.add_option("--max-steps", o.max_steps, "most saturation steps")
      ->check(CLI::Range(1u, 40u))
      ->capture_default_str();
  app.add_option("--window", o.window, "unacknowledged batches per stream")
      ->check(CLI::Range(1u, 1024u))
      ->capture_default_str();
  app.add_flag("--timestamp-start", o.timestamp_start,
               "date reports with the start_time Timestamp of 0.1 clients instead of "
               "start_unix_nanos");
  app.add_flag("--work-fields", o.work_fields,
               "each report also carries work, input_wait_seconds and optimizer_seconds "
               "(issue 31): what the daemon pays for them");
  app.add_option("--json", o.json_file, "write the results as JSON to this file");
  app.add_flag("--quiet", o.quiet, "print nothing but errors");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? kExitOk : kExitUsage;
  }
  std::string error;
  if (!o.ready_file.empty() && !ReadReadyFile(o, &error)) {
    std::cerr << "straggler-loadgen: " << error << '\n';
    return kExitUsage;
  }
  if (o.daemon.empty()) {
    std::cerr << "straggler-loadgen: give --daemon ADDR or --ready-file FILE\n";
    return kExitUsage;
  }
  if (!IsLoopback(o.daemon)) {
    std::cerr << "straggler-loadgen: --daemon " << o.daemon
              << " is not a loopback address (127.0.0.0/8, localhost, [::1], unix:)\n";
    return kExitUsage;
  }
  if (o.streams > o.ranks) {
    std::cerr << "straggler-loadgen: --streams " << o.streams << " > --ranks " << o.ranks
              << ": every stream needs at least one rank\n";
    return kExitUsage;
  }
  o.credentials =
      straggler::MakeChannelCredentials(straggler::ChannelSecurityFromEnv(), o.daemon, &error);
  if (!o.credentials) {
    std::cerr << "straggler-loadgen: " << error << '\n';
    return kExitUsage;
  }
  if (o.job.empty()) o.job = "loadgen-" + std::to_string(::getpid());
  return std::nullopt;
}


}  // namespace straggler::loadgen
