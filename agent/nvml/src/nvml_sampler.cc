#include "straggler/nvml/nvml_sampler.h"

#include <dlfcn.h>

#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nvml_api.h"
#include "spdlog/spdlog.h"

namespace straggler::nvml {
namespace {

constexpr char kDefaultLibrary[] = "libnvidia-ml.so.1";
constexpr double kHzPerMHz = 1e6;

template <class Fn>
bool Resolve(void* handle, const char* name, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(handle, name));
  return *out != nullptr;
}

std::string ErrorText(const detail::NvmlApi& api, detail::nvmlReturn_t rc) {
  const char* s = api.ErrorString(rc);
  return absl::StrCat(s != nullptr ? s : "unknown NVML error", " (nvmlReturn_t ", rc, ")");
}

}  // namespace

NvmlLibrary::NvmlLibrary(std::string path, void* handle, std::unique_ptr<detail::NvmlApi> api)
    : path_(std::move(path)), handle_(handle), api_(std::move(api)) {}

NvmlLibrary::~NvmlLibrary() {
  api_->Shutdown();
  dlclose(handle_);
}

absl::StatusOr<std::unique_ptr<NvmlLibrary>> NvmlLibrary::Open(const std::string& path) {
  // RTLD_LOCAL: NVML's symbols must not satisfy anyone else's lookups.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return absl::NotFoundError(
        absl::StrCat("cannot load NVML library '", path, "': ", why != nullptr ? why : "?"));
  }
  auto api = std::make_unique<detail::NvmlApi>();
  std::string missing;
  auto need = [&](const char* name, auto* fn) {
    if (!Resolve(handle, name, fn)) absl::StrAppend(&missing, missing.empty() ? "" : ", ", name);
  };
  need("nvmlInit_v2", &api->Init_v2);
  need("nvmlShutdown", &api->Shutdown);
  need("nvmlErrorString", &api->ErrorString);
  need("nvmlDeviceGetCount_v2", &api->DeviceGetCount_v2);
  need("nvmlDeviceGetHandleByIndex_v2", &api->DeviceGetHandleByIndex_v2);
  need("nvmlDeviceGetUUID", &api->DeviceGetUUID);
  need("nvmlDeviceGetClockInfo", &api->DeviceGetClockInfo);
  need("nvmlDeviceGetMaxClockInfo", &api->DeviceGetMaxClockInfo);
  need("nvmlDeviceGetTemperature", &api->DeviceGetTemperature);
  need("nvmlDeviceGetPowerUsage", &api->DeviceGetPowerUsage);
  need("nvmlDeviceGetEnforcedPowerLimit", &api->DeviceGetEnforcedPowerLimit);
  need("nvmlDeviceGetUtilizationRates", &api->DeviceGetUtilizationRates);
  need("nvmlDeviceGetTotalEccErrors", &api->DeviceGetTotalEccErrors);
  // Renamed in NVML 12.2; drivers before it have only the old name.
  if (!Resolve(handle, "nvmlDeviceGetCurrentClocksEventReasons",
               &api->DeviceGetCurrentClocksEventReasons)) {
    need("nvmlDeviceGetCurrentClocksThrottleReasons", &api->DeviceGetCurrentClocksEventReasons);
  }
  if (!missing.empty()) {
    dlclose(handle);
    return absl::FailedPreconditionError(absl::StrCat(
        "NVML library '", path, "' lacks the symbol(s) ", missing, " (driver too old?)"));
  }
  if (detail::nvmlReturn_t rc = api->Init_v2(); rc != detail::NVML_SUCCESS) {
    std::string why = ErrorText(*api, rc);
    dlclose(handle);
    return absl::FailedPreconditionError(
        absl::StrCat("nvmlInit_v2 from '", path, "' failed: ", why));
  }
  return std::unique_ptr<NvmlLibrary>(new NvmlLibrary(path, handle, std::move(api)));
}

