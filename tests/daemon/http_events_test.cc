// The event journal over REST on a real daemon (gRPC and HTTP on
// 127.0.0.1:0, fed through a real IngestService stream): what an event's JSON
// carries. A job-wide event (reprofile, policy_changed, membership) names no
// rank and no states; a per-rank one names its rank, 0 included.
#include <catch2/catch.hpp>

#include <httplib.h>

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <memory>
#include <set>
#include <string>

#include "daemon_test_util.h"
#include "straggler/v1/straggler.grpc.pb.h"

namespace v1 = straggler::v1;
namespace pb = google::protobuf;
using namespace straggler::daemon::testutil;

namespace {

constexpr char kJob[] = "events-job";
constexpr uint32_t kWorld = 4;

struct Fixture : LoopbackDaemon {
  Fixture() {
    REQUIRE(server.http_port() > 0);
    http = std::make_unique<httplib::Client>("127.0.0.1", server.http_port());
    http->set_read_timeout(10, 0);
    // Rank 3 turns straggler at iteration 10 (state_change of rank 3).
    FeedRank3Slower(*ingest, kJob, kWorld);
    // A rule change re-profiles: policy_changed and reprofile, both job-wide.
    Put("/policy", "{\"profileIterations\": 7}");
    // An override of rank 0: a per-rank event whose rank is 0.
    Put("/workers/0/override", "{\"override\":\"force_include\"}");
  }

  void Put(const std::string& path, const std::string& body) {
    auto res = http->Put((std::string("/v1/jobs/") + kJob + path).c_str(), body,
                         "application/json");
    REQUIRE(res);
    INFO(res->body);
    REQUIRE(res->status == 200);
  }

  // The response of GET `path` as the generic JSON it was sent as, so that
  // absent fields can be told from zero ones.
  pb::Struct GetJson(const std::string& path) {
    auto res = http->Get(path.c_str());
    REQUIRE(res);
    INFO(res->body);
    REQUIRE(res->status == 200);
    pb::Struct out;
    REQUIRE(pb::util::JsonStringToMessage(res->body, &out).ok());
    return out;
  }

  std::unique_ptr<httplib::Client> http;
};

const pb::ListValue& Events(const pb::Struct& page) {
  return page.fields().at("events").list_value();
}

std::string KindOf(const pb::Value& e) {
  return e.struct_value().fields().at("kind").string_value();
}

bool Has(const pb::Value& e, const char* field) {
  return e.struct_value().fields().count(field) > 0;
}

}  // namespace

TEST_CASE("http events: job-wide events carry no rank and no states") {
  Fixture f;
  const pb::Struct page = f.GetJson(std::string("/v1/jobs/") + kJob + "/events");
  std::set<std::string> seen;
  for (const pb::Value& e : Events(page).values()) {
    const std::string kind = KindOf(e);
    seen.insert(kind);
    INFO(kind);
    const bool job_wide = kind == "EVENT_KIND_REPROFILE" || kind == "EVENT_KIND_POLICY_CHANGED" ||
                          kind == "EVENT_KIND_MEMBERSHIP" || kind == "EVENT_KIND_RESET";
    if (job_wide) {
      // Formerly "rank": 0, "from"/"to": "WORKER_STATE_PENDING".
      CHECK_FALSE(Has(e, "rank"));
      CHECK_FALSE(Has(e, "from"));
      CHECK_FALSE(Has(e, "to"));
    } else {
      CHECK(Has(e, "rank"));
      CHECK(Has(e, "from"));
      CHECK(Has(e, "to"));
    }
    const auto& fields = e.struct_value().fields();
    if (kind == "EVENT_KIND_STATE_CHANGE") {
      CHECK(fields.at("rank").number_value() == 3);
      CHECK(fields.at("from").string_value() == "WORKER_STATE_HEALTHY");
      CHECK(fields.at("to").string_value() == "WORKER_STATE_STRAGGLER");
    }
    if (kind == "EVENT_KIND_OVERRIDE") CHECK(fields.at("rank").number_value() == 0);
  }
  CHECK(seen.count("EVENT_KIND_REPROFILE") == 1);
  CHECK(seen.count("EVENT_KIND_POLICY_CHANGED") == 1);
  CHECK(seen.count("EVENT_KIND_STATE_CHANGE") == 1);
  CHECK(seen.count("EVENT_KIND_OVERRIDE") == 1);
}

TEST_CASE("http events: ?kind= and ?rank= filter on the daemon, the cursor still advances") {
  Fixture f;
  const std::string events = std::string("/v1/jobs/") + kJob + "/events";
  const pb::Struct all = f.GetJson(events);
  const double newest = std::stod(all.fields().at("lastSequence").string_value());

  auto kinds_of = [](const pb::Struct& page) {
    std::multiset<std::string> out;
    for (const pb::Value& e : Events(page).values()) out.insert(KindOf(e));
    return out;
  };
  // Short words and enum names, comma-separated.
  const pb::Struct jobwide = f.GetJson(events + "?kind=reprofile,EVENT_KIND_POLICY_CHANGED");
  CHECK(kinds_of(jobwide) ==
        std::multiset<std::string>{"EVENT_KIND_POLICY_CHANGED", "EVENT_KIND_REPROFILE"});
  // A poll that matched nothing new still moves the cursor to the newest
  // sequence examined, so `--follow` does not rescan.
  CHECK(std::stod(jobwide.fields().at("lastSequence").string_value()) == newest);

  // rank 0: its override, and nothing job-wide; rank 3: its state change.
  const pb::Struct rank0 = f.GetJson(events + "?rank=0");
  CHECK(kinds_of(rank0).count("EVENT_KIND_OVERRIDE") == 1);
  for (const pb::Value& e : Events(rank0).values()) {
    INFO(KindOf(e));
    REQUIRE(Has(e, "rank"));
    CHECK(e.struct_value().fields().at("rank").number_value() == 0);
  }
  const pb::Struct rank3 = f.GetJson(events + "?rank=3&kind=state_change");
  REQUIRE(Events(rank3).values_size() == 1);
  CHECK(Events(rank3).values(0).struct_value().fields().at("rank").number_value() == 3);
  CHECK(Events(f.GetJson(events + "?rank=2&kind=state_change")).values_size() == 0);

  auto res = f.http->Get((events + "?kind=bogus").c_str());
  REQUIRE(res);
  CHECK(res->status == 400);
  CHECK_THAT(res->body, Catch::Contains("kind='bogus' is not an event kind"));
  res = f.http->Get((events + "?rank=-1").c_str());
  REQUIRE(res);
  CHECK(res->status == 400);
}
