// straggler::DaemonStore — a gloo::rendezvous::Store over stragglerd's
// RendezvousService, so Gloo contexts bootstrap through the daemon the job
// already talks to (no second server, no shared file system).
//
//   straggler::DaemonStore store("127.0.0.1:7070", "job-42");
//   gloo::rendezvous::PrefixStore prefixed("gloo/v3", store);
//   context->connectFullMesh(prefixed, device);
//
// `endpoint` is one address or several comma-separated (stragglerd replicas,
// docs/cluster.md): each call starts where the last one ended, follows a
// replica's redirect to the job's owner and tries the next address, with
// backoff, when one cannot be reached, within the call's bound.
//
// This is the Gloo glue header: it includes Gloo; the rest of the public API
// (collective.h) does not. get() blocks until the key is set, like Gloo's own
// stores; every wait is bounded and a timeout or an unreachable daemon throws
// gloo::IoException naming the job, the keys and the daemon's message.
//
// Thread-safe: gRPC stubs are, and the store keeps no other mutable state.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

namespace straggler {

class DaemonStore : public gloo::rendezvous::Store {
 public:
  // `ttl`: expiry of the keys this store sets. `get_timeout`: bound of get()
  // (and of wait() without a timeout).
  DaemonStore(const std::string& endpoint, std::string job_id,
              std::chrono::milliseconds ttl = std::chrono::minutes(10),
              std::chrono::milliseconds get_timeout = kDefaultTimeout);
  ~DaemonStore() override;

  // Where the next call goes first (after a redirect: the job's owner).
  std::string address() const;

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace straggler
