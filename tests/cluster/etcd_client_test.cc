// EtcdClient against a real etcd (etcd_harness.h): KV, transactions and
// their compares, leases and their expiry, keep-alive, watches, errors.
#include <catch2/catch.hpp>

#include <algorithm>

#include "cluster/etcd_client.h"
#include "etcd_catch.h"

namespace straggler::cluster {
namespace {

using namespace std::chrono_literals;
using testing::EtcdProcess;
using testing::PollUntil;
using testing::WatchRecorder;

struct Started {
  std::unique_ptr<EtcdProcess> etcd;
  std::unique_ptr<EtcdClient> client;
};

Started StartEtcd() {
  auto etcd = testing::RequireEtcd();
  auto client = EtcdClient::Connect({.endpoints = etcd->endpoint()});
  REQUIRE(client.ok());
  return {std::move(etcd), *std::move(client)};
}

TEST_CASE("etcd client: put, get, prefix and delete", "[cluster]") {
  Started s = StartEtcd();
  EtcdClient& c = *s.client;
  auto r1 = c.Put("/t/a/1", "one");
  auto r2 = c.Put("/t/a/2", "two");
  REQUIRE(c.Put("/t/b", "other").ok());
  REQUIRE(r1.ok());
  REQUIRE(r2.ok());
  CHECK(*r2 > *r1);

  auto one = c.Get("/t/a/1");
  REQUIRE(one.ok());
  REQUIRE(one->kvs.size() == 1);
  CHECK(one->kvs[0].value == "one");
  CHECK(one->kvs[0].create_revision == *r1);
  CHECK(one->kvs[0].version == 1);
  CHECK(one->kvs[0].lease == 0);

  auto prefix = c.GetPrefix("/t/a/");
  REQUIRE(prefix.ok());
  REQUIRE(prefix->kvs.size() == 2);
  CHECK(prefix->kvs[0].key == "/t/a/1");
  CHECK(prefix->kvs[1].key == "/t/a/2");

  auto deleted = c.DeletePrefix("/t/a/");
  REQUIRE(deleted.ok());
  CHECK(*deleted == 2);
  CHECK(c.GetPrefix("/t/a/")->kvs.empty());
  CHECK(c.Get("/t/b")->kvs.size() == 1);
  CHECK(*c.Delete("/t/b") == 1);
  CHECK(*c.Delete("/t/b") == 0);

  // 10 calls above, every one answered and timed.
  CHECK(c.stats().calls() == 10);
  CHECK(c.stats().errors() == 0);
  CHECK(c.stats().round_trip_seconds().Collect().histogram.sample_count == 10);
  CHECK(c.stats().round_trip_seconds().Collect().histogram.sample_sum > 0);
}

TEST_CASE("etcd client: a transaction runs one branch by its compares", "[cluster]") {
  Started s = StartEtcd();
  EtcdClient& c = *s.client;
  // Create-if-absent: only the first one creates.
  auto first = c.Txn({Compare::Absent("/t/k")}, {TxnOp::Put("/t/k", "v1")}, {TxnOp::Get("/t/k")});
  REQUIRE(first.ok());
  CHECK(first->succeeded);
  auto second = c.Txn({Compare::Absent("/t/k")}, {TxnOp::Put("/t/k", "v2")}, {TxnOp::Get("/t/k")});
  REQUIRE(second.ok());
  CHECK_FALSE(second->succeeded);
  REQUIRE(second->results.size() == 1);
  REQUIRE(second->results[0].size() == 1);
  const KeyValue held = second->results[0][0];
  CHECK(held.value == "v1");
  CHECK(held.create_revision == first->revision);

  // mod_revision: a write conditioned on the version read succeeds once.
  auto cas = c.Txn({Compare::ModRevisionIs("/t/k", held.mod_revision)}, {TxnOp::Put("/t/k", "v3")},
                   {});
  REQUIRE(cas.ok());
  CHECK(cas->succeeded);
  auto stale = c.Txn({Compare::ModRevisionIs("/t/k", held.mod_revision)},
                     {TxnOp::Put("/t/k", "lost")}, {});
  REQUIRE(stale.ok());
  CHECK_FALSE(stale->succeeded);

  // create_revision survives the update; value and lease compares.
  CHECK(c.Txn({Compare::CreateRevisionIs("/t/k", held.create_revision),
               Compare::ValueIs("/t/k", "v3"), Compare::LeaseIs("/t/k", 0)},
              {}, {})->succeeded);
  CHECK_FALSE(c.Txn({Compare::ValueIs("/t/k", "v1")}, {}, {})->succeeded);
  CHECK_FALSE(c.Txn({Compare::LeaseIs("/t/k", 12345)}, {}, {})->succeeded);
  CHECK(c.Get("/t/k")->kvs.at(0).value == "v3");
}

TEST_CASE("etcd client: an expired lease takes its keys, a kept one does not", "[cluster]") {
  Started s = StartEtcd();
  EtcdClient& c = *s.client;
  auto expiring = c.GrantLease(1);
  auto kept = c.GrantLease(1);
  REQUIRE(expiring.ok());
  REQUIRE(kept.ok());
  INFO("granted ttl " << expiring->ttl_seconds);
  CHECK(expiring->ttl_seconds >= 1);
  REQUIRE(c.Put("/t/expiring", "x", expiring->id).ok());
  REQUIRE(c.Put("/t/kept", "y", kept->id).ok());
  auto ttl = c.TimeToLive(expiring->id);
  REQUIRE(ttl.ok());
  CHECK(ttl->granted_ttl_seconds == expiring->ttl_seconds);
  CHECK(ttl->keys == std::vector<std::string>{"/t/expiring"});
  CHECK(c.Get("/t/expiring")->kvs.at(0).lease == expiring->id);

  // The keeper on a client of its own, so that its stats count renewals alone.
  auto keeper_client = EtcdClient::Connect({.endpoints = s.etcd->endpoint()});
  REQUIRE(keeper_client.ok());
  auto keeper = (*keeper_client)->KeepAlive(*kept);
  const auto first_deadline = keeper->Deadline();
  CHECK(first_deadline >= kept->sent + std::chrono::seconds(kept->ttl_seconds));
  // etcd revokes expired leases on a 500 ms sweep: TTL + 3 s is ample.
  const auto limit = std::chrono::seconds(expiring->ttl_seconds) + 3s;
  REQUIRE(PollUntil(std::chrono::duration_cast<std::chrono::milliseconds>(limit),
                    [&] { return c.Get("/t/expiring")->kvs.empty(); }));
  CHECK(c.TimeToLive(expiring->id)->ttl_seconds == -1);
  // By now the kept lease outlived its own TTL only by its renewals.
  REQUIRE(PollUntil(3s, [&] {
    return std::chrono::steady_clock::now() > kept->sent + std::chrono::seconds(kept->ttl_seconds);
  }));
  CHECK(c.Get("/t/kept")->kvs.size() == 1);
  CHECK(keeper->Renewals() >= 2);
  CHECK(keeper->Deadline() > first_deadline);
  CHECK(keeper->Deadline() > std::chrono::steady_clock::now());
  CHECK_FALSE(keeper->Lost());

  // Revoked: the keeper learns that the lease is gone and stops.
  REQUIRE(c.RevokeLease(kept->id).ok());
  CHECK(c.Get("/t/kept")->kvs.empty());
  REQUIRE(PollUntil(3s, [&] { return keeper->Lost(); }));
  CHECK(keeper->LastError().code() == absl::StatusCode::kNotFound);
  // Every renewal was a timed round trip, and so was etcd's "gone" answer.
  const EtcdStats& renewals = (*keeper_client)->stats();
  CHECK(renewals.calls() == static_cast<uint64_t>(keeper->Renewals()) + 1);
  CHECK(renewals.errors() == 0);
  CHECK(renewals.round_trip_seconds().Collect().histogram.sample_count == renewals.calls());
}

TEST_CASE("etcd client: a watch sees a prefix's puts and deletes in order", "[cluster]") {
  Started s = StartEtcd();
  EtcdClient& c = *s.client;
  WatchRecorder recorder;
  REQUIRE(c.Put("/t/w/before", "not seen").ok());
  auto watch = c.WatchPrefix("/t/w/", 0, recorder.OnEvents(), nullptr);
  REQUIRE(watch.ok());
  auto put = c.Put("/t/w/a", "1");
  REQUIRE(put.ok());
  REQUIRE(c.Put("/t/other", "not watched").ok());
  auto deleted = c.Delete("/t/w/a");
  REQUIRE(deleted.ok());
  const int64_t last_write = c.Get("/t/other")->revision;
  REQUIRE(PollUntil(5s, [&] { return recorder.Events().size() >= 2; }));
  const std::vector<WatchEvent> seen = recorder.Events();
  REQUIRE(seen.size() == 2);
  CHECK(seen[0].type == WatchEvent::Type::kPut);
  CHECK(seen[0].kv.key == "/t/w/a");
  CHECK(seen[0].kv.value == "1");
  CHECK(seen[0].kv.mod_revision == *put);
  CHECK(seen[1].type == WatchEvent::Type::kDelete);
  CHECK(seen[1].kv.key == "/t/w/a");
  CHECK(seen[1].kv.mod_revision > *put);
  // Each batch comes with etcd's revision when it was sent: at least its
  // events' (what ClusterView::Revision() reports), at most the last write.
  const std::vector<int64_t> revisions = recorder.Revisions();
  REQUIRE_FALSE(revisions.empty());
  CHECK(revisions.back() >= seen[1].kv.mod_revision);
  CHECK(revisions.back() <= last_write);
  CHECK(std::is_sorted(revisions.begin(), revisions.end()));
  CHECK((*watch)->Status().ok());
}

TEST_CASE("etcd client: a watch resumes after etcd restarts, each event once", "[cluster]") {
  Started s = StartEtcd();
  WatchRecorder seen;
  auto watch = s.client->WatchPrefix("/t/", 0, seen.OnEvents(), seen.OnEnd());
  REQUIRE(watch.ok());
  REQUIRE(s.client->Put("/t/a", "before").ok());
  REQUIRE(PollUntil(5s, [&] { return seen.Values().size() == 1; }));

  s.etcd->Kill();
  REQUIRE(PollUntil(5s, [&] { return !(*watch)->Status().ok(); }));
  CHECK_THAT(std::string((*watch)->Status().message()), Catch::Contains(s.etcd->endpoint()));
  absl::Status restarted = s.etcd->Restart();
  INFO(restarted.message());
  REQUIRE(restarted.ok());
  // Written as soon as etcd is back, maybe before the watch is: it must
  // still arrive, once, after "before".
  auto after = s.client->Put("/t/b", "after");
  REQUIRE(after.ok());
  REQUIRE(PollUntil(10s, [&] { return seen.Values().size() >= 2; }));
  CHECK((*watch)->Status().ok());
  CHECK((*watch)->Resumes() == 1);
  CHECK(s.client->stats().streams_broken() >= 1);
  REQUIRE(s.client->Put("/t/c", "later").ok());
  REQUIRE(PollUntil(5s, [&] { return seen.Values().size() >= 3; }));
  CHECK(seen.Values() == std::vector<std::string>{"before", "after", "later"});
  CHECK(seen.Events()[1].kv.mod_revision == *after);
  CHECK(seen.Ends().empty());
}

TEST_CASE("etcd client: a watch from a compacted revision ends with the reason", "[cluster]") {
  Started s = StartEtcd();
  auto first = s.client->Put("/t/k", "1");
  REQUIRE(first.ok());
  auto last = s.client->Put("/t/k", "2");
  REQUIRE(last.ok());
  REQUIRE(s.client->Compact(*last).ok());
  WatchRecorder seen;
  auto watch = s.client->WatchPrefix("/t/", *first, seen.OnEvents(), seen.OnEnd());
  // etcd may refuse it at once (WatchPrefix's error) or confirm then cancel
  // it (on_end): either way, the reason names the compaction.
  absl::Status reason;
  if (!watch.ok()) {
    reason = watch.status();
  } else {
    REQUIRE(PollUntil(5s, [&] { return !seen.Ends().empty(); }));
    REQUIRE(seen.Ends().size() == 1);
    reason = seen.Ends()[0];
    CHECK((*watch)->Status() == reason);
  }
  CHECK(reason.code() == absl::StatusCode::kAborted);
  CHECK_THAT(std::string(reason.message()), Catch::Contains("compacted"));
  CHECK(seen.Values().empty());
  // A later revision is still watchable.
  WatchRecorder fresh;
  auto again = s.client->WatchPrefix("/t/", *last, fresh.OnEvents(), fresh.OnEnd());
  REQUIRE(again.ok());
  REQUIRE(PollUntil(5s, [&] { return fresh.Values() == std::vector<std::string>{"2"}; }));
}

TEST_CASE("etcd client: errors name the endpoint and the call", "[cluster]") {
  auto bad = EtcdClient::Connect({.endpoints = "etcd-without-port"});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(bad.status().message()), Catch::Contains("'etcd-without-port'"));
  CHECK(EtcdClient::Connect({.endpoints = "https://127.0.0.1:2379"}).status().code() ==
        absl::StatusCode::kUnimplemented);
  auto names = EtcdClient::Connect({.endpoints = "a:1,b:2"});
  CHECK(names.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(names.status().message()), Catch::Contains("one DNS name"));
  CHECK(EtcdClient::Connect({.endpoints = "10.0.0.1:2379,[::1]:2379"}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(EtcdClient::Connect({.endpoints = "10.0.0.1:2379,10.0.0.2"})
                             .status()
                             .message()),
             Catch::Contains("'10.0.0.2' is not host:port"));
  auto several = EtcdClient::Connect({.endpoints = "http://10.0.0.1:2379, 10.0.0.2:2379"});
  REQUIRE(several.ok());
  CHECK((*several)->endpoint() == "10.0.0.1:2379,10.0.0.2:2379");
  CHECK(EtcdClient::Connect({.endpoints = "[::1]:2379,[::1]:2380"}).ok());
  auto ok = EtcdClient::Connect({.endpoints = "http://127.0.0.1:2379/"});
  REQUIRE(ok.ok());
  CHECK((*ok)->endpoint() == "127.0.0.1:2379");

  // Nothing listens there: the call fails at once, naming where and what.
  const std::string nobody = "127.0.0.1:" + std::to_string(testing::FreePort());
  auto client = EtcdClient::Connect({.endpoints = nobody, .call_timeout = 2s});
  REQUIRE(client.ok());
  auto got = (*client)->Get("/some/key");
  REQUIRE_FALSE(got.ok());
  CHECK(got.status().code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(got.status().message()),
             Catch::Contains("etcd " + nobody + " Range /some/key"));
  // Counted as an error, kept out of the round-trip times.
  CHECK((*client)->stats().calls() == 1);
  CHECK((*client)->stats().errors() == 1);
  CHECK((*client)->stats().round_trip_seconds().Collect().histogram.sample_count == 0);
  CHECK_THAT(std::string((*client)->GrantLease(0).status().message()), Catch::Contains(nobody));
}

TEST_CASE("etcd client: of several members, the one that answers serves", "[cluster]") {
  Started s = StartEtcd();
  // A member that is down first: calls go to the next one.
  const std::string down = "127.0.0.1:" + std::to_string(testing::FreePort());
  auto client = EtcdClient::Connect({.endpoints = down + "," + s.etcd->endpoint()});
  REQUIRE(client.ok());
  CHECK((*client)->endpoint() == down + "," + s.etcd->endpoint());
  absl::Status last;
  REQUIRE(PollUntil(5s, [&] {
    last = (*client)->Put("/t/k", "v").status();
    return last.ok();
  }));
  CHECK((*client)->Get("/t/k")->kvs.at(0).value == "v");
}

TEST_CASE("etcd client: PrefixRangeEnd", "[cluster]") {
  CHECK(PrefixRangeEnd("a/") == "a0");
  CHECK(PrefixRangeEnd("ab") == "ac");
  CHECK(PrefixRangeEnd(std::string("a\xff", 2)) == "b");
  CHECK(PrefixRangeEnd(std::string("\xff", 1)) == std::string(1, '\0'));
  CHECK(PrefixRangeEnd("") == std::string(1, '\0'));
}

}  // namespace
}  // namespace straggler::cluster
