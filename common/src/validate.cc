#include "straggler/common/validate.h"

#include <algorithm>
#include <limits>
#include <string_view>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace straggler::common {
namespace {

// The one length-and-bytes check behind CheckIdText, CheckPrintable and
// CheckNoControl. The rule is the wire's (straggler/v1/wire_rules.h
// FindTextFault: at most `max` bytes, each one `allowed` accepts); the
// message reads "FIELD 'VALUE' is N bytes; at most MAX" or "FIELD 'VALUE'
// has " and what `refused(i)` says of the first refused byte, at `i`.
template <typename Allowed, typename Refused>
absl::Status CheckBytes(absl::string_view field, absl::string_view value, size_t max,
                        Allowed allowed, Refused refused) {
  const v1::rules::TextFault fault =
      v1::rules::FindTextFault(std::string_view(value.data(), value.size()), max, allowed);
  if (fault.too_long) {
    return absl::InvalidArgumentError(absl::StrCat(field, " ", Quoted(value), " is ",
                                                   value.size(), " bytes; at most ", max));
  }
  if (fault.bad_byte != std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " ", Quoted(value), " has ", refused(fault.bad_byte)));
  }
  return absl::OkStatus();
}

// "0x0a": the byte at `i` of `value`.
std::string HexByte(absl::string_view value, size_t i) {
  return absl::StrCat("0x", absl::Hex(static_cast<unsigned char>(value[i]), absl::kZeroPad2));
}

// Free text an operator or a client wrote (override reasons, exclusion
// details): any UTF-8 (protobuf has checked it) but no ASCII control
// characters, which would forge lines in logs and terminals.
absl::Status CheckNoControl(absl::string_view field, absl::string_view value, size_t max) {
  return CheckBytes(
      field, value, max, [](char c) { return !(static_cast<unsigned char>(c) < 0x20 || c == 0x7f); },
      [&](size_t i) { return absl::StrCat("control character ", HexByte(value, i), " at byte ", i); });
}

}  // namespace

// Printable ASCII, space included: hostnames, agent ids, version strings,
// GPU models.
absl::Status CheckPrintable(absl::string_view field, absl::string_view value, size_t max) {
  return CheckBytes(field, value, max, v1::rules::IsPrintableAscii, [&](size_t i) {
    return absl::StrCat("byte ", HexByte(value, i), " at ", i,
                        "; allowed: ", std::string(v1::rules::kPrintableAsciiAllowed));
  });
}

absl::Status CheckIdText(absl::string_view field, absl::string_view value, size_t max,
                         absl::string_view suffix) {
  return CheckBytes(field, value, max, v1::rules::IsJobIdChar, [&](size_t i) {
    return absl::StrCat(Quoted(value.substr(i, 1)), " at byte ", i,
                        "; allowed: ", std::string(v1::rules::kJobIdAllowed), suffix);
  });
}

std::string Quoted(absl::string_view value, size_t max) {
  if (value.size() <= max) return absl::StrCat("'", absl::CHexEscape(value), "'");
  return absl::StrCat("'", absl::CHexEscape(value.substr(0, max)), "'...");
}

absl::Status ValidateJobId(absl::string_view field, absl::string_view job_id) {
  if (job_id.empty()) return absl::InvalidArgumentError(absl::StrCat(field, " must not be empty"));
  return CheckIdText(field, job_id, kMaxJobIdBytes, absl::StrCat(", 1 to ", kMaxJobIdBytes, " bytes"));
}

