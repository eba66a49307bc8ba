#include "render.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <ctime>

#include "absl/strings/match.h"

namespace stragglerctl {
namespace v1 = straggler::v1;

Table::Table(std::vector<std::string> headers, std::vector<Align> aligns)
    : headers_(std::move(headers)), aligns_(std::move(aligns)) {
  aligns_.resize(headers_.size(), Align::kLeft);
}

void Table::AddRow(std::vector<std::string> cells) {
  cells.resize(headers_.size());
  rows_.push_back(std::move(cells));
}

void Table::Print(std::ostream& out) const {
  std::vector<size_t> widths(headers_.size());
  for (size_t c = 0; c < headers_.size(); ++c) widths[c] = headers_[c].size();
  for (const auto& row : rows_)
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  auto print_row = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      const size_t pad = widths[c] - row[c].size();
      const bool last = c + 1 == row.size();
      if (aligns_[c] == Align::kRight) line.append(pad, ' ');
      line += row[c];
      // No trailing blanks on the last column: they only get in the way of grep and diff.
      if (aligns_[c] == Align::kLeft && !last) line.append(pad, ' ');
      if (!last) line += "  ";
    }
    out << line << '\n';
  };
  print_row(headers_);
  for (const auto& row : rows_) print_row(row);
}

namespace {

// "WORKER_STATE_STRAGGLER" -> "straggler": strip the enum's prefix and lowercase.
std::string ShortName(const std::string& full, std::string_view prefix) {
  std::string s = full;
  if (s.rfind(prefix, 0) == 0) s = s.substr(prefix.size());
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s.empty()) return "?";
  return s;
}

std::string Num(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string YesNo(bool b) { return b ? "yes" : "no"; }

}  // namespace

std::string StateName(v1::WorkerState s) {
  return ShortName(v1::WorkerState_Name(s), "WORKER_STATE_");
}
std::string ReasonName(v1::ExclusionReason r) {
  if (r == v1::EXCLUSION_REASON_UNSPECIFIED) return "-";
  return ShortName(v1::ExclusionReason_Name(r), "EXCLUSION_REASON_");
}
std::string PolicyKindName(v1::PolicyKind k) {
  return ShortName(v1::PolicyKind_Name(k), "POLICY_KIND_");
}
std::string RecoveryName(v1::RecoveryMode m) {
  return ShortName(v1::RecoveryMode_Name(m), "RECOVERY_MODE_");
}
std::string OverrideName(v1::RankOverride o) {
  if (o == v1::RANK_OVERRIDE_UNSPECIFIED || o == v1::RANK_OVERRIDE_NONE) return "-";
  return ShortName(v1::RankOverride_Name(o), "RANK_OVERRIDE_");
}
std::string EventKindName(v1::EventKind k) {
  return ShortName(v1::EventKind_Name(k), "EVENT_KIND_");
}

std::string Millis(double seconds) {
  if (seconds == 0.0 || !std::isfinite(seconds)) return "-";
  const double ms = seconds * 1000.0;
  // Three significant-ish digits: 0.123 ms, 21.3 ms, 1234 ms.
  const int decimals = ms < 1.0 ? 3 : (ms < 100.0 ? 1 : 0);
  return Num(ms, decimals) + " ms";
}

std::string TimeText(const google::protobuf::Timestamp& t) {
  if (t.seconds() == 0 && t.nanos() == 0) return "-";
  std::time_t secs = static_cast<std::time_t>(t.seconds());
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, t.nanos() / 1000000);
  return buf;
}

