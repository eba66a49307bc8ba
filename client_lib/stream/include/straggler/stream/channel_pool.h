// The daemon's addresses as a stream session sees them (issue 30, docs/
// cluster.md "Clients"): one address, or several comma-separated (replicas;
// a DNS name with several records is one address, gRPC's resolver spreads
// over its records), and the gRPC channel to each, made on first use and
// shared by every session of the process that holds the pool (the agent's
// jobs share one pool: one connection per replica, not per job).
//
//   absl::StatusOr<std::shared_ptr<ChannelPool>> pool =
//       ChannelPool::Make("10.0.0.1:7070,10.0.0.2:7070", credentials, args);
//   std::shared_ptr<grpc::Channel> ch = (*pool)->Get((*pool)->addresses()[0]);
//   (*pool)->Get("10.0.0.3:7070");   // a redirect's owner, not in the list
//
// Thread-safe: Get may be called from any thread.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace straggler::stream {

class ChannelPool {
 public:
  // `endpoints`: "host:port", "unix:/path", "dns:///name:port" ..., or
  // several of them comma-separated (spaces around a comma are ignored).
  // An empty list or an empty entry ("a,,b") is INVALID_ARGUMENT naming
  // `endpoints`. `credentials` and `args` are used for every channel.
  static absl::StatusOr<std::shared_ptr<ChannelPool>> Make(
      std::string_view endpoints, std::shared_ptr<grpc::ChannelCredentials> credentials,
      grpc::ChannelArguments args);
  // The list, in the order given; never empty.
  const std::vector<std::string>& addresses() const { return addresses_; }
  // The channel to `address` (one of addresses() or any other, such as a
  // redirect's owner), made on first use.
  std::shared_ptr<grpc::Channel> Get(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  ChannelPool(std::vector<std::string> addresses,
              std::shared_ptr<grpc::ChannelCredentials> credentials, grpc::ChannelArguments args)
      : addresses_(std::move(addresses)),
        credentials_(std::move(credentials)),
        args_(std::move(args)) {}

  const std::vector<std::string> addresses_;
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  const grpc::ChannelArguments args_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
};

// The list `endpoints` holds (see ChannelPool::Make), or INVALID_ARGUMENT
// naming it: for callers that check an option before they build anything.
absl::StatusOr<std::vector<std::string>> SplitEndpoints(std::string_view endpoints);

}  // namespace straggler::stream
