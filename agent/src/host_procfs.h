// The /proc files of the agent's host telemetry, parsed (docs/agent.md#host-telemetry).
// Every reader takes the /proc root, so tests point it at a directory of
// fake files; every error names the file and, for a bad value, the value.
//
//   absl::StatusOr<PressureSome> cpu = ReadPressure("/proc", "cpu");
//   // NOT_FOUND: no /proc/pressure/cpu (kernel without PSI)
//   // INVALID_ARGUMENT: "/proc/pressure/cpu: avg10='x' is not a number"
//
// Pure functions of the files' contents; safe from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace straggler::agent::procfs {

// The `some` line of /proc/pressure/<resource>.
struct PressureSome {
  double avg10_percent = 0;  // 0..100, as the kernel writes it
  uint64_t total_us = 0;     // microseconds stalled since boot
};

// The aggregate `cpu` line of /proc/stat, in USER_HZ ticks.
struct CpuTimes {
  uint64_t total = 0;  // user + nice + system + idle + iowait + irq + softirq + steal
  uint64_t steal = 0;  // the 8th value
};

// One thread's counters (/proc/PID/task/TID/{schedstat,status}).
struct ThreadCounters {
  uint64_t run_delay_ns = 0;       // schedstat's 2nd value: runnable, not running
  uint64_t involuntary_switches = 0;  // status's nonvoluntary_ctxt_switches
};

// Parsers of one file's text; `file` only names it in errors.
absl::StatusOr<PressureSome> ParsePressure(absl::string_view text, absl::string_view file);
absl::StatusOr<CpuTimes> ParseCpuTimes(absl::string_view text, absl::string_view file);
absl::StatusOr<uint64_t> ParseRunDelay(absl::string_view text, absl::string_view file);
absl::StatusOr<uint64_t> ParseInvoluntarySwitches(absl::string_view text, absl::string_view file);

// The whole file; NOT_FOUND when it does not exist (also ENOTDIR, and
// EOPNOTSUPP, which a kernel with PSI compiled in but disabled answers),
// UNAVAILABLE for any other read error; both name the path.
absl::StatusOr<std::string> ReadProcFile(const std::string& path);

// <root>/pressure/<resource> (cpu, memory, io).
absl::StatusOr<PressureSome> ReadPressure(const std::string& root, absl::string_view resource);
// <root>/stat.
absl::StatusOr<CpuTimes> ReadCpuTimes(const std::string& root);
// Every thread of process `pid`, by thread id. NOT_FOUND when the process
// does not exist, FAILED_PRECONDITION when the kernel keeps no schedstat; a
// thread that ends while it is read is left out.
absl::StatusOr<std::map<int64_t, ThreadCounters>> ReadProcessThreads(const std::string& root,
                                                                     int64_t pid);

}  // namespace straggler::agent::procfs
