// The C ABI against an endpoint nobody listens on: reports are counted
// (queued or dropped), memberships fall back to version 0, and destroying the
// client returns (ctest's timeout catches a hang).
#include <catch2/catch.hpp>

#include "straggler/client.h"
#include "straggler/straggler_c.h"

extern "C" int straggler_c_smoke(const char* endpoint, int n);

TEST_CASE("C API with an unreachable TCP endpoint", "[c_api]") {
  // Port 1 on loopback: connection refused at once.
  CHECK(straggler_c_smoke("127.0.0.1:1", 1000) == 0);
}

TEST_CASE("C API with a missing unix socket", "[c_api]") {
  CHECK(straggler_c_smoke("unix:///nonexistent/straggler-test.sock", 1000) == 0);
}

TEST_CASE("C API rejects NULL arguments without crashing", "[c_api]") {
  char err[64] = "unchanged";
  CHECK(straggler_client_create(nullptr, err, sizeof err) == nullptr);
  CHECK(std::string(err) == "options is NULL");
  straggler_membership_t m{};
  CHECK(straggler_membership_for(nullptr, 0, 0, 0, &m) == STRAGGLER_EINVAL);
  CHECK(straggler_current_membership(nullptr, &m) == STRAGGLER_EINVAL);
  CHECK(straggler_readmission_after(nullptr, 0, 0, &m) == STRAGGLER_EINVAL);
  CHECK(straggler_flush(nullptr, 0) == STRAGGLER_EINVAL);
  CHECK(straggler_stats(nullptr, nullptr) == STRAGGLER_EINVAL);
  CHECK(straggler_stats_sized(nullptr, nullptr, sizeof(straggler_stats_t)) == STRAGGLER_EINVAL);
  CHECK(straggler_is_excluded(nullptr, 0) == -1);
  CHECK(straggler_on_membership_change(nullptr, nullptr, nullptr) == STRAGGLER_EINVAL);
}

TEST_CASE("straggler_is_excluded tells when a truncated list cannot answer", "[c_api]") {
  uint32_t ranks[2] = {1, 5};
  straggler_membership_t m{};
  m.ranks = ranks;
  m.cap = 2;
  m.count = 2;
  CHECK(straggler_is_excluded(&m, 5) == 1);
  CHECK(straggler_is_excluded(&m, 2) == 0);
  m.count = 3;  // a third excluded rank did not fit
  CHECK(straggler_is_excluded(&m, 1) == 1);
  CHECK(straggler_is_excluded(&m, 2) == -1);
}

TEST_CASE("straggler_stats fills the original fields only, _sized every field that fits",
          "[c_api]") {
  straggler_options_t o;
  straggler_options_init(&o);
  const uint32_t rank = 0;
  o.endpoint = "127.0.0.1:1";  // nobody listens: no agent, so upstream_unavailable is 0
  o.job_id = "stats-sized";
  o.ranks = &rank;
  o.num_ranks = 1;
  o.world_size = 1;
  char err[256];
  straggler_client_t* c = straggler_client_create(&o, err, sizeof err);
  REQUIRE(c != nullptr);
  REQUIRE(straggler_report(c, 0, 0, 0, 0.1) == STRAGGLER_OK);

  // A program built against the struct before upstream_unavailable was
  // appended calls the symbol with a buffer that ends before it: the symbol
  // (parenthesised: not the macro) must not write there.
  straggler_stats_t s;
  s.upstream_unavailable = 42;
  REQUIRE((straggler_stats)(c, &s) == STRAGGLER_OK);
  CHECK(s.enqueued == 1);
  CHECK(s.upstream_unavailable == 42);
  // A program built against this header: the macro passes its struct's size,
  // so every field is filled.
  s.upstream_unavailable = 42;
  REQUIRE(straggler_stats(c, &s) == STRAGGLER_OK);
  CHECK(s.upstream_unavailable == 0);

  REQUIRE(straggler_stats_sized(c, &s, sizeof s) == STRAGGLER_OK);
  CHECK(s.enqueued == 1);
  // Nobody is excluded in version 0, so nothing readmits rank 0.
  straggler_membership_t m{};
  CHECK(straggler_readmission_after(c, 5, 0, &m) == STRAGGLER_NONE);
  CHECK(s.upstream_unavailable == 0);

  // Too small for even the original fields: refused, nothing written.
  straggler_stats_t t{};
  t.enqueued = 7;
  CHECK(straggler_stats_sized(c, &t, sizeof t.enqueued) == STRAGGLER_EINVAL);
  CHECK(t.enqueued == 7);
  straggler_client_destroy(c);
}

// Issue 28: a daemon that comes up late must be found within about 2 s, so
// the reconnect cap defaults to 2 s in C++ and in the C ABI (0 = the default).
TEST_CASE("late_daemon: the client's reconnect cap defaults to 2 s, in C++ and in C",
          "[c_api]") {
  CHECK(straggler::ClientOptions{}.backoff_max == std::chrono::milliseconds(2000));
  straggler_options_t o;
  straggler_options_init(&o);
  CHECK(o.backoff_max_ms == 2000);
}