// "3 (straggler)"; a replica out whole (docs/topology.md) as
// "replica 1 [2, 3, 10, 11] for rank 10 (group stage1, straggler)".
std::string ExcludedList(const v1::Membership& m) {
  if (m.excluded_size() == 0) return "none";
  std::string s;
  std::vector<bool> done(m.excluded_size(), false);
  for (int k = 0; k < m.excluded_size(); ++k) {
    if (done[k]) continue;
    const v1::ExcludedRank& e = m.excluded(k);
    if (!s.empty()) s += ", ";
    if (!e.has_replica() || !e.has_culprit_rank()) {
      s += std::to_string(e.rank()) + " (" + ReasonName(e.reason()) + ")";
      continue;
    }
    std::string ranks, reason = ReasonName(e.reason());
    for (int j = k; j < m.excluded_size(); ++j) {
      const v1::ExcludedRank& y = m.excluded(j);
      if (!y.has_replica() || y.replica() != e.replica()) continue;
      done[j] = true;
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(y.rank());
      if (y.rank() == e.culprit_rank()) reason = ReasonName(y.reason());
    }
    s += "replica " + std::to_string(e.replica()) + " [" + ranks + "] for rank " +
         std::to_string(e.culprit_rank()) + " (" +
         (e.culprit_peer_group().empty() ? "" : "group " + e.culprit_peer_group() + ", ") +
         reason + ")";
  }
  return s;
}

void PrintJobs(const v1::ListJobsResponse& r, std::ostream& out) {
  Table t({"JOB", "WORLD", "ACTIVE", "EXCLUDED", "STRAGGLERS", "MILD", "EPOCH", "ITERATION",
           "THRESHOLD", "MEMBERSHIP", "POLICY", "STREAMS", "LAST REPORT"},
          {Align::kLeft, Align::kRight, Align::kRight, Align::kRight, Align::kRight, Align::kRight,
           Align::kRight, Align::kRight, Align::kRight, Align::kLeft, Align::kLeft, Align::kRight,
           Align::kLeft});
  for (const auto& j : r.jobs()) {
    t.AddRow({j.job_id(), std::to_string(j.world_size()), std::to_string(j.active_ranks()),
              std::to_string(j.excluded_ranks()), std::to_string(j.straggler_ranks()),
              std::to_string(j.mild_ranks()), std::to_string(j.epoch()), std::to_string(j.highest_iteration()),
              Millis(j.threshold_seconds()), "v" + std::to_string(j.membership().version()),
              PolicyKindName(j.policy().kind()), std::to_string(j.streams()),
              TimeText(j.last_report_time())});
  }
  t.Print(out);
}

void PrintJob(const v1::Job& j, std::ostream& out) {
  Table t({"FIELD", "VALUE"}, {Align::kLeft, Align::kLeft});
  t.AddRow({"job", j.job_id()});
  t.AddRow({"run", j.run_id().empty() ? "(default)" : j.run_id()});
  t.AddRow({"status", j.finished() ? "finished" : j.lost() ? "ended unexpectedly" : "running"});
  t.AddRow({"world size", std::to_string(j.world_size())});
  t.AddRow({"epoch", std::to_string(j.epoch())});
  t.AddRow({"highest iteration", std::to_string(j.highest_iteration())});
  t.AddRow({"threshold", Millis(j.threshold_seconds())});
  t.AddRow({"baseline", Millis(j.baseline_seconds())});
  t.AddRow({"step time", Millis(j.step_seconds())});
  t.AddRow({"active ranks", std::to_string(j.active_ranks())});
  t.AddRow({"excluded ranks", std::to_string(j.excluded_ranks())});
  t.AddRow({"straggler ranks", std::to_string(j.straggler_ranks())});
  t.AddRow({"mild ranks", std::to_string(j.mild_ranks())});
  t.AddRow({"unresponsive ranks", std::to_string(j.unresponsive_ranks())});
  t.AddRow({"membership", "v" + std::to_string(j.membership().version()) + " from iteration " +
                              std::to_string(j.membership().effective_iteration()) +
                              ", excluded " + ExcludedList(j.membership())});
  t.AddRow({"streams", std::to_string(j.streams())});
  t.AddRow({"detections", std::to_string(j.detections_total())});
  t.AddRow({"recoveries", std::to_string(j.recoveries_total())});
  t.AddRow({"guard blocks", std::to_string(j.guard_blocks_total())});
  t.AddRow({"reports", std::to_string(j.reports_total())});
  t.AddRow({"created", TimeText(j.created_at())});
  t.AddRow({"last report", TimeText(j.last_report_time())});
  if (j.earlier_runs_size() > 0) {
    std::string runs;
    for (const std::string& r : j.earlier_runs()) runs += (runs.empty() ? "" : ", ") + r;
    t.AddRow({"earlier runs", runs});
  }
  t.Print(out);
  out << "\npolicy:\n";
  PrintPolicy(j.policy(), out);
}

