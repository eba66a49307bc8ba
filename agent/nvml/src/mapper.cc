#include <algorithm>
#include <cctype>
#include <charconv>

#include "straggler/nvml/telemetry.h"

namespace straggler::nvml {
namespace {

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

bool StartsWithIgnoreCase(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && EqualsIgnoreCase(s.substr(0, prefix.size()), prefix);
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// One CUDA_VISIBLE_DEVICES entry: an index, or a UUID (prefix) as CUDA
// accepts it, "GPU-" optional.
std::optional<uint32_t> Resolve(std::string_view entry, const std::vector<GpuIdentity>& gpus) {
  uint32_t index = 0;
  auto [end, ec] = std::from_chars(entry.data(), entry.data() + entry.size(), index);
  if (ec == std::errc() && end == entry.data() + entry.size()) {
    for (const GpuIdentity& g : gpus) {
      if (g.index == index) return index;
    }
    return std::nullopt;
  }
  std::string with_prefix(entry);
  if (!StartsWithIgnoreCase(entry, "GPU-") && !StartsWithIgnoreCase(entry, "MIG-")) {
    with_prefix = "GPU-" + with_prefix;
  }
  // A prefix must be unique, as CUDA requires.
  std::optional<uint32_t> found;
  for (const GpuIdentity& g : gpus) {
    if (!g.uuid.empty() && StartsWithIgnoreCase(g.uuid, with_prefix)) {
      if (found) return std::nullopt;
      found = g.index;
    }
  }
  return found;
}

}  // namespace

std::optional<uint32_t> MapRankToGpu(const RankDevice& device,
                                     const std::vector<GpuIdentity>& gpus) {
  if (!device.gpu_uuid.empty()) {
    for (const GpuIdentity& g : gpus) {
      if (EqualsIgnoreCase(g.uuid, Trim(device.gpu_uuid))) return g.index;
    }
    return std::nullopt;
  }
  if (!device.cuda_visible_devices.empty()) {
    std::vector<std::string_view> entries;
    std::string_view rest = device.cuda_visible_devices;
    for (;;) {
      const size_t comma = rest.find(',');
      std::string_view entry = Trim(rest.substr(0, comma));
      // CUDA stops at the first entry it cannot use; "-1" hides every GPU.
      if (entry.empty() || entry.front() == '-') break;
      entries.push_back(entry);
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
    if (entries.empty()) return std::nullopt;
    if (entries.size() == 1) return Resolve(entries.front(), gpus);
    if (device.local_rank >= entries.size()) return std::nullopt;
    return Resolve(entries[device.local_rank], gpus);
  }
  for (const GpuIdentity& g : gpus) {
    if (g.index == device.local_rank) return g.index;
  }
  return std::nullopt;
}

}  // namespace straggler::nvml
