// Internal helpers around straggler::ClientOptions (its FromEnv and Validate
// are in client_options.cc): what Client::Create derives from the options.
#pragma once

#include <string>

#include "straggler/common/channel_security.h"
#include "straggler/client.h"

namespace straggler::detail {

// The TLS files the options name, in the form channel_security.h checks and loads.
ChannelSecurity SecurityOf(const ClientOptions& options);

// This host's name ("unknown" when it cannot be read): ClientOptions::node's default.
std::string HostName();

}  // namespace straggler::detail
