// The CUDA-free decisions of the NCCL backend (client_lib/src/collective/
// nccl_plan.h): which communicator a rank uses for a new active set, the
// ncclCommShrink exclude list, the id's rendezvous key, the bounded
// communicator cache, and which NCCL membership calls (revoke, grow) a build
// and the loaded libnccl allow. Runs on every machine, with or without CUDA.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "nccl_plan.h"

using straggler::detail::CommCache;
using straggler::detail::CommIdKey;
using straggler::detail::FullCommIdKey;
using straggler::detail::CommPlan;
using straggler::detail::PlanCommunicator;
using straggler::detail::ShrinkExcludeList;
using straggler::detail::ChooseNcclFeatures;
using straggler::detail::NcclCode;
using straggler::detail::OrderAfterGrow;
using straggler::detail::OrderAfterShrink;
using straggler::detail::CommRankOf;
using straggler::detail::ReadmissionRecord;
using straggler::detail::EncodeRecord;
using straggler::detail::DecodeRecord;

TEST_CASE("shrink exclude list is in the parent's rank numbering") {
  // Parent {0,2,3,5}: world rank 3 is parent rank 2, world rank 5 parent rank 3.
  auto e = ShrinkExcludeList({0, 2, 3, 5}, {0, 2});
  REQUIRE(e.has_value());
  CHECK(*e == std::vector<int>{2, 3});
  CHECK(*ShrinkExcludeList({0, 1, 2, 3}, {0, 1, 2, 3}) == std::vector<int>{});
  // A shrink cannot add a rank, and an empty survivor set is no communicator.
  CHECK_FALSE(ShrinkExcludeList({0, 1, 2}, {0, 3}).has_value());
  CHECK_FALSE(ShrinkExcludeList({0, 1, 2}, {}).has_value());
}

TEST_CASE("communicator plan: reuse, shrink among survivors, fresh init on readmission") {
  using How = CommPlan::How;
  CHECK(PlanCommunicator(true, {0, 1, 2, 3}, true, {0, 1, 2, 3}).how == How::kReuse);

  CommPlan shrink = PlanCommunicator(true, {0, 1, 2, 3}, true, {0, 1, 3});
  CHECK(shrink.how == How::kShrink);
  CHECK(shrink.exclude == std::vector<int>{2});

  // The excluded rank itself issues nothing, not even the shrink.
  CHECK(PlanCommunicator(true, {0, 1, 2, 3}, false, {0, 1, 3}).how == How::kNone);
  // Readmission: the set gained rank 2, so no shared communicator exists.
  CHECK(PlanCommunicator(true, {0, 1, 3}, true, {0, 1, 2, 3}).how == How::kInit);
  // The rejoiner (not participating before) never reuses or shrinks, even
  // when its stale previous set happens to equal or contain the new one.
  CHECK(PlanCommunicator(false, {0, 1, 2, 3}, true, {0, 1, 2, 3}).how == How::kInit);
  CHECK(PlanCommunicator(false, {0, 1, 2, 3}, true, {0, 1, 2}).how == How::kInit);
  // A swap (one out, another in) cannot be a shrink.
  CHECK(PlanCommunicator(true, {0, 1, 2}, true, {0, 1, 3}).how == How::kInit);
}

TEST_CASE("NCCL features: revoke from 2.28.7, grow from 2.29, both at build and at run time") {
  // This machine's headers (2.28.9) with the same library: revoke, no grow.
  auto here = ChooseNcclFeatures(NcclCode(2, 28, 9), NcclCode(2, 28, 9), true, false);
  CHECK(here.revoke);
  CHECK_FALSE(here.grow);
  CHECK(here.Describe().find("ncclCommGrow no (built against 2.28.9, needs >= 2.29.0)") != std::string::npos);
  // Built against 2.28.9 but torch loaded an older libnccl: no revoke either.
  auto old_runtime = ChooseNcclFeatures(NcclCode(2, 28, 9), NcclCode(2, 27, 3), true, false);
  CHECK_FALSE(old_runtime.revoke);
  CHECK(old_runtime.Describe().find("the loaded libnccl is 2.27.3, needs >= 2.28.7") != std::string::npos);
  // 2.28.6 had no revoke; 2.28.7 does.
  CHECK_FALSE(ChooseNcclFeatures(NcclCode(2, 28, 6), NcclCode(2, 28, 6), true, false).revoke);
  CHECK(ChooseNcclFeatures(NcclCode(2, 28, 7), NcclCode(2, 28, 7), true, false).revoke);
  // Built against 2.29 and run against 2.29 or newer: grow, when the symbol is there.
  auto new_both = ChooseNcclFeatures(NcclCode(2, 29, 0), NcclCode(2, 30, 1), true, true);
  CHECK(new_both.revoke);
  CHECK(new_both.grow);
  CHECK_FALSE(ChooseNcclFeatures(NcclCode(2, 29, 0), NcclCode(2, 30, 1), true, false).grow);
  // Built against 2.28.9, run against 2.30: the grow branch is not compiled in.
  auto newer_runtime = ChooseNcclFeatures(NcclCode(2, 28, 9), NcclCode(2, 30, 1), true, true);
  CHECK(newer_runtime.revoke);
  CHECK_FALSE(newer_runtime.grow);
  // Built against 2.29, run against torch's 2.28.9: no grow.
  CHECK_FALSE(ChooseNcclFeatures(NcclCode(2, 29, 0), NcclCode(2, 28, 9), true, true).grow);
}

