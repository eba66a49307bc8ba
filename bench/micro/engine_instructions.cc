// Instructions per report of the detection engine, steady state, for one
// policy: a figure that does not move with the machine's load (the 2-core
// development machine rarely is quiet; engine_bench's nanoseconds are), for
// comparing two policies or two builds of one (issue 29's per-report and
// per-planned-row goals are stated in engine_bench's time, which this does
// not replace):
//
//   bash bench/engine_instructions.sh [BUILD_DIR]   # runs this under callgrind
//
// Feeds `warm` complete rows (past every profile) and then `rows` measured
// rows of `ranks` healthy reports (compute 0.1 s +-5%, engine_bench's noise)
// to one JobEngine; only Measure() is counted (callgrind
// --collect-atstart=no --toggle-collect='*Measure*'). With --planned, rank 3 is
// 3x slow and min_throughput_gain no exclusion can reach keeps it withheld,
// so every row is planned (engine_bench's BM_EngineRowPlanned). With --work,
// each report carries a work of 512-1535 units and its compute time grows in
// proportion (the noise on top): the peer policy judges per unit of work and
// fits time against work once per row (WorkFit), issue 31's cost.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine_inputs.h"
#include "straggler/engine/job_engine.h"
#include "straggler/engine/policy.h"

namespace se = straggler::engine;

namespace {

struct Job {
  se::JobEngine engine;
  uint32_t ranks;
  double slow;  // rank 3's factor
  bool work;    // reports carry work (--work)
  std::vector<double> noise;
  uint64_t iteration = 0;
  size_t k = 0;
  se::Time now{1'700'000'000'000'000'000};

  Job(uint32_t n, const se::PolicyConfig& p, double slow_factor, bool with_work)
      : engine(n, p, se::Time{1'700'000'000'000'000'000}),
        ranks(n),
        slow(slow_factor),
        work(with_work),
        noise(straggler::bench::NoiseTable()) {}
  void Row() {
    for (uint32_t r = 0; r < ranks; ++r) {
      se::Report rep;
      rep.rank = r;
      rep.iteration = iteration;
      rep.compute_seconds = noise[k++ & 4095] * (r == 3 ? slow : 1.0);
      if (work) {
        // Deterministic work per (rank, iteration), time in proportion.
        const double w = 512.0 + static_cast<double>((r * 2654435761u + iteration * 40503u) % 1024u);
        rep.work = w;
        rep.compute_seconds *= w / 1024.0;
      }
      if (!engine.Ingest(rep, now).accepted) {
        std::fprintf(stderr, "engine_instructions: a report was rejected\n");
        std::exit(1);
      }
    }
    ++iteration;
    now += std::chrono::milliseconds(100);
    engine.TakeEvents();
  }
};

// What callgrind counts (--toggle-collect='*Measure*': the name is in an
// anonymous namespace).
[[gnu::noinline]] void Measure(Job& job, uint64_t rows) {
  for (uint64_t i = 0; i < rows; ++i) job.Row();
}

}  // namespace

int main(int argc, char** argv) {
  std::string policy = "peer";
  uint32_t ranks = 1000;
  uint64_t rows = 200, warm = 40;
  bool planned = false, work = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--planned") {
      planned = true;
    } else if (a == "--work") {
      work = true;
    } else if (i + 1 < argc && a == "--policy") {
      policy = argv[++i];
    } else if (i + 1 < argc && a == "--ranks") {
      ranks = static_cast<uint32_t>(std::atol(argv[++i]));
    } else if (i + 1 < argc && a == "--rows") {
      rows = static_cast<uint64_t>(std::atol(argv[++i]));
    } else {
      std::fprintf(stderr,
                   "usage: engine_instructions [--policy P] [--ranks N] [--rows R] [--planned] [--work]\n");
      return 2;
    }
  }
  auto kind = se::ParsePolicyKind(policy);
  if (!kind.ok() || ranks < 8 || rows == 0) {
    std::fprintf(stderr, "engine_instructions: bad --policy '%s', --ranks (>= 8) or --rows\n",
                 policy.c_str());
    return 2;
  }
  se::PolicyConfig p = straggler::bench::Policy(*kind);
  if (planned) p.min_throughput_gain = 1e9;
  Job job(ranks, p, planned ? 3.0 : 1.0, work);
  for (uint64_t i = 0; i < warm; ++i) job.Row();
  Measure(job, rows);
  std::printf("policy %s, %u ranks, %llu rows measured (%llu reports)%s%s\n", policy.c_str(), ranks,
              static_cast<unsigned long long>(rows),
              static_cast<unsigned long long>(rows * ranks), planned ? ", planned" : "",
              work ? ", with work" : "");
  return 0;
}
