// The web console's HTTP side (console/console.h) on a loopback daemon: the
// page and its assets come from the binary with a Content-Security-Policy,
// every answer (REST and errors too) carries the policy, the script keeps the
// escaping and token rules docs/console.md states, and the report ring feeds
// the heatmap its reference, ratio and job step time.
#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <google/protobuf/util/json_util.h>

#include <memory>
#include <string>

#include "console/console.h"
#include "daemon_test_util.h"
#include "server/server.h"
#include "straggler/v1/straggler.grpc.pb.h"

namespace sd = straggler::daemon;
namespace v1 = straggler::v1;
using namespace straggler::daemon::testutil;

namespace {

struct Fixture : LoopbackDaemon {
  Fixture() : http(std::make_unique<httplib::Client>("127.0.0.1", server.http_port())) {
    http->set_read_timeout(10, 0);
  }
  std::unique_ptr<httplib::Client> http;
};

void CheckPolicy(const httplib::Result& res) {
  REQUIRE(res);
  CHECK(res->get_header_value("Content-Security-Policy") == sd::ContentSecurityPolicy());
  CHECK(res->get_header_value("X-Content-Type-Options") == "nosniff");
}

// GET `path`, expecting `status` and the security headers.
httplib::Result Fetch(Fixture& f, const std::string& path, int status) {
  INFO(path);
  httplib::Result res = f.http->Get(path);
  CheckPolicy(res);
  CHECK(res->status == status);
  return res;
}

}  // namespace

TEST_CASE("console: GET / serves the page and its assets from the binary") {
  Fixture f;
  auto page = Fetch(f, "/", 200);
  CHECK(page->get_header_value("Content-Type") == "text/html; charset=utf-8");
  CHECK(page->body.find("<script src=\"/console/console.js\" defer></script>") != std::string::npos);
  for (const char* path : {"/console/console.js", "/console/console.css"}) {
    auto res = Fetch(f, path, 200);
    CHECK(res->body == sd::FindConsoleAsset(path)->body);
    CHECK(res->body.size() > 100);
  }
  CHECK(f.http->Get("/console/console.js")->get_header_value("Content-Type") ==
        "text/javascript; charset=utf-8");
  CHECK(f.http->Head("/")->status == 200);

  auto post = f.http->Post("/", "", "text/plain");
  REQUIRE(post);
  CHECK(post->status == 405);
  CHECK(post->get_header_value("Allow") == "GET, HEAD");

  // Not a console path: the REST router's JSON 404, with the policy too.
  Fetch(f, "/console/nope.js", 404);
  Fetch(f, "/v1/jobs", 200);
}

TEST_CASE("console: the policy allows only the daemon's own scripts, no inline code, no framing") {
  const std::string_view csp = sd::ContentSecurityPolicy();
  CHECK(csp.find("default-src 'none'") != std::string_view::npos);
  CHECK(csp.find("script-src 'self'") != std::string_view::npos);
  CHECK(csp.find("frame-ancestors 'none'") != std::string_view::npos);
  CHECK(csp.find("unsafe-inline") == std::string_view::npos);
  CHECK(csp.find("unsafe-eval") == std::string_view::npos);
}

TEST_CASE("console: the script builds no markup from strings and stores no token") {
  // The rules console.js states at its top, held here so that a change
  // breaking them fails a test, not a browser at 3 a.m.
  const std::string_view js = sd::FindConsoleAsset("/console/console.js")->body;
  for (const char* banned : {"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write",
                             "eval(", "new Function", "localStorage.", "sessionStorage.",
                             "document.cookie", "console.log", "http://", "https://"}) {
    INFO(banned);
    CHECK(js.find(banned) == std::string_view::npos);
  }
  const std::string_view html = sd::FindConsoleAsset("/")->body;
  CHECK(html.find("http://") == std::string_view::npos);
  CHECK(html.find("https://") == std::string_view::npos);
  CHECK(html.find("<script>") == std::string_view::npos);  // no inline script (CSP refuses it)
}

TEST_CASE("console: ExportReports scores each report against the job's reference") {
  Fixture f;
  // One stream per iteration: a stream reads the job's baseline when it
  // first needs it (then at most every 100 ms), so each later iteration is
  // scored against the baseline the earlier ones built.
  for (uint64_t it = 1; it <= 12; ++it) {
    v1::ReportBatch b = Hello("scored", 4, {0, 1, 2, 3});
    for (uint32_t r = 0; r < 4; ++r) AddReport(b, r, it, r == 3 ? 0.3 : 0.1);
    CHECK(SendAlone(*f.ingest, b).accepted() == 4);
  }

  auto res = f.http->Get("/v1/jobs/scored/reports?since_iteration=12");
  REQUIRE(res);
  REQUIRE(res->status == 200);
  v1::ExportReportsResponse r;
  REQUIRE(google::protobuf::util::JsonStringToMessage(res->body, &r).ok());
  REQUIRE(r.reports_size() == 4);
  REQUIRE(r.scores_size() == r.reports_size());
  for (int i = 0; i < r.reports_size(); ++i) {
    INFO("rank " << r.reports(i).rank());
    const v1::ReportScore& s = r.scores(i);
    REQUIRE(s.reference_seconds() > 0);
    CHECK(s.ratio() == Approx(r.reports(i).compute_seconds() / s.reference_seconds()).epsilon(1e-6));
    CHECK(s.job_step_seconds() > 0);
  }
  CHECK(r.scores(3).ratio() == Approx(3 * r.scores(0).ratio()).epsilon(1e-3));

  // Before any baseline, the first batch's reports carry none: ratio 0.
  v1::ExportReportsResponse first;
  auto res1 = f.http->Get("/v1/jobs/scored/reports?limit=4");
  REQUIRE(res1);
  REQUIRE(google::protobuf::util::JsonStringToMessage(res1->body, &first).ok());
  REQUIRE(first.scores_size() == 4);
  CHECK(first.scores(0).reference_seconds() == 0);
  CHECK(first.scores(0).ratio() == 0);
}
