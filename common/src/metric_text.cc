#include "straggler/common/metric_text.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "straggler/common/metric_family.h"

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

// Writes `v` by the rule of metric_text.h into `buf` (64 bytes); returns the end.
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


std::string Scrape(const std::vector<const prometheus::Collectable*>& collectables) {
  std::vector<prometheus::MetricFamily> families;
  for (const prometheus::Collectable* c : collectables) {
    std::vector<prometheus::MetricFamily> more = c->Collect();
    families.insert(families.end(), std::make_move_iterator(more.begin()),
                    std::make_move_iterator(more.end()));
  }
  return TextSerializer().Serialize(families);
}

}  // namespace straggler::common