namespace {

// A monitor-only rank (its client does not act on membership) is never out
// for its state: "no (monitoring only)" says why a straggler stays in.
std::string ExcludedText(const v1::Worker& w) {
  if (w.excluded()) return "yes (" + ReasonName(w.exclusion_reason()) + ")";
  return w.monitor_only() ? "no (monitoring only)" : "no";
}

// A likely cause ("input_pipeline"), "-" for none (a worker that is no
// straggler); a cause this build does not know shows its number.
std::string CauseName(v1::LikelyCause c) {
  if (c == v1::LIKELY_CAUSE_UNSPECIFIED) return "-";
  const std::string& name = v1::LikelyCause_Name(c);
  return name.empty() ? std::to_string(c) : ShortName(name, "LIKELY_CAUSE_");
}

}  // namespace

void PrintWorkers(const v1::ListWorkersResponse& r, std::ostream& out) {
  // GROUP and REPLICA: the declared topology (docs/topology.md); "-" for the
  // default group and for a rank that is a replica of its own. GPU last: a
  // model name may hold spaces.
  Table t({"RANK", "STATE", "CAUSE", "EXCLUDED", "COUNTER", "EPOCH", "ITERATION", "LAST", "EWMA",
           "SLOWDOWN", "REPORTS", "OVERRIDE", "GROUP", "REPLICA", "NODE", "GPU"},
          {Align::kRight, Align::kLeft, Align::kLeft, Align::kLeft, Align::kRight, Align::kRight,
           Align::kRight,
           Align::kRight, Align::kRight, Align::kRight, Align::kRight, Align::kLeft, Align::kLeft,
           Align::kRight, Align::kLeft, Align::kLeft});
  for (const auto& w : r.workers()) {
    t.AddRow({std::to_string(w.rank()), StateName(w.state()), CauseName(w.likely_cause()),
              ExcludedText(w),
              std::to_string(w.counter()) + "/" + std::to_string(w.limit()),
              std::to_string(w.epoch()), std::to_string(w.last_iteration()),
              Millis(w.last_compute_seconds()), Millis(w.ewma_compute_seconds()),
              w.slowdown_ratio() > 0 ? Num(w.slowdown_ratio(), 2) + "x" : "-",
              std::to_string(w.reports_total()), OverrideName(w.override()),
              w.peer_group().empty() ? "-" : w.peer_group(),
              w.has_replica() ? std::to_string(w.replica()) : "-",
              w.node().empty() ? "-" : w.node(), w.gpu_model().empty() ? "-" : w.gpu_model()});
  }
  t.Print(out);
}

