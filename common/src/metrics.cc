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

namespace straggler::common {

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

}  // namespace straggler::common
