// HostSampler: see host_sampler.h.
#include "host_sampler.h"

#include <algorithm>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"

namespace straggler::agent {
namespace {

constexpr const char* kResources[3] = {"cpu", "memory", "io"};

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// NOT_FOUND (no such file: a kernel without PSI) and FAILED_PRECONDITION
// (the kernel keeps no such counter) are the kernel's "not available";
// anything else is an error worth fixing.
Reading ReadingOf(const absl::Status& s) {
  if (s.ok()) return Reading::kAvailable;
  return absl::IsNotFound(s) || absl::IsFailedPrecondition(s) ? Reading::kNotAvailable
                                                               : Reading::kError;
}

// The growth of a counter, or nullopt when it went back (a wrapped or reset
// counter says nothing about the period).
std::optional<uint64_t> Growth(uint64_t before, uint64_t now) {
  if (now < before) return std::nullopt;
  return now - before;
}

}  // namespace

std::unique_ptr<HostSampler> HostSampler::Start(const Options& options) {
  Options o = options;
  if (o.interval.count() <= 0) o.interval = std::chrono::seconds(1);
  std::unique_ptr<HostSampler> sampler(new HostSampler(o));
  sampler->SampleNow();  // quiet: this one line says what it found
  std::optional<NodeSample> n = sampler->Node();
  std::vector<std::string> missing, failing;
  auto note = [&](Reading r, const std::string& detail) {
    if (r == Reading::kNotAvailable) missing.push_back(detail);
    if (r == Reading::kError) failing.push_back(detail);
  };
  for (const auto* p : {&n->cpu, &n->memory, &n->io}) note(p->reading, p->detail);
  note(n->steal_reading, n->steal_detail);
  spdlog::log(failing.empty() ? spdlog::level::info : spdlog::level::warn,
              "host telemetry on: {} read every {} ms{}{}{}{}", o.proc_root, o.interval.count(),
              missing.empty() ? "" : "; ", absl::StrJoin(missing, "; "),
              failing.empty() ? "" : "; errors: ", absl::StrJoin(failing, "; "));
  {
    absl::MutexLock lock(&sampler->sample_mu_);
    sampler->started_ = true;
  }
  if (o.start_thread) sampler->thread_ = std::thread([s = sampler.get()] { s->Run(); });
  return sampler;
}

HostSampler::~HostSampler() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void HostSampler::Run() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      // Wakes early only to stop (true: stop_ is set).
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::FromChrono(options_.interval)))
        return;
    }
    SampleNow();
  }
}

std::optional<NodeSample> HostSampler::Node() const {
  absl::MutexLock lock(&mu_);
  return node_;
}

std::optional<ProcessSample> HostSampler::ForPid(int64_t pid) {
  absl::MutexLock lock(&mu_);
  watched_[pid] = std::chrono::steady_clock::now();
  auto it = latest_.find(pid);
  if (it == latest_.end()) return std::nullopt;
  return it->second;
}

void HostSampler::LogOnce(const std::string& key, const std::string& message) {
  auto [it, fresh] = logged_.try_emplace(key, message);
  if (!fresh && it->second == message) return;
  it->second = message;
  if (started_) spdlog::warn("host telemetry: {}", message);
}

PressureReading HostSampler::SamplePressure(const char* resource, size_t index, double period) {
  PressureReading out;
  absl::StatusOr<procfs::PressureSome> p = procfs::ReadPressure(options_.proc_root, resource);
  out.reading = ReadingOf(p.status());
  if (!p.ok()) {
    out.detail = std::string(p.status().message());
    if (out.reading == Reading::kNotAvailable) {
      out.detail = absl::StrCat(resource, " pressure not available (kernel without PSI?): ",
                                out.detail);
    }
    LogOnce(absl::StrCat("pressure/", resource), out.detail);
    pressure_[index].reset();
    return out;
  }
  out.some_avg10 = p->avg10_percent / 100;
  if (pressure_[index] && period > 0) {
    if (auto stalled = Growth(pressure_[index]->total_us, p->total_us)) {
      out.some_share = std::min(1.0, static_cast<double>(*stalled) / 1e6 / period);
    }
  }
  pressure_[index] = *p;
  return out;
}

