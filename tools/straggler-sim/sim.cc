// straggler-sim's rank threads: membership, compute, report, collective
// (sim.h).
#include "sim.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <thread>

#include "straggler/common/channel_security.h"
#include "straggler/topology.h"

namespace straggler_sim {

namespace {

using Clock = std::chrono::steady_clock;

// How often a paced shadow rank looks for a membership that takes it back.
constexpr std::chrono::milliseconds kShadowPoll{5};

}  // namespace

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

void Sim::Print(const std::string& line) {
  if (o_.quiet) return;
  absl::MutexLock lock(&print_mu_);
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
      absl::MutexLock lock(&raw->mu);
      raw->history[m.version] = m;
    });
    // The callback only sees versions received after registration.
    MembershipView current = state->client->CurrentMembership();
    {
      absl::MutexLock lock(&state->mu);
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
  absl::MutexLock lock(&applied_mu_);
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
  // The model needs every rank's step: not when processes split the job.
  if (o_.topology.replicas > 0 && o_.first_rank == 0 && o_.ranks == o_.World()) {
    pipeline_ = std::make_unique<PipelineModel>(o_);
    collective_->OnCompleted([this](uint64_t iteration, const std::vector<uint32_t>& members) {
      pipeline_->Record(iteration, members);
    });
  }

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

  return Summarize(wall);
}

}  // namespace straggler_sim
