// Human-readable rendering of straggler.v1 messages for stragglerctl: aligned
// tables, durations in milliseconds, enum values as short lowercase words
// ("straggler", "forced", "state_change") — the same words the daemon's logs
// and the YAML config use, so an operator sees one vocabulary.
//
//   Table t({"RANK", "STATE"}, {Align::kRight, Align::kLeft});
//   t.AddRow({"3", "straggler"});
//   t.Print(std::cout);
//
// Plain functions and a value type; no shared state.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "straggler/v1/straggler.pb.h"

namespace stragglerctl {

enum class Align { kLeft, kRight };

// Columns separated by two spaces, each as wide as its widest cell.
class Table {
 public:
  Table(std::vector<std::string> headers, std::vector<Align> aligns);
  void AddRow(std::vector<std::string> cells);
  void Print(std::ostream& out) const;

 private:
  std::vector<std::string> headers_;
  std::vector<Align> aligns_;
  std::vector<std::vector<std::string>> rows_;
};

std::string StateName(straggler::v1::WorkerState s);
std::string ReasonName(straggler::v1::ExclusionReason r);
std::string PolicyKindName(straggler::v1::PolicyKind k);
std::string RecoveryName(straggler::v1::RecoveryMode m);
std::string OverrideName(straggler::v1::RankOverride o);
std::string EventKindName(straggler::v1::EventKind k);

// 0.0213 -> "21.3 ms"; 0 -> "-" (no value yet).
std::string Millis(double seconds);
// "2024-05-01T12:00:03.123Z"; "-" for an unset timestamp.
std::string TimeText(const google::protobuf::Timestamp& t);
// "excluded [3 (straggler), 5 (forced)]" style list; "none" when empty.
std::string ExcludedList(const straggler::v1::Membership& m);

void PrintJobs(const straggler::v1::ListJobsResponse& r, std::ostream& out);
void PrintJob(const straggler::v1::Job& job, std::ostream& out);
void PrintWorkers(const straggler::v1::ListWorkersResponse& r, std::ostream& out);
void PrintWorker(const straggler::v1::Worker& w, std::ostream& out);
void PrintMembership(const straggler::v1::Membership& m, std::ostream& out);
// One line per version, for `watch`.
void PrintMembershipLine(const straggler::v1::Membership& m, std::ostream& out);
void PrintEvents(const straggler::v1::ListEventsResponse& r, std::ostream& out);
// One line per event, for `events --follow`: sequence, time, job, kind, the
// rank and its change where the event names one, iteration, membership
// version, message.
void PrintEventLine(const straggler::v1::Event& e, std::ostream& out);
void PrintPolicy(const straggler::v1::PolicyConfig& p, std::ostream& out);
// `export --format csv`: header epoch,iteration,rank,compute_seconds, one line
// per report in the response's order, compute_seconds with %.9g (what
// straggler-replay reads).
void PrintReportsCsv(const straggler::v1::ExportReportsResponse& r, std::ostream& out);

}  // namespace stragglerctl
