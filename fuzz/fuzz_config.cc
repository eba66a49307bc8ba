// libFuzzer target: the daemon's config loader (ParseConfig) on arbitrary
// YAML text, as `--config` or a SIGHUP reload would read it. Whatever the
// text, the loader answers with a config or an error naming the source; an
// accepted config is usable (policy lookup, validation) and every policy
// field of it lies within the bounds of PolicyFields().
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <variant>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "config/config.h"
#include "require.h"

namespace sd = straggler::daemon;

namespace {

void Require(bool ok, const char* what) { straggler::fuzz::Require(ok, "fuzz_config", what); }

// The invariant the PolicyFields() bounds exist for (issue 15): every
// numeric field of an accepted policy is finite and inside its range, and
// the durations convert to nanoseconds without saturating.
void RequireWithinBounds(const straggler::engine::PolicyConfig& p) {
  using straggler::engine::PolicyConfig;
  for (const auto& f : straggler::engine::PolicyFields()) {
    std::visit(
        [&](auto member) {
          using T = std::remove_cvref_t<decltype(p.*member)>;
          if constexpr (std::is_same_v<T, uint32_t> || std::is_same_v<T, double>) {
            const double v = static_cast<double>(p.*member);
            Require(std::isfinite(v) && v <= f.max && (f.min_exclusive ? v > f.min : v >= f.min),
                    "an accepted policy field outside its PolicyFields() range");
          }
        },
        f.member);
  }
  Require(straggler::engine::SaturatingNanoseconds(p.unresponsive_after_seconds) <
              std::chrono::nanoseconds::max(),
          "unresponsive_after_seconds overflows int64 nanoseconds");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<sd::DaemonConfig> config = sd::ParseConfig(text, "fuzz.yaml");
  if (!config.ok()) {
    Require(config.status().code() == absl::StatusCode::kInvalidArgument,
            "a config refused with another code");
    Require(absl::StartsWith(config.status().message(), "fuzz.yaml"),
            "a config error that does not name the file");
    return 0;
  }
  Require(config->policy.Validate().ok(), "an accepted config with an invalid policy");
  RequireWithinBounds(config->policy);
  for (const sd::JobPolicyRule& rule : config->jobs) {
    Require(rule.policy.Validate().ok(), "an accepted job rule with an invalid policy");
    RequireWithinBounds(rule.policy);
    Require(sd::GlobMatch(rule.match, rule.match), "a rule's pattern does not match itself");
  }
  (void)sd::SamePolicy(config->policy, config->PolicyFor("job-1"));
  return 0;
}
