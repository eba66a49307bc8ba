#include "nccl_plan.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace straggler::detail {

std::string SetText(const std::vector<uint32_t>& ranks) {
  std::ostringstream out;
  out << "{";
  for (size_t i = 0; i < ranks.size(); ++i) out << (i ? "," : "") << ranks[i];
  out << "}";
  return out.str();
}

std::string SetKey(const std::vector<uint32_t>& ranks) {
  std::string text = SetText(ranks);
  if (text.size() <= kSetKeyTextBytes) return text;
  uint64_t h = 14695981039346656037ull;  // FNV-1a 64, as the agreement's fingerprint
  for (uint32_t r : ranks) {
    for (int i = 0; i < 4; ++i) {
      h ^= (r >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return "n" + std::to_string(ranks.size()) + "h" + hex;
}

std::string NcclVersionText(int code) {
  return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." + std::to_string(code % 100);
}

NcclFeatures ChooseNcclFeatures(int compiled_code, int runtime_code, bool revoke_symbol, bool grow_symbol) {
  NcclFeatures f;
  f.compiled_code = compiled_code;
  f.runtime_code = runtime_code;
  f.revoke = compiled_code >= kNcclRevokeSince && runtime_code >= kNcclRevokeSince && revoke_symbol;
  f.grow = compiled_code >= kNcclGrowSince && runtime_code >= kNcclGrowSince && grow_symbol;
  return f;
}

std::string NcclFeatures::Describe() const {
  auto why_not = [&](int since, bool on) -> std::string {
    if (on) return "yes";
    std::string need = ">= " + NcclVersionText(since);
    if (compiled_code < since) return "no (built against " + NcclVersionText(compiled_code) + ", needs " + need + ")";
    if (runtime_code < since) return "no (the loaded libnccl is " + NcclVersionText(runtime_code) + ", needs " + need + ")";
    return "no (the symbol is missing from the loaded libnccl)";
  };
  return "NCCL " + NcclVersionText(runtime_code) + " (built against " + NcclVersionText(compiled_code) +
         "): ncclCommRevoke " + why_not(kNcclRevokeSince, revoke) + ", ncclCommGrow " + why_not(kNcclGrowSince, grow);
}

std::optional<std::vector<int>> ShrinkExcludeList(const std::vector<uint32_t>& parent,
                                                  const std::vector<uint32_t>& child) {
  if (child.empty()) return std::nullopt;
  for (uint32_t r : child)
    if (std::find(parent.begin(), parent.end(), r) == parent.end()) return std::nullopt;
  std::vector<int> exclude;
  for (size_t i = 0; i < parent.size(); ++i)
    if (!std::binary_search(child.begin(), child.end(), parent[i])) exclude.push_back(static_cast<int>(i));
  return exclude;
}

std::vector<uint32_t> OrderAfterShrink(const std::vector<uint32_t>& parent, const std::vector<uint32_t>& child) {
  std::vector<uint32_t> order;
  for (uint32_t r : parent)
    if (std::binary_search(child.begin(), child.end(), r)) order.push_back(r);
  return order;
}

std::vector<uint32_t> OrderAfterGrow(const std::vector<uint32_t>& parent, const std::vector<uint32_t>& child) {
  std::vector<uint32_t> order = parent;
  for (uint32_t r : child)
    if (std::find(parent.begin(), parent.end(), r) == parent.end()) order.push_back(r);
  return order;
}

int CommRankOf(const std::vector<uint32_t>& order, uint32_t rank) {
  const auto it = std::find(order.begin(), order.end(), rank);
  return it == order.end() ? -1 : static_cast<int>(it - order.begin());
}

const char* HowText(CommPlan::How how) {
  switch (how) {
    case CommPlan::How::kNone: return "none";
    case CommPlan::How::kReuse: return "reuse";
    case CommPlan::How::kShrink: return "ncclCommShrink";
    case CommPlan::How::kGrow: return "ncclCommGrow";
    case CommPlan::How::kInit: return "ncclCommInitRankConfig";
  }
  return "?";
}

CommPlan PlanCommunicator(bool previously_participating, const std::vector<uint32_t>& previous,
                          bool participating, const std::vector<uint32_t>& now, bool grow) {
  CommPlan p;
  if (!participating) return p;
  std::vector<uint32_t> previous_sorted = previous;
  std::sort(previous_sorted.begin(), previous_sorted.end());
  if (previously_participating && previous_sorted == now) {
    p.how = CommPlan::How::kReuse;
    return p;
  }
  if (previously_participating) {
    if (auto exclude = ShrinkExcludeList(previous, now)) {
      p.how = CommPlan::How::kShrink;
      p.exclude = std::move(*exclude);
      return p;
    }
    const bool only_gained = std::includes(now.begin(), now.end(), previous_sorted.begin(), previous_sorted.end());
    if (grow && only_gained && previous.size() > 1 && now.front() == previous_sorted.front()) {
      p.how = CommPlan::How::kGrow;
      return p;
    }
  }
  p.how = CommPlan::How::kInit;
  return p;
}

namespace {
void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint32_t GetU32(const std::string& in, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(in[at + i])) << (8 * i);
  return v;
}
}  // namespace

// 'I' or 'G', the id, then (kGrow) the parent order as little-endian u32s.
std::string EncodeRecord(const ReadmissionRecord& record) {
  std::string out(1, record.how == CommPlan::How::kGrow ? 'G' : 'I');
  out += record.id;
  if (record.how == CommPlan::How::kGrow)
    for (uint32_t r : record.parent_order) PutU32(out, r);
  return out;
}

std::optional<ReadmissionRecord> DecodeRecord(const std::string& bytes, size_t id_bytes, std::string* error) {
  auto fail = [&](const std::string& why) -> std::optional<ReadmissionRecord> {
    if (error) *error = why;
    return std::nullopt;
  };
  if (bytes.size() < 1 + id_bytes) {
    return fail("holds " + std::to_string(bytes.size()) + " bytes, a communicator record has at least " +
                std::to_string(1 + id_bytes));
  }
  ReadmissionRecord r;
  if (bytes[0] == 'I') {
    if (bytes.size() != 1 + id_bytes) return fail("an init record of " + std::to_string(bytes.size()) + " bytes");
    r.how = CommPlan::How::kInit;
  } else if (bytes[0] == 'G') {
    const size_t rest = bytes.size() - 1 - id_bytes;
    if (rest == 0 || rest % 4 != 0) return fail("a grow record with " + std::to_string(rest) + " bytes of parent ranks");
    r.how = CommPlan::How::kGrow;
    for (size_t at = 1 + id_bytes; at < bytes.size(); at += 4) r.parent_order.push_back(GetU32(bytes, at));
  } else {
    return fail("starts with byte " + std::to_string(static_cast<unsigned char>(bytes[0])) + ", not 'I' or 'G'");
  }
  r.id = bytes.substr(1, id_bytes);
  return r;
}

std::string CommIdKey(const std::string& run_id, uint64_t version, const std::vector<uint32_t>& set,
                      std::optional<uint64_t> retry_iteration) {
  std::string key = "nccl/" + run_id + "/v" + std::to_string(version) + "/" + SetKey(set);
  if (retry_iteration) key += "/i" + std::to_string(*retry_iteration);
  return key + "/id";
}

std::string FullCommIdKey(const std::string& run_id, uint32_t world_size) {
  return "nccl/" + run_id + "/full/w" + std::to_string(world_size) + "/id";
}

}  // namespace straggler::detail
