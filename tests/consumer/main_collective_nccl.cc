// Links against the installed straggler::collective_nccl without any CUDA or
// NCCL header: the public header has none. Checks that invalid options are
// refused naming the value, and reports the visible GPUs (0 on CI).
#include <cstdio>
#include <string>

#include <straggler/collective_nccl.h>

int main() {
  straggler::NcclOptions o;
  o.job_id = "consumer";
  o.world_size = 2;
  o.rank = 5;
  const std::string why = o.Validate();
  std::string gpus_error;
  const int gpus = straggler::NcclVisibleDevices(&gpus_error);
  std::printf("consumer_collective_nccl ok: validate='%s' gpus=%d %s\n", why.c_str(), gpus,
              gpus_error.c_str());
  return why.find("rank=5") != std::string::npos ? 0 : 1;
}