absl::StatusOr<uint32_t> NvmlLibrary::DeviceCount() const {
  unsigned int n = 0;
  if (detail::nvmlReturn_t rc = api_->DeviceGetCount_v2(&n); rc != detail::NVML_SUCCESS) {
    return absl::UnavailableError(absl::StrCat("nvmlDeviceGetCount_v2 failed: ", ErrorText(*api_, rc)));
  }
  return n;
}

absl::StatusOr<GpuSample> NvmlLibrary::Sample(uint32_t index) const {
  const detail::NvmlApi& api = *api_;
  detail::nvmlDevice_t dev = nullptr;
  if (detail::nvmlReturn_t rc = api.DeviceGetHandleByIndex_v2(index, &dev);
      rc != detail::NVML_SUCCESS) {
    return absl::UnavailableError(absl::StrCat("nvmlDeviceGetHandleByIndex_v2(", index,
                                               ") failed: ", ErrorText(api, rc)));
  }
  GpuSample s;
  s.gpu_index = index;
  s.sample_time = std::chrono::system_clock::now();
  char uuid[detail::kUuidBufferSize] = {};
  if (detail::nvmlReturn_t rc = api.DeviceGetUUID(dev, uuid, sizeof uuid);
      rc != detail::NVML_SUCCESS) {
    // Without the UUID a rank's reported UUID cannot be matched: treat the
    // device as unreachable rather than publish an anonymous sample.
    return absl::UnavailableError(
        absl::StrCat("nvmlDeviceGetUUID(gpu ", index, ") failed: ", ErrorText(api, rc)));
  }
  uuid[sizeof uuid - 1] = '\0';
  s.uuid = uuid;

  // Every other query is best effort: an error (NOT_SUPPORTED on consumer
  // boards, NO_PERMISSION in containers) leaves just that field absent.
  unsigned int v = 0;
  if (api.DeviceGetClockInfo(dev, detail::NVML_CLOCK_SM, &v) == detail::NVML_SUCCESS)
    s.sm_clock_hertz = v * kHzPerMHz;
  if (api.DeviceGetMaxClockInfo(dev, detail::NVML_CLOCK_SM, &v) == detail::NVML_SUCCESS)
    s.max_sm_clock_hertz = v * kHzPerMHz;
  if (api.DeviceGetClockInfo(dev, detail::NVML_CLOCK_MEM, &v) == detail::NVML_SUCCESS)
    s.memory_clock_hertz = v * kHzPerMHz;
  if (api.DeviceGetTemperature(dev, detail::NVML_TEMPERATURE_GPU, &v) == detail::NVML_SUCCESS)
    s.temperature_celsius = v;
  if (api.DeviceGetPowerUsage(dev, &v) == detail::NVML_SUCCESS) s.power_watts = v / 1000.0;
  if (api.DeviceGetEnforcedPowerLimit(dev, &v) == detail::NVML_SUCCESS)
    s.power_limit_watts = v / 1000.0;
  detail::nvmlUtilization_t util{};
  if (api.DeviceGetUtilizationRates(dev, &util) == detail::NVML_SUCCESS) {
    s.gpu_utilization = util.gpu / 100.0;
    s.memory_utilization = util.memory / 100.0;
  }
  unsigned long long bits = 0;
  if (api.DeviceGetCurrentClocksEventReasons(dev, &bits) == detail::NVML_SUCCESS)
    s.clock_event_reasons = bits;
  // Volatile counters: errors since the driver loaded, what a slowdown now
  // can relate to (aggregate counts include years-old errors).
  if (api.DeviceGetTotalEccErrors(dev, detail::NVML_MEMORY_ERROR_TYPE_CORRECTED,
                                  detail::NVML_VOLATILE_ECC, &bits) == detail::NVML_SUCCESS)
    s.ecc_corrected_errors = bits;
  if (api.DeviceGetTotalEccErrors(dev, detail::NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                  detail::NVML_VOLATILE_ECC, &bits) == detail::NVML_SUCCESS)
    s.ecc_uncorrected_errors = bits;
  return s;
}

