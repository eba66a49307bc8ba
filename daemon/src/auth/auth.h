// Who may call what (docs/security.md): with auth.token_file configured,
// AdminService RPCs and mutating REST calls need `authorization: Bearer
// <token>`; with auth.protect_reads also QueryService, REST GETs and
// /metrics. /healthz, /readyz, IngestService and RendezvousService stay open
// to every client the transport admits (trainers carry no token; mutual TLS
// is their guard).
//
//   Authorizer auth(config.auth, stats);
//   absl::Status s = auth.Check(Access::kAdmin, header_or_nullopt);
//   // UNAUTHENTICATED "this call needs a bearer token ..." / "the bearer token is not valid"
//   auth.Apply(reloaded.auth);  // SIGHUP
//
// Messages never quote what the caller sent. Thread-safe: Check and Apply
// may run concurrently from any threads.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/status/status.h"
#include "config/config.h"

namespace straggler::daemon {

struct DaemonStats;

enum class Access {
  kOpen,   // health, readiness, ingest, rendezvous
  kRead,   // queries: need the token only with auth.protect_reads
  kAdmin,  // changes: need the token whenever one is configured
};

// TokenDigest (SHA-256 of a token): config.h, where LoadConfig uses it.

class Authorizer {
 public:
  // `stats` counts the rejected calls (auth_rejected); it must outlive this.
  Authorizer(const AuthConfig& config, DaemonStats& stats);

  // Takes a reloaded config's token digest and protect_reads.
  void Apply(const AuthConfig& config);

  // OK when a call of `access` with this `authorization` header (nullopt:
  // none sent) may go on; else UNAUTHENTICATED, counted in stats. The token
  // comparison takes the same time whatever the presented token is.
  absl::Status Check(Access access, std::optional<std::string_view> authorization) const;

  bool token_configured() const;

 private:
  DaemonStats& stats_;
  mutable absl::Mutex mu_;
  std::string token_sha256_ ABSL_GUARDED_BY(mu_);  // "" = no token configured
  bool protect_reads_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace straggler::daemon
