// Private to the etcd client (etcd_client.cc): the stream objects behind
// EtcdClient::KeepAlive and WatchPrefix, and what every call shares: the
// error text and the KeyValue conversion.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cluster/etcd_stats.h"
#include "cluster/etcd_types.h"

namespace mvccpb {
class KeyValue;
}

namespace straggler::cluster::detail {

// etcd's mvccpb.KeyValue as the client's KeyValue (unary reads and watch
// events alike).
KeyValue FromProto(const ::mvccpb::KeyValue& kv);

// "etcd <endpoint> <call>: <gRPC's message>", with gRPC's code.
absl::Status CallError(absl::string_view endpoint, absl::string_view call, const grpc::Status& s);

std::unique_ptr<LeaseKeeper> StartLeaseKeeper(std::shared_ptr<grpc::Channel> channel,
                                              std::string endpoint, const Lease& lease,
                                              std::shared_ptr<EtcdStats> stats);

absl::StatusOr<std::unique_ptr<Watch>> StartWatch(std::shared_ptr<grpc::Channel> channel,
                                                  std::string endpoint, absl::string_view prefix,
                                                  int64_t start_revision,
                                                  std::chrono::milliseconds create_timeout,
                                                  std::shared_ptr<EtcdStats> stats,
                                                  Watch::OnEvents on_events, Watch::OnEnd on_end);

}  // namespace straggler::cluster::detail
