// Resident memory per rank of the detection engine alone (issue 29's budget
// of 512 B per rank at a million ranks is the daemon's; this is the engine's
// part of it), without gRPC or the registry around it, and how long the
// longest single Ingest() of each row took - the call that judges a row,
// which every stream of the job waits for in the daemon:
//
//   build/bench/micro/engine_memory [--policy peer|dynamic|ewma|static] [--ranks N] [--rows R]
//
// Feeds R complete rows of healthy reports (compute 0.1 s +-5%) to one
// JobEngine of N ranks and prints VmRSS growth per rank after the engine is
// built and after rows 1, 10, 12 and the last (the peer policy profiles for
// its first peer_profile_iterations rows, 10 by default, and frees that
// afterwards), and every row's longest Ingest() and longest run of 4 096
// consecutive ones (a daemon batch) (wall time, this machine).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <fstream>
#include <string>

#include "straggler/engine/job_engine.h"

namespace se = straggler::engine;

namespace {

long RssKiB() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  return 0;
}

// The loadgen goals' batch: a daemon stream takes this many reports under the
// job's lock, so their Ingest() calls together are what the batch waits.
constexpr uint32_t kBatch = 4096;

}  // namespace

int main(int argc, char** argv) {
  std::string policy = "peer";
  uint32_t ranks = 1u << 20;
  uint64_t rows = 30;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--policy") policy = argv[i + 1];
    else if (a == "--ranks") ranks = static_cast<uint32_t>(std::atol(argv[i + 1]));
    else if (a == "--rows") rows = static_cast<uint64_t>(std::atol(argv[i + 1]));
    else {
      std::fprintf(stderr, "usage: engine_memory [--policy P] [--ranks N] [--rows R]\n");
      return 2;
    }
  }
  auto kind = se::ParsePolicyKind(policy);
  if (!kind.ok() || ranks == 0 || rows == 0) {
    std::fprintf(stderr, "engine_memory: bad --policy '%s', --ranks or --rows\n", policy.c_str());
    return 2;
  }
  se::PolicyConfig p;
  p.kind = *kind;
  const long before = RssKiB();
  auto per_rank = [&] { return static_cast<double>(RssKiB() - before) * 1024.0 / ranks; };
  se::JobEngine engine(ranks, p, se::Time(0));
  std::printf("%s, %u ranks: built %.0f B/rank\n", policy.c_str(), ranks, per_rank());
  uint64_t s = 1;
  using Clock = std::chrono::steady_clock;
  for (uint64_t it = 0; it < rows; ++it) {
    Clock::duration longest{}, batch{}, longest_batch{};
    for (uint32_t r = 0; r < ranks; ++r) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      se::Report rep;
      rep.rank = r;
      rep.iteration = it;
      rep.compute_seconds =
          0.1 * (0.95 + 0.1 * static_cast<double>(s >> 11) / static_cast<double>(1ull << 53));
      const auto start = Clock::now();
      engine.Ingest(rep, se::Time(static_cast<int64_t>(it) * 1'000'000'000));
      const Clock::duration took = Clock::now() - start;
      longest = std::max(longest, took);
      batch += took;
      if ((r + 1) % kBatch == 0 || r + 1 == ranks) {
        longest_batch = std::max(longest_batch, batch);
        batch = {};
      }
    }
    engine.TakeEvents();
    std::printf("  row %llu: longest Ingest() %.1f ms, batch of %u %.1f ms",
                static_cast<unsigned long long>(it + 1),
                std::chrono::duration<double, std::milli>(longest).count(), kBatch,
                std::chrono::duration<double, std::milli>(longest_batch).count());
    if (it == 0 || it == 9 || it == 11 || it + 1 == rows) std::printf(", %.0f B/rank", per_rank());
    std::printf("\n");
  }
  return 0;
}
