#include "policy_flags.h"

#include <string>

namespace stragglerctl {
namespace v1 = straggler::v1;

namespace {

// A flag that, when given, sets its field through `set` and notes `any`.
template <typename T, typename Set>
CLI::Option* Flag(CLI::App* app, bool* any, const std::string& name, const std::string& help,
                  Set set) {
  return app->add_option_function<T>(
      name,
      [any, set](const T& value) {
        *any = true;
        set(value);
      },
      help);
}

}  // namespace

void AddPolicyFlags(CLI::App* p, v1::PolicyConfig* given, bool* any) {
  v1::PolicyConfig* g = given;
  Flag<std::string>(p, any, "--kind", "detection rule", [g](const std::string& v) {
    g->set_kind(v == "dynamic" ? v1::POLICY_KIND_DYNAMIC
                : v == "ewma"  ? v1::POLICY_KIND_EWMA
                               : v1::POLICY_KIND_STATIC);
  })->check(CLI::IsMember({"dynamic", "ewma", "static"}));
  Flag<uint32_t>(p, any, "--limit", "counter bound; a rank at the limit is a straggler",
                 [g](uint32_t v) { g->set_limit(v); });
  Flag<double>(p, any, "--limit-fraction", "limit as a fraction of an epoch's iterations",
               [g](double v) { g->set_limit_fraction(v); });
  Flag<uint32_t>(p, any, "--rejoin-mark", "a straggler rejoins at this counter",
                 [g](uint32_t v) { g->set_rejoin_mark(v); });
  Flag<uint32_t>(p, any, "--profile-iterations", "dynamic: n, iterations profiled",
                 [g](uint32_t v) { g->set_profile_iterations(v); });
  Flag<double>(p, any, "--threshold-factor", "dynamic: k, threshold factor",
               [g](double v) { g->set_threshold_factor(v); });
  Flag<uint32_t>(p, any, "--window-iterations", "dynamic: re-profile every W iterations",
                 [g](uint32_t v) { g->set_window_iterations(v); });
  Flag<double>(p, any, "--global-shift-fraction",
               "dynamic: more than this fraction slow at once is a job-wide slowdown",
               [g](double v) { g->set_global_shift_fraction(v); });
  Flag<std::string>(p, any, "--recovery", "how excluded ranks are judged",
                    [g](const std::string& v) {
                      g->set_recovery(v == "shadow" ? v1::RECOVERY_MODE_SHADOW
                                                    : v1::RECOVERY_MODE_PROBATION);
                    })
      ->check(CLI::IsMember({"shadow", "probation"}));
  Flag<double>(p, any, "--ewma-alpha", "ewma: smoothing factor",
               [g](double v) { g->set_ewma_alpha(v); });
  Flag<double>(p, any, "--ewma-ratio", "ewma: straggler above ratio x median",
               [g](double v) { g->set_ewma_ratio(v); });
  Flag<uint32_t>(p, any, "--ewma-min-samples", "ewma: samples needed",
                 [g](uint32_t v) { g->set_ewma_min_samples(v); });
  Flag<double>(p, any, "--static-threshold-seconds", "static: fixed threshold in seconds",
               [g](double v) { g->set_static_threshold_seconds(v); });
  Flag<double>(p, any, "--max-excluded-fraction",
               "guard: most ranks excluded at once, as a fraction",
               [g](double v) { g->set_max_excluded_fraction(v); });
  Flag<uint32_t>(p, any, "--min-active-ranks", "guard: fewest active",
                 [g](uint32_t v) { g->set_min_active_ranks(v); });
  Flag<uint32_t>(p, any, "--min-active-replicas", "guard: fewest active data-parallel replicas",
                 [g](uint32_t v) { g->set_min_active_replicas(v); });
  Flag<uint32_t>(p, any, "--cooldown-iterations", "guard: iterations between flips",
                 [g](uint32_t v) { g->set_cooldown_iterations(v); });
  Flag<double>(p, any, "--min-throughput-gain",
               "guard: exclude only when throughput gains this fraction",
               [g](double v) { g->set_min_throughput_gain(v); });
  Flag<uint32_t>(p, any, "--lead-iterations", "membership switch lead",
                 [g](uint32_t v) { g->set_lead_iterations(v); });
  Flag<double>(p, any, "--unresponsive-after-seconds", "silence before a rank is unresponsive",
               [g](double v) { g->set_unresponsive_after_seconds(v); });
  Flag<double>(p, any, "--max-compute-seconds",
               "reports above this compute time are rejected as absurd",
               [g](double v) { g->set_max_compute_seconds(v); });
  Flag<std::string>(p, any, "--exclusion-enabled", "false = classify and alert only",
                    [g](const std::string& v) { g->set_exclusion_enabled(v == "true"); })
      ->check(CLI::IsMember({"true", "false"}));
}

}  // namespace stragglerctl
