#include "straggler/quality/csv_trace.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "straggler/v1/wire_rules.h"

namespace straggler::quality {
namespace {

// The world a trace builds is 0 .. its highest rank, whatever ranks it
// has rows for, so one stray large rank id sizes every per-rank matrix (a
// 2-row CSV naming rank 999999 built a 1e6-rank world). The daemon accepts
// no job larger than its default limits.max_ranks_per_job either.
constexpr uint64_t kMaxRanks = 65536;

struct Cell {
  uint64_t iteration;
  uint32_t rank;
  double compute;
  std::optional<uint64_t> epoch;
  std::string peer_group;
  std::optional<uint32_t> replica;
  std::string gpu_model;
  // Issue 31's optional columns; NaN = the column is absent or the cell empty.
  double work = Trace::kNoReport;
  double input_wait = Trace::kNoReport;
  double optimizer = Trace::kNoReport;
  double run_delay = Trace::kNoReport;  // the process's, s/s (the agent's telemetry)
  size_t line;
};

// A peer group as the daemon accepts it: the wire rule, not a copy of it.
bool ValidPeerGroup(absl::string_view g) {
  const auto fault = v1::rules::FindTextFault(std::string_view(g.data(), g.size()),
                                              v1::rules::kMaxPeerGroupBytes,
                                              v1::rules::IsJobIdChar);
  return !fault.too_long && fault.bad_byte == std::string_view::npos;
}

// Columns of the header (-1: absent); other columns are ignored.
struct Columns {
  int iteration = -1, rank = -1, compute = -1, epoch = -1;
  int group = -1, replica = -1, gpu = -1;
  int work = -1, input_wait = -1, optimizer = -1, run_delay = -1;
  size_t count = 0;  // fields per line
};

absl::Status LineError(const std::string& source, size_t line, absl::string_view msg) {
  return absl::InvalidArgumentError(absl::StrCat(source, ":", line, ": ", msg));
}

// The header line: each known column's index; an error names a repeated or
// missing column.
absl::Status ReadHeader(const std::vector<std::string>& fields, const std::string& source,
                        size_t line_no, Columns* col) {
  auto error = [&](size_t line, absl::string_view msg) { return LineError(source, line, msg); };
  col->count = fields.size();
  for (size_t i = 0; i < fields.size(); ++i) {
    const std::string name = absl::AsciiStrToLower(fields[i]);
    int* slot = name == "iteration"         ? &col->iteration
                : name == "rank"            ? &col->rank
                : name == "compute_seconds" ? &col->compute
                : name == "epoch"           ? &col->epoch
                : name == "peer_group"      ? &col->group
                : name == "replica"         ? &col->replica
                : name == "gpu_model"       ? &col->gpu
                : name == "work"            ? &col->work
                : name == "input_wait_seconds" ? &col->input_wait
                : name == "optimizer_seconds"  ? &col->optimizer
                : name == "run_delay_seconds_per_second" ? &col->run_delay
                                            : nullptr;
    if (slot == nullptr) continue;  // other columns are ignored
    if (*slot >= 0) return error(line_no, absl::StrCat("column '", name, "' appears twice"));
    *slot = static_cast<int>(i);
  }
  std::vector<std::string> missing;
  if (col->iteration < 0) missing.push_back("iteration");
  if (col->rank < 0) missing.push_back("rank");
  if (col->compute < 0) missing.push_back("compute_seconds");
  if (!missing.empty())
    return error(line_no, absl::StrCat("header lacks column ", absl::StrJoin(missing, ", "),
                                       " (needs iteration,rank,compute_seconds[,epoch])"));
  return absl::OkStatus();
}

// One data line; an error names the line, the column and the value.
absl::StatusOr<Cell> ReadCell(const std::vector<std::string>& fields, const Columns& col,
                              const std::string& source, size_t line_no) {
  auto error = [&](size_t line, absl::string_view msg) { return LineError(source, line, msg); };
  if (fields.size() != col.count)
    return error(line_no, absl::StrCat("has ", fields.size(), " fields, the header has ",
                                       col.count));
  Cell c{};
  c.line = line_no;
  uint64_t rank = 0;
  if (!absl::SimpleAtoi(fields[col.iteration], &c.iteration))
    return error(line_no, absl::StrCat("iteration '", fields[col.iteration],
                                       "' is not a non-negative integer"));
  if (!absl::SimpleAtoi(fields[col.rank], &rank))
    return error(line_no, absl::StrCat("rank '", fields[col.rank],
                                       "' is not a rank (a non-negative integer)"));
  if (rank >= kMaxRanks)
    return error(line_no, absl::StrCat("rank '", fields[col.rank], "' is above ", kMaxRanks - 1,
                                       ": a trace's world is ranks 0 .. its highest rank, at "
                                       "most ", kMaxRanks,
                                       " (the daemon's default limits.max_ranks_per_job)"));
  c.rank = static_cast<uint32_t>(rank);
  if (!absl::SimpleAtod(fields[col.compute], &c.compute) || !std::isfinite(c.compute) ||
      c.compute < 0)
    return error(line_no, absl::StrCat("compute_seconds '", fields[col.compute],
                                       "' is not a finite number >= 0"));
  if (col.epoch >= 0) {
    uint64_t e = 0;
    if (!absl::SimpleAtoi(fields[col.epoch], &e))
      return error(line_no, absl::StrCat("epoch '", fields[col.epoch],
                                         "' is not a non-negative integer"));
    c.epoch = e;
  }
  if (col.group >= 0) {
    c.peer_group = fields[col.group];
    if (!ValidPeerGroup(c.peer_group))
      return error(line_no, absl::StrCat("peer_group '", c.peer_group, "' is not 0 to ",
                                         v1::rules::kMaxPeerGroupBytes, " bytes of ",
                                         std::string(v1::rules::kJobIdAllowed)));
  }
  if (col.replica >= 0 && !fields[col.replica].empty()) {
    uint32_t replica = 0;
    if (!absl::SimpleAtoi(fields[col.replica], &replica))
      return error(line_no, absl::StrCat("replica '", fields[col.replica],
                                         "' is not a non-negative integer"));
    c.replica = replica;
  }
  if (col.gpu >= 0) c.gpu_model = fields[col.gpu];
  // Work and phases, by the wire's rules (wire_rules.h); an empty cell is a
  // report that did not give it.
  struct Optional {
    int column;
    const char* name;
    bool (*valid)(double);
    std::string_view rule;
    double* out;
  };
  for (const Optional& o :
       {Optional{col.work, "work", v1::rules::IsValidWork, v1::rules::kWorkAllowed, &c.work},
        Optional{col.input_wait, "input_wait_seconds", v1::rules::IsValidPhaseSeconds,
                 v1::rules::kPhaseSecondsAllowed, &c.input_wait},
        Optional{col.optimizer, "optimizer_seconds", v1::rules::IsValidPhaseSeconds,
                 v1::rules::kPhaseSecondsAllowed, &c.optimizer},
        Optional{col.run_delay, "run_delay_seconds_per_second", v1::rules::IsValidPhaseSeconds,
                 v1::rules::kPhaseSecondsAllowed, &c.run_delay}}) {
    if (o.column < 0 || fields[o.column].empty()) continue;
    if (!absl::SimpleAtod(fields[o.column], o.out) || !o.valid(*o.out))
      return error(line_no, absl::StrCat(o.name, " '", fields[o.column], "' is not ",
                                         std::string(o.rule)));
  }
  return c;
}

// One topology per rank, as a client process declares one; an error names
// the line where a rank changes it or names a replica outside the world.
absl::Status ReadTopology(const std::vector<Cell>& cells, const Columns& col,
                          const std::string& source, Trace* t) {
  auto error = [&](size_t line, absl::string_view msg) { return LineError(source, line, msg); };
  t->peer_group.assign(t->ranks, "");
  t->replica.assign(t->ranks, std::nullopt);
  if (col.gpu >= 0) t->gpu_model.assign(t->ranks, "");
  std::vector<size_t> first(t->ranks, 0);
  for (const auto& c : cells) {
    if (first[c.rank] == 0) {
      first[c.rank] = c.line;
      t->peer_group[c.rank] = c.peer_group;
      t->replica[c.rank] = c.replica;
      if (col.gpu >= 0) t->gpu_model[c.rank] = c.gpu_model;
    } else if (t->peer_group[c.rank] != c.peer_group || t->replica[c.rank] != c.replica ||
               (col.gpu >= 0 && t->gpu_model[c.rank] != c.gpu_model)) {
      return error(c.line, absl::StrCat("rank ", c.rank, " changes its topology (peer_group '",
                                        c.peer_group, "', replica ",
                                        c.replica ? absl::StrCat(*c.replica) : "-",
                                        ", gpu_model '", c.gpu_model, "') from line ",
                                        first[c.rank]));
    }
    if (c.replica && *c.replica >= t->ranks)
      return error(c.line, absl::StrCat("replica ", *c.replica, " of rank ", c.rank,
                                        " is not below the trace's ", t->ranks, " ranks"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Trace> ParseCsvTrace(std::istream& in, const std::string& source) {
  auto error = [&](size_t line, absl::string_view msg) { return LineError(source, line, msg); };
  std::string text;
  size_t line_no = 0;
  Columns col;
  bool have_header = false;
  std::vector<Cell> cells;
  while (std::getline(in, text)) {
    ++line_no;
    if (!text.empty() && text.back() == '\r') text.pop_back();
    const absl::string_view stripped = absl::StripAsciiWhitespace(text);
    if (stripped.empty() || stripped.front() == '#') continue;
    std::vector<std::string> fields = absl::StrSplit(stripped, ',');
    for (auto& f : fields) f = std::string(absl::StripAsciiWhitespace(f));
    if (!have_header) {
      have_header = true;
      if (absl::Status s = ReadHeader(fields, source, line_no, &col); !s.ok()) return s;
      continue;
    }
    absl::StatusOr<Cell> c = ReadCell(fields, col, source, line_no);
    if (!c.ok()) return c.status();
    cells.push_back(*std::move(c));
  }
  if (!have_header) return absl::InvalidArgumentError(absl::StrCat(source, ": empty trace"));
  if (cells.empty()) return absl::InvalidArgumentError(absl::StrCat(source, ": no data rows"));

  Trace t;
  t.name = source;
  uint64_t lo = cells[0].iteration, hi = lo;
  uint32_t max_rank = 0;
  for (const auto& c : cells) {
    lo = std::min(lo, c.iteration);
    hi = std::max(hi, c.iteration);
    max_rank = std::max(max_rank, c.rank);
  }
  if (hi - lo >= 10'000'000)
    return absl::InvalidArgumentError(absl::StrCat(source, ": iterations span ", lo, "..", hi,
                                                   ", more than 1e7"));
  t.ranks = max_rank + 1;
  t.first_iteration = lo;
  t.iterations = hi - lo + 1;
  t.compute.assign(static_cast<size_t>(t.iterations) * t.ranks, Trace::kNoReport);
  t.epoch.assign(t.iterations, 0);
  std::vector<size_t> epoch_line(t.iterations, 0);
  std::vector<size_t> cell_line(t.compute.size(), 0);
  for (const auto& c : cells) {
    const uint64_t row = c.iteration - lo;
    const size_t idx = static_cast<size_t>(row) * t.ranks + c.rank;
    if (cell_line[idx] != 0)
      return error(c.line, absl::StrCat("rank ", c.rank, " iteration ", c.iteration,
                                        " already given at line ", cell_line[idx]));
    cell_line[idx] = c.line;
    t.compute[idx] = c.compute;
    for (auto [column, value, out] : {std::tuple{col.work, c.work, &t.work},
                                      std::tuple{col.input_wait, c.input_wait, &t.input_wait},
                                      std::tuple{col.optimizer, c.optimizer, &t.optimizer},
                                      std::tuple{col.run_delay, c.run_delay, &t.run_delay}}) {
      if (column < 0) continue;  // files without the column read as before: no vector
      if (out->empty()) out->assign(t.compute.size(), Trace::kNoReport);
      (*out)[idx] = value;
    }
    if (c.epoch) {
      if (epoch_line[row] != 0 && t.epoch[row] != *c.epoch)
        return error(c.line, absl::StrCat("epoch ", *c.epoch, " for iteration ", c.iteration,
                                          " differs from epoch ", t.epoch[row], " at line ",
                                          epoch_line[row]));
      t.epoch[row] = *c.epoch;
      epoch_line[row] = c.line;
    }
  }
  if (col.group >= 0 || col.replica >= 0 || col.gpu >= 0) {
    if (absl::Status s = ReadTopology(cells, col, source, &t); !s.ok()) return s;
  }
  // Rows no rank gave an epoch for inherit the previous row's.
  for (uint64_t row = 1; row < t.iterations; ++row)
    if (epoch_line[row] == 0) t.epoch[row] = t.epoch[row - 1];
  for (uint64_t row = 1; row < t.iterations; ++row)
    if (t.epoch[row] < t.epoch[row - 1])
      return error(epoch_line[row], absl::StrCat("epoch goes back from ", t.epoch[row - 1],
                                                 " to ", t.epoch[row], " at iteration ",
                                                 t.Iteration(row)));
  std::vector<double> all;
  all.reserve(cells.size());
  for (const auto& c : cells) all.push_back(c.compute);
  auto mid = all.begin() + all.size() / 2;
  std::nth_element(all.begin(), mid, all.end());
  t.base_seconds = *mid;
  return t;
}

absl::StatusOr<Trace> LoadCsvTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  return ParseCsvTrace(in, path);
}

}  // namespace straggler::quality
