// Internal helpers around straggler::ClientOptions (its FromEnv and Validate
// are in client_options.cc): what Client::Create derives from the options.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "straggler/common/channel_security.h"
#include "straggler/client.h"

namespace straggler::detail {

// The TLS files the options name, in the form channel_security.h checks and loads.
ChannelSecurity SecurityOf(const ClientOptions& options);

// Sets the options' TLS files from STRAGGLER_TLS_CA/_CERT/_KEY
// (ChannelSecurityFromEnv): ClientOptions::FromEnv and the C ABI's
// straggler_client_create, which has no TLS fields, both take them so.
void TlsFromEnv(ClientOptions* options);

// Sets the options' GPU fields from CUDA_VISIBLE_DEVICES and
// STRAGGLER_GPU_UUID, each verbatim where set (an unset one leaves its
// field): ClientOptions::FromEnv, and the C ABI's straggler_client_create
// for a struct too old to hold the fields, both take them so.
void GpuFromEnv(ClientOptions* options);

// The launcher's topology variables, read once for ClientOptions::FromEnv
// and the C API: STRAGGLER_PEER_GROUP and STRAGGLER_GPU_MODEL as set;
// STRAGGLER_REPLICA nullopt when unset or empty, and a value that does not
// parse sets *error (when it is empty) and gives nullopt.
struct TopologyEnv {
  std::string peer_group;
  std::string gpu_model;
  std::optional<uint32_t> replica;
};
TopologyEnv TopologyFromEnv(std::string* error);

// Empty when `group` is a peer group the daemon accepts, else why (naming it).
std::string ValidatePeerGroup(const std::string& group);

// This host's name ("unknown" when it cannot be read): ClientOptions::node's default.
std::string HostName();

}  // namespace straggler::detail
