#include "options.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace straggler_sim {
namespace {

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t pos = s.find(sep, start);
    parts.push_back(s.substr(start, pos == std::string::npos ? std::string::npos : pos - start));
    if (pos == std::string::npos) return parts;
    start = pos + 1;
  }
}

template <typename T>
bool ParseUnsigned(const std::string& s, T* out) {
  if (s.empty()) return false;
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, *out);
  return ec == std::errc() && ptr == end;
}

// Shortest readable form: 0.05, -1, 1e-09 (std::to_string would print -1.000000).
std::string Num(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

bool ParseDouble(const std::string& s, double* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  *out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

}  // namespace

bool ParseSlowSpec(const std::string& text, SlowSpec* spec, std::string* error) {
  const std::string where = "--slow '" + text + "': ";
  const auto parts = Split(text, ':');
  if (parts.size() != 4) {
    *error = where + "expected RANK:FACTOR:FROM:TO, got " + std::to_string(parts.size()) +
             " field" + (parts.size() == 1 ? "" : "s");
    return false;
  }
  if (!ParseUnsigned(parts[0], &spec->rank)) {
    *error = where + "RANK '" + parts[0] + "' is not a non-negative integer";
    return false;
  }
  if (!ParseDouble(parts[1], &spec->factor)) {
    *error = where + "FACTOR '" + parts[1] + "' is not a number";
    return false;
  }
  if (!std::isfinite(spec->factor) || spec->factor <= 0.0) {
    *error = where + "FACTOR '" + parts[1] + "' must be a finite number > 0";
    return false;
  }
  if (!ParseUnsigned(parts[2], &spec->from)) {
    *error = where + "FROM '" + parts[2] + "' is not a non-negative integer";
    return false;
  }
  if (!ParseUnsigned(parts[3], &spec->to)) {
    *error = where + "TO '" + parts[3] + "' is not a non-negative integer";
    return false;
  }
  if (spec->to <= spec->from) {
    *error = where + "TO " + parts[3] + " must be greater than FROM " + parts[2];
    return false;
  }
  return true;
}

bool ParseTopology(const std::string& text, Topology* t, std::string* error) {
  const std::string where = "--topology '" + text + "': ";
  const auto parts = Split(text, 'x');
  if (parts.size() != 3) {
    *error = where + "expected REPLICASxSTAGESxTENSOR, e.g. 4x2x2";
    return false;
  }
  const char* names[] = {"REPLICAS", "STAGES", "TENSOR"};
  uint32_t* fields[] = {&t->replicas, &t->stages, &t->tensor};
  for (size_t i = 0; i < 3; ++i) {
    if (!ParseUnsigned(parts[i], fields[i]) || *fields[i] == 0) {
      *error = where + names[i] + " '" + parts[i] + "' is not an integer >= 1";
      return false;
    }
  }
  if (static_cast<uint64_t>(t->replicas) * t->stages * t->tensor > 65536) {
    *error = where + "more than 65536 ranks";
    return false;
  }
  return true;
}

bool ParseStageCost(const std::string& text, std::vector<double>* costs, std::string* error) {
  costs->clear();
  for (const std::string& part : Split(text, ',')) {
    double c = 0;
    if (!ParseDouble(part, &c) || !std::isfinite(c) || c <= 0.0) {
      *error = "--stage-cost '" + text + "': '" + part + "' is not a number > 0";
      return false;
    }
    costs->push_back(c);
  }
  return true;
}

uint32_t StageOf(const SimOptions& o, uint32_t rank) {
  const Topology& t = o.topology;
  if (t.replicas == 0) return 0;
  return rank / (t.tensor * t.replicas);  // rank = t + T*(r + R*s)
}

std::string Validate(const SimOptions& o) {
  if (o.ranks < 1) return "--ranks " + std::to_string(o.ranks) + " must be >= 1";
  if (o.iterations < 1) return "--iterations " + std::to_string(o.iterations) + " must be >= 1";
  if (!(o.iteration_ms > 0.0) || !std::isfinite(o.iteration_ms))
    return "--iteration-ms " + Num(o.iteration_ms) + " must be > 0";
  // Beyond 1 the truncation at zero dominates and the "noise" is mostly resampling.
  if (!(o.noise >= 0.0) || o.noise > 1.0)
    return "--noise " + Num(o.noise) + " must be in [0, 1]";
  if (o.membership_timeout_ms < 1)
    return "--membership-timeout-ms " + std::to_string(o.membership_timeout_ms) + " must be >= 1";
  if (o.first_rank + static_cast<uint64_t>(o.ranks) > o.World()) {
    return "--first-rank " + std::to_string(o.first_rank) + " + --ranks " +
           std::to_string(o.ranks) + " exceeds --world-size " + std::to_string(o.World());
  }
  if (o.topology.replicas > 0 && o.topology.World() != o.World()) {
    return "--topology " + std::to_string(o.topology.replicas) + "x" +
           std::to_string(o.topology.stages) + "x" + std::to_string(o.topology.tensor) + " is " +
           std::to_string(o.topology.World()) + " ranks, but the job has " +
           std::to_string(o.World()) + " (--world-size, else --ranks)";
  }
  if (o.microbatches == 0 || o.microbatches > 1'000'000)
    return "--microbatches " + std::to_string(o.microbatches) + " must be in [1, 1000000]";
  if (!o.stage_cost.empty() && o.topology.replicas == 0)
    return "--stage-cost needs --topology (the stages it prices)";
  if (!o.stage_cost.empty() && o.stage_cost.size() != o.topology.stages) {
    return "--stage-cost has " + std::to_string(o.stage_cost.size()) + " values for " +
           std::to_string(o.topology.stages) + " stages";
  }
  for (const auto& s : o.slow) {
    if (s.rank < o.first_rank || s.rank >= o.first_rank + o.ranks) {
      return "--slow rank " + std::to_string(s.rank) + " is out of range: this process runs ranks " +
             std::to_string(o.first_rank) + ".." + std::to_string(o.first_rank + o.ranks - 1);
    }
  }
  return "";
}

double SlowFactor(const SimOptions& o, uint32_t rank, uint64_t iteration) {
  double factor = 1.0;
  bool slowed = false;
  for (const auto& s : o.slow) {
    if (s.rank == rank && iteration >= s.from && iteration < s.to) {
      factor = slowed ? std::max(factor, s.factor) : s.factor;
      slowed = true;
    }
  }
  if (!o.stage_cost.empty()) factor *= o.stage_cost[StageOf(o, rank)];
  return factor;
}

}  // namespace straggler_sim