void PrintWorker(const v1::Worker& w, std::ostream& out) {
  Table t({"FIELD", "VALUE"}, {Align::kLeft, Align::kLeft});
  t.AddRow({"job", w.job_id()});
  t.AddRow({"rank", std::to_string(w.rank())});
  t.AddRow({"node", w.node().empty() ? "-" : w.node()});
  t.AddRow({"peer group", w.peer_group().empty() ? "- (default)" : w.peer_group()});
  t.AddRow({"replica", w.has_replica() ? std::to_string(w.replica()) : "- (its own)"});
  t.AddRow({"gpu model", w.gpu_model().empty() ? "- (unknown)" : w.gpu_model()});
  t.AddRow({"state", StateName(w.state())});
  t.AddRow({"excluded", ExcludedText(w)});
  t.AddRow({"override", OverrideName(w.override())});
  t.AddRow({"counter", std::to_string(w.counter()) + "/" + std::to_string(w.limit())});
  t.AddRow({"epoch", std::to_string(w.epoch())});
  t.AddRow({"last iteration", std::to_string(w.last_iteration())});
  t.AddRow({"last compute", Millis(w.last_compute_seconds())});
  t.AddRow({"ewma compute", Millis(w.ewma_compute_seconds())});
  t.AddRow({"slowdown", w.slowdown_ratio() > 0 ? Num(w.slowdown_ratio(), 2) + "x" : "-"});
  if (w.likely_cause() != v1::LIKELY_CAUSE_UNSPECIFIED) {
    const std::string& detail = w.likely_cause_detail();
    t.AddRow({"likely cause", CauseName(w.likely_cause()) + (detail.empty() ? "" : ": " + detail)});
  }
  t.AddRow({"reports", std::to_string(w.reports_total())});
  t.AddRow({"last report", TimeText(w.last_report_time())});
  if (w.has_gpu()) {
    const v1::GpuTelemetry& g = w.gpu();
    auto opt = [](bool has, double v, int digits, const char* unit) {
      return has ? Num(v, digits) + unit : std::string("-");
    };
    t.AddRow({"gpu", std::to_string(g.gpu_index()) + " " + (g.uuid().empty() ? "-" : g.uuid()) +
                         (w.gpu_stale() ? "  (stale)" : "")});
    t.AddRow({"gpu sampled", TimeText(g.sample_time())});
    t.AddRow({"sm clock", opt(g.has_sm_clock_hertz(), g.sm_clock_hertz() / 1e9, 2, " GHz") +
                              " / max " +
                              opt(g.has_max_sm_clock_hertz(), g.max_sm_clock_hertz() / 1e9, 2, " GHz")});
    t.AddRow({"memory clock", opt(g.has_memory_clock_hertz(), g.memory_clock_hertz() / 1e9, 2, " GHz")});
    t.AddRow({"temperature", opt(g.has_temperature_celsius(), g.temperature_celsius(), 0, " C")});
    t.AddRow({"power", opt(g.has_power_watts(), g.power_watts(), 0, " W") + " / limit " +
                           opt(g.has_power_limit_watts(), g.power_limit_watts(), 0, " W")});
    t.AddRow({"utilization", opt(g.has_gpu_utilization(), g.gpu_utilization() * 100, 0, "%") +
                                 " gpu, " +
                                 opt(g.has_memory_utilization(), g.memory_utilization() * 100, 0, "%") +
                                 " memory"});
    std::string reasons = "-";
    if (g.has_clock_event_reasons()) {
      char hex[32];
      std::snprintf(hex, sizeof hex, "0x%llx",
                    static_cast<unsigned long long>(g.clock_event_reasons()));
      reasons = hex;
      if (g.clock_event_reasons() & (0x20 | 0x40)) reasons += " thermal";
      if (g.clock_event_reasons() & (0x4 | 0x80)) reasons += " power";
      if (g.clock_event_reasons() & 0x8) reasons += " hw_slowdown";
    }
    t.AddRow({"clock event reasons", reasons});
    auto count = [](bool has, uint64_t v) { return has ? std::to_string(v) : std::string("-"); };
    t.AddRow({"ecc errors", count(g.has_ecc_corrected_errors(), g.ecc_corrected_errors()) +
                                " corrected, " +
                                count(g.has_ecc_uncorrected_errors(), g.ecc_uncorrected_errors()) +
                                " uncorrected"});
  } else {
    t.AddRow({"gpu", "- (no telemetry)"});
  }
  t.Print(out);
}

