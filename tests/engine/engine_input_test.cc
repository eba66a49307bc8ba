// Every kind of bad input: reports with bad values, ranks out of range,
// duplicates and stale iterations, bad policies and policy names.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <string_view>

#include "engine_test_util.h"

namespace straggler::engine {
namespace {

using namespace testutil;  // engine_test_util.h

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

void CheckInvalid(const IngestResult& r, std::vector<std::string> needles) {
  INFO("message: " << r.message);
  CHECK_FALSE(r.accepted);
  CHECK(r.reason == RejectReason::kInvalidValue);
  for (const auto& n : needles) CHECK_THAT(r.message, Catch::Contains(n, Catch::CaseSensitive::No));
}

TEST_CASE("input: bad compute times are rejected with the value in the message",
          "[engine][input]") {
  Harness h(4);
  CheckInvalid(h.Send(1, 0, 0, kNaN), {"compute_seconds", "nan"});
  CheckInvalid(h.Send(1, 0, 0, kInf), {"compute_seconds", "inf"});
  CheckInvalid(h.Send(1, 0, 0, -kInf), {"compute_seconds", "inf"});
  CheckInvalid(h.Send(1, 0, 0, -0.3), {"compute_seconds=-0.3"});
  {
    const auto r = h.Send(1, 0, 0, 1e9);  // > max_compute_seconds (3600)
    CheckInvalid(r, {"compute_seconds"});
    INFO("message: " << r.message);
    CHECK((Contains(r.message, "1e+09") || Contains(r.message, "1000000000")));
  }
  // None of them was taken: no progress, and the same iteration with a good
  // value is accepted.
  CHECK_FALSE(h.engine().Progress(1).has_value());
  const auto ok = h.Send(1, 0, 0, 0.5);
  CHECK(ok.accepted);
  CHECK(ok.reason == RejectReason::kNone);
  CHECK(h.engine().Progress(1) == std::optional<uint64_t>(0));
  CHECK(h.engine().Worker(1).last_compute_seconds == 0.5);
}

TEST_CASE("input: max_compute_seconds bounds the accepted values", "[engine][input]") {
  PolicyConfig p = DynamicPolicy();
  p.max_compute_seconds = 10.0;
  Harness h(2, p);
  CHECK(h.Send(0, 0, 0, 10.0).accepted);  // not above the bound
  CheckInvalid(h.Send(0, 0, 1, 10.5), {"10.5"});
  CHECK(h.Send(1, 0, 0, 0.0).accepted);  // zero is not negative
}

TEST_CASE("input: bad optional times are rejected", "[engine][input]") {
  Harness h(4);
  {
    auto rep = MakeReport(2, 0, 0, 1.0);
    rep.step_seconds = -2.5;
    CheckInvalid(h.Send(rep), {"-2.5"});
  }
  {
    auto rep = MakeReport(2, 0, 0, 1.0);
    rep.step_seconds = kNaN;
    CheckInvalid(h.Send(rep), {"nan"});
  }
  {
    auto rep = MakeReport(2, 0, 0, 1.0);
    rep.collective_wait_seconds = kInf;
    CheckInvalid(h.Send(rep), {"inf"});
  }
  {
    auto rep = MakeReport(2, 0, 0, 1.0);
    rep.collective_wait_seconds = -0.7;
    CheckInvalid(h.Send(rep), {"-0.7"});
  }
  CHECK_FALSE(h.engine().Progress(2).has_value());
  auto good = MakeReport(2, 0, 0, 1.0);
  good.step_seconds = 1.2;
  good.collective_wait_seconds = 0.2;
  CHECK(h.Send(good).accepted);
}

TEST_CASE("input: work and phases - each bound refused naming the value, absent passes",
          "[engine][input]") {
  // Issue 31: work > 0 and finite; input wait and optimizer time finite,
  // >= 0 and at most 10 x max_compute_seconds, like step times.
  Harness h(4);
  auto base = MakeReport(2, 0, 9, 0.1);
  for (double bad : {0.0, -1.0, kInf, kNaN}) {
    auto rep = base;
    rep.work = bad;
    const IngestResult r = h.Send(rep);
    CHECK(r.reason == RejectReason::kInvalidValue);
    CHECK_THAT(r.message, Catch::StartsWith("rank 2 iteration 9 reported work=") &&
                              Catch::EndsWith("(must be a finite number > 0)"));
  }
  for (double bad : {-1e-12, kInf, -kInf, kNaN}) {
    auto rep = base;
    rep.input_wait_seconds = bad;
    CHECK_THAT(h.Send(rep).message, Catch::Contains("reported input_wait_seconds=") &&
                                        Catch::EndsWith("(must be a finite number >= 0)"));
    rep = base;
    rep.optimizer_seconds = bad;
    CHECK_THAT(h.Send(rep).message, Catch::Contains("reported optimizer_seconds=") &&
                                        Catch::EndsWith("(must be a finite number >= 0)"));
  }
  auto over = base;
  over.optimizer_seconds = 10 * PolicyConfig{}.max_compute_seconds * 1.5;
  CHECK_THAT(h.Send(over).message, Catch::Contains("(above 10 x max_compute_seconds="));
  auto neg = base;
  neg.input_wait_seconds = -0.25;
  CHECK(h.Send(neg).message ==
        "rank 2 iteration 9 reported input_wait_seconds=-0.25 (must be a finite number >= 0)");
  CHECK_FALSE(h.engine().Progress(2).has_value());
  auto good = base;
  good.work = 1e-9;
  good.input_wait_seconds = 0.0;
  good.optimizer_seconds = 0.25;
  CHECK(h.Send(good).accepted);
  CHECK(h.Send(MakeReport(3, 0, 9, 0.1)).accepted);  // none of them: as before
}

TEST_CASE("input: rank out of range names the rank and the world size", "[engine][input]") {
  Harness h(6);
  for (uint32_t rank : {6u, 9u}) {
    const auto r = h.Send(rank, 0, 0, 1.0);
    INFO("message: " << r.message);
    CHECK_FALSE(r.accepted);
    CHECK(r.reason == RejectReason::kRankOutOfRange);
    CHECK_THAT(r.message, Catch::Contains(std::to_string(rank)));
    CHECK_THAT(r.message, Catch::Contains("6"));
  }
}

TEST_CASE("input: a duplicate (rank, iteration) is rejected and changes nothing",
          "[engine][input]") {
  Harness h(4, CounterOnlyPolicy());
  h.Rows(0, 5, 0, Uniform(4, 1.0));
  h.Row(5, 0, With(Uniform(4, 1.0), 1, 3.0));
  REQUIRE(h.Counter(1) == 1);
  const WorkerView before = h.engine().Worker(1);

  SECTION("after the row was judged") {
    const auto r = h.Send(1, 0, 5, 3.0);
    CHECK_FALSE(r.accepted);
    CHECK(r.reason == RejectReason::kDuplicate);
    const auto r2 = h.Send(1, 0, 5, 9.0);  // a different value changes nothing either
    CHECK(r2.reason == RejectReason::kDuplicate);
    const WorkerView after = h.engine().Worker(1);
    CHECK(after.counter == 1);
    CHECK(after.last_compute_seconds == before.last_compute_seconds);
    CHECK(after.ewma_compute_seconds == before.ewma_compute_seconds);
    CHECK(after.last_iteration == 5);
    CHECK(after.state == before.state);
  }
  SECTION("inside a row that is not complete yet") {
    h.Feed(1, 0, 6, 3.0);
    const auto r = h.Send(1, 0, 6, 3.0);
    CHECK(r.reason == RejectReason::kDuplicate);
    for (uint32_t rank : {0u, 2u, 3u}) h.Feed(rank, 0, 6, 1.0);
    CHECK(h.Counter(1) == 2);  // judged once, not twice
  }
}

TEST_CASE("input: an older iteration is stale", "[engine][input]") {
  Harness h(2);
  h.Feed(0, 0, 10, 1.0);
  const auto r = h.Send(0, 0, 9, 1.0);
  CHECK_FALSE(r.accepted);
  CHECK(r.reason == RejectReason::kStale);
  CHECK(h.engine().Progress(0) == std::optional<uint64_t>(10));
  CHECK(h.engine().Worker(0).last_iteration == 10);
  CHECK(h.Send(0, 0, 11, 1.0).accepted);
}

TEST_CASE("policy: Validate names the bad field and value", "[engine][input][policy]") {
  CHECK(DynamicPolicy().Validate().ok());

  struct Case {
    const char* name;
    PolicyConfig p = DynamicPolicy();
    std::vector<std::string> needles;
  };
  std::vector<Case> cases;
  {
    PolicyConfig p = DynamicPolicy();
    p.threshold_factor = 0.5;
    cases.push_back({"threshold_factor", p, {"threshold_factor", "0.5"}});
  }
  {
    PolicyConfig p = DynamicPolicy();
    p.limit = 0;
    cases.push_back({"limit", p, {"limit", "0"}});
  }
  {
    PolicyConfig p = DynamicPolicy();
    p.max_excluded_fraction = 1.5;
    cases.push_back({"max_excluded_fraction", p, {"max_excluded_fraction", "1.5"}});
  }
  {
    PolicyConfig p = DynamicPolicy();
    p.kind = PolicyKind::kEwma;
    p.ewma_alpha = 0.0;
    cases.push_back({"ewma_alpha", p, {"ewma_alpha", "0"}});
  }
  {
    PolicyConfig p = DynamicPolicy();
    p.rejoin_mark = 5;  // == limit
    cases.push_back({"rejoin_mark == limit", p, {"rejoin_mark", "5"}});
  }
  {
    PolicyConfig p = DynamicPolicy();
    p.rejoin_mark = 9;
    cases.push_back({"rejoin_mark > limit", p, {"rejoin_mark", "9"}});
  }
  for (const auto& c : cases) {
    INFO(c.name);
    const absl::Status s = c.p.Validate();
    INFO("status: " << s.ToString());
    CHECK(absl::IsInvalidArgument(s));
    for (const auto& n : c.needles) CHECK_THAT(std::string(s.message()), Catch::Contains(n));
  }

  PolicyConfig paper = DynamicPolicy();
  paper.rejoin_mark = 4;  // limit - 1: the paper's rule, valid
  CHECK(paper.Validate().ok());
}

TEST_CASE("policy: ParsePolicyKind and ParseRecoveryMode", "[engine][input][policy]") {
  // Every kind of the table (policy_table.inc) reads back from its own name,
  // and no two share one: the list, in kPolicyKinds' order, as messages give it.
  std::set<std::string_view> names;
  std::string listed;
  for (PolicyKind k : kPolicyKinds) {
    INFO("kind " << PolicyKindName(k));
    auto parsed = ParsePolicyKind(PolicyKindName(k));
    REQUIRE(parsed.ok());
    CHECK(*parsed == k);
    names.insert(PolicyKindName(k));
    listed += (listed.empty() ? "" : ", ") + std::string(PolicyKindName(k));
  }
  CHECK(names.size() == std::size(kPolicyKinds));
  CHECK(names.count("unknown") == 0);
  CHECK(PolicyKindName(static_cast<PolicyKind>(999)) == "unknown");
  // The default first.
  CHECK(kPolicyKinds[0] == PolicyConfig{}.kind);
  CHECK(PolicyKindName(kPolicyKinds[0]) == "peer");
  CHECK(ParsePolicyKind("dynamic").value() == PolicyKind::kDynamic);
  CHECK(ParsePolicyKind("ewma").value() == PolicyKind::kEwma);
  CHECK(ParsePolicyKind("static").value() == PolicyKind::kStatic);
  const auto bad = ParsePolicyKind("bogus");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message() == "policy kind 'bogus' is not one of " + listed);
  // The same list as a sentence: "peer, dynamic, ewma or static".
  const size_t last = listed.rfind(", ");
  REQUIRE(last != std::string::npos);
  CHECK(PolicyKindChoices() == listed.substr(0, last) + " or " + listed.substr(last + 2));

