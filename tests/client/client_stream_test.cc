// straggler::Client against an in-process fake IngestService on loopback:
// the hello, batching, acknowledgements, Flush, membership delivery and
// MembershipFor's certainty rule, and resending after a dropped stream.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <chrono>
#include <cmath>
#include <cstring>
#include <condition_variable>
#include <cstddef>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <grpcpp/grpcpp.h>

#include "straggler/client.h"
#include "straggler/straggler_c.h"
#include "straggler/v1/straggler.grpc.pb.h"

namespace pb = straggler::v1;
using namespace std::chrono_literals;

namespace {

// Acknowledges every batch with per-rank progress and the configured
// memberships; records what it saw. Can be told to drop the next stream
// after N batches without acknowledging them (to exercise resending).
class FakeIngest final : public pb::IngestService::Service {
 public:
  // Like stragglerd, every stream's directives carry version 0 with the
  // daemon's lead (until then a client assumes the smallest lead, 1).
  FakeIngest() { AddMembership(0, 0, {}); }

  grpc::Status Stream(grpc::ServerContext*,
                      grpc::ServerReaderWriter<pb::Directive, pb::ReportBatch>* stream) override {
    pb::ReportBatch batch;
    bool first = true;
    int batches_this_stream = 0;
    while (stream->Read(&batch)) {
      std::unique_lock<std::mutex> lock(mu_);
      if (first) {
        first = false;
        if (!batch.has_hello()) return {grpc::StatusCode::INVALID_ARGUMENT, "no hello"};
        hellos_.push_back(batch.hello());
        if (batch.hello().job_id() == "bad-job")
          return {grpc::StatusCode::INVALID_ARGUMENT, "job_id 'bad-job' is not allowed"};
      }
      if (drop_after_ >= 0 && batches_this_stream == drop_after_) {
        drop_after_ = -1;
        return {grpc::StatusCode::UNAVAILABLE, "simulated failure"};
      }
      ++batches_this_stream;
      pb::Directive d;
      uint32_t accepted = 0;
      for (const pb::IterationReport& r : batch.reports()) {
        auto [_, fresh] = seen_.insert({r.rank(), r.iteration()});
        if (fresh) ++accepted;  // duplicates are idempotent
        if (fresh) reports_[{r.rank(), r.iteration()}] = r;
        ++reports_received_;
        uint64_t& p = progress_[r.rank()];
        p = std::max(p, r.iteration());
      }
      d.set_acked_sequence(batch.sequence());
      d.set_accepted(accepted);
      for (const auto& [rank, it] : progress_) {
        pb::RankProgress* rp = d.add_progress();
        rp->set_rank(rank);
        rp->set_iteration(it);
      }
      for (const pb::Membership& m : memberships_) *d.add_memberships() = m;
      lock.unlock();
      cv_.notify_all();
      if (!stream->Write(d)) break;
    }
    return grpc::Status::OK;
  }

