#include "replay.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "registry/attribution.h"
#include "straggler/engine/job_engine.h"

namespace straggler::replay {

using engine::EventKind;
using engine::JobEngine;
using engine::Time;
using engine::WorkerState;

PolicyRun ReplayEngine(const quality::Trace& t, const engine::PolicyConfig& policy,
                       std::string name) {
  PolicyRun run;
  run.policy = std::move(name);
  run.flagged = quality::RankMatrix(t.ranks, t.iterations);
  run.detected_at.resize(t.ranks);
  run.recovered_at.resize(t.ranks);
  run.unresponsive_at.resize(t.ranks);

  const Time t0 = std::chrono::seconds(1'700'000'000);
  const auto step = std::chrono::duration_cast<Time>(
      std::chrono::duration<double>(t.base_seconds > 0 ? t.base_seconds : 1.0));
  JobEngine job(t.ranks, policy, t0);
  if (t.iterations_per_epoch > 0) job.SetIterationsPerEpoch(t.iterations_per_epoch);
  // A rank's hello: its declared topology (as IngestSession hands it to the
  // engine; a trace that declares none leaves every rank in the default
  // group), then the announcement. It comes at the start, or just before the
  // rank's first report when it joins late (scenario `join` effects).
  const bool declared = !t.peer_group.empty() || !t.gpu_model.empty();
  auto hello = [&](uint32_t r, Time now) {
    if (declared) {
      engine::RankTopology topology;
      if (!t.peer_group.empty()) topology.peer_group = t.peer_group[r];
      if (!t.replica.empty()) topology.replica = t.replica[r];
      if (!t.gpu_model.empty()) topology.gpu_model = t.gpu_model[r];
      job.SetTopology(r, topology);
    }
    job.Announce(r, now);
  };
  auto joins_at = [&](uint32_t r) { return t.join_row.empty() ? 0 : t.join_row[r]; };
  for (uint32_t r = 0; r < t.ranks; ++r)
    if (joins_at(r) == 0) hello(r, t0);

  // The daemon's phase column (JobState::phases), each rank's latest process
  // telemetry where the trace has run delays, and its likely cause of a
  // detection (JobState::Attribute with those: a trace has no GPU telemetry).
  const bool phased = !t.input_wait.empty() || !t.optimizer.empty();
  const bool host = !t.run_delay.empty();
  if (phased || host) run.detected_cause.resize(t.ranks);
  std::vector<daemon::RankPhases> phases;
  std::vector<std::optional<v1::ProcessTelemetry>> processes(host ? t.ranks : 0);
  auto evidence = [&](uint32_t r) {
    daemon::RankEvidence e;
    if (r < phases.size() && phases[r].reports > 0) e.phases = &phases[r];
    if (r < processes.size() && processes[r]) e.process = &*processes[r];
    return e;
  };
  auto cause_of = [&](uint32_t rank) {
    std::vector<daemon::RankEvidence> others;
    for (uint32_t r = 0; r < t.ranks; ++r)
      if (r != rank)
        if (daemon::RankEvidence e = evidence(r); e.phases || e.process) others.push_back(e);
    return std::string(
        daemon::LikelyCauseName(daemon::AttributeLikelyCause(evidence(rank), others).cause));
  };

  // Per rank: (row, flagged from that row on), in emission order.
  std::vector<std::vector<std::pair<uint64_t, bool>>> changes(t.ranks);
  auto collect = [&] {
    for (const auto& e : job.TakeEvents()) {
      if (e.kind != EventKind::kStateChange) continue;
      const uint64_t row = e.iteration >= t.first_iteration ? e.iteration - t.first_iteration : 0;
      if (e.to == WorkerState::kStraggler) {
        run.detected_at[e.rank].push_back(e.iteration);
        if (phased || host) run.detected_cause[e.rank].push_back(cause_of(e.rank));
        changes[e.rank].push_back({row, true});
      } else if (e.from == WorkerState::kStraggler) {
        // Back to healthy, or to the gray zone (mild): the flag ends either way.
        if (e.to == WorkerState::kHealthy || e.to == WorkerState::kMild)
          run.recovered_at[e.rank].push_back(e.iteration);
        changes[e.rank].push_back({row, false});
      }
      if (e.to == WorkerState::kUnresponsive) run.unresponsive_at[e.rank].push_back(e.iteration);
    }
  };

  engine::Report rep;
  for (uint64_t row = 0; row < t.iterations; ++row) {
    const Time now = t0 + step * static_cast<int64_t>(row + 1);
    for (uint32_t r = 0; r < t.ranks; ++r) {
      if (row > 0 && joins_at(r) == row) hello(r, now);
      if (!t.Reported(row, r)) continue;
      rep.rank = r;
      rep.epoch = t.epoch[row];
      rep.iteration = t.Iteration(row);
      rep.compute_seconds = t.At(row, r);
      // Work and phases where the trace has them (NaN: not in this report).
      const size_t cell = static_cast<size_t>(row) * t.ranks + r;
      auto field = [&](const std::vector<double>& v) -> std::optional<double> {
        return v.empty() || std::isnan(v[cell]) ? std::nullopt : std::optional<double>(v[cell]);
      };
      rep.work = field(t.work);
      rep.input_wait_seconds = field(t.input_wait);
      rep.optimizer_seconds = field(t.optimizer);
      rep.start_time = now;
      ++run.reports;
      const auto res = job.Ingest(rep, now);
      if (!res.accepted) {
        if (run.rejected++ == 0) run.first_rejection = res.message;
      } else {
        if (phased)
          daemon::NotePhases(phases, t.ranks, r, rep.input_wait_seconds, rep.compute_seconds,
                             rep.optimizer_seconds);
        if (const auto delay = field(t.run_delay)) {
          v1::ProcessTelemetry& p = processes[r].emplace();
          p.set_rank(r);
          p.set_pid(r + 1);
          p.set_period_seconds(1);
          p.set_reading(v1::HOST_READING_AVAILABLE);
          p.set_run_delay_seconds_per_second(*delay);
        }
      }
    }
    job.Tick(now);
    collect();
  }

  for (uint32_t r = 0; r < t.ranks; ++r) run.topology.push_back(job.Topology(r));
  for (uint32_t r = 0; r < t.ranks; ++r) {
    auto& c = changes[r];
    std::stable_sort(c.begin(), c.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    bool state = false;
    size_t k = 0;
    for (uint64_t row = 0; row < t.iterations; ++row) {
      while (k < c.size() && c[k].first <= row) state = c[k++].second;
      if (state) run.flagged.set(r, row, true);
    }
  }
  return run;
}

PolicyRun FromFlags(const quality::Trace& t, quality::RankMatrix flags, std::string name) {
  PolicyRun run;
  run.policy = std::move(name);
  run.detected_at.resize(t.ranks);
  run.recovered_at.resize(t.ranks);
  run.unresponsive_at.resize(t.ranks);
  for (uint32_t r = 0; r < t.ranks; ++r) {
    bool prev = false;
    for (uint64_t row = 0; row < t.iterations; ++row) {
      if (!t.Reported(row, r)) continue;
      ++run.reports;
      const bool f = flags.at(r, row);
      if (f && !prev) run.detected_at[r].push_back(t.Iteration(row));
      if (!f && prev) run.recovered_at[r].push_back(t.Iteration(row));
      prev = f;
    }
  }
  run.flagged = std::move(flags);
  return run;
}

}  // namespace straggler::replay
