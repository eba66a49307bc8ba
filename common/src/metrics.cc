#include "straggler/common/metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace straggler::common {

namespace {

// Debian's abseil has its own string_view: convert explicitly for StrCat.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

bool IsAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

const char* TypeName(prometheus::MetricType t) {
  switch (t) {
    case prometheus::MetricType::Counter: return "counter";
    case prometheus::MetricType::Gauge: return "gauge";
    case prometheus::MetricType::Histogram: return "histogram";
    case prometheus::MetricType::Summary: return "summary";
    case prometheus::MetricType::Untyped: return "untyped";
  }
  return "untyped";
}

// Writes `v` by the rule of metrics.h into `buf` (64 bytes); returns the end.
char* FormatValueTo(double v, char* buf) {
  auto put = [&](std::string_view s) { return std::copy(s.begin(), s.end(), buf); };
  if (std::isnan(v)) return put("NaN");
  if (std::isinf(v)) return put(v > 0 ? "+Inf" : "-Inf");
  // Exact integers (every double of magnitude >= 2^52 is one) print as such.
  if (v == std::trunc(v) && std::fabs(v) < 9223372036854775808.0) {
    return std::to_chars(buf, buf + 64, static_cast<int64_t>(v)).ptr;
  }
  // Shortest round-trip digits, laid out as a plain decimal from 1e-4 up to
  // 1e21 and with an exponent outside.
  char sci[64];
  auto r = std::to_chars(sci, sci + sizeof sci, v, std::chars_format::scientific);
  std::string_view s(sci, static_cast<size_t>(r.ptr - sci));  // "-d.ddde+XX"
  const size_t e = s.find('e');
  std::string_view mantissa = s.substr(0, e);
  std::string_view exp_text = s.substr(e + 1);
  const bool exp_negative = exp_text.front() == '-';
  exp_text.remove_prefix(1);  // to_chars always writes the sign
  int exp = 0;
  std::from_chars(exp_text.data(), exp_text.data() + exp_text.size(), exp);
  if (exp_negative) exp = -exp;
  char* out = buf;
  if (mantissa.front() == '-') {
    *out++ = '-';
    mantissa.remove_prefix(1);
  }
  char digits[32];
  size_t n = 0;
  for (char c : mantissa) {
    if (c != '.') digits[n++] = c;
  }
  if (exp < -4 || exp >= 21) {
    *out++ = digits[0];
    if (n > 1) {
      *out++ = '.';
      out = std::copy(digits + 1, digits + n, out);
    }
    *out++ = 'e';
    *out++ = exp < 0 ? '-' : '+';
    const int a = std::abs(exp);
    if (a < 10) *out++ = '0';
    return std::to_chars(out, buf + 64, a).ptr;
  }
  if (exp < 0) {
    *out++ = '0';
    *out++ = '.';
    out = std::fill_n(out, -exp - 1, '0');
    return std::copy(digits, digits + n, out);
  }
  const size_t int_digits = static_cast<size_t>(exp) + 1;
  if (n <= int_digits) {
    out = std::copy(digits, digits + n, out);
    return std::fill_n(out, int_digits - n, '0');
  }
  out = std::copy(digits, digits + int_digits, out);
  *out++ = '.';
  return std::copy(digits + int_digits, digits + n, out);
}

void AppendValue(std::string& out, double v) {
  char buf[64];
  out.append(buf, static_cast<size_t>(FormatValueTo(v, buf) - buf));
}

void AppendCount(std::string& out, uint64_t v) {
  char buf[24];
  out.append(buf, static_cast<size_t>(std::to_chars(buf, buf + sizeof buf, v).ptr - buf));
}

void AppendEscaped(std::string& out, std::string_view s, bool quote) {
  // Most label values need no escape: append them whole.
  if (s.find_first_of(quote ? "\\\"\n" : "\\\n") == std::string_view::npos) {
    out.append(s);
    return;
  }
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
}

// One line: name+suffix{labels[,extra]} value.
struct LineWriter {
  std::string& out;
  const std::string& name;
  const Labels& labels;

