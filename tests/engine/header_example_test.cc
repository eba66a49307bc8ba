// The usage example at the top of straggler/engine/job_engine.h, compiled
// and run: a header example that stops compiling (it once called a
// constructor that does not exist) fails here. Keep the two in step.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "straggler/engine/job_engine.h"

namespace {

TEST_CASE("header example: job_engine.h's example compiles and does what it says",
          "[engine][docs]") {
  using namespace straggler::engine;
  const Time now = std::chrono::seconds(1'700'000'000);
  std::vector<std::string> logged;
  auto log = [&](const std::string& m) { logged.push_back(m); };
  std::vector<Event> seen;

  // ---- as in the header ----
  JobEngine job(/*world_size=*/8, PolicyConfig{}, now);
  Report rep;
  rep.rank = 3;
  rep.iteration = 17;
  rep.compute_seconds = 0.12;
  IngestResult r = job.Ingest(rep, now);
  if (!r.accepted) log(r.message);
  for (const Event& e : job.TakeEvents()) seen.push_back(e);  // state changes, memberships
  const Membership& m = job.membership();                      // who takes part, from when
  // ---- end ----

  CHECK(r.accepted);
  CHECK(logged.empty());
  CHECK(m.version == 0);
  CHECK(m.excluded.empty());
  CHECK(job.Progress(3) == std::optional<uint64_t>(17));

  // The rejection the header quotes.
  rep.iteration = 18;
  rep.compute_seconds = std::nan("");
  r = job.Ingest(rep, now);
  if (!r.accepted) log(r.message);
  REQUIRE(logged.size() == 1);
  CHECK(logged[0] ==
        "rank 3 iteration 18 reported compute_seconds=nan (must be a finite number >= 0)");
}

}  // namespace
