// absl::Status -> grpc::Status, for every gRPC service of stragglerd and
// straggler-agent that finishes a call or a stream with an absl::Status.
//
//   reactor->Finish(common::ToGrpcStatus(status));
//
// Header-only, pure; safe from any thread.
#pragma once

#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"

namespace straggler::common {

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode share their numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

}  // namespace straggler::common
