// straggler-sim's summary of a run: flushing the clients, the daemon's
// events read back per rank, the printed summary and the --report JSON
// (sim.h).
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <thread>

#include <nlohmann/json.hpp>

#include "sim.h"
#include "straggler/common/channel_security.h"
#include "straggler/v1/straggler.grpc.pb.h"

namespace straggler_sim {

namespace {

namespace v1 = straggler::v1;

constexpr std::chrono::milliseconds kFlushTimeout{2000};
constexpr std::chrono::milliseconds kQueryTimeout{5000};
constexpr uint32_t kEventsPageSize = 1000;

}  // namespace

bool Sim::FetchEvents(std::vector<v1::Event>* events, std::string* error) const {
  const std::string& address = o_.query_daemon.empty() ? o_.daemon : o_.query_daemon;
  auto credentials =
      straggler::MakeChannelCredentials(straggler::ChannelSecurityFromEnv(), address, error);
  if (!credentials) return false;
  // A daemon with auth.protect_reads wants the token for ListEvents too.
  std::string token;
  if (const char* file = std::getenv("STRAGGLER_TOKEN_FILE"); file != nullptr && *file != '\0') {
    if (!straggler::ReadBearerToken(file, &token, error)) return false;
  }
  auto channel = grpc::CreateChannel(address, credentials);
  auto stub = v1::QueryService::NewStub(channel);
  uint64_t since = 0;
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + kQueryTimeout);
    if (!token.empty()) ctx.AddMetadata("authorization", straggler::BearerAuthorization(token));
    v1::ListEventsRequest req;
    req.set_job_id(o_.job);
    req.set_run_id(o_.run_id);  // this launch's events, not an earlier run's
    req.set_since_sequence(since);
    req.set_limit(kEventsPageSize);
    v1::ListEventsResponse resp;
    grpc::Status status = stub->ListEvents(&ctx, req, &resp);
    if (!status.ok()) {
      *error = "ListEvents(" + o_.job + ") at " + o_.daemon + ": " + status.error_message();
      return false;
    }
    if (resp.events_size() == 0) return true;
    uint64_t highest = since;
    for (const auto& e : resp.events()) {
      events->push_back(e);
      highest = std::max(highest, e.sequence());
    }
    if (highest <= since) return true;  // a daemon that ignores since_sequence
    since = highest;
  }
}

uint64_t Sim::JobIteration(uint32_t rank, uint64_t reported_iteration) const {
  const auto& map = ranks_[rank - o_.first_rank]->shadow_job_iteration;
  auto it = map.find(reported_iteration);
  return it == map.end() ? reported_iteration : it->second;
}

namespace {

nlohmann::json StretchJson(const StretchThroughput& s) {
  return {{"from", s.from},
          {"to", s.to},
          {"iterations", s.iterations},
          {"with_exclusion", s.with_exclusion},
          {"without_exclusion", s.without_exclusion}};
}

std::string Ratio(double a, double b) { return b > 0 ? Fixed(a / b, 2) + "x" : "-"; }

}  // namespace

nlohmann::json Sim::PrintPipeline(const PipelineSummary& p) {
  const Topology& t = o_.topology;
  Print("pipeline model (1F1B, " + std::to_string(p.microbatches) + " microbatches, " +
        std::to_string(t.replicas) + "x" + std::to_string(t.stages) + "x" +
        std::to_string(t.tensor) + "): healthy " + Fixed(p.healthy, 1) +
        " microbatches/s; this run " + Fixed(p.run.with_exclusion, 1) + ", without exclusion " +
        Fixed(p.run.without_exclusion, 1) + " (" +
        Ratio(p.run.with_exclusion, p.run.without_exclusion) + ")");
  for (const StretchThroughput& s : p.slow) {
    Print("  slow stretch [" + std::to_string(s.from) + ", " + std::to_string(s.to) + "): " +
          Fixed(s.with_exclusion, 1) + " microbatches/s, without exclusion " +
          Fixed(s.without_exclusion, 1) + " (" + Ratio(s.with_exclusion, s.without_exclusion) +
          ")");
  }
  if (p.reduced_iterations > 0) {
    Print("  while replicas were out (" + std::to_string(p.reduced_iterations) +
          " iterations): " + Fixed(p.reduced, 1) + " microbatches/s, " +
          Ratio(p.reduced, p.healthy) + " of healthy");
  }
  nlohmann::json slow = nlohmann::json::array();
  for (const StretchThroughput& s : p.slow) slow.push_back(StretchJson(s));
  return {{"microbatches", p.microbatches},
          {"replicas", t.replicas},
          {"stages", t.stages},
          {"tensor", t.tensor},
          {"healthy", p.healthy},
          {"run", StretchJson(p.run)},
          {"slow", slow},
          {"reduced_iterations", p.reduced_iterations},
          {"reduced", p.reduced}};
}

