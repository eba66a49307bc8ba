// The agent's host telemetry (docs/agent.md#host-telemetry): a thread that
// reads, without root, the node's pressure (PSI) and CPU steal and the
// trainer processes' run delay and involuntary context switches from /proc,
// as rates over each sample period.
//
//   HostSampler::Options o;
//   o.proc_root = "/proc";               // tests: a directory of fake files
//   std::unique_ptr<HostSampler> host = HostSampler::Start(o);
//   std::optional<NodeSample> node = host->Node();
//   std::optional<ProcessSample> p = host->ForPid(pid);  // starts watching pid
//
// What the kernel does not provide is an explicit kNotAvailable (logged
// once), never a zero: no /proc/pressure on a kernel without PSI.
//
// Thread-safe: Node, ForPid and SampleNow may be called from any thread;
// the destructor stops and joins the sampling thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "host_procfs.h"

namespace straggler::agent {

enum class Reading { kAvailable, kNotAvailable, kError };

// One resource's pressure: the `some` line of /proc/pressure/<resource>.
struct PressureReading {
  Reading reading = Reading::kNotAvailable;
  std::string detail;                // why not kAvailable: the file and the reason
  std::optional<double> some_avg10;  // 0..1
  std::optional<double> some_share;  // 0..1 of the period; absent on the first sample
};

struct NodeSample {
  uint64_t sequence = 0;  // unique among the sampler's samples, node and process
  std::chrono::system_clock::time_point sample_time{};
  double period_seconds = 0;  // since the previous sample; 0 on the first
  PressureReading cpu, memory, io;
  Reading steal_reading = Reading::kNotAvailable;
  std::string steal_detail;
  std::optional<double> cpu_steal_share;  // 0..1 of all CPUs' time in the period
};

struct ProcessSample {
  uint64_t sequence = 0;
  int64_t pid = 0;
  std::chrono::system_clock::time_point sample_time{};
  double period_seconds = 0;
  Reading reading = Reading::kAvailable;
  std::string detail;
  // Summed over the process's threads (so it may exceed 1).
  std::optional<double> run_delay_seconds_per_second;
  std::optional<double> involuntary_switches_per_second;
};

class HostSampler {
 public:
  struct Options {
    std::string proc_root = "/proc";
    std::chrono::milliseconds interval{1000};
    // A process nobody asked about (ForPid) for this long is no longer read.
    std::chrono::milliseconds forget_after{60000};
    bool start_thread = true;  // false: only SampleNow samples (tests)
  };

  // Never null. Takes the first sample before it returns and logs one line
  // (on, root, interval, and what is not available).
  static std::unique_ptr<HostSampler> Start(const Options& options);
  ~HostSampler();
  HostSampler(const HostSampler&) = delete;
  HostSampler& operator=(const HostSampler&) = delete;

  // The latest node sample (present from Start on).
  std::optional<NodeSample> Node() const ABSL_LOCKS_EXCLUDED(mu_);
  // The latest sample of process `pid` with rates (two readings apart) or
  // with an error; nullopt before that. The first call starts reading it.
  std::optional<ProcessSample> ForPid(int64_t pid) ABSL_LOCKS_EXCLUDED(mu_);
  // Reads everything now (the thread does this every interval).
  void SampleNow() ABSL_LOCKS_EXCLUDED(mu_, sample_mu_);

  const std::string& proc_root() const { return options_.proc_root; }

 private:
  explicit HostSampler(const Options& options) : options_(options) {}
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  PressureReading SamplePressure(const char* resource, size_t index, double period)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(sample_mu_);
  std::optional<ProcessSample> SampleProcess(int64_t pid, std::chrono::steady_clock::time_point now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(sample_mu_);
  // Logs `message` at warn level once per distinct message per `key`.
  void LogOnce(const std::string& key, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(sample_mu_);

  const Options options_;

  // The readers' previous counters: SampleNow's alone.
  struct ProcessState {
    std::chrono::steady_clock::time_point at{};
    std::map<int64_t, procfs::ThreadCounters> threads;
  };
  absl::Mutex sample_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::optional<std::chrono::steady_clock::time_point> node_at_ ABSL_GUARDED_BY(sample_mu_);
  std::optional<procfs::PressureSome> pressure_[3] ABSL_GUARDED_BY(sample_mu_);
  std::optional<procfs::CpuTimes> cpu_ ABSL_GUARDED_BY(sample_mu_);
  std::map<int64_t, ProcessState> processes_ ABSL_GUARDED_BY(sample_mu_);
  std::map<std::string, std::string> logged_ ABSL_GUARDED_BY(sample_mu_);
  bool started_ ABSL_GUARDED_BY(sample_mu_) = false;  // Start logged its line: log changes

  // What readers see.
  mutable absl::Mutex mu_;
  uint64_t sequence_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<NodeSample> node_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, ProcessSample> latest_ ABSL_GUARDED_BY(mu_);
  // Watched processes: when ForPid last asked about each.
  std::map<int64_t, std::chrono::steady_clock::time_point> watched_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace straggler::agent