std::optional<ProcessSample> HostSampler::SampleProcess(int64_t pid,
                                                        std::chrono::steady_clock::time_point now) {
  ProcessSample s;
  s.pid = pid;
  s.sample_time = std::chrono::system_clock::now();
  absl::StatusOr<std::map<int64_t, procfs::ThreadCounters>> threads =
      procfs::ReadProcessThreads(options_.proc_root, pid);
  if (!threads.ok()) {
    processes_.erase(pid);
    s.reading = ReadingOf(threads.status());
    s.detail = absl::IsNotFound(threads.status())
                   ? absl::StrCat("process ", pid, " does not exist (",
                                  threads.status().message(), ")")
                   : std::string(threads.status().message());
    // A trainer that exited is no news; a kernel or file that fails is.
    if (!absl::IsNotFound(threads.status())) LogOnce(absl::StrCat("pid ", pid), s.detail);
    return s;
  }
  auto [state, fresh] = processes_.try_emplace(pid);
  ProcessState before = std::exchange(state->second, ProcessState{now, *std::move(threads)});
  const double period = Seconds(now - before.at);
  if (fresh || period <= 0) return std::nullopt;  // rates need two readings
  // Per thread: a thread new since the last reading counts whole (it began
  // within the period); one that ended is lost for its last stretch.
  uint64_t delay_ns = 0, switches = 0;
  for (const auto& [tid, c] : state->second.threads) {
    procfs::ThreadCounters was{};
    if (auto it = before.threads.find(tid); it != before.threads.end()) was = it->second;
    delay_ns += Growth(was.run_delay_ns, c.run_delay_ns).value_or(c.run_delay_ns);
    switches += Growth(was.involuntary_switches, c.involuntary_switches)
                    .value_or(c.involuntary_switches);
  }
  s.period_seconds = period;
  s.run_delay_seconds_per_second = static_cast<double>(delay_ns) / 1e9 / period;
  s.involuntary_switches_per_second = static_cast<double>(switches) / period;
  return s;
}

void HostSampler::SampleNow() {
  absl::MutexLock sample_lock(&sample_mu_);
  const auto now = std::chrono::steady_clock::now();
  NodeSample n;
  n.sample_time = std::chrono::system_clock::now();
  n.period_seconds = node_at_ ? Seconds(now - *node_at_) : 0;
  node_at_ = now;
  n.cpu = SamplePressure(kResources[0], 0, n.period_seconds);
  n.memory = SamplePressure(kResources[1], 1, n.period_seconds);
  n.io = SamplePressure(kResources[2], 2, n.period_seconds);
  absl::StatusOr<procfs::CpuTimes> cpu = procfs::ReadCpuTimes(options_.proc_root);
  n.steal_reading = ReadingOf(cpu.status());
  if (cpu.ok()) {
    if (cpu_ && n.period_seconds > 0) {
      auto total = Growth(cpu_->total, cpu->total);
      auto steal = Growth(cpu_->steal, cpu->steal);
      if (total && steal && *total > 0) {
        n.cpu_steal_share = static_cast<double>(*steal) / static_cast<double>(*total);
      }
    }
    cpu_ = *cpu;
  } else {
    n.steal_detail = std::string(cpu.status().message());
    LogOnce("stat", n.steal_detail);
    cpu_.reset();
  }

  std::vector<int64_t> pids;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = watched_.begin(); it != watched_.end();) {
      if (now - it->second > options_.forget_after) {
        latest_.erase(it->first);
        it = watched_.erase(it);
      } else {
        pids.push_back(it->first);
        ++it;
      }
    }
  }
  for (auto it = processes_.begin(); it != processes_.end();) {
    it = std::binary_search(pids.begin(), pids.end(), it->first) ? std::next(it)
                                                                 : processes_.erase(it);
  }
  std::erase_if(logged_, [&](const auto& kv) {
    int64_t pid = 0;
    return kv.first.rfind("pid ", 0) == 0 && absl::SimpleAtoi(kv.first.substr(4), &pid) &&
           !std::binary_search(pids.begin(), pids.end(), pid);
  });
  std::vector<ProcessSample> samples;
  for (int64_t pid : pids) {
    if (std::optional<ProcessSample> s = SampleProcess(pid, now)) samples.push_back(*s);
  }

  absl::MutexLock lock(&mu_);
  n.sequence = ++sequence_;
  node_ = std::move(n);
  for (ProcessSample& s : samples) {
    auto it = latest_.find(s.pid);
    // An unchanged "not available" is not a new sample (it would be sent
    // again with every batch).
    if (it != latest_.end() && s.reading != Reading::kAvailable &&
        it->second.reading == s.reading && it->second.detail == s.detail) {
      continue;
    }
    s.sequence = ++sequence_;
    latest_[s.pid] = std::move(s);
  }
}

}  // namespace straggler::agent
