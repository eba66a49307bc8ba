// straggler-sim — a simulated synchronous data-parallel job that reports to a
// real stragglerd through the real client library, so the whole loop
// (report -> detection -> membership -> partial "all-reduce") can be watched
// and measured without GPUs:
//
//   straggler-sim --daemon 127.0.0.1:7070 --ranks 8 --iterations 400
//                 --slow 3:3:50:350 --report run.json
//
// Each rank is a thread with its own straggler::Client (ranks = {r}). A step
// is: ask the client which membership is in force at iteration i, "compute"
// (sleep for a drawn time), report the measured time, then wait in an
// in-process barrier for the active ranks of that membership — so the job
// runs at the speed of the slowest *active* rank, as with a partial
// all-reduce. An excluded rank keeps computing and reporting on its own
// ("shadow"), and rejoins the group at the effective iteration of the first
// version that includes it again.
//
// Exit status: 0 ok; 1 ranks ran a step with different active sets (or the
// collective hung); 2 bad flags; 3 the daemon (--daemon) was never reached:
// no report of any rank came back acknowledged, rejected or as a duplicate.
// Ranks that ran a step with the same active
// set under different version numbers (a rank still disconnected after a
// daemon restart) are counted in the report's version_splits, not failed.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "straggler/common/channel_security.h"
#include "collective.h"
#include "options.h"
#include "straggler/client.h"
#include "straggler/topology.h"
#include "straggler/v1/straggler.grpc.pb.h"

namespace straggler_sim {
namespace {

namespace v1 = straggler::v1;
using straggler::MembershipView;
using Clock = std::chrono::steady_clock;

constexpr int kExitOk = 0;
constexpr int kExitViolation = 1;
constexpr int kExitUsage = 2;
constexpr int kExitUnreachable = 3;  // as stragglerctl's
constexpr std::chrono::milliseconds kFlushTimeout{2000};
constexpr std::chrono::milliseconds kQueryTimeout{5000};
constexpr uint32_t kEventsPageSize = 1000;
// How often a paced shadow rank looks for a membership that takes it back.
constexpr std::chrono::milliseconds kShadowPoll{5};

std::string RankList(const std::vector<uint32_t>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s + "]";
}

std::string Fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

// What one rank thread learns and records. The client's callback writes
// `history` on the client's thread; everything else belongs to the rank's
// own thread until the threads are joined.
struct RankState {
  std::unique_ptr<straggler::Client> client;
  std::mutex mu;
  std::map<uint64_t, MembershipView> history;  // guarded by mu: every version seen, by version

  std::mt19937_64 rng;
  // Shadow reports are numbered by the rank's own counter, which lags the
  // job; this maps them back to the job iteration they were computed at, so
  // the daemon's events can be read in job iterations.
  std::map<uint64_t, uint64_t> shadow_job_iteration;
  std::vector<uint64_t> excluded_at;    // job iterations at which it went to shadow mode
  std::vector<uint64_t> readmitted_at;  // iterations at which it rejoined the group
  uint64_t rejoined_behind = 0;         // see Shadow(): stays 0
  double membership_wait_seconds = 0;   // time spent in MembershipFor (on the step's critical path)
  uint64_t membership_calls = 0;
  uint64_t reports_queued = 0;  // Report() calls the client took (not dropped): what must arrive
};

class Sim {
 public:
  explicit Sim(SimOptions options) : o_(std::move(options)) {}

  int Run();

 private:
  bool CreateClients(std::string* error);
  void RankMain(uint32_t rank);
  std::optional<MembershipView> Shadow(uint32_t rank, uint64_t start);
  // Sleeps for the drawn compute time of `rank` at `job_iteration`; returns
  // the measured time. `planned` (optional) receives the drawn time.
  double Compute(uint32_t rank, uint64_t job_iteration, double* planned = nullptr);
  void RecordApplied(uint32_t rank, uint64_t iteration, const MembershipView& m);
  std::vector<uint32_t> ActiveRanks(const MembershipView& m) const;
  uint64_t Epoch(uint64_t iteration) const {
    return o_.epoch_iterations > 0 ? iteration / o_.epoch_iterations : 0;
  }
  void Print(const std::string& line);
  bool FetchEvents(std::vector<v1::Event>* events, std::string* error) const;
  uint64_t JobIteration(uint32_t rank, uint64_t reported_iteration) const;

  SimOptions o_;
  std::vector<std::unique_ptr<RankState>> ranks_;
  std::unique_ptr<Collective> collective_;
  std::atomic<uint64_t> membership_timeouts_{0};

