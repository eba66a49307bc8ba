// Sends --concurrent IngestService.Stream calls at once, each opening with a
// ReportBatch of about --bytes bytes (a hello whose `node` is that long), to a
// running stragglerd, each over its own connection, and samples the daemon's
// resident memory (/proc/PID/status VmRSS) every 20 ms: before, the peak while
// the calls run, and --after-seconds after the last call ended. Prints the
// calls' status codes and one line of figures in MB (10^6 bytes).
//
//   oversize_probe --target 127.0.0.1:50051 --pid $(pidof stragglerd)
//                  --bytes 100000000 --concurrent 8 [--after-seconds 5] [--rounds 1]
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "straggler/v1/straggler.grpc.pb.h"

namespace {

// VmRSS of `pid` in kB (0 when unreadable).
long RssKb(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return 0;
}

double Mb(long kb) { return static_cast<double>(kb) * 1024.0 / 1e6; }

}  // namespace

int main(int argc, char** argv) {
  std::string target = "127.0.0.1:50051";
  int pid = 0;
  long bytes = 100'000'000;
  int concurrent = 8;
  int after_seconds = 5;
  int rounds = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* v = argv[i + 1];
    if (flag == "--target") target = v;
    else if (flag == "--pid") pid = std::atoi(v);
    else if (flag == "--bytes") bytes = std::atol(v);
    else if (flag == "--concurrent") concurrent = std::atoi(v);
    else if (flag == "--after-seconds") after_seconds = std::atoi(v);
    else if (flag == "--rounds") rounds = std::atoi(v);
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (pid <= 0) {
    std::fprintf(stderr, "--pid of the daemon is required\n");
    return 2;
  }
  straggler::v1::ReportBatch big;
  big.mutable_hello()->set_job_id("oversize");
  big.mutable_hello()->set_world_size(1);
  big.mutable_hello()->add_ranks(0);
  big.mutable_hello()->set_node(std::string(static_cast<size_t>(bytes), 'n'));

  const long before = RssKb(pid);
  std::atomic<long> peak{before};
  std::atomic<bool> sampling{true};
  std::thread sampler([&] {
    while (sampling.load()) {
      long r = RssKb(pid);
      long p = peak.load();
      while (r > p && !peak.compare_exchange_weak(p, r)) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  std::map<std::string, int> codes;
  std::mutex codes_mu;
  const auto start = std::chrono::steady_clock::now();
  for (int round = 0; round < rounds; ++round) {
    std::vector<std::thread> callers;
    for (int c = 0; c < concurrent; ++c) {
      callers.emplace_back([&, c, round] {
        grpc::ChannelArguments args;
        args.SetInt("oversize_probe.connection", round * concurrent + c);  // one connection each
        args.SetMaxSendMessageSize(-1);
        auto channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
        auto stub = straggler::v1::IngestService::NewStub(channel);
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
        auto stream = stub->Stream(&ctx);
        stream->Write(big);
        stream->WritesDone();
        straggler::v1::Directive d;
        while (stream->Read(&d)) {
        }
        grpc::Status s = stream->Finish();
        std::lock_guard lock(codes_mu);
        ++codes[std::to_string(s.error_code()) + " " + s.error_message().substr(0, 60)];
      });
    }
    for (std::thread& t : callers) t.join();
  }
  const double call_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::this_thread::sleep_for(std::chrono::seconds(after_seconds));
  sampling = false;
  sampler.join();
  const long after = RssKb(pid);
  for (const auto& [code, n] : codes) std::printf("status %s: %d\n", code.c_str(), n);
  std::printf("bytes=%ld concurrent=%d rounds=%d calls_s=%.2f rss_before_mb=%.1f rss_peak_mb=%.1f "
              "rss_after_%ds_mb=%.1f peak_growth_mb=%.1f after_growth_mb=%.1f\n",
              bytes, concurrent, rounds, call_s, Mb(before), Mb(peak.load()), after_seconds,
              Mb(after), Mb(peak.load() - before), Mb(after - before));
  return 0;
}
