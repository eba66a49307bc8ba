// Opens --streams IngestService.Stream calls at once to a running stragglerd,
// spread over --connections connections (stream i is rank i of one job of
// world_size --streams, as the ranks of a data-parallel job are), holds them
// --hold-seconds once every one has been answered or has ended, then closes
// them cleanly. Prints how many were acknowledged, how many were still open
// at the end of the hold, and each status the others ended with, e.g.
//
//   stream_probe --target 127.0.0.1:7070 --streams 2000 --connections 2000
//   opened=1024 open_after_hold=1024
//   status 8 1024 ingest streams are open (limits.max_streams=1024); r: 976
//
// One event-driven client (gRPC's callback API): thousands of streams need
// no thread each. Exit 0 when every stream was answered or ended within
// --wait-seconds, 1 otherwise.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "straggler/v1/straggler.grpc.pb.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Tally {
  std::mutex mu;
  std::condition_variable cv;
  int answered = 0;  // acknowledged (a first Directive) or ended
  int ended = 0;
  std::atomic<int> opened{0};
  std::map<std::string, int> statuses;  // guarded by mu
};

class Call final : public grpc::ClientBidiReactor<straggler::v1::ReportBatch,
                                                  straggler::v1::Directive> {
 public:
  Call(straggler::v1::IngestService::Stub& stub, Tally& tally, const std::string& job,
       uint32_t rank, uint32_t world_size)
      : tally_(tally) {
    straggler::v1::StreamHello* hello = hello_.mutable_hello();
    hello->set_job_id(job);
    hello->set_world_size(world_size);
    hello->add_ranks(rank);
    hello->set_node("stream-probe");
    stub.async()->Stream(&ctx_, this);
    StartWrite(&hello_);
    StartRead(&directive_);
    StartCall();
  }

  void OnWriteDone(bool /*ok*/) override {
    std::lock_guard lock(mu_);
    hello_written_ = true;
    if (close_requested_ && !done_) StartWritesDone();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    if (!acknowledged_) {
      acknowledged_ = true;
      tally_.opened.fetch_add(1);
      Answered();
    }
    StartRead(&directive_);
  }

  void OnDone(const grpc::Status& status) override {
    {
      std::lock_guard lock(mu_);
      done_ = true;  // no operation may start on a finished call
    }
    std::lock_guard lock(tally_.mu);
    if (!acknowledged_) ++tally_.answered;
    ++tally_.ended;
    if (!status.ok()) {
      ++tally_.statuses[std::to_string(status.error_code()) + " " +
                        status.error_message().substr(0, 60)];
    }
    tally_.cv.notify_all();
  }

  // A clean close (WritesDone), once the hello has gone out.
  void Close() {
    std::lock_guard lock(mu_);
    close_requested_ = true;
    if (hello_written_ && !done_) StartWritesDone();
  }

 private:
  void Answered() {
    std::lock_guard lock(tally_.mu);
    ++tally_.answered;
    tally_.cv.notify_all();
  }

  Tally& tally_;
  grpc::ClientContext ctx_;
  straggler::v1::ReportBatch hello_;
  straggler::v1::Directive directive_;
  bool acknowledged_ = false;  // the read chain's only
  std::mutex mu_;
  bool hello_written_ = false;   // guarded by mu_
  bool close_requested_ = false;  // guarded by mu_
  bool done_ = false;             // guarded by mu_: OnDone ran
};

}  // namespace

int main(int argc, char** argv) {
  std::string target = "127.0.0.1:7070";
  std::string job = "stream-probe";
  int streams = 1000;
  int connections = 0;  // 0: one per stream
  int hold_seconds = 3;
  int wait_seconds = 30;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* v = argv[i + 1];
    if (flag == "--target") target = v;
    else if (flag == "--job") job = v;
    else if (flag == "--streams") streams = std::atoi(v);
    else if (flag == "--connections") connections = std::atoi(v);
    else if (flag == "--hold-seconds") hold_seconds = std::atoi(v);
    else if (flag == "--wait-seconds") wait_seconds = std::atoi(v);
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (streams <= 0) {
    std::fprintf(stderr, "--streams must be > 0\n");
    return 2;
  }
  if (connections <= 0 || connections > streams) connections = streams;

  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<straggler::v1::IngestService::Stub>> stubs;
  for (int c = 0; c < connections; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("stream_probe.connection", c);  // a distinct argument: a connection each
    channels.push_back(
        grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
    stubs.push_back(straggler::v1::IngestService::NewStub(channels.back()));
  }
  Tally tally;
  std::vector<std::unique_ptr<Call>> calls;
  const auto start = Clock::now();
  for (int i = 0; i < streams; ++i) {
    calls.push_back(std::make_unique<Call>(*stubs[i % connections], tally, job,
                                           static_cast<uint32_t>(i),
                                           static_cast<uint32_t>(streams)));
  }
  bool all_answered = false;
  {
    std::unique_lock lock(tally.mu);
    all_answered = tally.cv.wait_for(lock, std::chrono::seconds(wait_seconds),
                                     [&] { return tally.answered == streams; });
  }
  const double answer_s = std::chrono::duration<double>(Clock::now() - start).count();
  std::this_thread::sleep_for(std::chrono::seconds(hold_seconds));
  int open_after_hold = 0;
  {
    std::lock_guard lock(tally.mu);
    open_after_hold = streams - tally.ended;
  }
  for (auto& call : calls) call->Close();
  bool all_ended = false;
  {
    std::unique_lock lock(tally.mu);
    all_ended = tally.cv.wait_for(lock, std::chrono::seconds(wait_seconds),
                                  [&] { return tally.ended == streams; });
  }
  std::printf("streams=%d connections=%d answered_s=%.2f opened=%d open_after_hold=%d\n", streams,
              connections, answer_s, tally.opened.load(), open_after_hold);
  {
    std::lock_guard lock(tally.mu);
    for (const auto& [status, n] : tally.statuses) {
      std::printf("status %s: %d\n", status.c_str(), n);
    }
  }
  std::fflush(stdout);
  if (!all_ended) {
    // Reactors still running cannot be destroyed: leave without it.
    std::fprintf(stderr, "not every stream ended within %d s\n", wait_seconds);
    std::_Exit(1);
  }
  return all_answered ? 0 : 1;
}