std::unique_ptr<NvmlSampler> NvmlSampler::Start(const Options& options) {
  std::unique_ptr<NvmlSampler> sampler(new NvmlSampler());
  sampler->interval_ = options.interval.count() > 0 ? options.interval : std::chrono::seconds(1);
  std::string path = options.library;
  if (path.empty()) {
    const char* env = std::getenv("STRAGGLER_NVML_LIBRARY");
    path = env != nullptr && *env != '\0' ? env : kDefaultLibrary;
  }
  auto library = NvmlLibrary::Open(path);
  if (!library.ok()) {
    sampler->disabled_reason_ = std::string(library.status().message());
    spdlog::warn("GPU telemetry off: {}", sampler->disabled_reason_);
    return sampler;
  }
  auto count = (*library)->DeviceCount();
  if (!count.ok()) {
    sampler->disabled_reason_ = std::string(count.status().message());
    spdlog::warn("GPU telemetry off: {}", sampler->disabled_reason_);
    return sampler;
  }
  sampler->library_ = *std::move(library);
  {
    // Uncontended (no thread yet); taken so that the analysis sees the writes.
    absl::MutexLock lock(&sampler->mu_);
    sampler->latest_.resize(*count);
    sampler->sequence_.assign(*count, 0);
    sampler->logged_errors_.resize(*count);
  }
  spdlog::info("GPU telemetry on: {} GPU(s) through '{}', sampled every {} ms", *count, path,
               sampler->interval_.count());
  sampler->SampleNow();
  sampler->thread_ = std::thread([s = sampler.get()] { s->Run(); });
  return sampler;
}

NvmlSampler::~NvmlSampler() {
  {
    // Run's wait sees stop_ as the lock is released: no condition variable.
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void NvmlSampler::Run() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::FromChrono(interval_))) return;
    }
    SampleNow();
  }
}

void NvmlSampler::SampleNow() {
  if (!library_) return;
  size_t gpus = 0;  // fixed by Start
  {
    absl::MutexLock lock(&mu_);
    gpus = latest_.size();
  }
  for (uint32_t i = 0; i < gpus; ++i) {
    // NVML calls without mu_: a slow driver must not stall ForRank.
    absl::StatusOr<GpuSample> s = library_->Sample(i);
    absl::MutexLock lock(&mu_);
    if (!s.ok()) {
      // The previous sample stays (the daemon ages it out); log once per
      // distinct error, not once per interval.
      if (logged_errors_[i] != s.status().message()) {
        logged_errors_[i] = std::string(s.status().message());
        spdlog::warn("GPU telemetry: {}", logged_errors_[i]);
      }
      continue;
    }
    logged_errors_[i].clear();
    s->sequence = ++sequence_[i];
    latest_[i] = *std::move(s);
  }
}

std::optional<GpuSample> NvmlSampler::Latest(uint32_t gpu_index) const {
  absl::MutexLock lock(&mu_);
  if (gpu_index >= latest_.size()) return std::nullopt;
  return latest_[gpu_index];
}

std::vector<GpuIdentity> NvmlSampler::Gpus() const {
  absl::MutexLock lock(&mu_);
  std::vector<GpuIdentity> out;
  for (uint32_t i = 0; i < latest_.size(); ++i) {
    // A GPU never sampled has no UUID yet: matchable by index only.
    out.push_back({i, latest_[i] ? latest_[i]->uuid : std::string()});
  }
  return out;
}

std::optional<GpuSample> NvmlSampler::ForRank(const RankDevice& device) const {
  if (!library_) return std::nullopt;
  std::optional<uint32_t> index = MapRankToGpu(device, Gpus());
  if (!index) return std::nullopt;
  return Latest(*index);
}

}  // namespace straggler::nvml
