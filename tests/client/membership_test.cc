// The client's switch rule (client_lib/src/membership_history.h): which
// version is in force at an iteration, and when that answer is final.
#include <catch2/catch.hpp>

#include "membership_history.h"

using straggler::MembershipView;
using straggler::detail::IsCertain;
using straggler::detail::MembershipHistory;

namespace {

MembershipView Version(uint64_t version, uint64_t effective, std::vector<uint32_t> excluded = {}) {
  MembershipView v;
  v.version = version;
  v.effective_iteration = effective;
  v.world_size = 8;
  for (uint32_t r : excluded) v.excluded.push_back({r, "straggler", ""});
  return v;
}

}  // namespace

TEST_CASE("the newest version with effective_iteration <= iteration is in force", "[membership]") {
  MembershipHistory h(Version(0, 0));
  CHECK(h.Add(Version(1, 10, {3})) != nullptr);
  CHECK(h.Add(Version(2, 20)) != nullptr);
  CHECK(h.InForce(0).version == 0);
  CHECK(h.InForce(9).version == 0);
  CHECK(h.InForce(10).version == 1);
  CHECK(h.InForce(10).IsExcluded(3));
  CHECK(h.InForce(19).version == 1);
  CHECK(h.InForce(20).version == 2);
  CHECK(h.InForce(1000).version == 2);
  CHECK(h.Newest()->version == 2);
}

TEST_CASE("versions are deduplicated, an older late one is kept but not announced",
          "[membership]") {
  MembershipHistory h(Version(0, 0));
  CHECK(h.Add(Version(2, 20)) != nullptr);
  CHECK(h.Add(Version(2, 20)) == nullptr);  // duplicate
  CHECK(h.Add(Version(1, 10, {5})) == nullptr);  // late, older
  CHECK(h.size() == 3);
  CHECK(h.InForce(15).version == 1);
  CHECK(h.Newest()->version == 2);
}

TEST_CASE("the daemon's version 0 replaces the local placeholder", "[membership]") {
  MembershipHistory h(Version(0, 0));
  MembershipView daemon_v0 = Version(0, 0);
  daemon_v0.lead_iterations = 5;
  CHECK(h.Add(daemon_v0) == nullptr);  // not a new version to announce...
  CHECK(h.Newest()->lead_iterations == 5);  // ...but its lead is used
}

TEST_CASE("certainty: the report of iteration + 1 - lead must be processed", "[membership]") {
  // Below the lead no version can be in force yet.
  CHECK(IsCertain(0, 2, std::nullopt));
  CHECK(IsCertain(1, 2, std::nullopt));
  CHECK_FALSE(IsCertain(2, 2, std::nullopt));
  // effective >= highest + lead: with our report of p processed, versions
  // still unknown take effect at p + lead or later.
  CHECK_FALSE(IsCertain(10, 2, 8));  // a version effective at 10 may still come
  CHECK(IsCertain(10, 2, 9));
  CHECK(IsCertain(10, 2, 50));
  CHECK_FALSE(IsCertain(10, 5, 5));
  CHECK(IsCertain(10, 5, 6));
  // Lead 0 (unset) means the smallest a daemon may use, 1: only iteration 0
  // is certain by rule.
  CHECK(IsCertain(0, 0, std::nullopt));
  CHECK_FALSE(IsCertain(1, 0, std::nullopt));
  CHECK(IsCertain(1, 0, 1));
}

// Until the daemon's version 0 says its lead, a client may not take an
// iteration as certain by rule that a daemon with lead 1 could already have
// a version in force at (report 0 processed -> effective 1).
TEST_CASE("before the daemon's version 0 arrives, only iteration 0 is certain by rule", "[membership]") {
  MembershipView placeholder = Version(0, 0);
  placeholder.lead_iterations = straggler::detail::kAssumedLeadIterations;
  MembershipHistory h(placeholder);
  CHECK(h.Certain(0, 0, std::nullopt));
  CHECK_FALSE(h.Certain(1, 0, std::nullopt));
  MembershipView daemon_v0 = Version(0, 0);
  daemon_v0.lead_iterations = 3;
  h.Add(daemon_v0);
  CHECK(h.Certain(2, 0, std::nullopt));  // the daemon's lead from now on
  CHECK_FALSE(h.Certain(3, 0, std::nullopt));
}

TEST_CASE("a readmitted rank is certain at its readmission's effective iteration at once",
          "[membership]") {
  MembershipHistory h(Version(0, 0));
  h.Add(Version(1, 10, {3}));   // rank 3 out from 10
  h.Add(Version(2, 40));        // back from 40
  // Rank 3 fell behind in shadow: its last processed report is 12.
  CHECK_FALSE(h.Certain(39, 3, 12));
  CHECK(h.Certain(40, 3, 12));   // version 2 takes effect exactly at 40
  CHECK(h.InForce(40).version == 2);
  CHECK_FALSE(h.Certain(41, 3, 12));  // past it, a later version may still come
  // Only the readmitted rank: the others keep waiting for their own progress
  // (a daemon gone inside the lead must leave them on the applied membership).
  CHECK_FALSE(h.Certain(40, 0, 12));
  CHECK(h.Certain(40, 0, 39));
  // An exclusion taking effect is never certain early, not even for the
  // rank it excludes.
  CHECK_FALSE(h.Certain(10, 3, 2));
}

TEST_CASE("ReadmissionAfter names the first later version that includes the rank",
          "[membership]") {
  MembershipHistory h(Version(0, 0));
  h.Add(Version(1, 10, {3}));
  CHECK_FALSE(h.ReadmissionAfter(5, 3).has_value());   // not excluded at 5
  CHECK_FALSE(h.ReadmissionAfter(12, 3).has_value());  // nothing readmits it yet
  h.Add(Version(2, 40, {3, 5}));                       // still out (and 5 too)
  CHECK_FALSE(h.ReadmissionAfter(12, 3).has_value());
  h.Add(Version(3, 45, {5}));                          // back at 45...
  h.Add(Version(4, 50, {3, 5}));                       // ...and out again at 50
  auto back = h.ReadmissionAfter(12, 3);
  REQUIRE(back.has_value());
  // Not the newest version: the group counts on rank 3 from 45 to 49.
  CHECK(back->version == 3);
  CHECK(back->effective_iteration == 45);
  CHECK(h.Certain(45, 3, 12));
  CHECK_FALSE(h.Certain(50, 3, 12));  // an exclusion, not a readmission
  CHECK_FALSE(h.ReadmissionAfter(12, 0).has_value());  // rank 0 never left
  CHECK_FALSE(h.ReadmissionAfter(46, 3).has_value());  // past its readmission
  CHECK_FALSE(h.ReadmissionAfter(46, 5).has_value());  // 5 stays out
}
