// The ranges of the PolicyFields() table: every numeric field accepts its
// bounds and refuses one step past them, naming the value and the bound;
// durations convert to nanoseconds without overflow (issue 15, item 3).
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <variant>

#include "engine_test_util.h"

namespace straggler::engine {
namespace {

using testutil::Harness;

// A policy with `field` set to `v` and the cross-field rules kept
// (rejoin_mark below limit).
PolicyConfig With(const PolicyField& f, double v) {
  PolicyConfig p;
  if (std::string(f.name) == "rejoin_mark") p.limit = 100000;
  std::visit(
      [&](auto member) {
        using T = std::remove_cvref_t<decltype(p.*member)>;
        if constexpr (std::is_same_v<T, uint32_t>) {
          p.*member = static_cast<uint32_t>(v);
        } else if constexpr (std::is_same_v<T, double>) {
          p.*member = v;
        }
      },
      f.member);
  return p;
}

bool Numeric(const PolicyField& f) {
  return std::visit(
      [](auto member) {
        using T = std::remove_cvref_t<decltype(PolicyConfig{}.*member)>;
        return std::is_same_v<T, uint32_t> || std::is_same_v<T, double>;
      },
      f.member);
}

bool Integer(const PolicyField& f) {
  return std::holds_alternative<uint32_t PolicyConfig::*>(f.member);
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST_CASE("policy bounds: every numeric field has an upper bound, accepted at it and refused "
          "past it with the value and the bound named",
          "[engine][policy][bounds]") {
  int numeric = 0;
  for (const PolicyField& f : PolicyFields()) {
    if (!Numeric(f)) continue;
    ++numeric;
    INFO("field " << f.name << " range " << f.min << ".." << f.max);
    CHECK(f.max > f.min);
    // Every bound is far from where int64 nanoseconds or uint64 iterations
    // could wrap.
    CHECK(f.max <= 1e7);

    CHECK(With(f, f.max).Validate().ok());
    const double above = Integer(f) ? f.max + 1 : f.max * 1.0000001 + 1e-9;
    const absl::Status s = With(f, above).Validate();
    INFO("status: " << s.ToString());
    CHECK(absl::IsInvalidArgument(s));
    CHECK_THAT(Message(s), Catch::StartsWith(std::string(f.name) + "=" + ExactNumber(above)));
    CHECK_THAT(Message(s), Catch::Contains("upper bound"));
    CHECK_THAT(Message(s), Catch::Contains("<= " + ExactNumber(f.max)));

    if (f.min_exclusive) {
      const absl::Status low = With(f, f.min).Validate();
      CHECK_THAT(Message(low), Catch::Contains("must be > " + ExactNumber(f.min)));
    } else {
      CHECK(With(f, f.min).Validate().ok());
      if (!Integer(f) || f.min > 0) {
        const double below = Integer(f) ? f.min - 1 : f.min - 0.001;
        const absl::Status low = With(f, below).Validate();
        CHECK_THAT(Message(low), Catch::Contains("must be >= " + ExactNumber(f.min)));
      }
    }
    if (!Integer(f)) {
      const absl::Status nan = With(f, std::nan("")).Validate();
      CHECK_THAT(Message(nan), Catch::Contains("must be a finite number in"));
      const absl::Status inf = With(f, std::numeric_limits<double>::infinity()).Validate();
      CHECK(absl::IsInvalidArgument(inf));
    }
  }
  // The loop saw the table: at least the 29 numeric fields of issue 33's
  // (a new policy's parameters add to them; docs/detection.md, "Adding a policy").
  CHECK(numeric >= 29);
}

TEST_CASE("policy bounds: unresponsive_after_seconds past int64 nanoseconds is refused",
          "[engine][policy][bounds]") {
  PolicyConfig p;
  p.unresponsive_after_seconds = 1e10;  // ~ 9.2e9 s is where int64 nanoseconds end
  const absl::Status s = p.Validate();
  CHECK(Message(s) ==
        "unresponsive_after_seconds=1e+10 is above its upper bound: must be <= 604800");
  p.unresponsive_after_seconds = kMaxPolicySeconds;
  CHECK(p.Validate().ok());

  PolicyConfig m;
  m.max_compute_seconds = 1e300;
  CHECK_THAT(Message(m.Validate()), Catch::Contains("max_compute_seconds=1e+300 is above"));
}

TEST_CASE("policy bounds: at the longest unresponsive_after_seconds a reporting rank stays "
          "healthy",
          "[engine][policy][bounds]") {
  PolicyConfig p;
  p.unresponsive_after_seconds = kMaxPolicySeconds;
  Harness h(4, p);
  h.Rows(0, 5, 0, testutil::Uniform(4, 1.0));
  const auto version = h.engine().membership().version;
  h.Advance(std::chrono::seconds(30));
  h.engine().Tick(h.now());
  h.Collect();
  for (uint32_t r = 0; r < 4; ++r) CHECK(h.State(r) != WorkerState::kUnresponsive);
  CHECK(h.engine().membership().version == version);
}

TEST_CASE("input: a refused duration names the rule it broke, with every digit",
          "[engine][input][bounds]") {
  Harness h(2);  // max_compute_seconds = 3600
  auto r = h.Send(0, 0, 0, 3600.0001);
  CHECK_FALSE(r.accepted);
  CHECK_THAT(r.message, Catch::EndsWith(
                            "compute_seconds=3600.0001 (above max_compute_seconds=3600)"));

  auto rep = testutil::MakeReport(0, 0, 0, 1.0);
  rep.step_seconds = 1e300;
  r = h.Send(rep);
  CHECK_FALSE(r.accepted);
  CHECK_THAT(r.message,
             Catch::EndsWith("step_seconds=1e+300 (above 10 x max_compute_seconds=36000)"));
  rep.step_seconds = -1;
  CHECK_THAT(h.Send(rep).message,
             Catch::EndsWith("step_seconds=-1 (must be a finite number >= 0)"));
  rep.step_seconds.reset();
  rep.collective_wait_seconds = 36000.5;
  CHECK_THAT(h.Send(rep).message,
             Catch::EndsWith("collective_wait_seconds=36000.5 (above 10 x "
                             "max_compute_seconds=36000)"));
}

TEST_CASE("policy bounds: SaturatingNanoseconds never wraps", "[engine][policy][bounds]") {
  using std::chrono::nanoseconds;
  CHECK(SaturatingNanoseconds(1.5) == nanoseconds(1'500'000'000));
  CHECK(SaturatingNanoseconds(1e10) == nanoseconds::max());
  CHECK(SaturatingNanoseconds(1e300) == nanoseconds::max());
  CHECK(SaturatingNanoseconds(-1e300) == nanoseconds::min());
  CHECK(SaturatingNanoseconds(std::numeric_limits<double>::infinity()) == nanoseconds::max());
  CHECK(SaturatingNanoseconds(std::nan("")) == nanoseconds(0));
  CHECK(SaturatingNanoseconds(kMaxPolicySeconds) == std::chrono::hours(7 * 24));
}

TEST_CASE("policy bounds: ExactNumber shows the digits that differ", "[engine][policy][bounds]") {
  CHECK(ExactNumber(3600.0001) == "3600.0001");
  CHECK(ExactNumber(3600) == "3600");
  CHECK(ExactNumber(0.1) == "0.1");
  CHECK(ExactNumber(1e300) == "1e+300");
  CHECK(ExactNumber(1e10) == "1e+10");
  CHECK(ExactNumber(604800) == "604800");
}

}  // namespace
}  // namespace straggler::engine
