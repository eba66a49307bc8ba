// The engine's per-rank storage at scale (engine/src/peer_profiles.h,
// rank_chunks.h, topology_table.h): profiles in one mapped block per 4 096
// ranks, handed back to the system when the chunk's last profile ends; rank
// state built a chunk at a time, read as the default state before; each
// rank's topology as an index into the job's distinct pairs; a short window
// in place (peer_steps.h) and row counters held far above what they are
// compared with (peer_state.h).
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "peer_profiles.h"
#include "peer_state.h"
#include "peer_steps.h"
#include "rank_chunks.h"
#include "topology_table.h"

namespace si = straggler::engine::internal;
using P = si::PeerProfiles;

namespace {
std::vector<double> Values(const P& p, P::Kind kind, uint32_t rank) {
  std::vector<double> v{-1.0};  // replaced
  p.CopyTo(kind, rank, v);
  return v;
}
}  // namespace

TEST_CASE("peer profiles: values kept per rank and kind, block unmapped when the last ends") {
  P p;
  p.Resize(10'000);
  CHECK(p.MappedBytes() == 0);
  CHECK(Values(p, P::kOwn, 5).empty());
  p.Push(P::kOwn, 5, 1.5, 4);
  p.Push(P::kOwn, 5, -2.0, 4);
  p.Push(P::kGen, 5, 7.0, 4);
  p.Push(P::kOwn, 4095, 3.0, 4);  // the same chunk
  p.Push(P::kOwn, 4096, 9.0, 4);  // the next one
  const size_t two_blocks = p.MappedBytes();
  CHECK(two_blocks > 0);
  REQUIRE(p.Count(P::kOwn, 5) == 2);
  CHECK(Values(p, P::kOwn, 5) == std::vector<double>{1.5, -2.0});
  CHECK(Values(p, P::kOwn, 4095) == std::vector<double>{3.0});
  CHECK(p.Count(P::kGen, 5) == 1);
  CHECK(Values(p, P::kGen, 5) == std::vector<double>{7.0});
  CHECK(p.Count(P::kOwn, 6) == 0);

  p.Clear(P::kOwn, 4096);  // the second chunk's only profile
  CHECK(p.MappedBytes() == two_blocks / 2);
  p.Clear(P::kOwn, 5);  // rank 5 still holds its kGen value
  CHECK(p.Count(P::kGen, 5) == 1);
  p.Clear(P::kGen, 5);
  CHECK(p.MappedBytes() == two_blocks / 2);  // rank 4095 holds the block
  p.Clear(P::kOwn, 4095);
  CHECK(p.MappedBytes() == 0);
  p.Clear(P::kOwn, 4095);  // nothing to clear: no-op
  CHECK(p.Count(P::kOwn, 4095) == 0);
}

TEST_CASE("peer profiles: a profile longer than its block's room grows the block, values kept") {
  P p;
  p.Resize(8);
  for (int i = 0; i < 10; ++i) p.Push(P::kOwn, 3, i, 2);
  p.Push(P::kGen, 7, 42.0, 2);
  REQUIRE(p.Count(P::kOwn, 3) == 10);
  const std::vector<double> v = Values(p, P::kOwn, 3);
  REQUIRE(v.size() == 10);
  for (int i = 0; i < 10; ++i) CHECK(v[i] == i);
  CHECK(Values(p, P::kGen, 7) == std::vector<double>{42.0});
  CHECK(Values(p, P::kOwn, 7).empty());
}

TEST_CASE("peer profiles: ranks dropped by a smaller world start with no profile") {
  P p;
  p.Resize(100);
  p.Push(P::kOwn, 90, 1.0, 4);
  p.Push(P::kOwn, 10, 1.0, 4);
  p.Resize(50);
  p.Resize(100);
  CHECK(p.Count(P::kOwn, 90) == 0);
  CHECK(p.Count(P::kOwn, 10) == 1);
  p.Resize(0);
  CHECK(p.MappedBytes() == 0);
}

TEST_CASE("rank chunks: default state until written, dropped ranks start over") {
  struct S {
    int v = 7;
  };
  si::RankChunks<S> c;
  c.resize(10'000);
  const auto& cc = c;
  CHECK(cc[9'999].v == 7);  // never built: the default
  c[5000].v = 1;
  CHECK(cc[5000].v == 1);
  CHECK(cc[5001].v == 7);
  CHECK(c.Find(100) == nullptr);  // a pass over every rank skips unbuilt chunks
  REQUIRE(c.Find(5001) != nullptr);
  CHECK(c.Find(5001)->v == 7);
  size_t built = 0;
  c.ForEachBuilt([&](S& s) {
    ++built;
    s.v += 1;
  });
  CHECK(built == 4096);  // one chunk: ranks 4096..8191
  CHECK(cc[5000].v == 2);
  CHECK(cc[100].v == 7);
  c.resize(4097);  // rank 5000 dropped, rank 4096 kept
  c.resize(10'000);
  CHECK(cc[5000].v == 7);
  CHECK(cc[4096].v == 8);
  c.resize(4098);
  built = 0;
  c.ForEachBuilt([&](S&) { ++built; });
  CHECK(built == 2);  // only ranks below size()
}

TEST_CASE("topology table: ranks share their pairs, renamed ones are let go") {
  si::TopologyTable t(1000);
  CHECK(t.Get(5) == straggler::engine::RankTopology{});
  straggler::engine::RankTopology a{"stage0", 3, "H100"};
  CHECK(t.Set(5, a));
  CHECK_FALSE(t.Set(5, a));  // unchanged
  for (uint32_t r = 0; r < 1000; ++r) t.Set(r, {"stage" + std::to_string(r % 4), r / 8, "H100"});
  CHECK(t.Keys().size() == 5);  // ("", "") and four stages
  CHECK(t.Get(6) == (straggler::engine::RankTopology{"stage2", 0, "H100"}));
  CHECK(t.KeyIndex(2) == t.KeyIndex(6));
  CHECK(t.PeerGroup(7) == "stage3");
  REQUIRE(t.Replica(17).has_value());
  CHECK(*t.Replica(17) == 2);
  // One rank renamed 10 000 times: the pairs nobody names are dropped.
  for (int i = 0; i < 10'000; ++i) t.Set(0, {"churn" + std::to_string(i), 0, ""});
  CHECK(t.Keys().size() <= 2 * 1000 + 64 + 1);
  CHECK(t.Get(0).peer_group == "churn9999");
  CHECK(t.Get(6) == (straggler::engine::RankTopology{"stage2", 0, "H100"}));
}

TEST_CASE("window floats: a vector's values in place, on the heap past 10, copied and shrunk") {
  si::WindowFloats w;
  std::vector<float> ref;
  for (int i = 0; i < 25; ++i) {  // in place up to 10, then two growths on the heap
    w.push_back(static_cast<float>(i) * 0.5f);
    ref.push_back(static_cast<float>(i) * 0.5f);
    REQUIRE(w.size() == ref.size());
    CHECK(std::vector<float>(w.begin(), w.end()) == ref);
  }
  w[3] = -1.0f;
  ref[3] = -1.0f;
  si::WindowFloats copy = w;  // a heap copy of its own
  w[4] = 9.0f;
  CHECK(std::vector<float>(copy.begin(), copy.end()) == ref);
  w.resize(7);  // the window made shorter keeps the first values
  ref[4] = 9.0f;
  ref.resize(7);
  CHECK(std::vector<float>(w.begin(), w.end()) == ref);
  si::WindowFloats small;
  small.push_back(1.0f);
  copy = small;  // from the heap back to few values
  CHECK(copy.size() == 1);
  CHECK(copy[0] == 1.0f);
  small = w;  // in place, taking a longer one
  CHECK(std::vector<float>(small.begin(), small.end()) == ref);
  small.clear();
  CHECK(small.empty());
}

TEST_CASE("peer rank: row counters are held at their bound, not wrapped") {
  si::PeerRank pr;
  pr.above_rows = si::PeerRank::kMaxRows - 1;
  pr.above_rows = si::PeerRank::Bump(pr.above_rows);
  CHECK(pr.above_rows == si::PeerRank::kMaxRows);
  pr.above_rows = si::PeerRank::Bump(pr.above_rows);
  CHECK(pr.above_rows == si::PeerRank::kMaxRows);  // a plain +1 would wrap to 0
  CHECK(si::PeerRank::kMaxRows > 100000);           // above every limit and row count compared
  pr.below_rows = 5;
  pr.gray_rows = 7;
  CHECK(pr.above_rows == si::PeerRank::kMaxRows);  // the fields share a word, not bits
}