  void AddMembership(uint64_t version, uint64_t effective, std::vector<uint32_t> excluded) {
    std::lock_guard<std::mutex> lock(mu_);
    pb::Membership m;
    m.set_job_id("job");
    m.set_version(version);
    m.set_effective_iteration(effective);
    m.set_world_size(4);
    m.set_lead_iterations(2);
    for (uint32_t r : excluded) {
      pb::ExcludedRank* e = m.add_excluded();
      e->set_rank(r);
      e->set_reason(pb::EXCLUSION_REASON_STRAGGLER);
    }
    memberships_.push_back(m);
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<pb::StreamHello> hellos_;
  std::set<std::pair<uint32_t, uint64_t>> seen_;
  std::map<std::pair<uint32_t, uint64_t>, pb::IterationReport> reports_;  // as first received
  std::map<uint32_t, uint64_t> progress_;
  std::vector<pb::Membership> memberships_;
  uint64_t reports_received_ = 0;
  int drop_after_ = -1;
};

struct Server {
  FakeIngest service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  explicit Server(const std::string& address = "127.0.0.1:0") {
    grpc::ServerBuilder b;
    b.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
    b.RegisterService(&service);
    server = b.BuildAndStart();
  }
  ~Server() { server->Shutdown(std::chrono::system_clock::now() + 1s); }
  std::string Endpoint() const { return "127.0.0.1:" + std::to_string(port); }
};

straggler::ClientOptions Options(const std::string& endpoint) {
  straggler::ClientOptions o;
  o.endpoint = endpoint;
  o.job_id = "job";
  o.ranks = {1};
  o.world_size = 4;
  o.node = "test-node";
  o.iterations_per_epoch = 100;
  o.max_batch = 8;
  o.backoff_initial = 10ms;
  o.backoff_max = 50ms;
  return o;
}

}  // namespace

TEST_CASE("reports reach the daemon after a hello and Flush sees them acknowledged",
          "[stream]") {
  Server s;
  REQUIRE(s.port != 0);
  straggler::ClientOptions options = Options(s.Endpoint());
  options.local_rank = 1;
  options.cuda_visible_devices = "0,1";
  options.gpu_uuid = "GPU-1111";
  auto client = straggler::Client::Create(options);
  REQUIRE(client);
  for (uint64_t it = 0; it < 50; ++it) REQUIRE(client->Report(0, it, 0.1));
  REQUIRE(client->Flush(10s));
  const straggler::ClientStats st = client->Stats();
  CHECK(st.enqueued == 50);
  CHECK(st.dropped == 0);
  CHECK(st.sent == 50);
  CHECK(st.acked == 50);
  CHECK(st.connected);
  std::lock_guard<std::mutex> lock(s.service.mu_);
  REQUIRE(s.service.hellos_.size() == 1);
  const pb::StreamHello& h = s.service.hellos_[0];
  CHECK(h.job_id() == "job");
  CHECK(h.node() == "test-node");
  CHECK(h.ranks_size() == 1);
  CHECK(h.ranks(0) == 1);
  CHECK(h.world_size() == 4);
  CHECK(h.iterations_per_epoch() == 100);
  CHECK(h.client_version() == "0.1.0");
  CHECK(h.known_membership_version() == 0);  // held nothing from a daemon yet
  // The rank's device identity, for the agent's GPU telemetry.
  REQUIRE(h.devices_size() == 1);
  CHECK(h.devices(0).rank() == 1);
  CHECK(h.devices(0).local_rank() == 1);
  CHECK(h.devices(0).cuda_visible_devices() == "0,1");
  CHECK(h.devices(0).gpu_uuid() == "GPU-1111");
  // No topology declared: the default group, a replica of its own.
  CHECK(h.devices(0).peer_group().empty());
  CHECK_FALSE(h.devices(0).has_replica());
  CHECK(s.service.seen_.size() == 50);
}

TEST_CASE("topology: the hello carries the rank's peer group and replica", "[stream][topology]") {
  Server s;
  REQUIRE(s.port != 0);
  straggler::ClientOptions options = Options(s.Endpoint());
  options.peer_group = "stage1";
  options.replica = 0;  // a declared 0 is not "unset"
  options.gpu_model = "NVIDIA A100-SXM4-40GB";
  auto client = straggler::Client::Create(options);
  REQUIRE(client);
  REQUIRE(client->Report(0, 0, 0.1));
  REQUIRE(client->Flush(10s));
  std::lock_guard<std::mutex> lock(s.service.mu_);
  REQUIRE(!s.service.hellos_.empty());
  const pb::StreamHello& h = s.service.hellos_[0];
  REQUIRE(h.devices_size() == 1);
  CHECK(h.devices(0).peer_group() == "stage1");
  REQUIRE(h.devices(0).has_replica());
  CHECK(h.devices(0).replica() == 0);
  CHECK(h.devices(0).gpu_model() == "NVIDIA A100-SXM4-40GB");
}

// Report() never wakes the sender; a trainer that only reports (no
// MembershipFor, no Flush) relies on the sender's poll timer.
TEST_CASE("without Flush or MembershipFor, reports still reach the daemon", "[stream]") {
  Server s;
  straggler::ClientOptions o = Options(s.Endpoint());
  o.max_send_delay = 5ms;
  auto client = straggler::Client::Create(o);
  REQUIRE(client);
  // Let the sender go idle after its opening hello.
  {
    std::unique_lock<std::mutex> lock(s.service.mu_);
    REQUIRE(s.service.cv_.wait_for(lock, 10s, [&] { return !s.service.hellos_.empty(); }));
  }
  std::this_thread::sleep_for(50ms);
  for (uint64_t it = 0; it < 3; ++it) REQUIRE(client->Report(0, it, 0.1));
  CHECK(client->Stats().report_wakes == 0);  // no system call on the training thread
  std::unique_lock<std::mutex> lock(s.service.mu_);
  CHECK(s.service.cv_.wait_for(lock, 10s, [&] { return s.service.seen_.size() == 3; }));
}

// Issue 31: a step's work and phases reach the wire from Report(StepDetails),
// from ComputeTimer's marks and from the C ABI's straggler_report_step; the
// short forms send none of them (a daemon of the previous release ignores
// them either way: docs/api.md, "Wire compatibility").
TEST_CASE("work and phases: Report(StepDetails), ComputeTimer marks and the C ABI send them",
          "[stream][c_api]") {
  Server s;
  REQUIRE(s.port != 0);
  auto client = straggler::Client::Create(Options(s.Endpoint()));
  REQUIRE(client);
  REQUIRE(client->Report(1, 0, 1, 0.25,
                         straggler::StepDetails{.step_seconds = 0.5,
                                                .collective_wait_seconds = 0.05,
                                                .input_wait_seconds = 0.1,
                                                .optimizer_seconds = 0.03,
                                                .work = 2048}));
  REQUIRE(client->Report(1, 0, 2, 0.25, straggler::StepDetails{.work = 3}));
  REQUIRE(client->Report(0, 3, 0.25));  // the short form: none
  CHECK_FALSE(client->Report(2, 0, 4, 0.25, straggler::StepDetails{.work = 3}));  // not served
  {
    straggler::ComputeTimer t(*client, 0, 5);
    std::this_thread::sleep_for(200ms);  // "waiting for the data loader"
    t.InputReady();
    t.OptimizerStart();                  // no compute in between
    std::this_thread::sleep_for(30ms);   // "the optimizer"
    t.SetWork(7);
  }
  { straggler::ComputeTimer t(*client, 0, 6); }  // no marks: as before
  {
    straggler::ComputeTimer t(*client, 0, 7);
    t.SetWork(11);  // work alone: compute is the whole scope
  }
  REQUIRE(client->Flush(10s));

  // The C ABI: init sets every field absent; the sized call reads the fields.
  const std::string endpoint = s.Endpoint();
  const uint32_t ranks[] = {2};
  straggler_options_t o;
  straggler_options_init(&o);
  o.endpoint = endpoint.c_str();
  o.job_id = "job";
  o.ranks = ranks;
  o.num_ranks = 1;
  o.world_size = 4;
  char err[256] = {};
  straggler_client_t* c = straggler_client_create(&o, err, sizeof err);
  REQUIRE(c != nullptr);
  straggler_step_t step;
  std::memset(&step, 0, sizeof step);
  REQUIRE(straggler_step_init(&step) == STRAGGLER_OK);
  for (double v : {step.step_seconds, step.collective_wait_seconds, step.input_wait_seconds,
                   step.optimizer_seconds, step.work})
    CHECK(std::isnan(v));
  step.work = 5;
  step.input_wait_seconds = 0.125;
  CHECK(straggler_report_step(c, 2, 0, 10, 0.1, &step) == STRAGGLER_OK);
  CHECK(straggler_report_step(c, 2, 0, 11, 0.1, nullptr) == STRAGGLER_OK);  // no details
  CHECK(straggler_report_step(nullptr, 2, 0, 12, 0.1, &step) == STRAGGLER_EINVAL);
  CHECK(straggler_report_step(c, 3, 0, 12, 0.1, &step) == STRAGGLER_INCOMPLETE);  // not served
  // Below the first layout: refused, nothing queued or written.
  CHECK(straggler_report_step_sized(c, 2, 0, 13, 0.1, &step, sizeof(double) * 4) ==
        STRAGGLER_EINVAL);
  CHECK(straggler_step_init_sized(&step, sizeof(double) * 4) == STRAGGLER_EINVAL);
  CHECK(step.work == 5);
  CHECK(straggler_step_init_sized(nullptr, sizeof step) == STRAGGLER_EINVAL);
  // A program built against a newer, longer straggler_step_t: the fields
  // this library knows are read, the rest ignored.
  double newer[7];
  std::memcpy(newer, &step, sizeof step);
  newer[5] = newer[6] = 99;
  CHECK(straggler_report_step_sized(c, 2, 0, 14, 0.1,
                                    reinterpret_cast<const straggler_step_t*>(newer),
                                    sizeof newer) == STRAGGLER_OK);
  CHECK(straggler_flush(c, 10000) == STRAGGLER_OK);
  straggler_client_destroy(c);

  std::lock_guard<std::mutex> lock(s.service.mu_);
  auto at = [&](uint32_t rank, uint64_t it) -> const pb::IterationReport& {
    auto found = s.service.reports_.find({rank, it});
    REQUIRE(found != s.service.reports_.end());
    return found->second;
  };
  const pb::IterationReport& full = at(1, 1);
  CHECK(full.compute_seconds() == 0.25);
  CHECK(full.step_seconds() == 0.5);
  CHECK(full.collective_wait_seconds() == 0.05);
  CHECK(full.input_wait_seconds() == 0.1);
  CHECK(full.optimizer_seconds() == 0.03);
  CHECK(full.work() == 2048);
  const pb::IterationReport& work_only = at(1, 2);
  CHECK(work_only.work() == 3);
  CHECK_FALSE(work_only.has_step_seconds());
  CHECK_FALSE(work_only.has_input_wait_seconds());
  CHECK_FALSE(work_only.has_optimizer_seconds());
  for (const pb::IterationReport* r : {&at(1, 3), &at(1, 6)}) {
    CHECK_FALSE(r->has_work());
    CHECK_FALSE(r->has_input_wait_seconds());
    CHECK_FALSE(r->has_optimizer_seconds());
  }
  // The timer's phases are apart from compute: 200 ms before InputReady is
  // input wait, 30 ms after OptimizerStart the optimizer, and compute holds
  // neither (nothing ran between the marks).
  const pb::IterationReport& timed = at(1, 5);
  CHECK(timed.input_wait_seconds() >= 0.2);
  CHECK(timed.optimizer_seconds() >= 0.03);
  CHECK(timed.compute_seconds() < 0.2);
  CHECK(timed.work() == 7);
  const pb::IterationReport& work_timed = at(1, 7);
  CHECK(work_timed.work() == 11);
  CHECK_FALSE(work_timed.has_input_wait_seconds());
  CHECK_FALSE(work_timed.has_optimizer_seconds());
  const pb::IterationReport& from_c = at(2, 10);
  CHECK(from_c.work() == 5);
  CHECK(from_c.input_wait_seconds() == 0.125);
  CHECK_FALSE(from_c.has_optimizer_seconds());
  CHECK_FALSE(from_c.has_step_seconds());
  CHECK_FALSE(at(2, 11).has_work());
  CHECK(s.service.reports_.count({2, 13}) == 0);
  CHECK(at(2, 14).work() == 5);
}

// Once the trainer asks MembershipFor, its next MembershipFor waits for the
// acknowledgement of the report it just made: Report() wakes the sleeping
// sender so the round trip starts at once, and counts the wake.
TEST_CASE("after MembershipFor, Report() wakes the sleeping sender and counts it", "[stream]") {
  Server s;
  auto client = straggler::Client::Create(Options(s.Endpoint()));
  REQUIRE(client);
  while (!client->Stats().connected) std::this_thread::sleep_for(5ms);
  client->MembershipFor(0, 0ms);  // iteration 0 is certain: no wait
  // A report made while the sender sleeps on its timer wakes it. (The timer
  // may fire just as a report is made; a few tries make that race moot.)
  uint64_t it = 0;
  while (it < 5 && client->Stats().report_wakes == 0) {
    std::this_thread::sleep_for(50ms);
    REQUIRE(client->Report(0, it++, 0.1));
  }
  CHECK(client->Stats().report_wakes >= 1);
  CHECK(client->Stats().report_wakes <= it);
  REQUIRE(client->Flush(10s));
  CHECK(client->Stats().acked == it);
}

TEST_CASE("memberships arrive in order, callbacks fire, MembershipFor waits for progress",
          "[stream]") {
  Server s;
  s.service.AddMembership(1, 6, {2});
  // Declared before the client: its callback may run until the client is gone.
  std::mutex mu;
  std::condition_variable cv;
  std::vector<uint64_t> versions;
  auto client = straggler::Client::Create(Options(s.Endpoint()));
  REQUIRE(client);
  client->OnMembershipChange([&](const straggler::MembershipView& v) {
    std::lock_guard<std::mutex> lock(mu);
    versions.push_back(v.version);
    cv.notify_all();
  });

  // Connected first: a wait that times out before the stream is up would
  // make the later calls answer at once (the once-per-outage rule), and on a
  // loaded machine the first connection can take longer than 50 ms.
  while (!client->Stats().connected) std::this_thread::sleep_for(5ms);
  // Iteration 6 is certain once our report of 5 (= 6 + 1 - lead) is processed.
  auto early = client->MembershipFor(6, 50ms);
  CHECK_FALSE(early.ok);
  for (uint64_t it = 0; it <= 5; ++it) REQUIRE(client->Report(0, it, 0.1));
  auto m6 = client->MembershipFor(6, 10s);
  CHECK(m6.ok);
  CHECK(m6.version == 1);
  CHECK(m6.IsExcluded(2));
  CHECK(m6.ActiveRanks() == std::vector<uint32_t>{0, 1, 3});
  auto m5 = client->MembershipFor(5, 10s);
  CHECK(m5.ok);
  CHECK(m5.version == 0);
  CHECK(client->CurrentMembership().version == 1);

  s.service.AddMembership(2, 9, {});
  auto m9_early = client->MembershipFor(9, 50ms);  // needs our report of 8
  CHECK_FALSE(m9_early.ok);
  for (uint64_t it = 6; it <= 8; ++it) REQUIRE(client->Report(0, it, 0.1));
  auto m9 = client->MembershipFor(9, 10s);
  CHECK(m9.ok);
  CHECK(m9.version == 2);
  CHECK(client->MembershipFor(8, 1s).version == 1);
  // Callbacks run on the reader thread, possibly after MembershipFor already
  // returned the version: wait for them rather than race them.
  std::unique_lock<std::mutex> lock(mu);
  cv.wait_for(lock, 10s, [&] { return versions.size() >= 2; });
  CHECK(versions == std::vector<uint64_t>{1, 2});
}

TEST_CASE("after a failed stream the client reconnects, says hello again and resends",
          "[stream]") {
  Server s;
  s.service.AddMembership(3, 7, {2});
  s.service.drop_after_ = 1;  // ack one batch, then fail on the next one unacknowledged
  auto o = Options(s.Endpoint());
  o.max_batch = 4;
  auto client = straggler::Client::Create(o);
  REQUIRE(client);
  for (uint64_t it = 0; it < 40; ++it) {
    REQUIRE(client->Report(0, it, 0.1));
    std::this_thread::sleep_for(1ms);
  }
  REQUIRE(client->Flush(10s));
  const straggler::ClientStats st = client->Stats();
  CHECK(st.reconnects >= 1);
  CHECK(st.acked == 40);
  std::lock_guard<std::mutex> lock(s.service.mu_);
  CHECK(s.service.hellos_.size() >= 2);
  CHECK(s.service.seen_.size() == 40);  // nothing lost
  // The first hello held nothing; a reconnect names the newest version held,
  // which a restarted daemon must publish a version above.
  CHECK(s.service.hellos_.front().known_membership_version() == 0);
  CHECK(s.service.hellos_.back().known_membership_version() == 3);
  CHECK(s.service.hellos_.back().known_effective_iteration() == 7);
  // With that version's excluded ranks, so that a daemon restarted without
  // its state keeps them out, and how far the ranks are.
  const pb::StreamHello& last = s.service.hellos_.back();
  REQUIRE(last.known_excluded_size() == 1);
  CHECK(last.known_excluded(0).rank() == 2);
  CHECK(last.known_excluded(0).reason() == pb::EXCLUSION_REASON_STRAGGLER);
  // The stream failed on a batch of reports, so the reconnect has some to name.
  REQUIRE(last.has_reported_iteration());
  CHECK(last.reported_iteration() <= 39);
}

TEST_CASE("a refused hello is retried slowly and the client still shuts down", "[stream]") {
  Server s;
  auto o = Options(s.Endpoint());
  o.job_id = "bad-job";
  o.backoff_initial = 10ms;
  o.backoff_max = 300ms;
  auto client = straggler::Client::Create(o);
  REQUIRE(client);
  REQUIRE(client->Report(0, 0, 0.1));
  std::this_thread::sleep_for(500ms);
  {
    // Max backoff after INVALID_ARGUMENT: a handful of tries, not a spin.
    std::lock_guard<std::mutex> lock(s.service.mu_);
    CHECK(s.service.hellos_.size() >= 1);
    CHECK(s.service.hellos_.size() <= 4);
  }
  CHECK_FALSE(client->Flush(10ms));
  client.reset();  // must return
}

TEST_CASE("the C ABI passes the GPU identity and topology into the hello", "[stream][c_api]") {
  Server s;
  REQUIRE(s.port != 0);
  const std::string endpoint = s.Endpoint();
  const uint32_t ranks[] = {2};
  straggler_options_t o;
  straggler_options_init(&o);
  CHECK(o.cuda_visible_devices == nullptr);  // init leaves them unknown
  CHECK(o.gpu_uuid == nullptr);
  o.endpoint = endpoint.c_str();
  o.job_id = "job";
  o.ranks = ranks;
  o.num_ranks = 1;
  o.world_size = 4;
  o.local_rank = 3;
  o.cuda_visible_devices = "GPU-abcd";
  o.gpu_uuid = "GPU-abcd-full";
  CHECK(o.peer_group == nullptr);
  CHECK(o.has_replica == 0);
  o.peer_group = "stage0";
  o.has_replica = 1;
  o.replica = 3;
  CHECK(o.gpu_model == nullptr);
  o.gpu_model = "NVIDIA H100 80GB HBM3";
  char err[256] = {};
  straggler_client_t* c = straggler_client_create(&o, err, sizeof err);
  REQUIRE(c != nullptr);
  REQUIRE(straggler_report(c, 2, 0, 0, 0.1) == STRAGGLER_OK);
  CHECK(straggler_flush(c, 10000) == STRAGGLER_OK);
  straggler_client_destroy(c);
  std::lock_guard<std::mutex> lock(s.service.mu_);
  REQUIRE(!s.service.hellos_.empty());
  const pb::StreamHello& h = s.service.hellos_[0];
  REQUIRE(h.devices_size() == 1);
  CHECK(h.devices(0).rank() == 2);
  CHECK(h.devices(0).local_rank() == 3);
  CHECK(h.devices(0).cuda_visible_devices() == "GPU-abcd");
  CHECK(h.devices(0).gpu_uuid() == "GPU-abcd-full");
  CHECK(h.devices(0).peer_group() == "stage0");
  CHECK(h.devices(0).replica() == 3);
  CHECK(h.devices(0).gpu_model() == "NVIDIA H100 80GB HBM3");
}

extern "C" int straggler_c_first_layout(const char* endpoint, const char* job, int sized);
extern "C" int straggler_c_third_layout(const char* endpoint, const char* job);
extern "C" int straggler_c_full_layout(const char* endpoint, const char* job,
                                       const char* gpu_model);
extern "C" int straggler_c_refuses_size(size_t size, char* err, size_t errlen);

namespace {

// The variables a field beyond an older struct falls back to, set for one
// test so that "the default" is visible in the hello (CUDA_VISIBLE_DEVICES
// restored after: the test process may run with one).
struct EnvDefaultsSet {
  EnvDefaultsSet() {
    if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v != nullptr) saved_cuda = v;
    setenv("STRAGGLER_PEER_GROUP", "envgroup", 1);
    setenv("STRAGGLER_GPU_MODEL", "Env GPU", 1);
    setenv("CUDA_VISIBLE_DEVICES", "2,3", 1);
    setenv("STRAGGLER_GPU_UUID", "GPU-env-uuid", 1);
    unsetenv("STRAGGLER_REPLICA");
  }
  ~EnvDefaultsSet() {
    unsetenv("STRAGGLER_PEER_GROUP");
    unsetenv("STRAGGLER_GPU_MODEL");
    unsetenv("STRAGGLER_GPU_UUID");
    if (saved_cuda) {
      setenv("CUDA_VISIBLE_DEVICES", saved_cuda->c_str(), 1);
    } else {
      unsetenv("CUDA_VISIBLE_DEVICES");
    }
  }
  std::optional<std::string> saved_cuda;
};

// The first hello the fake daemon received for `job`.
pb::StreamHello HelloOf(FakeIngest& service, const std::string& job) {
  std::lock_guard<std::mutex> lock(service.mu_);
  for (const pb::StreamHello& h : service.hellos_)
    if (h.job_id() == job) return h;
  FAIL("no hello for job " << job);
  return {};
}

}  // namespace

