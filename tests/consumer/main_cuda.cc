// Links against the installed libstraggler_cuda (component `cuda`) with no
// CUDA toolkit on the include or link path: the public header has no CUDA
// type and the runtime is inside the library. Without a GPU, Create must
// fail cleanly; with one, an empty interval on the default stream is timed.
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include <straggler/client.h>
#include <straggler/cuda_timer.h>
#include <straggler/straggler_cuda_c.h>

#include "offline_client.h"

int main() {
  auto client = OfflineClient("consumer-cuda");
  if (!client) return 1;
  std::string error;
  auto timer = straggler::CudaComputeTimer::Create(*client, {}, &error);
  if (!timer) {
    std::printf("consumer_cuda ok: no usable GPU here (%s)\n", error.c_str());
    return error.empty() ? 1 : 0;
  }
  timer->Begin(nullptr, 0, 0);
  timer->End(nullptr);
  for (int i = 0; i < 10000 && timer->Stats().reported == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::printf("consumer_cuda ok: reported=%llu\n",
              static_cast<unsigned long long>(timer->Stats().reported));
  return timer->Stats().reported == 1 ? 0 : 1;
}
