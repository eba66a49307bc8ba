// A redirect to a job's owner (issue 30, docs/cluster.md "Redirects"): a
// replica that does not own a job ends the job's call with UNAVAILABLE and
// names the owner in the call's trailing metadata. The status carries the
// owner as payloads until the gRPC layer turns them into metadata
// (AddRedirectMetadata, api/rpc_util.h), so the code that decides (the
// cluster member) needs no gRPC.
//
//   absl::Status s = WithOwner(absl::UnavailableError("..."), {"r2", "10.0.0.2:7070", ...});
//   AddRedirectMetadata(s, ctx);   // straggler-owner: 10.0.0.2:7070, ...
//
// Pure functions; thread-safe.
#pragma once

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "straggler/v1/wire_rules.h"

namespace straggler::daemon {

// The trailing-metadata keys of a redirect: the wire's, shared with the
// clients (straggler/v1/wire_rules.h).
using v1::rules::kOwnerGrpcMetadata;
using v1::rules::kOwnerHttpMetadata;
using v1::rules::kOwnerIdMetadata;

struct OwnerAddress {
  std::string id;
  std::string grpc_address;
  std::string http_address;
};

// `status` with the owner attached (each non-empty field a payload under its
// metadata key).
inline absl::Status WithOwner(absl::Status status, const OwnerAddress& owner) {
  for (const auto& [key, value] : {std::pair{kOwnerIdMetadata, &owner.id},
                                   std::pair{kOwnerGrpcMetadata, &owner.grpc_address},
                                   std::pair{kOwnerHttpMetadata, &owner.http_address}}) {
    if (!value->empty()) status.SetPayload(key, absl::Cord(*value));
  }
  return status;
}

// The owner a status names, when WithOwner attached one with a gRPC address.
inline std::optional<OwnerAddress> OwnerOf(const absl::Status& status) {
  auto grpc = status.GetPayload(kOwnerGrpcMetadata);  // absl::optional
  if (!grpc) return std::nullopt;
  OwnerAddress owner;
  owner.grpc_address = std::string(*grpc);
  if (auto id = status.GetPayload(kOwnerIdMetadata)) owner.id = std::string(*id);
  if (auto http = status.GetPayload(kOwnerHttpMetadata)) owner.http_address = std::string(*http);
  return owner;
}

}  // namespace straggler::daemon
