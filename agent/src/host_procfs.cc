// /proc parsers of the host telemetry: see host_procfs.h.
#include "host_procfs.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <optional>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace straggler::agent::procfs {
namespace {

absl::StatusOr<uint64_t> Count(absl::string_view value, absl::string_view file,
                               absl::string_view name) {
  uint64_t v = 0;
  if (!absl::SimpleAtoi(value, &v)) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": ", name, "='", value,
                                                   "' is not a non-negative integer"));
  }
  return v;
}

std::vector<absl::string_view> Fields(absl::string_view line) {
  return absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
}

// The first line of `text` whose first field is `key`.
std::optional<absl::string_view> LineOf(absl::string_view text, absl::string_view key) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::vector<absl::string_view> f = Fields(line);
    if (!f.empty() && f[0] == key) return line;
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<PressureSome> ParsePressure(absl::string_view text, absl::string_view file) {
  std::optional<absl::string_view> line = LineOf(text, "some");
  if (!line) return absl::InvalidArgumentError(absl::StrCat(file, ": no 'some' line"));
  std::optional<absl::string_view> avg10, total;
  for (absl::string_view field : Fields(*line)) {
    if (absl::ConsumePrefix(&field, "avg10=")) avg10 = field;
    if (absl::ConsumePrefix(&field, "total=")) total = field;
  }
  if (!avg10 || !total) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": the 'some' line lacks ", !avg10 ? "avg10=" : "total=", ": '",
                     *line, "'"));
  }
  PressureSome out;
  if (!absl::SimpleAtod(*avg10, &out.avg10_percent) ||
      !(out.avg10_percent >= 0 && out.avg10_percent <= 100)) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": avg10='", *avg10, "' is not a percentage in [0, 100]"));
  }
  absl::StatusOr<uint64_t> t = Count(*total, file, "total");
  if (!t.ok()) return t.status();
  out.total_us = *t;
  return out;
}

absl::StatusOr<CpuTimes> ParseCpuTimes(absl::string_view text, absl::string_view file) {
  std::optional<absl::string_view> line = LineOf(text, "cpu");
  if (!line) return absl::InvalidArgumentError(absl::StrCat(file, ": no 'cpu' line"));
  std::vector<absl::string_view> f = Fields(*line);
  // cpu user nice system idle iowait irq softirq steal [guest guest_nice]:
  // guest time is already inside user and nice, so the first 8 are the total.
  constexpr size_t kValues = 8;
  if (f.size() < 1 + kValues) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": the cpu line has ", f.size() - 1,
                                                   " values, steal is the 8th: '", *line, "'"));
  }
  static constexpr const char* kNames[kValues] = {"user", "nice",    "system", "idle",
                                                  "iowait", "irq", "softirq", "steal"};
  CpuTimes out;
  for (size_t i = 0; i < kValues; ++i) {
    absl::StatusOr<uint64_t> v = Count(f[1 + i], file, absl::StrCat("cpu ", kNames[i]));
    if (!v.ok()) return v.status();
    out.total += *v;
    if (i == kValues - 1) out.steal = *v;
  }
  return out;
}

absl::StatusOr<uint64_t> ParseRunDelay(absl::string_view text, absl::string_view file) {
  // "<on-cpu ns> <run delay ns> <timeslices>"
  std::vector<absl::string_view> f = Fields(absl::StripAsciiWhitespace(text));
  if (f.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": expected 3 values, run delay the 2nd: '", text, "'"));
  }
  return Count(f[1], file, "run delay");
}

absl::StatusOr<uint64_t> ParseInvoluntarySwitches(absl::string_view text, absl::string_view file) {
  std::optional<absl::string_view> line = LineOf(text, "nonvoluntary_ctxt_switches:");
  if (!line) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": no nonvoluntary_ctxt_switches line"));
  }
  std::vector<absl::string_view> f = Fields(*line);
  return Count(f.size() > 1 ? f[1] : "", file, "nonvoluntary_ctxt_switches");
}

absl::StatusOr<std::string> ReadProcFile(const std::string& path) {
  // open/read rather than a stream: the errno decides "not available" (a
  // kernel with PSI compiled in but disabled opens the file, then fails the
  // read with EOPNOTSUPP) from a real error.
  auto fail = [&](absl::string_view what, int e) -> absl::Status {
    const std::string why = absl::StrCat(path, ": ", what, std::strerror(e));
    if (e == ENOENT || e == ENOTDIR || e == EOPNOTSUPP || e == ESRCH) {
      return absl::NotFoundError(why);
    }
    return absl::UnavailableError(why);
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail("", errno);
  std::string text;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      return fail("read failed: ", e);
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

absl::StatusOr<PressureSome> ReadPressure(const std::string& root, absl::string_view resource) {
  const std::string path = absl::StrCat(root, "/pressure/", resource);
  absl::StatusOr<std::string> text = ReadProcFile(path);
  if (!text.ok()) return text.status();
  return ParsePressure(*text, path);
}

absl::StatusOr<CpuTimes> ReadCpuTimes(const std::string& root) {
  const std::string path = absl::StrCat(root, "/stat");
  absl::StatusOr<std::string> text = ReadProcFile(path);
  if (!text.ok()) return text.status();
  return ParseCpuTimes(*text, path);
}

absl::StatusOr<std::map<int64_t, ThreadCounters>> ReadProcessThreads(const std::string& root,
                                                                     int64_t pid) {
  const std::string tasks = absl::StrCat(root, "/", pid, "/task");
  std::error_code ec;
  std::filesystem::directory_iterator it(tasks, ec);
  if (ec) {
    const std::string why = absl::StrCat(tasks, ": ", ec.message());
    if (ec == std::errc::no_such_file_or_directory || ec == std::errc::no_such_process) {
      return absl::NotFoundError(why);
    }
    return absl::UnavailableError(why);
  }
  std::map<int64_t, ThreadCounters> out;
  for (const auto& entry : it) {
    int64_t tid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &tid)) continue;
    const std::string dir = entry.path().string();
    absl::StatusOr<std::string> sched = ReadProcFile(dir + "/schedstat");
    absl::StatusOr<std::string> status = ReadProcFile(dir + "/status");
    // A thread that ended between the listing and the read.
    if (absl::IsNotFound(status.status())) continue;
    if (!status.ok()) return status.status();
    if (absl::IsNotFound(sched.status())) {
      return absl::FailedPreconditionError(absl::StrCat(
          sched.status().message(), " (a kernel without CONFIG_SCHED_INFO has no run delay)"));
    }
    if (!sched.ok()) return sched.status();
    absl::StatusOr<uint64_t> delay = ParseRunDelay(*sched, dir + "/schedstat");
    if (!delay.ok()) return delay.status();
    absl::StatusOr<uint64_t> switches = ParseInvoluntarySwitches(*status, dir + "/status");
    if (!switches.ok()) return switches.status();
    out[tid] = {*delay, *switches};
  }
  return out;
}

}  // namespace straggler::agent::procfs
