// The bare limit every ingest figure is compared with (issue 29): a gRPC
// server with stragglerd's IngestService.Stream and nothing behind it. Each
// ReportBatch is parsed by gRPC into a reused message, exactly as the daemon's
// read chain does, counted, and acknowledged by a Directive that carries only
// acked_sequence and accepted - no engine, no registry, no progress, no
// memberships - so straggler-loadgen drives it with the same window and
// measures the transport and parse alone. Callback API, as stragglerd.
//
//   bare_ingest --ready-file /tmp/bare.json &          # address and pid
//   straggler-loadgen --ready-file /tmp/bare.json --ranks 1000 --streams 4
//       --batch 1000 --rate 0 --duration 4     (one command line)
//
// bench/loadgen_goals.sh runs it in the same minute as the daemon and
// prints the daemon's share of it. Stops on SIGINT/SIGTERM.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>

#include <unistd.h>

#include "straggler/v1/straggler.grpc.pb.h"

namespace {

namespace v1 = straggler::v1;

std::atomic<uint64_t> g_reports{0};

class BareReactor final : public grpc::ServerBidiReactor<v1::ReportBatch, v1::Directive> {
 public:
  BareReactor() { StartRead(&batch_); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      std::lock_guard lock(mu_);
      finishing_ = true;
      if (!writing_) Finish(grpc::Status::OK);
      return;
    }
    const auto n = static_cast<uint32_t>(batch_.reports_size());
    g_reports.fetch_add(n, std::memory_order_relaxed);
    {
      std::lock_guard lock(mu_);
      // One write in flight; acks that pile up meanwhile merge into one, as
      // the daemon's write slot merges directives.
      pending_accepted_ += n;
      pending_sequence_ = batch_.sequence();
      have_pending_ = true;
      if (!writing_) WriteLocked();
    }
    StartRead(&batch_);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard lock(mu_);
    writing_ = false;
    if (ok && have_pending_ && !finishing_) {
      WriteLocked();
    } else if (finishing_ || !ok) {
      finishing_ = true;
      Finish(grpc::Status::OK);
    }
  }

  void OnDone() override { delete this; }

 private:
  void WriteLocked() {
    out_.Clear();
    out_.set_acked_sequence(pending_sequence_);
    out_.set_accepted(pending_accepted_);
    pending_accepted_ = 0;
    have_pending_ = false;
    writing_ = true;
    StartWrite(&out_);
  }

  v1::ReportBatch batch_;  // reused, as the daemon's reactor reuses its own
  std::mutex mu_;
  v1::Directive out_;
  uint32_t pending_accepted_ = 0;
  uint64_t pending_sequence_ = 0;
  bool have_pending_ = false;
  bool writing_ = false;
  bool finishing_ = false;
};

class BareService final : public v1::IngestService::CallbackService {
  grpc::ServerBidiReactor<v1::ReportBatch, v1::Directive>* Stream(
      grpc::CallbackServerContext*) override {
    return new BareReactor();
  }
};

std::atomic<bool> g_stop{false};

}  // namespace

int main(int argc, char** argv) {
  std::string address = "127.0.0.1:0", ready_file;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--address" && i + 1 < argc) {
      address = argv[++i];
    } else if (a == "--ready-file" && i + 1 < argc) {
      ready_file = argv[++i];
    } else {
      std::cerr << "usage: bare_ingest [--address HOST:PORT] [--ready-file FILE]\n"
                   "  the bare gRPC ingest limit for straggler-loadgen (see the header)\n";
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  BareService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    std::cerr << "bare_ingest: cannot listen on " << address << "\n";
    return 1;
  }
  const std::string bound = address.substr(0, address.rfind(':')) + ":" + std::to_string(port);
  if (!ready_file.empty()) {
    const std::string tmp = ready_file + ".tmp";
    std::ofstream(tmp) << "{\"grpc_address\": \"" << bound << "\", \"pid\": " << ::getpid()
                       << "}\n";
    std::rename(tmp.c_str(), ready_file.c_str());
  }
  std::signal(SIGINT, [](int) { g_stop = true; });
  std::signal(SIGTERM, [](int) { g_stop = true; });
  while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  std::cout << "bare_ingest: " << g_reports.load() << " reports parsed\n";
  return 0;
}