absl::Status ValidateHello(const StreamHello& hello, uint32_t max_ranks_per_job) {
  if (absl::Status s = ValidateJobId("hello.job_id", hello.job_id); !s.ok()) return s;
  if (absl::Status s = CheckPrintable("hello.node", hello.node, kMaxNodeBytes); !s.ok()) return s;
  if (!hello.run_id.empty()) {
    if (absl::Status s = ValidateJobId("hello.run_id", hello.run_id); !s.ok()) return s;
  }
  if (absl::Status s =
          CheckPrintable("hello.client_version", hello.client_version, kMaxClientVersionBytes);
      !s.ok()) {
    return s;
  }
  if (hello.world_size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("hello.world_size=0 for job '", hello.job_id, "' must be > 0"));
  }
  if (hello.world_size > max_ranks_per_job) {
    return absl::InvalidArgumentError(
        absl::StrCat("hello.world_size=", hello.world_size, " exceeds limits.max_ranks_per_job=",
                     max_ranks_per_job));
  }
  if (hello.ranks.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("hello.ranks is empty for job '", hello.job_id, "'"));
  }
  for (uint32_t r : hello.ranks) {
    if (r >= hello.world_size) {
      return absl::InvalidArgumentError(absl::StrCat("hello rank ", r, " >= world_size=",
                                                     hello.world_size, " of job '",
                                                     hello.job_id, "'"));
    }
  }
  for (uint32_t r : hello.monitor_only_ranks) {
    if (!std::binary_search(hello.ranks.begin(), hello.ranks.end(), r)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "hello.monitor_only_ranks names rank ", r, ", which is not among the hello's ranks of job '",
          hello.job_id, "'"));
    }
  }
  for (size_t i = 0; i < hello.known_excluded.size(); ++i) {
    const engine::ExcludedRank& e = hello.known_excluded[i];
    if (e.rank >= hello.world_size) {
      return absl::InvalidArgumentError(absl::StrCat("hello.known_excluded rank ", e.rank,
                                                     " >= world_size=", hello.world_size,
                                                     " of job '", hello.job_id, "'"));
    }
    // The engine keeps a held entry as it is and publishes it again: a
    // reason it never gives would be released blindly or confuse clients.
    const bool wire = i < hello.known_excluded_wire_reasons.size();
    if (e.reason == engine::ExclusionReason::kNone) {
      const int value = wire ? hello.known_excluded_wire_reasons[i] : 0;
      const std::string name = v1::ExclusionReason_IsValid(value)
                                   ? absl::StrCat(" (", v1::ExclusionReason_Name(value), ")")
                                   : "";
      return absl::InvalidArgumentError(absl::StrCat(
          "hello.known_excluded rank ", e.rank, " reason=", value, name,
          " is not an exclusion reason; allowed: EXCLUSION_REASON_STRAGGLER, _UNRESPONSIVE, "
          "_FORCED, _PROBATION_END, _REPLICA"));
    }
    if (absl::Status s = CheckNoControl(absl::StrCat("hello.known_excluded rank ", e.rank,
                                                     " detail"),
                                        e.detail, kMaxReasonBytes);
        !s.ok()) {
      return s;
    }
    // Who took a replica out (docs/hybrid.md): the engine groups a held
    // rank by its entry's replica until the rank declares one.
    for (const auto& [name, value] : {std::pair{"culprit_rank", e.culprit},
                                      std::pair{"replica", e.replica}}) {
      if (value && *value >= hello.world_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "hello.known_excluded rank ", e.rank, " ", name, "=", *value, " >= world_size=",
            hello.world_size, " of job '", hello.job_id, "'"));
      }
    }
    // A peer group name, by the rule of the hello's own peer_group.
    if (absl::Status s = CheckIdText(
            absl::StrCat("hello.known_excluded rank ", e.rank, " culprit_peer_group"),
            e.culprit_group, v1::rules::kMaxPeerGroupBytes, "");
        !s.ok())
      return s;
  }
  return absl::OkStatus();
}

absl::Status ValidateTelemetry(const v1::GpuTelemetry& t) {
  auto check = [&](bool has, double v, const char* name, double max) -> absl::Status {
    if (has && !(v >= 0 && v <= max)) {  // also NaN
      return absl::InvalidArgumentError(
          absl::StrCat("telemetry of gpu ", t.gpu_index(), ": ", name, "=", v,
                       " is outside [0, ", max, "]"));
    }
    return absl::OkStatus();
  };
  constexpr double kInf = std::numeric_limits<double>::max();
  for (absl::Status s : {check(t.has_sm_clock_hertz(), t.sm_clock_hertz(), "sm_clock_hertz", kInf),
                         check(t.has_max_sm_clock_hertz(), t.max_sm_clock_hertz(), "max_sm_clock_hertz", kInf),
                         check(t.has_memory_clock_hertz(), t.memory_clock_hertz(), "memory_clock_hertz", kInf),
                         check(t.has_temperature_celsius(), t.temperature_celsius(), "temperature_celsius", 1000),
                         check(t.has_power_watts(), t.power_watts(), "power_watts", kInf),
                         check(t.has_power_limit_watts(), t.power_limit_watts(), "power_limit_watts", kInf),
                         check(t.has_gpu_utilization(), t.gpu_utilization(), "gpu_utilization", 1),
                         check(t.has_memory_utilization(), t.memory_utilization(), "memory_utilization", 1)}) {
    if (!s.ok()) return s;
  }
  return CheckPrintable(absl::StrCat("telemetry of gpu ", t.gpu_index(), ": uuid"), t.uuid(),
                        kMaxGpuUuidBytes);
}

