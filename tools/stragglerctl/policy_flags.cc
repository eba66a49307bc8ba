#include "policy_flags.h"

#include <algorithm>
#include <map>
#include <string>

#include "straggler/v1/enum_names.h"

namespace stragglerctl {
namespace v1 = straggler::v1;
namespace pb = google::protobuf;

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

// The help of each flag (docs/detection.md has the full table); a field not
// listed here (a new one) still gets its flag, with a pointer to the reference.
const std::map<std::string, std::string>& FieldHelp() {
  static const auto* help = new std::map<std::string, std::string>{
      {"kind", "detection rule"},
      {"recovery", "how excluded ranks are judged"},
      {"limit", "counter bound; a rank at the limit is a straggler"},
      {"limit_fraction", "limit as a fraction of an epoch's iterations"},
      {"rejoin_mark", "a straggler rejoins at this counter"},
      {"profile_iterations", "dynamic: n, iterations profiled"},
      {"threshold_factor", "dynamic: k, threshold factor"},
      {"window_iterations", "dynamic: re-profile every W iterations"},
      {"global_shift_fraction",
       "dynamic: more than this fraction slow at once is a job-wide slowdown"},
      {"ewma_alpha", "ewma: smoothing factor"},
      {"ewma_ratio", "ewma: straggler above ratio x median"},
      {"ewma_min_samples", "ewma: samples needed"},
      {"static_threshold_seconds", "static: fixed threshold in seconds"},
      {"peer_enter_ratio", "peer: the lowest threshold, as a ratio to the group's median"},
      {"peer_noise_z", "peer: the threshold in units of the group's noise, when higher"},
      {"peer_window", "peer: steps in a rank's window"},
      {"peer_enter_rows", "peer: rows at the threshold before a rank is flagged"},
      {"peer_severe_ratio", "peer: 5 of the last 6 steps at this ratio flag at once"},
      {"peer_spike_ratio", "peer: a step at this ratio is a spike, left out of the window"},
      {"peer_exit_rows", "peer: rows below half the threshold before a straggler is healthy"},
      {"peer_straggler_ratio",
       "peer: stragglers from this ratio; mild (gray zone) between the threshold and it"},
      {"peer_min_group", "peer: smaller groups are judged against each rank's own baseline"},
      {"peer_profile_iterations", "peer: rows before a group is judged"},
      {"max_excluded_fraction", "guard: most ranks excluded at once, as a fraction"},
      {"min_active_ranks", "guard: fewest active"},
      {"min_active_replicas", "guard: fewest active data-parallel replicas"},
      {"cooldown_iterations", "guard: iterations between flips"},
      {"min_throughput_gain", "guard: exclude only when throughput gains this fraction"},
      {"lead_iterations", "membership switch lead"},
      {"unresponsive_after_seconds", "silence before a rank is unresponsive"},
      {"max_compute_seconds", "reports above this compute time are rejected as absurd"},
      {"exclusion_enabled", "false = classify and alert only"},
  };
  return *help;
}

}  // namespace

void AddPolicyFlags(CLI::App* p, v1::PolicyConfig* given, bool* any) {
  v1::PolicyConfig* g = given;
  // Every field, from the message itself: --field-name sets field_name; an
  // enum's names (--kind, --recovery) are its values' in straggler.proto.
  const pb::Descriptor* message = v1::PolicyConfig::descriptor();
  const pb::Reflection* reflection = v1::PolicyConfig::GetReflection();
  for (int i = 0; i < message->field_count(); ++i) {
    const pb::FieldDescriptor* field = message->field(i);
    std::string flag = "--" + field->name();
    std::replace(flag.begin(), flag.end(), '_', '-');
    const auto help = FieldHelp().find(field->name());
    const std::string text = help != FieldHelp().end()
                                 ? help->second
                                 : "policy." + field->name() + " (docs/configuration.md)";
    switch (field->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_UINT32:
        Flag<uint32_t>(p, any, flag, text,
                       [g, field, reflection](uint32_t v) { reflection->SetUInt32(g, field, v); });
        break;
      case pb::FieldDescriptor::CPPTYPE_DOUBLE:
        Flag<double>(p, any, flag, text,
                     [g, field, reflection](double v) { reflection->SetDouble(g, field, v); });
        break;
      case pb::FieldDescriptor::CPPTYPE_BOOL:
        Flag<std::string>(p, any, flag, text,
                          [g, field, reflection](const std::string& v) {
                            reflection->SetBool(g, field, v == "true");
                          })
            ->check(CLI::IsMember({"true", "false"}));
        break;
      case pb::FieldDescriptor::CPPTYPE_ENUM:
        Flag<std::string>(p, any, flag, text,
                          [g, field, reflection](const std::string& v) {
                            // IsMember admitted only the enum's names.
                            reflection->SetEnumValue(
                                g, field, *v1::ParseEnumShortName(field->enum_type(), v));
                          })
            ->check(CLI::IsMember(v1::EnumShortNames(field->enum_type())));
        break;
      default:
        break;
    }
  }
}

}  // namespace stragglerctl
