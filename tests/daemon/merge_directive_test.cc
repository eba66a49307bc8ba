// MergeDirective: how a directive that could not be written yet absorbs the
// next one (a slow reader): memberships by version (newer copy wins, capped
// at the kept history), progress by rank (higher iteration), counts summed.
#include <catch2/catch.hpp>

#include "straggler/common/directive.h"
#include "straggler/engine/job_engine.h"

namespace v1 = straggler::v1;
using straggler::common::MergeDirective;

namespace {
v1::Directive With(std::initializer_list<uint64_t> versions,
                   std::initializer_list<std::pair<uint32_t, uint64_t>> progress) {
  v1::Directive d;
  for (uint64_t v : versions) {
    v1::Membership* m = d.add_memberships();
    m->set_version(v);
    m->set_effective_iteration(v * 10);
  }
  for (auto [rank, it] : progress) {
    v1::RankProgress* p = d.add_progress();
    p->set_rank(rank);
    p->set_iteration(it);
  }
  return d;
}
}  // namespace

TEST_CASE("MergeDirective merges memberships by version and progress by rank", "[merge]") {
  v1::Directive pending = With({1, 3}, {{0, 5}, {2, 7}});
  pending.set_accepted(2);
  v1::Directive newer = With({2, 3, 4}, {{1, 4}, {2, 6}, {3, 9}});
  newer.mutable_memberships(1)->set_effective_iteration(31);  // the newer copy of v3
  newer.set_accepted(3);
  newer.set_acked_sequence(17);
  MergeDirective(pending, std::move(newer));

  REQUIRE(pending.memberships_size() == 4);
  for (int i = 0; i < 4; ++i) CHECK(pending.memberships(i).version() == uint64_t(i + 1));
  CHECK(pending.memberships(2).effective_iteration() == 31);
  REQUIRE(pending.progress_size() == 4);
  const std::pair<uint32_t, uint64_t> want[] = {{0, 5}, {1, 4}, {2, 7}, {3, 9}};
  for (int i = 0; i < 4; ++i) {
    CHECK(pending.progress(i).rank() == want[i].first);
    CHECK(pending.progress(i).iteration() == want[i].second);
  }
  CHECK(pending.accepted() == 5);
  CHECK(pending.acked_sequence() == 17);
}

TEST_CASE("MergeDirective keeps only the newest kept-history versions", "[merge]") {
  const uint64_t cap = straggler::engine::JobEngine::kMembershipHistory;
  v1::Directive pending;
  for (uint64_t v = 1; v <= cap; ++v) pending.add_memberships()->set_version(v);
  MergeDirective(pending, With({cap + 1, cap + 2}, {}));
  REQUIRE(pending.memberships_size() == static_cast<int>(cap));
  CHECK(pending.memberships(0).version() == 3);
  CHECK(pending.memberships(static_cast<int>(cap) - 1).version() == cap + 2);

  // A plain acknowledgement leaves the memberships alone.
  MergeDirective(pending, With({}, {{0, 1}}));
  CHECK(pending.memberships_size() == static_cast<int>(cap));
  CHECK(pending.progress_size() == 1);
}