void PrintMembership(const v1::Membership& m, std::ostream& out) {
  out << "job " << m.job_id() << "  version " << m.version() << "  effective at iteration "
      << m.effective_iteration() << "  world size " << m.world_size() << "  lead "
      << m.lead_iterations() << "  created " << TimeText(m.created_at()) << '\n';
  if (m.excluded_size() == 0) {
    out << "excluded: none\n";
    return;
  }
  bool hybrid = false;  // replica and culprit columns only where a rank declared a replica
  for (const auto& e : m.excluded()) hybrid = hybrid || e.has_replica();
  if (!hybrid) {
    Table t({"RANK", "REASON", "SINCE ITERATION", "DETAIL"},
            {Align::kRight, Align::kLeft, Align::kRight, Align::kLeft});
    for (const auto& e : m.excluded())
      t.AddRow({std::to_string(e.rank()), ReasonName(e.reason()),
                std::to_string(e.since_iteration()), e.detail().empty() ? "-" : e.detail()});
    t.Print(out);
    return;
  }
  Table t({"RANK", "REASON", "REPLICA", "CULPRIT", "SINCE ITERATION", "DETAIL"},
          {Align::kRight, Align::kLeft, Align::kRight, Align::kLeft, Align::kRight, Align::kLeft});
  for (const auto& e : m.excluded()) {
    std::string culprit = "-";
    if (e.has_culprit_rank()) {
      culprit = std::to_string(e.culprit_rank());
      if (!e.culprit_peer_group().empty()) culprit += " (" + e.culprit_peer_group() + ")";
    }
    t.AddRow({std::to_string(e.rank()), ReasonName(e.reason()),
              e.has_replica() ? std::to_string(e.replica()) : "-", culprit,
              std::to_string(e.since_iteration()), e.detail().empty() ? "-" : e.detail()});
  }
  t.Print(out);
}

void PrintMembershipLine(const v1::Membership& m, std::ostream& out) {
  out << TimeText(m.created_at()) << "  v" << m.version() << "  effective at iteration "
      << m.effective_iteration() << "  excluded " << ExcludedList(m) << '\n';
}

// The event's message, and on a detection the likely cause (docs/detection.md).
std::string MessageWithCause(const v1::Event& e) {
  std::string m = e.message();
  if (e.has_evidence() && e.evidence().likely_cause() != v1::LIKELY_CAUSE_UNSPECIFIED) {
    if (!m.empty()) m += "; ";
    m += "likely cause " + CauseName(e.evidence().likely_cause());
    if (!e.evidence().likely_cause_detail().empty()) m += ": " + e.evidence().likely_cause_detail();
  }
  return m.empty() ? "-" : m;
}

void PrintEvents(const v1::ListEventsResponse& r, std::ostream& out) {
  Table t({"SEQ", "TIME", "KIND", "RANK", "CHANGE", "ITERATION", "COMPUTE", "THRESHOLD", "COUNTER",
           "MEMBERSHIP", "MESSAGE"},
          {Align::kRight, Align::kLeft, Align::kLeft, Align::kRight, Align::kLeft, Align::kRight,
           Align::kRight, Align::kRight, Align::kRight, Align::kLeft, Align::kLeft});
  for (const auto& e : r.events()) {
    const bool per_rank = e.has_rank();
    const bool change = e.kind() == v1::EVENT_KIND_STATE_CHANGE;
    const bool evidence = e.has_evidence() && per_rank;
    t.AddRow({std::to_string(e.sequence()), TimeText(e.time()), EventKindName(e.kind()),
              per_rank ? std::to_string(e.rank()) : "-",
              change ? StateName(e.from()) + " -> " + StateName(e.to()) : "-",
              std::to_string(e.iteration()),
              evidence ? Millis(e.evidence().compute_seconds()) : "-",
              evidence ? Millis(e.evidence().threshold_seconds()) : "-",
              evidence ? std::to_string(e.evidence().counter()) + "/" +
                             std::to_string(e.evidence().limit())
                       : "-",
              e.membership_version() > 0 ? "v" + std::to_string(e.membership_version()) : "-",
              MessageWithCause(e)});
  }
  t.Print(out);
  out << "last sequence: " << r.last_sequence() << '\n';
}

