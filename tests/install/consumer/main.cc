// report_consumer ENDPOINT JOB_ID: the one rank of a one-rank job reports a
// few steps to the daemon at ENDPOINT and waits until they are delivered
// (exit 0), or says why not (exit 1).
#include <chrono>
#include <cstdio>
#include <string>

#include <straggler/client.h>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: report_consumer ENDPOINT JOB_ID\n");
    return 2;
  }
  straggler::ClientOptions o;
  o.endpoint = argv[1];
  o.job_id = argv[2];
  o.ranks = {0};
  o.world_size = 1;
  std::string error;
  auto client = straggler::Client::Create(o, &error);
  if (!client) {
    std::fprintf(stderr, "report_consumer: creating the client failed: %s\n", error.c_str());
    return 1;
  }
  for (uint64_t i = 0; i < 20; ++i) client->Report(0, i, 0.01);
  if (!client->Flush(std::chrono::seconds(30))) {
    std::fprintf(stderr, "report_consumer: reports not delivered to %s within 30 s\n", argv[1]);
    return 1;
  }
  std::printf("report_consumer: delivered %llu reports of job %s\n",
              static_cast<unsigned long long>(client->Stats().enqueued), argv[2]);
  return 0;
}