TEST_CASE("communicator plan with grow: existing ranks keep their numbers, joiners appended") {
  using How = CommPlan::How;
  // Readmission of rank 2 into {0,1,3}: grow where allowed, init otherwise.
  CHECK(PlanCommunicator(true, {0, 1, 3}, true, {0, 1, 2, 3}, true).how == How::kGrow);
  CHECK(PlanCommunicator(true, {0, 1, 3}, true, {0, 1, 2, 3}, false).how == How::kInit);
  CHECK(OrderAfterGrow({0, 1, 3}, {0, 1, 2, 3}) == std::vector<uint32_t>{0, 1, 3, 2});
  CHECK(CommRankOf(OrderAfterGrow({0, 1, 3}, {0, 1, 2, 3}), 2) == 3);
  // A joiner lower than every member would be the init publisher: init, so
  // that the id's publisher is the lowest rank of the set either way.
  CHECK(PlanCommunicator(true, {1, 2}, true, {0, 1, 2}, true).how == How::kInit);
  // A previous set of one is rebuilt fresh.
  CHECK(PlanCommunicator(true, {0}, true, {0, 1}, true).how == How::kInit);
  // One out and one in at once: neither shrink nor grow.
  CHECK(PlanCommunicator(true, {0, 1, 2}, true, {0, 1, 3}, true).how == How::kInit);
  // A joiner always inits from its own point of view; the record tells it to grow.
  CHECK(PlanCommunicator(false, {0, 1, 3}, true, {0, 1, 2, 3}, true).how == How::kInit);
  // The previous set in a grown order (not ascending) is still the same set.
  CHECK(PlanCommunicator(true, {0, 1, 3, 2}, true, {0, 1, 2, 3}, true).how == How::kReuse);
  // Shrinking a grown communicator: positions in its own order.
  CommPlan shrink = PlanCommunicator(true, {0, 1, 3, 2}, true, {0, 2, 3}, true);
  CHECK(shrink.how == How::kShrink);
  CHECK(shrink.exclude == std::vector<int>{1});
  CHECK(OrderAfterShrink({0, 1, 3, 2}, {0, 2, 3}) == std::vector<uint32_t>{0, 3, 2});
  CHECK(CommRankOf({0, 3, 2}, 7) == -1);
}

TEST_CASE("readmission record round trip, and what a bad one says") {
  const std::string id(128, 'x');
  ReadmissionRecord grow{CommPlan::How::kGrow, id, {0, 1, 3, 70000}};
  std::string error;
  auto back = DecodeRecord(EncodeRecord(grow), 128, &error);
  REQUIRE(back.has_value());
  CHECK(back->how == CommPlan::How::kGrow);
  CHECK(back->id == id);
  CHECK(back->parent_order == std::vector<uint32_t>{0, 1, 3, 70000});
  auto init = DecodeRecord(EncodeRecord({CommPlan::How::kInit, id, {}}), 128, &error);
  REQUIRE(init.has_value());
  CHECK(init->how == CommPlan::How::kInit);
  CHECK(init->parent_order.empty());
  // A raw 128-byte id (a build of another version of this backend) is refused by name.
  CHECK_FALSE(DecodeRecord(id, 128, &error).has_value());
  CHECK(error.find("holds 128 bytes") != std::string::npos);
  CHECK_FALSE(DecodeRecord("Q" + id, 128, &error).has_value());
  CHECK(error.find("not 'I' or 'G'") != std::string::npos);
  CHECK_FALSE(DecodeRecord("G" + id + "abc", 128, &error).has_value());
}