TEST_CASE("C ABI: a program built against the first options struct, old and sized calls",
          "[stream][c_api]") {
  Server s;
  REQUIRE(s.port != 0);
  EnvDefaultsSet env;
  for (int sized : {0, 1}) {
    INFO("sized " << sized);
    const std::string job = "first-layout-" + std::to_string(sized);
    // Neither call touches the canary after the struct; the client works.
    REQUIRE(straggler_c_first_layout(s.Endpoint().c_str(), job.c_str(), sized) == 0);
    const pb::StreamHello h = HelloOf(s.service, job);
    REQUIRE(h.devices_size() == 1);
    CHECK(h.devices(0).rank() == 1);
    CHECK(h.devices(0).local_rank() == 2);
    // Fields appended later: the environment's, as ClientOptions::FromEnv
    // reads it (the old symbol's callers cannot pass them any other way).
    CHECK(h.devices(0).cuda_visible_devices() == "2,3");
    CHECK(h.devices(0).gpu_uuid() == "GPU-env-uuid");
    CHECK(h.devices(0).peer_group() == "envgroup");
    CHECK_FALSE(h.devices(0).has_replica());
    CHECK(h.devices(0).gpu_model() == "Env GPU");
  }
}

TEST_CASE("C ABI: the third options layout sends its topology, gpu_model is the default",
          "[stream][c_api]") {
  Server s;
  REQUIRE(s.port != 0);
  EnvDefaultsSet env;
  REQUIRE(straggler_c_third_layout(s.Endpoint().c_str(), "third-layout") == 0);
  const pb::StreamHello h = HelloOf(s.service, "third-layout");
  REQUIRE(h.devices_size() == 1);
  CHECK(h.devices(0).peer_group() == "stage1");
  CHECK(h.devices(0).replica() == 3);
  CHECK(h.devices(0).gpu_model() == "Env GPU");
  // Its struct holds the GPU fields and leaves them NULL: unknown, not the
  // environment's.
  CHECK(h.devices(0).cuda_visible_devices().empty());
  CHECK(h.devices(0).gpu_uuid().empty());
  // monitor_only lies beyond its struct: it acts on membership.
  CHECK(h.monitor_only_ranks_size() == 0);
}

