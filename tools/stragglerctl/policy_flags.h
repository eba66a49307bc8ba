// stragglerctl's `policy` flags: one per PolicyConfig field, made from the
// message's descriptor (--field-name sets field_name). Only the flags
// given end up in the PolicyConfig that SetPolicy sends, so the daemon keeps
// every other field as it is.
//
//   v1::PolicyConfig given;
//   bool any = false;
//   stragglerctl::AddPolicyFlags(policy_subcommand, &given, &any);
//   app.parse(argc, argv);  // `given` holds what the flags said; `any`: were there any
//
// `given` and `any` must outlive the parse. Not thread-safe (as CLI::App).
#pragma once

#include <CLI/CLI.hpp>

#include "straggler/v1/straggler.pb.h"

namespace stragglerctl {

void AddPolicyFlags(CLI::App* policy, straggler::v1::PolicyConfig* given, bool* any);

}  // namespace stragglerctl
