// NVML, loaded at run time, and a thread that samples every GPU of the node.
//
//   NvmlSampler::Options o;                 // library from STRAGGLER_NVML_LIBRARY, else
//   o.interval = std::chrono::seconds(1);   // "libnvidia-ml.so.1"
//   std::unique_ptr<NvmlSampler> gpus = NvmlSampler::Start(o);  // never null
//   if (!gpus->enabled()) { /* GPU-less host: one log line was written */ }
//   std::optional<GpuSample> s = gpus->ForRank(device);
//
// dlopen() instead of linking libnvidia-ml, so the same agent binary runs on
// hosts without the NVIDIA driver: there, Start logs one line and telemetry
// stays off (ForRank answers nullopt).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "straggler/nvml/telemetry.h"

namespace straggler::nvml {

namespace detail {
struct NvmlApi;  // the resolved entry points (src/nvml_api.h)
}

// An initialised NVML: dlopen, the entry points the sampler uses, nvmlInit_v2.
// Thread safety: NVML's device queries are thread-safe; this class adds no
// state after Open, so Sample/DeviceCount may run concurrently.
class NvmlLibrary {
 public:
  // Loads `path` and resolves every entry point used. Errors name the path
  // and, for a missing symbol, the symbol; nvmlInit_v2 failing names NVML's
  // own error string. NOT_FOUND when the library cannot be loaded at all (a
  // GPU-less host), FAILED_PRECONDITION for the rest.
  static absl::StatusOr<std::unique_ptr<NvmlLibrary>> Open(const std::string& path);
  ~NvmlLibrary();  // nvmlShutdown, dlclose
  NvmlLibrary(const NvmlLibrary&) = delete;
  NvmlLibrary& operator=(const NvmlLibrary&) = delete;

  const std::string& path() const { return path_; }
  absl::StatusOr<uint32_t> DeviceCount() const;
  // One reading of GPU `index`: a field whose query NVML answers with an
  // error (NOT_SUPPORTED, NO_PERMISSION, ...) stays nullopt. Errors only when
  // the device itself cannot be reached (handle or UUID), naming the index
  // and NVML's error string.
  absl::StatusOr<GpuSample> Sample(uint32_t index) const;

 private:
  NvmlLibrary(std::string path, void* handle, std::unique_ptr<detail::NvmlApi> api);
  std::string path_;
  void* handle_;
  std::unique_ptr<detail::NvmlApi> api_;
};

// Samples every GPU of the node every `interval` on its own thread and keeps
// the latest sample per GPU. Thread-safe: ForRank/Latest may be called from
// any thread; the destructor stops and joins the thread.
class NvmlSampler final : public TelemetrySource {
 public:
  struct Options {
    // "" = $STRAGGLER_NVML_LIBRARY, else "libnvidia-ml.so.1".
    std::string library;
    std::chrono::milliseconds interval{1000};
  };

  // Never null. When NVML cannot be opened, logs one line saying why and
  // returns a sampler with telemetry off (enabled() false, no thread).
  // The first sample of every GPU is taken before Start returns.
  static std::unique_ptr<NvmlSampler> Start(const Options& options);
  ~NvmlSampler() override;

  bool enabled() const { return library_ != nullptr; }
  // Why telemetry is off ("" when on).
  const std::string& disabled_reason() const { return disabled_reason_; }
  std::optional<GpuSample> ForRank(const RankDevice& device) const override;
  std::optional<GpuSample> Latest(uint32_t gpu_index) const;
  std::vector<GpuIdentity> Gpus() const;
  // Samples every GPU now (the thread does this every interval).
  void SampleNow() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  NvmlSampler() = default;
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  std::unique_ptr<NvmlLibrary> library_;
  std::string disabled_reason_;
  std::chrono::milliseconds interval_{1000};

  mutable absl::Mutex mu_;
  std::vector<std::optional<GpuSample>> latest_ ABSL_GUARDED_BY(mu_);  // by NVML index
  std::vector<uint64_t> sequence_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> logged_errors_ ABSL_GUARDED_BY(mu_);  // per GPU, last error logged
  bool stop_ ABSL_GUARDED_BY(mu_) = false;  // Run's wait ends when it is set
  std::thread thread_;
};

}  // namespace straggler::nvml