  void Start(std::string_view suffix, std::string_view le) {
    out += name;
    out.append(suffix);
    if (labels.empty() && le.empty()) {
      out += ' ';
      return;
    }
    out += '{';
    bool first = true;
    for (const auto& l : labels) {
      if (!first) out += ',';
      first = false;
      out += l.name;
      out += "=\"";
      AppendEscaped(out, l.value, true);
      out += '"';
    }
    if (!le.empty()) {
      if (!first) out += ',';
      out += "le=\"";
      out.append(le);
      out += '"';
    }
    out += "} ";
  }
  void Value(std::string_view suffix, double v, std::string_view le = {}) {
    Start(suffix, le);
    AppendValue(out, v);
    out += '\n';
  }
  void Count(std::string_view suffix, uint64_t v, std::string_view le = {}) {
    Start(suffix, le);
    AppendCount(out, v);
    out += '\n';
  }
};

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
  char buf[64];
  return std::string(buf, FormatValueTo(v, buf));
}

std::string EscapeHelp(std::string_view help) {
  std::string out;
  AppendEscaped(out, help, false);
  return out;
}

std::string EscapeLabelValue(std::string_view value) {
  std::string out;
  AppendEscaped(out, value, true);
  return out;
}

// ------------------------------------------------------------- serializer

std::string TextSerializer::Write(const std::vector<prometheus::MetricFamily>& families,
                                  absl::Status* status) const {
  auto error = [&](std::string message) {
    if (status != nullptr && status->ok()) *status = absl::InvalidArgumentError(message);
  };
  if (status != nullptr) *status = absl::OkStatus();
  size_t series = 0;
  for (const auto& f : families) series += f.metric.size();
  std::string out;
  out.reserve(series * 80 + families.size() * 160);
  std::vector<std::string_view> seen;
  seen.reserve(families.size());
  for (const auto& f : families) {
    if (!IsValidMetricName(f.name)) {
      error(absl::StrCat("invalid metric name '", f.name, "'"));
      continue;
    }
    if (std::find(seen.begin(), seen.end(), f.name) != seen.end()) {
      error(absl::StrCat("metric family '", f.name, "' written twice"));
      continue;
    }
    seen.emplace_back(f.name);
    absl::StrAppend(&out, "# HELP ", f.name, " ");
    AppendEscaped(out, f.help, false);
    absl::StrAppend(&out, "\n# TYPE ", f.name, " ", TypeName(f.type), "\n");
    const bool histogram = f.type == prometheus::MetricType::Histogram;
    for (const auto& m : f.metric) {
      bool valid = true;
      for (size_t i = 0; i < m.label.size() && valid; ++i) {
        const std::string& name = m.label[i].name;
        // `le` belongs to the histogram's buckets.
        if (!IsValidLabelName(name) || (histogram && name == "le")) {
          error(absl::StrCat("invalid label name '", name, "' in family '", f.name, "'"));
          valid = false;
        }
        for (size_t k = 0; k < i && valid; ++k) {
          if (m.label[k].name == name) {
            error(absl::StrCat("label '", name, "' repeated in family '", f.name, "'"));
            valid = false;
          }
        }
      }
      if (!valid) continue;
      LineWriter line{out, f.name, m.label};
      switch (f.type) {
        case prometheus::MetricType::Counter: line.Value("", m.counter.value); break;
        case prometheus::MetricType::Gauge: line.Value("", m.gauge.value); break;
        case prometheus::MetricType::Untyped: line.Value("", m.untyped.value); break;
        case prometheus::MetricType::Summary: {
          for (const auto& q : m.summary.quantile) {
            // quantile is a label of its own: written like an `le` bound.
            char buf[64];
            const std::string_view text(buf, static_cast<size_t>(FormatValueTo(q.quantile, buf) - buf));
            out += f.name;
            out += '{';
            for (const auto& l : m.label) {
              absl::StrAppend(&out, l.name, "=\"", EscapeLabelValue(l.value), "\",");
            }
            absl::StrAppend(&out, "quantile=\"", Sv(text), "\"} ");
            AppendValue(out, q.value);
            out += '\n';
          }
          line.Value("_sum", m.summary.sample_sum);
          line.Count("_count", m.summary.sample_count);
          break;
        }
        case prometheus::MetricType::Histogram: {
          bool has_inf = false;
          for (const auto& b : m.histogram.bucket) {
            char buf[64];
            const std::string_view le(buf, static_cast<size_t>(FormatValueTo(b.upper_bound, buf) - buf));
            has_inf = has_inf || std::isinf(b.upper_bound);
            line.Count("_bucket", b.cumulative_count, le);
          }
          // The format requires a +Inf bucket; its count is the total.
          if (!has_inf) line.Count("_bucket", m.histogram.sample_count, "+Inf");
          line.Value("_sum", m.histogram.sample_sum);
          line.Count("_count", m.histogram.sample_count);
          break;
        }
      }
    }
  }
  return out;
}

