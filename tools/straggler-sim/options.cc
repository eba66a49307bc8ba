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
  return factor;
}

}  // namespace straggler_sim
