#include <absl/status/status.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "loadgen.h"

namespace straggler::loadgen {

using nlohmann::json;

namespace {

// gRPC's codes are absl's (same numbering); absl names them.
std::string CodeName(grpc::StatusCode code) {
  const std::string name(absl::StatusCodeToString(static_cast<absl::StatusCode>(code)));
  return name.empty() ? "CODE_" + std::to_string(static_cast<int>(code)) : name;
}

// The daemon's rate_limited rejection says "... over the stream's
// limits.stream_reports_per_second=20000 (burst 100000)"; the limit, when
// the message names it.
std::optional<double> RateLimitFrom(const std::string& message) {
  static const std::string kKey = "limits.stream_reports_per_second=";
  const size_t at = message.find(kKey);
  if (at == std::string::npos) return std::nullopt;
  const char* begin = message.c_str() + at + kKey.size();
  char* end = nullptr;
  const double v = std::strtod(begin, &end);
  if (end == begin || !std::isfinite(v) || v <= 0) return std::nullopt;
  return v;
}

json ToJson(const StepResult& s) {
  return json{{"offered_rate", s.offered_rate}, {"seconds", s.seconds},
              {"accepted", s.accepted},         {"rejected", s.rejected},
              {"duplicates", s.duplicates},     {"batches_acked", s.batches},
              {"accepted_per_s", s.accepted_per_s}, {"p50_ms", s.p50_ms},
              {"p99_ms", s.p99_ms},             {"max_ms", s.max_ms}};
}

std::string Fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

uint64_t SoakMaxRss(const Results& r) {
  uint64_t m = 0;
  for (const auto& s : r.soak) m = std::max(m, s.rss_kib.value_or(0));
  return m;
}

std::optional<double> BytesPerRank(const Options& o, const Results& r) {
  if (!r.rss_before || !r.rss_after) return std::nullopt;
  return (static_cast<double>(*r.rss_after) - static_cast<double>(*r.rss_before)) * 1024.0 /
         o.ranks;
}

}  // namespace

std::optional<uint64_t> RssKiB(int64_t pid) {
  if (pid <= 0) return std::nullopt;
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      std::istringstream s(line.substr(6));
      uint64_t kib = 0;
      if (s >> kib) return kib;
    }
  }
  return std::nullopt;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

std::string StatusText(const grpc::Status& status) {
  return CodeName(status.error_code()) + ": " + status.error_message();
}

std::string RateLimitText(const std::string& message, uint32_t streams) {
  std::string text = "the daemon's per-stream rate limit";
  if (auto limit = RateLimitFrom(message)) {
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  " (limits.stream_reports_per_second=%.0f per stream: %.0f/s over %u streams)",
                  *limit, *limit * streams, streams);
    return text + buf;
  }
  return text + " (limits.stream_reports_per_second)";
}


void PrintStep(const Options& o, const StepResult& s, bool& header_printed) {
  if (o.quiet) return;
  if (!header_printed) {
    header_printed = true;
    std::printf("%12s %14s %10s %10s %10s %10s %10s\n", "offered/s", "accepted/s", "rejected",
                "batches", "p50_ms", "p99_ms", "max_ms");
  }
  std::printf("%12s %14.0f %10llu %10llu %10.3f %10.3f %10.3f\n",
              s.offered_rate > 0 ? Fmt("%.0f", s.offered_rate).c_str() : "max",
              s.accepted_per_s, static_cast<unsigned long long>(s.rejected),
              static_cast<unsigned long long>(s.batches), s.p50_ms, s.p99_ms, s.max_ms);
  std::fflush(stdout);
}