// ------------------------------------------------------------- data model

prometheus::MetricFamily& AddFamily(std::vector<prometheus::MetricFamily>& out, std::string name,
                                    prometheus::MetricType type, std::string help) {
  prometheus::MetricFamily& f = out.emplace_back();
  f.name = std::move(name);
  f.type = type;
  f.help = std::move(help);
  return f;
}

void AddSample(prometheus::MetricFamily& family, Labels labels, double value) {
  prometheus::ClientMetric& m = family.metric.emplace_back();
  m.label = std::move(labels);
  switch (family.type) {
    case prometheus::MetricType::Counter: m.counter.value = value; break;
    case prometheus::MetricType::Gauge: m.gauge.value = value; break;
    default: m.untyped.value = value; break;
  }
}

AtomicHistogram::AtomicHistogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void AtomicHistogram::Observe(double value) {
  // prometheus::Histogram's rule (a NaN finds no bound: +Inf).
  const size_t i = static_cast<size_t>(
      std::find_if(bounds_.begin(), bounds_.end(), [value](double b) { return b >= value; }) -
      bounds_.begin());
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

prometheus::ClientMetric AtomicHistogram::Collect() const {
  prometheus::ClientMetric m;
  m.histogram.bucket.resize(bounds_.size() + 1);
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i].load(std::memory_order_relaxed);
    m.histogram.bucket[i].cumulative_count = cumulative;
    m.histogram.bucket[i].upper_bound =
        i == bounds_.size() ? std::numeric_limits<double>::infinity() : bounds_[i];
  }
  m.histogram.sample_count = cumulative;
  m.histogram.sample_sum = sum_.load(std::memory_order_relaxed);
  return m;
}

void AddHistogram(prometheus::MetricFamily& family, Labels labels, const AtomicHistogram& h) {
  prometheus::ClientMetric m = h.Collect();
  m.label = std::move(labels);
  family.metric.push_back(std::move(m));
}

std::string Scrape(const std::vector<const prometheus::Collectable*>& collectables) {
  std::vector<prometheus::MetricFamily> families;
  for (const prometheus::Collectable* c : collectables) {
    std::vector<prometheus::MetricFamily> more = c->Collect();
    families.insert(families.end(), std::make_move_iterator(more.begin()),
                    std::make_move_iterator(more.end()));
  }
  return TextSerializer().Serialize(families);
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

void AddProcessMetrics(const ProcessStats& p, std::vector<prometheus::MetricFamily>& out) {
  using T = prometheus::MetricType;
  auto one = [&](const char* name, T type, const char* help, const std::optional<double>& v) {
    if (v) AddSample(AddFamily(out, name, type, help), {}, *v);
  };
  one("process_cpu_seconds_total", T::Counter,
      "Total user and system CPU time spent in seconds.", p.cpu_seconds);
  one("process_resident_memory_bytes", T::Gauge, "Resident memory size in bytes.",
      p.resident_memory_bytes);
  one("process_virtual_memory_bytes", T::Gauge, "Virtual memory size in bytes.",
      p.virtual_memory_bytes);
  one("process_open_fds", T::Gauge, "Number of open file descriptors.", p.open_fds);
  one("process_max_fds", T::Gauge, "Maximum number of open file descriptors.", p.max_fds);
  one("process_start_time_seconds", T::Gauge,
      "Start time of the process since unix epoch in seconds.", p.start_time_seconds);
}

std::vector<prometheus::MetricFamily> ProcessCollector::Collect() const {
  std::vector<prometheus::MetricFamily> out;
  AddProcessMetrics(ReadProcessStats(), out);
  return out;
}

}  // namespace straggler::common