namespace {

// `value` (when `has`) within [0, max]; NaN is outside.
absl::Status CheckRange(absl::string_view what, absl::string_view name, bool has, double value,
                        double max) {
  if (has && !(value >= 0 && value <= max)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", name, "=", value, " is outside [0, ", max, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateHostTelemetry(const v1::HostTelemetry& t) {
  constexpr double kInf = std::numeric_limits<double>::max();
  constexpr absl::string_view kWhat = "host telemetry";
  absl::Status s = CheckRange(kWhat, "period_seconds", true, t.period_seconds(), kInf);
  for (const auto& [name, p] : {std::pair{"cpu_pressure", &t.cpu_pressure()},
                                std::pair{"memory_pressure", &t.memory_pressure()},
                                std::pair{"io_pressure", &t.io_pressure()}}) {
    if (!s.ok()) return s;
    s = CheckRange(kWhat, absl::StrCat(name, ".some_avg10"), p->has_some_avg10(),
                   p->some_avg10(), 1);
    if (s.ok()) {
      s = CheckRange(kWhat, absl::StrCat(name, ".some_share"), p->has_some_share(),
                     p->some_share(), 1);
    }
    if (s.ok()) s = CheckPrintable(absl::StrCat(kWhat, ": ", name, ".detail"), p->detail(),
                                   kMaxHostDetailBytes);
  }
  if (!s.ok()) return s;
  s = CheckRange(kWhat, "cpu_steal_share", t.has_cpu_steal_share(), t.cpu_steal_share(), 1);
  if (!s.ok()) return s;
  return CheckPrintable(absl::StrCat(kWhat, ": steal_detail"), t.steal_detail(),
                        kMaxHostDetailBytes);
}

absl::Status ValidateProcessTelemetry(const v1::ProcessTelemetry& p) {
  constexpr double kInf = std::numeric_limits<double>::max();
  const std::string what = absl::StrCat("process telemetry of rank ", p.rank());
  for (absl::Status s :
       {CheckRange(what, "period_seconds", true, p.period_seconds(), kInf),
        CheckRange(what, "run_delay_seconds_per_second", p.has_run_delay_seconds_per_second(),
                   p.run_delay_seconds_per_second(), kInf),
        CheckRange(what, "involuntary_switches_per_second",
                   p.has_involuntary_switches_per_second(), p.involuntary_switches_per_second(),
                   kInf)}) {
    if (!s.ok()) return s;
  }
  return CheckPrintable(absl::StrCat(what, ": detail"), p.detail(), kMaxHostDetailBytes);
}

absl::Status RequireHello(const v1::ReportBatch& first) {
  if (first.has_hello()) return absl::OkStatus();
  return absl::InvalidArgumentError("the first ReportBatch of a stream must carry hello");
}

absl::Status ValidateReason(absl::string_view reason) {
  return CheckNoControl("reason", reason, kMaxReasonBytes);
}

engine::Time FromProto(const google::protobuf::Timestamp& t) {
  // engine::Time (int64 ns) spans the years 1678..2262: saturate outside.
  constexpr int64_t kMaxSeconds = std::numeric_limits<int64_t>::max() / 1'000'000'000 - 1;
  // nanos outside [0, 1e9) make an invalid Timestamp, but the wire carries
  // any int32: fold whole seconds of it into seconds, then check the range
  // (seconds * 1e9 + nanos overflowed int64 near the ends before).
  if (t.seconds() > kMaxSeconds) return engine::Time::max();
  if (t.seconds() < -kMaxSeconds) return engine::Time::min();
  const int64_t seconds = t.seconds() + t.nanos() / 1'000'000'000;
  const int64_t nanos = t.nanos() % 1'000'000'000;
  if (seconds > kMaxSeconds) return engine::Time::max();
  if (seconds < -kMaxSeconds) return engine::Time::min();
  return engine::Time(seconds * 1'000'000'000 + nanos);
}

engine::Report FromProto(const v1::IterationReport& r) {
  engine::Report out;
  out.rank = r.rank();
  out.epoch = r.epoch();
  out.iteration = r.iteration();
  out.compute_seconds = r.compute_seconds();
  if (r.has_step_seconds()) out.step_seconds = r.step_seconds();
  if (r.has_collective_wait_seconds()) out.collective_wait_seconds = r.collective_wait_seconds();
  if (r.has_work()) out.work = r.work();
  if (r.has_input_wait_seconds()) out.input_wait_seconds = r.input_wait_seconds();
  if (r.has_optimizer_seconds()) out.optimizer_seconds = r.optimizer_seconds();
  if (r.start_unix_nanos() != 0) {
    // Above 2^63 - 1 (year 2262) the wire value is no time: the newest one.
    out.start_time = engine::Time(static_cast<int64_t>(
        std::min<uint64_t>(r.start_unix_nanos(), std::numeric_limits<int64_t>::max())));
  } else if (r.has_start_time()) {
    out.start_time = FromProto(r.start_time());  // a 0.1 client
  }
  return out;
}

engine::ExclusionReason FromProto(v1::ExclusionReason r) {
  switch (r) {
    case v1::EXCLUSION_REASON_STRAGGLER: return engine::ExclusionReason::kStraggler;
    case v1::EXCLUSION_REASON_UNRESPONSIVE: return engine::ExclusionReason::kUnresponsive;
    case v1::EXCLUSION_REASON_FORCED: return engine::ExclusionReason::kForced;
    case v1::EXCLUSION_REASON_PROBATION_END: return engine::ExclusionReason::kProbationEnd;
    case v1::EXCLUSION_REASON_REPLICA: return engine::ExclusionReason::kReplica;
    default: return engine::ExclusionReason::kNone;
  }
}

engine::ExcludedRank FromProto(const v1::ExcludedRank& e) {
  engine::ExcludedRank x{e.rank(), FromProto(e.reason()), e.detail(), e.since_iteration()};
  if (e.has_culprit_rank()) x.culprit = e.culprit_rank();
  x.culprit_group = e.culprit_peer_group();
  if (e.has_replica()) x.replica = e.replica();
  return x;
}

StreamHello FromProto(const v1::StreamHello& h) {
  StreamHello out;
  out.job_id = h.job_id();
  out.node = h.node();
  out.client_version = h.client_version();
  out.ranks.assign(h.ranks().begin(), h.ranks().end());
  // Sorted and unique, whatever order the client or agent sent them in: the
  // registry binary-searches them (e.g. for ranks whose incarnation changed).
  auto sorted_unique = [](std::vector<uint32_t>& v) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
  };
  sorted_unique(out.ranks);
  out.monitor_only_ranks.assign(h.monitor_only_ranks().begin(), h.monitor_only_ranks().end());
  sorted_unique(out.monitor_only_ranks);
  out.world_size = h.world_size();
  out.iterations_per_epoch = h.iterations_per_epoch();
  out.known_membership_version = h.known_membership_version();
  out.known_effective_iteration = h.known_effective_iteration();
  out.known_incarnation = h.known_incarnation();
  for (const v1::ExcludedRank& e : h.known_excluded()) {
    out.known_excluded.push_back(FromProto(e));
    out.known_excluded_wire_reasons.push_back(static_cast<int>(e.reason()));
  }
  if (h.has_reported_iteration()) out.reported_iteration = h.reported_iteration();
  out.run_id = h.run_id();
  for (const v1::RankDevice& d : h.devices()) {
    if (d.incarnation() != 0) out.rank_incarnations.emplace_back(d.rank(), d.incarnation());
    TopologyClaim& c = out.topologies.emplace_back();
    c.rank = d.rank();
    c.incarnation = d.incarnation();
    c.topology.peer_group = d.peer_group();
    if (d.has_replica()) c.topology.replica = d.replica();
    c.topology.gpu_model = d.gpu_model();
  }
  return out;
}

}  // namespace straggler::common