nlohmann::json Sim::RanksJson(const std::vector<v1::Event>& events, Detections* found) const {
  nlohmann::json ranks_json = nlohmann::json::array();
  for (uint32_t r = o_.first_rank; r < o_.first_rank + o_.ranks; ++r) {
    nlohmann::json detected = nlohmann::json::array(), recovered = nlohmann::json::array(),
                   changes = nlohmann::json::array();
    for (const auto& e : events) {
      if (e.kind() != v1::EVENT_KIND_STATE_CHANGE || e.rank() != r) continue;
      const uint64_t job_iteration = JobIteration(r, e.iteration());
      changes.push_back({{"from", v1::WorkerState_Name(e.from())},
                         {"to", v1::WorkerState_Name(e.to())},
                         {"iteration", e.iteration()},
                         {"job_iteration", job_iteration}});
      if (e.to() == v1::WORKER_STATE_STRAGGLER) {
        detected.push_back(job_iteration);
        ++found->detections;
        found->detection_text.push_back("rank " + std::to_string(r) + " at " +
                                 std::to_string(job_iteration));
      } else if (e.from() == v1::WORKER_STATE_STRAGGLER && e.to() == v1::WORKER_STATE_HEALTHY) {
        recovered.push_back(job_iteration);
        ++found->recoveries;
        found->recovery_text.push_back("rank " + std::to_string(r) + " at " +
                                std::to_string(job_iteration));
      }
    }
    nlohmann::json slow = nlohmann::json::array();
    for (const auto& s : o_.slow)
      if (s.rank == r) slow.push_back({{"factor", s.factor}, {"from", s.from}, {"to", s.to}});
    const RankState& s = *ranks_[r - o_.first_rank];
    ranks_json.push_back({{"rank", r},
                          {"reports_queued", s.reports_queued},
                          {"detected_at", detected},
                          {"recovered_at", recovered},
                          {"excluded_at", s.excluded_at},
                          {"readmitted_at", s.readmitted_at},
                          {"state_changes", changes},
                          {"slow", slow}});
    if (o_.topology.replicas > 0) {
      ranks_json.back()["stage"] = StageOf(o_, r);
      ranks_json.back()["replica"] = (r / o_.topology.tensor) % o_.topology.replicas;
    }
  }
  return ranks_json;
}

nlohmann::json Sim::MembershipsJson() {
  std::map<uint64_t, MembershipView> versions;
  for (auto& s : ranks_) {
    absl::MutexLock lock(&s->mu);
    versions.insert(s->history.begin(), s->history.end());
  }
  nlohmann::json memberships = nlohmann::json::array();
  {
    absl::MutexLock lock(&applied_mu_);
    versions.insert(applied_views_.begin(), applied_views_.end());
    for (const auto& [version, m] : versions) {
      nlohmann::json excluded = nlohmann::json::array();
      for (const auto& e : m.excluded) excluded.push_back({{"rank", e.rank}, {"reason", e.reason}});
      nlohmann::json applied = nlohmann::json::object();
      if (auto it = applied_at_.find(version); it != applied_at_.end())
        for (const auto& [r, it_at] : it->second) applied[std::to_string(r)] = it_at;
      memberships.push_back({{"version", version},
                             {"effective_iteration", m.effective_iteration},
                             {"excluded", excluded},
                             {"applied_at", applied}});
    }
  }
  return memberships;
}