  CHECK(ParseRecoveryMode("shadow").value() == RecoveryMode::kShadow);
  CHECK(ParseRecoveryMode("probation").value() == RecoveryMode::kProbation);
  const auto bad_mode = ParseRecoveryMode("sometimes");
  REQUIRE_FALSE(bad_mode.ok());
  CHECK(bad_mode.status().message() == "recovery 'sometimes' is not one of shadow, probation");
  for (auto m : {RecoveryMode::kShadow, RecoveryMode::kProbation}) {
    CHECK(ParseRecoveryMode(RecoveryModeName(m)).value() == m);
  }
  CHECK(RecoveryModeChoices() == "shadow or probation");
}

TEST_CASE("policy: SetPolicy rejects an invalid policy and keeps the old one",
          "[engine][input][policy]") {
  Harness h(4);
  PolicyConfig bad;
  bad.threshold_factor = 0.5;
  const absl::Status s = h.engine().SetPolicy(bad, h.now());
  CHECK(absl::IsInvalidArgument(s));
  CHECK(h.engine().policy().threshold_factor == 2.0);

  PolicyConfig good = DynamicPolicy();
  good.limit = 7;
  CHECK(h.engine().SetPolicy(good, h.now()).ok());
  CHECK(h.engine().policy().limit == 7);
}

TEST_CASE("policy: a policy change names each changed field with its old and new value",
          "[engine][input][policy]") {
  Harness h(4);
  PolicyConfig next = h.engine().policy();
  next.limit = 7;
  next.threshold_factor = 2.5;
  next.recovery = RecoveryMode::kProbation;
  next.exclusion_enabled = false;
  REQUIRE(h.engine().SetPolicy(next, h.now()).ok());
  h.Collect();
  auto changed = h.Of(EventKind::kPolicyChanged);
  REQUIRE(changed.size() == 1);
  // PolicyFields() order; the kind, unchanged, is not named.
  CHECK(changed[0].message ==
        "policy changed: limit 5 -> 7, threshold_factor 2 -> 2.5, recovery shadow -> probation, "
        "exclusion_enabled true -> false");

  // The same policy again is journaled, and says nothing changed.
  REQUIRE(h.engine().SetPolicy(next, h.now()).ok());
  h.Collect();
  changed = h.Of(EventKind::kPolicyChanged);
  REQUIRE(changed.size() == 2);
  CHECK(changed[1].message == "policy set again, no field changed");

  PolicyConfig a, b;
  b.kind = PolicyKind::kStatic;
  b.static_threshold_seconds = 0.25;
  CHECK(PolicyChanges(a, b) == "kind peer -> static, static_threshold_seconds 0 -> 0.25");
  CHECK(PolicyChanges(a, a).empty());
}

}  // namespace
}  // namespace straggler::engine
