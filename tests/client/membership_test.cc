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

TEST_CASE("versions are deduplicated; an older late one is kept but not announced",
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
  // Lead 0 (unset) means the default of 2.
  CHECK(IsCertain(1, 0, std::nullopt));
  CHECK_FALSE(IsCertain(2, 0, std::nullopt));
}
