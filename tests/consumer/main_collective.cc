// Links against the installed straggler::collective and runs a one-rank
// PartialAllReduce: a set of one needs no rendezvous, so no daemon is needed,
// and the average of one rank must be its own buffer, divided by 1.
#include <cstdio>
#include <string>
#include <vector>

#include <straggler/client.h>
#include <straggler/collective.h>
#include <straggler/collective_gloo.h>

#include "offline_client.h"

int main() {
  auto client = OfflineClient("consumer");
  if (!client) return 1;
  std::string error;
  straggler::GlooOptions g;
  g.rendezvous_endpoint = "127.0.0.1:1";
  g.job_id = "consumer";
  g.world_size = 1;
  g.membership_timeout = std::chrono::milliseconds(50);
  auto reducer = straggler::CreateGlooPartialAllReduce(*client, g, &error);
  if (!reducer) {
    std::fprintf(stderr, "gloo: %s\n", error.c_str());
    return 1;
  }
  const straggler::StepPlan plan = reducer->BeginIteration(0);
  std::vector<float> grad{3.0f, 6.0f};
  const auto r = reducer->AllReduceAverage(std::span<float>(grad));
  std::printf("consumer_collective ok: participated=%d active=%u sync=%d avg=%g,%g\n",
              r.participated, r.active_ranks, plan.sync_parameters, grad[0], grad[1]);
  return r.participated && r.active_ranks == 1 && grad[0] == 3.0f && grad[1] == 6.0f ? 0 : 1;
}
