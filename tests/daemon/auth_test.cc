// Authorizer: which access needs the bearer token under which config, the
// header forms accepted, the refusals counted, and a reload taking effect.
#include <catch2/catch.hpp>

#include <optional>
#include <string>

#include "auth/auth.h"
#include "config/config.h"
#include "metrics/stats.h"

namespace sd = straggler::daemon;
using sd::Access;

namespace {

sd::AuthConfig WithToken(const std::string& token, bool protect_reads = false) {
  sd::AuthConfig c;
  c.token_file = "/etc/stragglerd/token";
  c.token_sha256 = sd::TokenDigest(token);
  c.protect_reads = protect_reads;
  return c;
}

}  // namespace

TEST_CASE("without a token everything is open") {
  sd::DaemonStats stats;
  sd::Authorizer auth(sd::AuthConfig{}, stats);
  CHECK_FALSE(auth.token_configured());
  for (Access a : {Access::kOpen, Access::kRead, Access::kAdmin}) {
    CHECK(auth.Check(a, std::nullopt).ok());
    CHECK(auth.Check(a, "Bearer anything").ok());
  }
  CHECK(stats.auth_rejected.load() == 0);
}

TEST_CASE("a token guards admin calls, reads only with protect_reads") {
  sd::DaemonStats stats;
  sd::Authorizer auth(WithToken("t0ken-A"), stats);
  CHECK(auth.token_configured());
  CHECK(auth.Check(Access::kOpen, std::nullopt).ok());
  CHECK(auth.Check(Access::kRead, std::nullopt).ok());

  absl::Status none = auth.Check(Access::kAdmin, std::nullopt);
  CHECK(none.code() == absl::StatusCode::kUnauthenticated);
  CHECK_THAT(std::string(none.message()), Catch::Contains("needs a bearer token"));
  absl::Status wrong = auth.Check(Access::kAdmin, "Bearer t0ken-B");
  CHECK(wrong.code() == absl::StatusCode::kUnauthenticated);
  CHECK(std::string(wrong.message()) == "the bearer token is not valid");
  // A prefix or an extension of the token is as wrong as any other.
  CHECK_FALSE(auth.Check(Access::kAdmin, "Bearer t0ken-").ok());
  CHECK_FALSE(auth.Check(Access::kAdmin, "Bearer t0ken-AA").ok());
  absl::Status basic = auth.Check(Access::kAdmin, "Basic dXNlcjpwYXNz");
  CHECK_THAT(std::string(basic.message()), Catch::Contains("not 'Bearer <token>'"));
  CHECK_FALSE(auth.Check(Access::kAdmin, "Bearer ").ok());
  CHECK_FALSE(auth.Check(Access::kAdmin, "t0ken-A").ok());

  CHECK(auth.Check(Access::kAdmin, "Bearer t0ken-A").ok());
  CHECK(auth.Check(Access::kAdmin, "bearer t0ken-A").ok());  // the scheme is case-insensitive
  CHECK(stats.auth_rejected.load() == 7);

  auth.Apply(WithToken("t0ken-A", /*protect_reads=*/true));
  CHECK(auth.Check(Access::kRead, std::nullopt).code() == absl::StatusCode::kUnauthenticated);
  CHECK(auth.Check(Access::kRead, "Bearer t0ken-A").ok());
  CHECK(auth.Check(Access::kOpen, std::nullopt).ok());
}

TEST_CASE("a reload swaps the token: the old one stops working") {
  sd::DaemonStats stats;
  sd::Authorizer auth(WithToken("old-token"), stats);
  CHECK(auth.Check(Access::kAdmin, "Bearer old-token").ok());
  auth.Apply(WithToken("new-token"));
  CHECK_FALSE(auth.Check(Access::kAdmin, "Bearer old-token").ok());
  CHECK(auth.Check(Access::kAdmin, "Bearer new-token").ok());
  auth.Apply(sd::AuthConfig{});
  CHECK(auth.Check(Access::kAdmin, std::nullopt).ok());
}

TEST_CASE("messages never echo what the caller sent") {
  sd::DaemonStats stats;
  sd::Authorizer auth(WithToken("right-token"), stats);
  for (const char* header : {"Bearer guessed-secret-123", "Basic guessed-secret-123",
                             "guessed-secret-123"}) {
    absl::Status s = auth.Check(Access::kAdmin, header);
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(std::string(s.message()), !Catch::Contains("guessed-secret-123"));
    CHECK_THAT(std::string(s.message()), !Catch::Contains("right-token"));
  }
}
