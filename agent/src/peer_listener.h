// The agent's unix socket, accepted by the agent itself so that it knows
// the process on the other end of each trainer connection (SO_PEERCRED)
// before it hands the connection to gRPC (grpc::AddInsecureChannelFromFd).
// gRPC names such a connection's peer "fd:N"; PidOf maps it back. The host
// telemetry reads that process's run delay (docs/agent.md#host-telemetry).
//
//   auto listener = UnixPeerListener::Bind("/run/straggler/agent.sock");  // under the caller's umask
//   server = builder.BuildAndStart();
//   (*listener)->Serve(server.get());
//   int64_t pid = (*listener)->PidOf(context->peer());   // 0: not a connection of ours
//   (*listener)->Stop();                                  // before server->Shutdown
//
// Thread-safe: PidOf from any thread; Bind, Serve and Stop from one.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace straggler::agent {

class UnixPeerListener {
 public:
  // Binds `path` (a stale socket file there is replaced, as gRPC does) and
  // listens. UNAVAILABLE naming the path and the system's reason otherwise.
  static absl::StatusOr<std::unique_ptr<UnixPeerListener>> Bind(const std::string& path);
  ~UnixPeerListener();  // Stop()
  UnixPeerListener(const UnixPeerListener&) = delete;
  UnixPeerListener& operator=(const UnixPeerListener&) = delete;

  // Accepts on its own thread; each connection becomes a channel of
  // `server` (started, outliving Stop).
  void Serve(grpc::Server* server);
  // No new connections; open ones stay the server's.
  void Stop();
  // The process of the connection gRPC calls `peer` ("fd:N"), in the
  // agent's PID namespace; 0 when unknown (another listener's peer, or a
  // process the kernel cannot name there).
  int64_t PidOf(const std::string& peer) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  UnixPeerListener(int fd, int wake_read, int wake_write)
      : fd_(fd), wake_read_(wake_read), wake_write_(wake_write) {}
  void Run(grpc::Server* server) ABSL_LOCKS_EXCLUDED(mu_);

  const int fd_;
  const int wake_read_, wake_write_;  // a pipe: Stop wakes the accept loop
  std::thread thread_;
  mutable absl::Mutex mu_;
  // By connection fd. An fd number is reused only after gRPC closed its
  // connection, and the next accept on it overwrites the entry before any
  // stream of the new connection can ask.
  std::map<int, int64_t> pids_ ABSL_GUARDED_BY(mu_);
};

}  // namespace straggler::agent
