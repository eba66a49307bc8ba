// YamlReader and the scenario models' parsers (scenario_yaml.h): `work`,
// `input`, `host`.
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "scenario_yaml.h"

namespace straggler::quality::internal {

absl::Status YamlReader::Error(const YAML::Node& node, absl::string_view message) const {
  const YAML::Mark m = node.Mark();
  if (m.line < 0) return absl::InvalidArgumentError(absl::StrCat(source_, ": ", message));
  return absl::InvalidArgumentError(absl::StrCat(source_, ":", m.line + 1, ": ", message));
}

absl::StatusOr<std::string> YamlReader::Scalar(const YAML::Node& n, absl::string_view key) const {
  if (!n.IsScalar()) return Error(n, absl::StrCat(key, " must be a single value"));
  return n.Scalar();
}

absl::StatusOr<uint64_t> YamlReader::Uint(const YAML::Node& n, absl::string_view key) const {
  auto s = Scalar(n, key);
  if (!s.ok()) return s.status();
  uint64_t v = 0;
  if (!absl::SimpleAtoi(*s, &v))
    return Error(n, absl::StrCat(key, "=", *s, " is not a non-negative integer"));
  return v;
}

absl::StatusOr<double> YamlReader::Double(const YAML::Node& n, absl::string_view key) const {
  auto s = Scalar(n, key);
  if (!s.ok()) return s.status();
  double v = 0;
  if (!absl::SimpleAtod(*s, &v) || !std::isfinite(v))
    return Error(n, absl::StrCat(key, "=", *s, " is not a number"));
  return v;
}

absl::StatusOr<double> YamlReader::Bounded(const YAML::Node& n, absl::string_view key,
                                           Range r) const {
  auto v = Double(n, key);
  if (!v.ok()) return v.status();
  const bool above = r.lo_open ? *v > r.lo : *v >= r.lo;
  const bool below = r.hi_open ? *v < r.hi : *v <= r.hi;
  if (!above || !below)
    return Error(n, absl::StrCat(key, "=", *v, " must be in ", r.lo_open ? "(" : "[", r.lo,
                                 ", ", r.hi, r.hi_open ? ")" : "]"));
  return *v;
}

namespace {

// Every key of map `n` (model `name`) through `one(key, value node)`; a key
// `one` does not know is NOT_FOUND, reported naming `keys`.
template <typename F>
absl::Status EachKey(const YamlReader& in, const YAML::Node& n, absl::string_view name,
                     absl::string_view keys, F&& one) {
  if (!n.IsMap()) return in.Error(n, absl::StrCat(name, " must be a map"));
  for (const auto& kv : n) {
    const std::string key = kv.first.Scalar();
    absl::Status s = one(key, kv.second);
    if (absl::IsNotFound(s))
      return in.Error(kv.first, absl::StrCat("unknown key '", key, "' in ", name, " (", keys, ")"));
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// `value` into `out` when it reads, else its error.
absl::Status Set(const absl::StatusOr<double>& value, double& out) {
  if (!value.ok()) return value.status();
  out = *value;
  return absl::OkStatus();
}

}  // namespace

// `work: {sequences: N, sigma: S, attention: A, overhead: O, report:
// cost|tokens|none}`.
absl::Status ParseWork(const YamlReader& in, const YAML::Node& n, WorkModel& w) {
  absl::Status s = EachKey(
      in, n, "work", "sequences, sigma, attention, overhead, report",
      [&](const std::string& key, const YAML::Node& v) -> absl::Status {
        if (key == "sequences") {
          auto count = in.Uint(v, "work.sequences");
          if (!count.ok()) return count.status();
          if (*count < 1 || *count > 4096)
            return in.Error(v, absl::StrCat("work.sequences=", *count, " must be in [1, 4096]"));
          w.sequences = static_cast<uint32_t>(*count);
          return absl::OkStatus();
        }
        if (key == "sigma") return Set(in.Bounded(v, "work.sigma", {0, 2}), w.sigma);
        if (key == "attention") return Set(in.Bounded(v, "work.attention", {0, 100}), w.attention);
        if (key == "overhead")
          return Set(in.Bounded(v, "work.overhead", {0, 1, false, true}), w.overhead);
        if (key != "report") return absl::NotFoundError(key);
        const std::string r = v.Scalar();
        if (r == "cost") w.report = WorkModel::Reported::kCost;
        else if (r == "tokens") w.report = WorkModel::Reported::kTokens;
        else if (r == "none") w.report = WorkModel::Reported::kNone;
        else return in.Error(v, absl::StrCat("work.report='", r, "' must be cost, tokens or none"));
        return absl::OkStatus();
      });
  if (s.ok()) w.enabled = true;
  return s;
}

// `input: {share: S, noise: N}`.
absl::Status ParseInput(const YamlReader& in, const YAML::Node& n, InputModel& m) {
  absl::Status s = EachKey(in, n, "input", "share, noise",
                           [&](const std::string& key, const YAML::Node& v) -> absl::Status {
                             if (key == "share")
                               return Set(in.Bounded(v, "input.share", {0, 1, true, true}),
                                          m.share);
                             if (key == "noise")
                               return Set(in.Bounded(v, "input.noise", {0, 1}), m.noise);
                             return absl::NotFoundError(key);
                           });
  if (s.ok()) m.enabled = true;
  return s;
}

// `host: {run_delay: D}`.
absl::Status ParseHost(const YamlReader& in, const YAML::Node& n, HostModel& h) {
  absl::Status s = EachKey(in, n, "host", "run_delay",
                           [&](const std::string& key, const YAML::Node& v) -> absl::Status {
                             if (key != "run_delay") return absl::NotFoundError(key);
                             return Set(in.Bounded(v, "host.run_delay", {0, 1, false, true}),
                                        h.run_delay);
                           });
  if (s.ok()) h.enabled = true;
  return s;
}

}  // namespace straggler::quality::internal