TEST_CASE("communicator id key names run, version and set") {
  CHECK(CommIdKey("run7", 3, {0, 1, 3}) == "nccl/run7/v3/{0,1,3}/id");
  CHECK(CommIdKey("run7", 3, {0, 1, 3}) != CommIdKey("run7", 4, {0, 1, 3}));
  CHECK(CommIdKey("run7", 3, {0, 1, 3}) != CommIdKey("run7", 3, {0, 1, 2, 3}));
  CHECK(CommIdKey("run7", 3, {0, 1, 3}) != CommIdKey("run8", 3, {0, 1, 3}));
  CHECK(FullCommIdKey("run7", 4) == "nccl/run7/full/w4/id");
  CHECK(FullCommIdKey("run7", 4) != CommIdKey("run7", 0, {0, 1, 2, 3}));
  // A retried build (a later slot than the version's first) names its
  // iteration: it never reads the id a failed attempt left.
  CHECK(CommIdKey("run7", 3, {0, 1, 3}, 21) == "nccl/run7/v3/{0,1,3}/i21/id");
  // A large set is named by its size and a hash: keys stay within the
  // daemon's rendezvous.max_key_bytes (512) at any world size.
  std::vector<uint32_t> big(8192), other(8192);
  for (uint32_t r = 0; r < 8192; ++r) big[r] = other[r] = r;
  other[8191] = 8192;  // rank 8191 out, 8192 in: same size, another set
  const std::string k = CommIdKey("a-run-id-of-64-bytes-0123456789012345678901234567890123456789012", 123456789, big, 987654321);
  CHECK(k.size() < 200);
  CHECK(k.find("n8192h") != std::string::npos);
  CHECK(k != CommIdKey("a-run-id-of-64-bytes-0123456789012345678901234567890123456789012", 123456789, other, 987654321));
  CHECK(straggler::detail::SetKey({0, 1, 3}) == "{0,1,3}");
  CHECK(CommIdKey("run7", 3, {0, 1, 3}, 21) != CommIdKey("run7", 3, {0, 1, 3}));
  CHECK(CommIdKey("run7", 3, {0, 1, 3}, 21) != CommIdKey("run7", 3, {0, 1, 3}, 22));
}

namespace {
struct Released {
  std::vector<std::pair<int, bool>> log;  // (handle, healthy)
};
}  // namespace

TEST_CASE("communicator cache: bounded LRU, current and pending never evicted") {
  Released r;
  {
    CommCache<int> cache(2, [&](int& h, bool healthy) { r.log.emplace_back(h, healthy); });
    auto* a = cache.Insert({0, 1, 2, 3}, 0, 10);
    cache.SetCurrent(a);
    cache.Insert({0, 1, 2}, 1, 11);
    CHECK(cache.Size() == 2);
    CHECK(r.log.empty());

    // Third entry: the LRU that is not current ({0,1,2}) goes, healthy.
    auto* c = cache.Insert({0, 1}, 2, 12);
    CHECK(cache.Size() == 2);
    REQUIRE(r.log.size() == 1);
    CHECK(r.log[0] == std::make_pair(11, true));
    CHECK(cache.Find({0, 1, 2}) == nullptr);
    CHECK(cache.Find({0, 1, 2, 3}) != nullptr);

    // Current and pending both pinned: the bound stretches, nothing is lost
    // that is in use or being built ahead of a switch.
    cache.SetPending(c);
    auto* d = cache.Insert({0}, 3, 13);
    CHECK(cache.Size() == 3);  // a (current), c (pending), d (just inserted)
    cache.SetCurrent(d);       // a is no longer pinned: evicted now
    CHECK(cache.Size() == 2);
    REQUIRE(r.log.size() == 2);
    CHECK(r.log[1] == std::make_pair(10, true));

    // Replacing a set's entry releases the old handle first.
    cache.Insert({0}, 4, 14);
    REQUIRE(r.log.size() == 3);
    CHECK(r.log[2] == std::make_pair(13, true));
    CHECK(cache.Find({0})->version == 4);

    // Erased after an error: released as unhealthy (the owner aborts it),
    // and the pending mark goes with it.
    cache.Erase({0, 1}, false);
    REQUIRE(r.log.size() == 4);
    CHECK(r.log[3] == std::make_pair(12, false));
    CHECK(cache.Pending() == nullptr);
  }
  // Destruction releases what is left, exactly once each.
  REQUIRE(r.log.size() == 5);
  CHECK(r.log[4] == std::make_pair(14, true));
}

TEST_CASE("communicator cache: touch protects the recently used") {
  Released r;
  CommCache<int> cache(2, [&](int& h, bool healthy) { r.log.emplace_back(h, healthy); });
  auto* a = cache.Insert({0, 1}, 0, 1);
  cache.Insert({0, 2}, 0, 2);
  cache.Touch(a);  // {0,2} is now the least recently used
  cache.Insert({1, 2}, 0, 3);
  REQUIRE(r.log.size() == 1);
  CHECK(r.log[0].first == 2);
}