TEST_CASE("C ABI: the full options struct through the macros sends gpu_model and monitor_only",
          "[stream][c_api]") {
  Server s;
  REQUIRE(s.port != 0);
  EnvDefaultsSet env;  // the struct's gpu_model wins over the environment's
  REQUIRE(straggler_c_full_layout(s.Endpoint().c_str(), "full-layout", "NVIDIA H200") == 0);
  const pb::StreamHello h = HelloOf(s.service, "full-layout");
  REQUIRE(h.devices_size() == 1);
  CHECK(h.devices(0).rank() == 3);
  CHECK(h.devices(0).gpu_model() == "NVIDIA H200");
  CHECK(h.devices(0).peer_group() == "envgroup");
  CHECK(std::vector<uint32_t>(h.monitor_only_ranks().begin(), h.monitor_only_ranks().end()) ==
        std::vector<uint32_t>{3});
}

TEST_CASE("C ABI: an options size that is no known layout is refused, naming it",
          "[c_api]") {
  for (size_t size : {size_t{0}, size_t{8}, sizeof(straggler_options_t) - 1,
                      sizeof(straggler_options_t) - sizeof(void*) / 2,
                      sizeof(straggler_options_t) + 8}) {
    INFO("size " << size);
    char err[512] = {};
    REQUIRE(straggler_c_refuses_size(size, err, sizeof err) == 0);
    CHECK_THAT(std::string(err),
               Catch::StartsWith("straggler_client_create: options size " +
                                 std::to_string(size) +
                                 " is not a size of straggler_options_t this library knows (" +
                                 std::to_string(offsetof(straggler_options_t,
                                                         cuda_visible_devices)) +
                                 ", ") &&
                   Catch::Contains(std::to_string(sizeof(straggler_options_t)) +
                                   "); pass sizeof(straggler_options_t)"));
    if (size > sizeof(straggler_options_t))
      CHECK_THAT(std::string(err), Catch::EndsWith("newer straggler_c.h than this library?)"));
  }
}

