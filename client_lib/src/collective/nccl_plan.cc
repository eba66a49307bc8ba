#include "nccl_plan.h"

#include <algorithm>
#include <sstream>

namespace straggler::detail {

std::string SetText(const std::vector<uint32_t>& ranks) {
  std::ostringstream out;
  out << "{";
  for (size_t i = 0; i < ranks.size(); ++i) out << (i ? "," : "") << ranks[i];
  out << "}";
  return out.str();
}

std::optional<std::vector<int>> ShrinkExcludeList(const std::vector<uint32_t>& parent,
                                                  const std::vector<uint32_t>& child) {
  if (child.empty()) return std::nullopt;
  for (uint32_t r : child)
    if (!std::binary_search(parent.begin(), parent.end(), r)) return std::nullopt;
  std::vector<int> exclude;
  for (size_t i = 0; i < parent.size(); ++i)
    if (!std::binary_search(child.begin(), child.end(), parent[i])) exclude.push_back(static_cast<int>(i));
  return exclude;
}

CommPlan PlanCommunicator(bool previously_participating, const std::vector<uint32_t>& previous,
                          bool participating, const std::vector<uint32_t>& now) {
  CommPlan p;
  if (!participating) return p;
  if (previously_participating && previous == now) {
    p.how = CommPlan::How::kReuse;
    return p;
  }
  if (previously_participating) {
    if (auto exclude = ShrinkExcludeList(previous, now)) {
      p.how = CommPlan::How::kShrink;
      p.exclude = std::move(*exclude);
      return p;
    }
  }
  p.how = CommPlan::How::kInit;
  return p;
}

std::string CommIdKey(const std::string& run_id, uint64_t version, const std::vector<uint32_t>& set,
                      std::optional<uint64_t> retry_iteration) {
  std::string key = "nccl/" + run_id + "/v" + std::to_string(version) + "/" + SetText(set);
  if (retry_iteration) key += "/i" + std::to_string(*retry_iteration);
  return key + "/id";
}

std::string FullCommIdKey(const std::string& run_id, uint32_t world_size) {
  return "nccl/" + run_id + "/full/w" + std::to_string(world_size) + "/id";
}

}  // namespace straggler::detail