void PrintEventLine(const v1::Event& e, std::ostream& out) {
  out << e.sequence() << "  " << TimeText(e.time()) << "  " << e.job_id() << "  "
      << EventKindName(e.kind());
  if (e.has_rank()) {
    out << "  rank " << e.rank();
    if (e.kind() == v1::EVENT_KIND_STATE_CHANGE)
      out << " " << StateName(e.from()) << " -> " << StateName(e.to());
  }
  out << "  iteration " << e.iteration();
  if (e.membership_version() > 0) out << "  v" << e.membership_version();
  out << "  " << MessageWithCause(e) << '\n';
}

// Every field of v1.PolicyConfig, by its name (the YAML key and, with
// dashes, the `stragglerctl policy` flag; policy_flags.cc builds those from
// the same descriptor), so a new field is shown without an edit here. "-":
// not set (the daemon's default applies).
void PrintPolicy(const v1::PolicyConfig& p, std::ostream& out) {
  namespace pb = google::protobuf;
  Table t({"SETTING", "VALUE"}, {Align::kLeft, Align::kLeft});
  const pb::Descriptor* d = p.GetDescriptor();
  const pb::Reflection* r = p.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    std::string value = "-";
    if (!f->has_presence() || r->HasField(p, f)) {
      switch (f->cpp_type()) {
        case pb::FieldDescriptor::CPPTYPE_ENUM:
          value = f->name() == "kind"       ? PolicyKindName(p.kind())
                  : f->name() == "recovery" ? RecoveryName(p.recovery())
                                            : r->GetEnum(p, f)->name();
          break;
        case pb::FieldDescriptor::CPPTYPE_DOUBLE: {
          const double v = r->GetDouble(p, f);
          value = absl::EndsWith(f->name(), "_seconds") ? Num(v, 3) + " s" : Num(v, 3);
          break;
        }
        case pb::FieldDescriptor::CPPTYPE_UINT32:
          value = std::to_string(r->GetUInt32(p, f));
          break;
        case pb::FieldDescriptor::CPPTYPE_BOOL:
          value = YesNo(r->GetBool(p, f));
          break;
        default:
          value = "?";  // a field type PolicyConfig does not use (yet)
      }
    }
    t.AddRow({f->name(), value});
  }
  t.Print(out);
}

void PrintReportsCsv(const v1::ExportReportsResponse& r, std::ostream& out) {
  // The work and phase columns only where some report has them: a trace of
  // a job that reports none keeps its four columns.
  bool extra = false;
  for (const v1::IterationReport& report : r.reports())
    extra = extra || report.has_work() || report.has_input_wait_seconds() ||
            report.has_optimizer_seconds();
  out << "epoch,iteration,rank,compute_seconds"
      << (extra ? ",work,input_wait_seconds,optimizer_seconds\n" : "\n");
  char v[32];
  auto num = [&](double x) {
    std::snprintf(v, sizeof v, "%.9g", x);
    return std::string(v);
  };
  for (const v1::IterationReport& report : r.reports()) {
    out << report.epoch() << ',' << report.iteration() << ',' << report.rank() << ','
        << num(report.compute_seconds());
    if (extra) {  // an empty cell: not in this report
      out << ',' << (report.has_work() ? num(report.work()) : "") << ','
          << (report.has_input_wait_seconds() ? num(report.input_wait_seconds()) : "") << ','
          << (report.has_optimizer_seconds() ? num(report.optimizer_seconds()) : "");
    }
    out << '\n';
  }
}

}  // namespace stragglerctl