int Sim::Summarize(double wall) {
  std::string error;
  // In parallel: with the daemon gone, one after the other would take 2 s per rank.
  std::vector<char> flushed(ranks_.size(), 0);
  std::vector<std::thread> flushers;
  for (size_t r = 0; r < ranks_.size(); ++r)
    flushers.emplace_back([&, r] { flushed[r] = ranks_[r]->client->Flush(kFlushTimeout); });
  for (auto& t : flushers) t.join();
  uint64_t dropped = 0, rejected = 0, unflushed = 0, answered = 0, queued = 0;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const auto& s = ranks_[i];
    if (!flushed[i]) ++unflushed;
    const auto stats = s->client->Stats();
    dropped += stats.dropped;
    rejected += stats.rejected;
    answered += stats.acked + stats.rejected + stats.duplicates;
    queued += s->reports_queued;
  }
  // Nothing reported came back in any form: the run never reached a daemon
  // (nothing listening, a wrong address or TLS setup), so its numbers say
  // nothing about detection and it must not pass as a success. A daemon
  // killed mid-run still answered before it went, so such runs are not caught.
  const bool never_reached = queued > 0 && answered == 0;

  if (unflushed > 0) {
    std::cerr << "straggler-sim: " << unflushed << " of " << ranks_.size()
              << " ranks had reports not acknowledged within 2 s\n";
  }

  std::vector<v1::Event> events;
  if (!FetchEvents(&events, &error)) {
    std::cerr << "straggler-sim: cannot read the job's events, detections are not in the report: "
              << error << '\n';
  }

  // Per rank: detections and recoveries from the daemon's journal.
  Detections found;
  const nlohmann::json ranks_json = RanksJson(events, &found);
  const nlohmann::json memberships = MembershipsJson();

  const uint64_t done_iterations = collective_->Completed();
  const double ips = wall > 0 ? static_cast<double>(done_iterations) / wall : 0.0;
  const uint64_t violations = collective_->agreement_violations();
  uint64_t rejoined_behind = 0, membership_calls = 0;
  double membership_wait = 0;
  for (auto& s : ranks_) {
    rejoined_behind += s->rejoined_behind;
    membership_calls += s->membership_calls;
    membership_wait += s->membership_wait_seconds;
  }
  const double membership_wait_ms_mean =
      membership_calls > 0 ? 1000.0 * membership_wait / static_cast<double>(membership_calls) : 0.0;

  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
    return s.empty() ? s : " (" + s + ")";
  };
  Print("done: " + std::to_string(done_iterations) + " iterations in " + Fixed(wall, 2) + " s (" +
        Fixed(ips, 1) + " iterations/s); critical path " +
        Fixed(collective_->critical_path_seconds(), 2) + " s of planned compute");
  nlohmann::json pipeline_json;
  if (pipeline_) pipeline_json = PrintPipeline(pipeline_->Summarize());
  Print("detections: " + std::to_string(found.detections) + join(found.detection_text));
  Print("recoveries: " + std::to_string(found.recoveries) + join(found.recovery_text));
  Print("agreement violations: " + std::to_string(violations) +
        ", version splits: " + std::to_string(collective_->version_splits()) +
        ", membership timeouts: " + std::to_string(membership_timeouts_.load()) +
        ", mean membership wait: " + Fixed(membership_wait_ms_mean, 3) + " ms" +
        ", reports dropped: " + std::to_string(dropped) +
        ", rejected: " + std::to_string(rejected));
  if (collective_->aborted())
    std::cerr << "straggler-sim: run aborted: " << collective_->abort_reason() << '\n';
  if (never_reached)
    std::cerr << "straggler-sim: the daemon at " << o_.daemon << " was never reached: none of "
              << queued << " reports was answered (is stragglerd listening there?)\n";

  if (!o_.report.empty()) {
    nlohmann::json report = {
        {"job", o_.job},
        {"run_id", o_.run_id},
        {"ranks_count", o_.ranks},
        {"first_rank", o_.first_rank},
        {"world_size", o_.World()},
        {"iterations", done_iterations},
        {"iterations_requested", o_.iterations},
        {"iteration_ms", o_.iteration_ms},
        {"noise", o_.noise},
        {"seed", o_.seed},
        {"no_exclusion", o_.no_exclusion},
        {"wall_seconds", wall},
        {"critical_path_seconds", collective_->critical_path_seconds()},
        {"iterations_per_second", ips},
        {"agreement_violations", violations},
        {"version_splits", collective_->version_splits()},
        {"collective_timeouts", collective_->timeouts()},
        {"membership_timeouts", membership_timeouts_.load()},
        {"rejoined_behind", rejoined_behind},
        {"membership_wait_ms_mean", membership_wait_ms_mean},
        {"reports_dropped", dropped},
        {"reports_rejected", rejected},
        {"ranks", ranks_json},
        {"memberships", memberships},
    };
    if (pipeline_) report["pipeline"] = pipeline_json;
    std::ofstream out(o_.report);
    out << report.dump(2) << '\n';
    if (!out) std::cerr << "straggler-sim: cannot write --report " << o_.report << '\n';
  }
  // A client's destructor flushes again for up to 1 s when reports are still
  // unacknowledged (the daemon is gone): close them in parallel too.
  std::vector<std::thread> closers;
  for (auto& s : ranks_) closers.emplace_back([&s] { s->client.reset(); });
  for (auto& t : closers) t.join();
  ranks_.clear();
  if (violations > 0 || collective_->aborted()) return kExitViolation;
  return never_reached ? kExitUnreachable : kExitOk;
}

}  // namespace straggler_sim