TEST_CASE("MembershipFor waits its timeout once per outage, then answers at once until reconnected",
          "[stream]") {
  // A unix socket path: nothing listens on it until the server starts there,
  // without the race of re-binding a freed TCP port.
  const std::string path = "/tmp/straggler-client-test-" + std::to_string(::getpid()) + ".sock";
  std::remove(path.c_str());
  const std::string endpoint = "unix://" + path;
  auto client = straggler::Client::Create(Options(endpoint));
  REQUIRE(client);
  // The first wait while the daemon is unreachable runs out its timeout.
  straggler::MembershipView first = client->MembershipFor(10, 50ms);
  CHECK_FALSE(first.ok);
  // Now the client knows: a wait of an hour must return at once (else this
  // test hangs until ctest's timeout fails it), still uncertain.
  straggler::MembershipView second = client->MembershipFor(11, std::chrono::hours(1));
  CHECK_FALSE(second.ok);
  CHECK(second.version == 0);
  // Once the stream reaches a daemon again, MembershipFor waits as before and
  // becomes certain when the progress arrives.
  FakeIngest service;
  grpc::ServerBuilder b;
  b.AddListeningPort(endpoint, grpc::InsecureServerCredentials());
  b.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  REQUIRE(server);
  for (uint64_t it = 0; it <= 10; ++it) REQUIRE(client->Report(0, it, 0.1));
  while (!client->Stats().connected) std::this_thread::sleep_for(5ms);
  straggler::MembershipView third = client->MembershipFor(11, std::chrono::hours(1));
  CHECK(third.ok);
  client.reset();
  server->Shutdown(std::chrono::system_clock::now() + 1s);
  std::remove(path.c_str());
}