  std::mutex print_mu_;

  std::mutex applied_mu_;
  // version -> rank -> first iteration at which the rank used that version.
  std::map<uint64_t, std::map<uint32_t, uint64_t>> applied_at_;  // guarded by applied_mu_
  std::map<uint64_t, MembershipView> applied_views_;              // guarded by applied_mu_
  std::set<uint32_t> printed_excluded_;                           // guarded by applied_mu_
};

void Sim::Print(const std::string& line) {
  if (o_.quiet) return;
  std::lock_guard lock(print_mu_);
  std::cout << line << '\n';
  std::cout.flush();
}

std::vector<uint32_t> Sim::ActiveRanks(const MembershipView& m) const {
  // Computed from our own world size: a view received before the daemon knew
  // the job may carry world_size 0.
  std::vector<uint32_t> active;
  for (uint32_t r = o_.first_rank; r < o_.first_rank + o_.ranks; ++r)
    if (!m.IsExcluded(r)) active.push_back(r);
  return active;
}

bool Sim::CreateClients(std::string* error) {
  for (uint32_t r = o_.first_rank; r < o_.first_rank + o_.ranks; ++r) {
    auto state = std::make_unique<RankState>();
    state->rng.seed(o_.seed + 0x9E3779B97F4A7C15ull * (r + 1));
    straggler::ClientOptions co;
    co.endpoint = o_.daemon;
    // TLS as a trainer's: from STRAGGLER_TLS_CA/_CERT/_KEY.
    const straggler::ChannelSecurity tls = straggler::ChannelSecurityFromEnv();
    co.tls_ca_file = tls.ca_file;
    co.tls_cert_file = tls.cert_file;
    co.tls_key_file = tls.key_file;
    co.job_id = o_.job;
    co.run_id = o_.run_id;
    co.ranks = {r};
    co.world_size = o_.World();
    co.local_rank = r;
    if (o_.topology.replicas > 0) {
      // Megatron's default order, as docs/topology.md tells trainers to declare it.
      straggler::ParallelLayout layout;
      layout.data = o_.topology.replicas;
      layout.pipeline = o_.topology.stages;
      layout.tensor = o_.topology.tensor;
      const auto t = straggler::TopologyFromLayout(layout, r, error);
      if (!t) return false;
      co.peer_group = t->peer_group;
      co.replica = t->replica;
    }
    // Without --epoch-iterations the run is one epoch, and saying how long it
    // is lets the daemon size fractional limits correctly.
    co.iterations_per_epoch = o_.epoch_iterations > 0 ? o_.epoch_iterations : o_.iterations;
    state->client = straggler::Client::Create(co, error);
    if (!state->client) return false;
    RankState* raw = state.get();
    state->client->OnMembershipChange([raw](const MembershipView& m) {
      std::lock_guard lock(raw->mu);
      raw->history[m.version] = m;
    });
    // The callback only sees versions received after registration.
    MembershipView current = state->client->CurrentMembership();
    {
      std::lock_guard lock(state->mu);
      state->history.emplace(current.version, current);
    }
    ranks_.push_back(std::move(state));
  }
  return true;
}

double Sim::Compute(uint32_t rank, uint64_t job_iteration, double* planned) {
  RankState& s = *ranks_[rank - o_.first_rank];
  const double base = o_.iteration_ms / 1000.0 * SlowFactor(o_, rank, job_iteration);
  double relative = 1.0;
  if (o_.noise > 0.0) {
    std::normal_distribution<double> gauss(1.0, o_.noise);
    // Truncated: a step never takes zero or negative time.
    do relative = gauss(s.rng);
    while (relative <= 0.0);
  }
  if (planned) *planned = base * relative;
  const auto start = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(base * relative));
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void Sim::RecordApplied(uint32_t rank, uint64_t iteration, const MembershipView& m) {
  std::lock_guard lock(applied_mu_);
  auto& by_rank = applied_at_[m.version];
  const bool first_anywhere = by_rank.empty();
  by_rank.emplace(rank, iteration);
  applied_views_.emplace(m.version, m);
  if (!first_anywhere) return;

  // Printed when the first rank switches, i.e. at the version's effective
  // iteration as the group sees it.
  std::set<uint32_t> now;
  std::vector<uint32_t> excluded;
  std::set<std::string> reasons;
  for (const auto& e : m.excluded) {
    now.insert(e.rank);
    excluded.push_back(e.rank);
    reasons.insert(e.reason);
  }
  if (m.version == 0 && excluded.empty()) return;  // the initial "everyone" view
  std::string line = "iteration " + std::to_string(iteration) + ": membership v" +
                     std::to_string(m.version) + " — excluded " + RankList(excluded);
  if (reasons.size() == 1) {
    line += " (" + *reasons.begin() + ")";
  } else if (!reasons.empty()) {
    line += " (";
    for (size_t i = 0; i < m.excluded.size(); ++i)
      line += (i ? ", " : "") + std::to_string(m.excluded[i].rank) + ": " + m.excluded[i].reason;
    line += ")";
  }
  for (const auto& e : m.excluded) {
    if (!printed_excluded_.count(e.rank)) {
      line += "\n  rank " + std::to_string(e.rank) + " excluded as " + e.reason +
              (e.detail.empty() ? "" : ": " + e.detail);
    }
  }
  for (uint32_t r : printed_excluded_) {
    if (!now.count(r)) line += "\n  rank " + std::to_string(r) + " readmitted";
  }
  printed_excluded_ = now;
  Print(line);
}

std::optional<MembershipView> Sim::Shadow(uint32_t rank, uint64_t start) {
  RankState& s = *ranks_[rank - o_.first_rank];
  s.excluded_at.push_back(start);
  uint64_t own = start;
  while (!collective_->Finished() && !collective_->aborted()) {
    // The first version after our exclusion that includes us again (not
    // simply the newest: one readmitting us may have been followed quickly by
    // one excluding us again, and the group counts on us in between). Asked
    // at `start`, where we were excluded, not at `own`: a rank whose
    // directive came late may reach the readmission's effective iteration
    // before it knows of it, and there the version in force includes it, so
    // ReadmissionAfter(own) would answer nullopt while the group waits.
    if (auto back = s.client->ReadmissionAfter(start, rank)) {
      const uint64_t e = back->effective_iteration;
      if (e < o_.iterations) {
        // Every iteration we reported in shadow mode is below e, so our
        // report for e is new to the daemon. Why: the pacing below never lets
        // us start an iteration the group has not finished, and the group
        // cannot finish e without us (e's membership includes us). A
        // straggler lags far behind anyway: it was excluded for being slower
        // than the group. The pacing is for a healthy rank an operator forced
        // out, which would otherwise run ahead, free of the group's barrier.
        if (own > e) ++s.rejoined_behind;  // defensive; see above
        // Rejoining means taking the group's parameters at the start of e:
        // wait until the group has finished e - 1.
        if (!collective_->WaitCompleted(e)) return std::nullopt;
        s.readmitted_at.push_back(e);
        return back;
      }
      // The job ends before e: keep shadowing until it does.
    }
    // Pacing: an excluded rank keeps to the job's data schedule and never
    // starts an iteration the group has not finished. Short waits, so a new
    // membership is noticed while waiting too.
    if (collective_->Completed() <= own) {
      collective_->WaitCompletedFor(own + 1, kShadowPoll);
      continue;
    }
    // The rank's slowness follows the job's progress, not its own lagging
    // counter: a slowdown is something that happens to the machine during a
    // stretch of the job, and keying it to the job keeps the slow stretch the
    // same length (in job iterations) with and without exclusion.
    const uint64_t job_iteration = collective_->Completed();
    const double seconds = Compute(rank, job_iteration);
    s.reports_queued += s.client->Report(rank, Epoch(own), own, seconds);
    s.shadow_job_iteration[own] = job_iteration;
    ++own;
  }
  return std::nullopt;
}

void Sim::RankMain(uint32_t rank) {
  RankState& s = *ranks_[rank - o_.first_rank];
  const std::chrono::milliseconds timeout(o_.membership_timeout_ms);
  MembershipView everyone;
  everyone.world_size = o_.World();
  uint64_t i = 0;
  while (i < o_.iterations && !collective_->aborted()) {
    MembershipView m;
    if (o_.no_exclusion) {
      m = everyone;
    } else {
      // Also right after a rejoin, whose counter jumped to the readmission's
      // effective iteration, maybe far past its last shadow report: the
      // client answers at once that the readmitting version is in force
      // there (Client::ReadmissionAfter). Waiting instead for its report of
      // i + 1 - lead, which it never sends, would end in a timeout, counted
      // in membership_timeouts.
      const auto asked = Clock::now();
      m = s.client->MembershipFor(i, timeout);
      s.membership_wait_seconds += std::chrono::duration<double>(Clock::now() - asked).count();
      ++s.membership_calls;
      if (!m.ok) ++membership_timeouts_;
    }
    if (!o_.no_exclusion) {
      RecordApplied(rank, i, m);
      if (m.IsExcluded(rank)) {
        const std::optional<MembershipView> back = Shadow(rank, i);
        if (!back) return;
        i = back->effective_iteration;
        continue;
      }
    }
    double planned = 0;
    const double seconds = Compute(rank, i, &planned);
    s.reports_queued += s.client->Report(rank, Epoch(i), i, seconds);
    if (collective_->Arrive(i, rank, m.version, ActiveRanks(m), planned) !=
        Collective::Outcome::kCompleted)
      return;
    ++i;
  }
}

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

int Sim::Run() {
  std::string error;
  if (!CreateClients(&error)) {
    std::cerr << "straggler-sim: " << error << '\n';
    return kExitUsage;
  }
  // No step of a healthy run waits longer than a membership timeout (other
  // ranks stuck in MembershipFor) plus a few slowed steps; far beyond that,
  // the ranks disagree about who takes part and would wait forever.
  double max_factor = 1.0;
  for (const auto& s : o_.slow) max_factor = std::max(max_factor, s.factor);
  const auto step_timeout = std::chrono::milliseconds(
      2 * o_.membership_timeout_ms + static_cast<int64_t>(10 * max_factor * o_.iteration_ms) +
      10000);
  collective_ = std::make_unique<Collective>(o_.iterations, step_timeout);

  std::string slow_text;
  for (const auto& s : o_.slow) {
    slow_text += "; rank " + std::to_string(s.rank) + " " + Fixed(s.factor, 2) +
                 "x slower at iterations [" + std::to_string(s.from) + ", " +
                 std::to_string(s.to) + ")";
  }
  Print("straggler-sim: job " + o_.job + ", " + std::to_string(o_.ranks) + " ranks, " +
        std::to_string(o_.iterations) + " iterations of " + Fixed(o_.iteration_ms, 1) +
        " ms, noise " + Fixed(o_.noise * 100.0, 1) + "%, seed " + std::to_string(o_.seed) +
        ", daemon " + o_.daemon + (o_.no_exclusion ? ", exclusion ignored" : "") + slow_text);

  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (uint32_t r = o_.first_rank; r < o_.first_rank + o_.ranks; ++r)
    threads.emplace_back([this, r] { RankMain(r); });
  for (auto& t : threads) t.join();
  const bool finished = collective_->Finished();
  const double wall = std::chrono::duration<double>(
                          (finished ? collective_->finished_at() : Clock::now()) - start)
                          .count();

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
  nlohmann::json ranks_json = nlohmann::json::array();
  std::vector<std::string> detection_text, recovery_text;
  uint64_t detections = 0, recoveries = 0;
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
        ++detections;
        detection_text.push_back("rank " + std::to_string(r) + " at " +
                                 std::to_string(job_iteration));
      } else if (e.from() == v1::WORKER_STATE_STRAGGLER && e.to() == v1::WORKER_STATE_HEALTHY) {
        recovered.push_back(job_iteration);
        ++recoveries;
        recovery_text.push_back("rank " + std::to_string(r) + " at " +
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

  // Every version any rank saw or applied.
  std::map<uint64_t, MembershipView> versions;
  for (auto& s : ranks_) {
    std::lock_guard lock(s->mu);
    versions.insert(s->history.begin(), s->history.end());
  }
  nlohmann::json memberships = nlohmann::json::array();
  {
    std::lock_guard lock(applied_mu_);
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
  Print("detections: " + std::to_string(detections) + join(detection_text));
  Print("recoveries: " + std::to_string(recoveries) + join(recovery_text));
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

}  // namespace
}  // namespace straggler_sim

int main(int argc, char** argv) {
  using straggler_sim::SimOptions;
  SimOptions o;
  std::vector<std::string> slow_texts;
  CLI::App app{
      "straggler-sim: a simulated synchronous data-parallel job reporting to stragglerd\n"
      "TLS to the daemon from STRAGGLER_TLS_CA, STRAGGLER_TLS_CERT, STRAGGLER_TLS_KEY; the\n"
      "bearer token for reading its events (auth.protect_reads) from the file\n"
      "STRAGGLER_TOKEN_FILE names."};
  app.add_option("--daemon", o.daemon, "daemon gRPC address")->capture_default_str();
  app.add_option("--job", o.job, "job id (default sim-<pid>)");
  app.add_option("--run-id", o.run_id,
                 "this launch's run id (default: STRAGGLER_RUN_ID or TORCHELASTIC_RUN_ID, else a "
                 "random one when this process runs every rank; processes that split one job "
                 "across --first-rank must pass the same value)");
  app.add_option("--ranks", o.ranks, "ranks (threads) this process runs")->capture_default_str();
  app.add_option("--first-rank", o.first_rank,
                 "the first of this process's ranks: it runs FIRST..FIRST+RANKS-1 (one job split "
                 "across processes; each process's collective waits for its own ranks only)")
      ->capture_default_str();
  app.add_option("--world-size", o.world_size, "ranks in the whole job (default: --ranks)");
  app.add_option("--iterations", o.iterations, "iterations to run")->capture_default_str();
  app.add_option("--iteration-ms", o.iteration_ms, "compute time of a healthy step, ms")
      ->capture_default_str();
  app.add_option("--noise", o.noise, "relative gaussian noise on compute time (sigma)")
      ->capture_default_str();
  app.add_option("--epoch-iterations", o.epoch_iterations, "iterations per epoch (0 = one epoch)")
      ->capture_default_str();
  app.add_option("--slow", slow_texts,
                 "RANK:FACTOR:FROM:TO — rank computes FACTOR times slower at iterations "
                 "[FROM, TO); repeatable")
      ->allow_extra_args(false);
  std::string topology_text, stage_cost_text;
  app.add_option("--topology", topology_text,
                 "REPLICASxSTAGESxTENSOR, e.g. 4x2x2: each rank declares peer group stage<s> and "
                 "replica r (rank = t + T*(r + R*s), docs/topology.md); --ranks defaults to the "
                 "product");
  app.add_option("--stage-cost", stage_cost_text,
                 "c0,c1,...: stage s computes c<s> times --iteration-ms (needs --topology)");
  app.add_flag("--no-exclusion", o.no_exclusion, "ignore memberships: every rank in every step");
  app.add_option("--report", o.report, "write a JSON report to this file");
  app.add_option("--query-daemon", o.query_daemon,
                 "daemon address for reading the job's events when --daemon is a node agent "
                 "(default: --daemon)");
  auto* seed = app.add_option("--seed", o.seed, "random seed (default: random, printed)");
  app.add_option("--membership-timeout-ms", o.membership_timeout_ms,
                 "how long a rank waits for the membership of an iteration")
      ->capture_default_str();
  app.add_flag("--quiet", o.quiet, "print nothing but errors");
  app.footer(
      "Exit status: 0 ok; 1 ranks ran a step with different active sets, or the collective "
      "hung; 2 bad flags; 3 the daemon at --daemon was never reached (no report answered).");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? straggler_sim::kExitOk : straggler_sim::kExitUsage;
  }
  for (const auto& text : slow_texts) {
    straggler_sim::SlowSpec spec;
    std::string error;
    if (!straggler_sim::ParseSlowSpec(text, &spec, &error)) {
      std::cerr << "straggler-sim: " << error << '\n';
      return straggler_sim::kExitUsage;
    }
    o.slow.push_back(spec);
  }
  if (!topology_text.empty()) {
    std::string error;
    if (!straggler_sim::ParseTopology(topology_text, &o.topology, &error)) {
      std::cerr << "straggler-sim: " << error << '\n';
      return straggler_sim::kExitUsage;
    }
    if (app.count("--ranks") == 0 && app.count("--world-size") == 0) o.ranks = o.topology.World();
  }
  if (!stage_cost_text.empty()) {
    std::string error;
    if (!straggler_sim::ParseStageCost(stage_cost_text, &o.stage_cost, &error)) {
      std::cerr << "straggler-sim: " << error << '\n';
      return straggler_sim::kExitUsage;
    }
  }
  if (std::string error = straggler_sim::Validate(o); !error.empty()) {
    std::cerr << "straggler-sim: " << error << '\n';
    return straggler_sim::kExitUsage;
  }
  if (o.job.empty()) o.job = "sim-" + std::to_string(getpid());
  if (o.run_id.empty()) o.run_id = straggler::ClientOptions::FromEnv().run_id;
  if (o.run_id.empty() && o.first_rank == 0 && o.ranks == o.World()) {
    // One process, the whole job: a launch of its own, so a job id used
    // again does not inherit the last launch's exclusions.
    std::mt19937_64 rng(std::random_device{}());
    char text[32];
    std::snprintf(text, sizeof text, "sim-%016llx", static_cast<unsigned long long>(rng()));
    o.run_id = text;
  }
  o.seed_given = seed->count() > 0;
  if (!o.seed_given) o.seed = std::random_device{}();
  return straggler_sim::Sim(std::move(o)).Run();
}
