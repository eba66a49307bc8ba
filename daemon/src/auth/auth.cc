#include "auth/auth.h"

#include <openssl/crypto.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "metrics/stats.h"

namespace straggler::daemon {

Authorizer::Authorizer(const AuthConfig& config, DaemonStats& stats) : stats_(stats) {
  Apply(config);
}

void Authorizer::Apply(const AuthConfig& config) {
  absl::MutexLock lock(&mu_);
  token_sha256_ = config.token_sha256;
  protect_reads_ = config.protect_reads;
}

bool Authorizer::token_configured() const {
  absl::MutexLock lock(&mu_);
  return !token_sha256_.empty();
}

absl::Status Authorizer::Check(Access access,
                               std::optional<std::string_view> authorization) const {
  std::string expected;
  {
    absl::MutexLock lock(&mu_);
    if (token_sha256_.empty() || access == Access::kOpen ||
        (access == Access::kRead && !protect_reads_)) {
      return absl::OkStatus();
    }
    expected = token_sha256_;
  }
  auto reject = [this](const char* message) {
    stats_.auth_rejected.fetch_add(1, std::memory_order_relaxed);
    return absl::UnauthenticatedError(message);
  };
  if (!authorization) {
    return reject(
        "this call needs a bearer token: send 'authorization: Bearer <token>' (stragglerctl "
        "--token-file)");
  }
  // RFC 6750: the scheme is case-insensitive, one space, then the token.
  std::string_view value = *authorization;
  constexpr std::string_view kScheme = "bearer ";
  if (value.size() <= kScheme.size() ||
      !absl::EqualsIgnoreCase(absl::string_view(value.data(), kScheme.size()),
                              absl::string_view(kScheme.data(), kScheme.size()))) {
    return reject("the authorization header is not 'Bearer <token>'");
  }
  value.remove_prefix(kScheme.size());
  // Digests of equal length, compared without an early exit: the time taken
  // says nothing about how much of the token was right.
  const std::string presented = TokenDigest(value);
  if (CRYPTO_memcmp(presented.data(), expected.data(), expected.size()) != 0) {
    return reject("the bearer token is not valid");
  }
  return absl::OkStatus();
}

}  // namespace straggler::daemon
