// libFuzzer target: the daemon's config loader (ParseConfig) on arbitrary
// YAML text, as `--config` or a SIGHUP reload would read it. Whatever the
// text, the loader answers with a config or an error naming the source; an
// accepted config is usable (policy lookup, validation) and every policy
// field of it lies within the bounds of PolicyFields().
#include <cstddef>
#include <cstdint>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "config/config.h"
#include "policy_bounds.h"
#include "require.h"

namespace sd = straggler::daemon;

namespace {

void Require(bool ok, const char* what) { straggler::fuzz::Require(ok, "fuzz_config", what); }

void RequireWithinBounds(const straggler::engine::PolicyConfig& p) {
  straggler::fuzz::RequireWithinBounds(p, "fuzz_config");
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
