#include "straggler/common/process_metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

#include "absl/strings/numbers.h"
#include "straggler/common/metric_family.h"

namespace straggler::common {

namespace {

std::optional<std::string> ReadFile(const char* path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// "VmRSS:     1234 kB" -> 1234 * 1024.
std::optional<double> StatusKb(const std::string& status, std::string_view key) {
  size_t pos = 0;
  while (pos < status.size()) {
    size_t end = status.find('\n', pos);
    if (end == std::string::npos) end = status.size();
    std::string_view line(status.data() + pos, end - pos);
    if (line.substr(0, key.size()) == key && line.size() > key.size() &&
        line[key.size()] == ':') {
      std::istringstream in{std::string(line.substr(key.size() + 1))};
      double kb = 0;
      if (in >> kb) return kb * 1024.0;
      return std::nullopt;
    }
    pos = end + 1;
  }
  return std::nullopt;
}

}  // namespace

ProcessStats ReadProcessStats() {
  ProcessStats p;
  const long ticks = sysconf(_SC_CLK_TCK);
  if (auto stat = ReadFile("/proc/self/stat"); stat && ticks > 0) {
    // Fields after "(comm)", which may itself hold spaces and parentheses.
    const size_t close = stat->rfind(')');
    if (close != std::string::npos) {
      std::istringstream in(stat->substr(close + 1));
      std::vector<std::string> f;
      for (std::string field; in >> field;) f.push_back(field);
      // f[0] is field 3 (state): utime = field 14, stime = 15, starttime = 22.
      if (f.size() > 19) {
        double utime = 0, stime = 0, start = 0;
        if (absl::SimpleAtod(f[11], &utime) && absl::SimpleAtod(f[12], &stime)) {
          p.cpu_seconds = (utime + stime) / static_cast<double>(ticks);
        }
        if (absl::SimpleAtod(f[19], &start)) {
          if (auto proc_stat = ReadFile("/proc/stat")) {
            const size_t at = proc_stat->find("\nbtime ");
            double btime = 0;
            if (at != std::string::npos) {
              std::istringstream b(proc_stat->substr(at + 7));
              if (b >> btime) p.start_time_seconds = btime + start / static_cast<double>(ticks);
            }
          }
        }
      }
    }
  }
  if (auto status = ReadFile("/proc/self/status")) {
    p.resident_memory_bytes = StatusKb(*status, "VmRSS");
    p.virtual_memory_bytes = StatusKb(*status, "VmSize");
  }
  if (DIR* dir = opendir("/proc/self/fd")) {
    double n = 0;
    while (const dirent* e = readdir(dir)) {
      if (e->d_name[0] != '.') ++n;
    }
    closedir(dir);
    p.open_fds = n - 1;  // not counting the descriptor of the listing itself
  }
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    p.max_fds = static_cast<double>(limit.rlim_cur);
  }
  return p;
}

void AddProcessMetrics(const ProcessStats& p, std::vector<prometheus::MetricFamily>& out) {
  using T = prometheus::MetricType;
  auto one = [&](const char* name, T type, const char* help, const std::optional<double>& v) {
    if (v) AddSample(AddFamily(out, name, type, help), {}, *v);
  };
  one("process_cpu_seconds_total", T::Counter,
      "Total user and system CPU time spent in seconds.", p.cpu_seconds);
  one("process_resident_memory_bytes", T::Gauge, "Resident memory size in bytes.",
      p.resident_memory_bytes);
  one("process_virtual_memory_bytes", T::Gauge, "Virtual memory size in bytes.",
      p.virtual_memory_bytes);
  one("process_open_fds", T::Gauge, "Number of open file descriptors.", p.open_fds);
  one("process_max_fds", T::Gauge, "Maximum number of open file descriptors.", p.max_fds);
  one("process_start_time_seconds", T::Gauge,
      "Start time of the process since unix epoch in seconds.", p.start_time_seconds);
}

std::vector<prometheus::MetricFamily> ProcessCollector::Collect() const {
  std::vector<prometheus::MetricFamily> out;
  AddProcessMetrics(ReadProcessStats(), out);
  return out;
}

}  // namespace straggler::common