// The hello of a client that reported while no daemon was reachable: the
// reports it made before the first connection are still in its queue (the
// first `capacity` of them) or were dropped (the rest, when the queue filled).
pb::StreamHello HelloAfterOutage(uint64_t reports, size_t queue_capacity) {
  const std::string path =
      "/tmp/straggler-client-outage-" + std::to_string(::getpid()) + ".sock";
  std::remove(path.c_str());
  const std::string endpoint = "unix://" + path;
  straggler::ClientOptions o = Options(endpoint);
  o.queue_capacity = queue_capacity;
  auto client = straggler::Client::Create(o);
  REQUIRE(client);
  for (uint64_t it = 0; it < reports; ++it) client->Report(1, it, 0.1);  // false once full
  pb::StreamHello hello;
  {
    Server s(endpoint);
    REQUIRE(s.server);
    std::unique_lock<std::mutex> lock(s.service.mu_);
    REQUIRE(s.service.cv_.wait_for(lock, 10s, [&] { return !s.service.hellos_.empty(); }));
    hello = s.service.hellos_.front();
    lock.unlock();
    client.reset();
  }
  std::remove(path.c_str());
  return hello;
}

TEST_CASE("a hello names the newest iteration reported, including reports still queued",
          "[stream]") {
  // Iterations 0..5 sit in the queue (capacity 8) when the first stream opens.
  const pb::StreamHello hello = HelloAfterOutage(6, 8);
  REQUIRE(hello.has_reported_iteration());
  CHECK(hello.reported_iteration() == 5);
}

TEST_CASE("a hello names the newest iteration reported, including reports dropped",
          "[stream]") {
  // Iterations 0..7 fill the queue; 8..19 are dropped, yet the rank reached 19.
  const pb::StreamHello hello = HelloAfterOutage(20, 8);
  REQUIRE(hello.has_reported_iteration());
  CHECK(hello.reported_iteration() == 19);
}