void PrintSummary(const Options& o, const Results& r) {
  if (o.quiet) return;
  std::printf("job %s: %u ranks over %u streams, batch %u, window %u\n", o.job.c_str(),
              o.ranks, o.streams, o.batch, o.window);
  if (o.find_saturation) {
    if (r.knee) {
      const StepResult& k = r.steps[*r.knee];
      std::printf("knee: offered %.0f/s, accepted %.0f/s, p50 %.3f ms, p99 %.3f ms%s\n",
                  k.offered_rate, k.accepted_per_s, k.p50_ms, k.p99_ms,
                  r.rate_limited_stop ? " (the last step before the daemon's rate limit rejected "
                                       "reports; not the daemon's capacity)"
                                     : "");
    } else {
      std::printf("knee: none (the first step already fell behind its offered rate)\n");
    }
    std::printf("saturation: best accepted %.0f/s (%s)\n", r.saturation, r.stop_reason.c_str());
  }
  if (!r.soak.empty() && r.soak.front().rss_kib && r.soak.back().rss_kib) {
    std::printf("soak: daemon VmRSS %llu KiB after the first sample, %llu KiB after the last "
                "(max %llu KiB)\n",
                static_cast<unsigned long long>(*r.soak.front().rss_kib),
                static_cast<unsigned long long>(*r.soak.back().rss_kib),
                static_cast<unsigned long long>(SoakMaxRss(r)));
  }
  if (auto b = BytesPerRank(o, r)) {
    std::printf("daemon VmRSS: %llu KiB before, %llu KiB after: %.0f bytes per rank\n",
                static_cast<unsigned long long>(*r.rss_before),
                static_cast<unsigned long long>(*r.rss_after), *b);
  } else {
    std::printf("daemon VmRSS: not measured (give --daemon-pid or --ready-file)\n");
  }
}

bool WriteJson(const Options& o, const Results& r) {
  json j;
  j["config"] = {{"daemon", o.daemon},   {"job", o.job},         {"ranks", o.ranks},
                 {"streams", o.streams}, {"rate", o.rate},       {"batch", o.batch},
                 {"window", o.window},
                 {"find_saturation", o.find_saturation},
                 {"soak_minutes", o.soak_minutes}, {"soak_interval", o.soak_interval}};
  // --duration is the length of a plain run only: a saturation run records
  // what its steps ran instead (each step's measured seconds are in steps[]).
  if (o.find_saturation) {
    j["config"]["step_duration"] = o.step_duration;
    j["config"]["step_factor"] = o.step_factor;
    j["config"]["max_steps"] = o.max_steps;
  } else if (o.soak_minutes == 0) {  // a soak's length is soak_minutes
    j["config"]["duration"] = o.duration;
  }
  j["steps"] = json::array();
  for (const auto& s : r.steps) j["steps"].push_back(ToJson(s));
  uint64_t accepted = 0, rejected = 0;
  for (const auto& s : r.steps) {
    accepted += s.accepted;
    rejected += s.rejected;
  }
  j["accepted"] = accepted;
  j["rejected"] = rejected;
  if (o.find_saturation) {
    j["knee"] = r.knee ? ToJson(r.steps[*r.knee]) : json(nullptr);
    j["saturation_accepted_per_s"] = r.saturation;
    j["stop_reason"] = r.stop_reason;
  }
  if (o.soak_minutes > 0) {
    json samples = json::array();
    for (size_t i = 0; i < r.soak.size(); ++i) {
      samples.push_back({{"elapsed_s", r.soak[i].elapsed_s},
                         {"rss_kib", r.soak[i].rss_kib ? json(*r.soak[i].rss_kib) : json(nullptr)},
                         {"accepted_per_s", r.steps[i].accepted_per_s},
                         {"p99_ms", r.steps[i].p99_ms}});
    }
    json soak{{"samples", samples}};
    const bool measured = !r.soak.empty() && r.soak.front().rss_kib && r.soak.back().rss_kib;
    soak["rss_growth_kib"] = measured ? json(static_cast<int64_t>(*r.soak.back().rss_kib) -
                                             static_cast<int64_t>(*r.soak.front().rss_kib))
                                      : json(nullptr);
    soak["rss_max_kib"] = measured ? json(SoakMaxRss(r)) : json(nullptr);
    j["soak"] = soak;
  }
  json mem;
  mem["daemon_pid"] = o.daemon_pid;
  mem["rss_before_kib"] = r.rss_before ? json(*r.rss_before) : json(nullptr);
  mem["rss_after_kib"] = r.rss_after ? json(*r.rss_after) : json(nullptr);
  auto b = BytesPerRank(o, r);
  mem["bytes_per_rank"] = b ? json(*b) : json(nullptr);
  j["memory"] = mem;
  std::ofstream out(o.json_file, std::ios::trunc);
  out << j.dump(2) << '\n';
  return static_cast<bool>(out.flush());
}

}  // namespace straggler::loadgen
