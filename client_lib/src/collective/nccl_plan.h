// The CUDA-free decisions of the NCCL backend of PartialAllReduce: which
// NCCL membership calls the build and the loaded libnccl allow (revoke,
// grow), how a rank gets the communicator of a new active set (reuse,
// ncclCommShrink or ncclCommGrow of the current one, or a fresh
// ncclCommInitRank), the exclude list handed to ncclCommShrink, the record a
// coordinator publishes for a readmission, the rendezvous key of a
// communicator id, and the bounded cache of communicators. Kept apart from
// nccl_partial_allreduce.cc so that tests/collective/nccl_plan_test.cc pins
// them on machines without CUDA.
//
//   NcclFeatures f = ChooseNcclFeatures(NCCL_VERSION_CODE, runtime_code, has_revoke, has_grow);
//   CommPlan p = PlanCommunicator(prev_participating, prev_order, participating, new_set, f.grow);
//   if (p.how == CommPlan::How::kShrink) ncclCommShrink(current, p.exclude.data(), ...);
//
// Not thread-safe: used by the one thread that drives a PartialAllReduce.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <optional>
#include <string>
#include <vector>

namespace straggler::detail {

// "{0,1,3}": how sets appear in error messages.
std::string SetText(const std::vector<uint32_t>& ranks);
// How a set appears in rendezvous keys: SetText while that is at most
// kSetKeyTextBytes, else "n<size>h<FNV-1a 64 of the ranks, hex>", so a key
// stays within the daemon's rendezvous.max_key_bytes (512 by default) for
// any world size: a set's text grows ~4 bytes a rank (~100 ranks passed 512).
inline constexpr size_t kSetKeyTextBytes = 64;
std::string SetKey(const std::vector<uint32_t>& ranks);

// NCCL_VERSION_CODE of NCCL >= 2.9 (major*10000 + minor*100 + patch).
constexpr int NcclCode(int major, int minor, int patch) { return major * 10000 + minor * 100 + patch; }
// "2.28.9" for 22809.
std::string NcclVersionText(int code);

inline constexpr int kNcclRevokeSince = NcclCode(2, 28, 7);  // ncclCommRevoke
inline constexpr int kNcclGrowSince = NcclCode(2, 29, 0);    // ncclCommGrow, ncclCommGetUniqueId

// Which membership calls the backend uses. Each needs all three: the
// headers built against declare it (compiled_code), the libnccl.so.2 loaded
// in this process is new enough (runtime_code, ncclGetVersion: in a PyTorch
// process usually torch's bundled NCCL, not the one built against), and the
// symbol resolves in that library (the backend never links it directly, so
// it loads against an older libnccl too).
struct NcclFeatures {
  bool revoke = false;  // stop a failed collective with ncclCommRevoke, keep the comm to shrink
  bool grow = false;    // readmission by ncclCommGrow of the previous set's communicator
  int compiled_code = 0;
  int runtime_code = 0;
  // "NCCL 2.28.9 (built against 2.28.9): revoke yes, grow no (needs >= 2.29.0 ...)".
  std::string Describe() const;
};
NcclFeatures ChooseNcclFeatures(int compiled_code, int runtime_code, bool revoke_symbol, bool grow_symbol);

// The ranks of `parent` that are not in `child` (ascending), as positions in
// `parent` - the rank numbering of the parent communicator that
// ncclCommShrink expects. `parent` is in communicator order (ascending,
// unless it was grown: ncclCommGrow appends the new ranks). nullopt when
// `child` holds a rank `parent` lacks (a shrink cannot add ranks) or
// `child` is empty.
std::optional<std::vector<int>> ShrinkExcludeList(const std::vector<uint32_t>& parent,
                                                  const std::vector<uint32_t>& child);

// The communicator order after a shrink: `parent` without the excluded
// ranks, in the same relative order (NCCL closes the gaps).
std::vector<uint32_t> OrderAfterShrink(const std::vector<uint32_t>& parent, const std::vector<uint32_t>& child);
// After ncclCommGrow: existing ranks keep their numbers, the new ones
// (`child` minus `parent`, ascending) are appended.
std::vector<uint32_t> OrderAfterGrow(const std::vector<uint32_t>& parent, const std::vector<uint32_t>& child);
// The position of `rank` in `order` (its rank in the communicator), -1 if absent.
int CommRankOf(const std::vector<uint32_t>& order, uint32_t rank);

struct CommPlan {
  enum class How {
    kNone,    // this rank is excluded: no communicator, no collective
    kReuse,   // same set as at this rank's previous iteration: the current one
    kShrink,  // ncclCommShrink of the current communicator, survivors only
    kGrow,    // ncclCommGrow of the current communicator, joiners appended
    kInit,    // a fresh ncclCommInitRank for the set, id through the store
  };
  How how = How::kNone;
  std::vector<int> exclude;  // kShrink: positions in the previous set
};
const char* HowText(CommPlan::How how);

// Why these rules: an NCCL communicator may only be used (and shrunk) by
// ranks that issued the same sequence of operations on it. Every member of
// `now` that also took part at its previous iteration holds the previous
// set's communicator with the same history (the switch rule keeps them in
// step), so a pure exclusion shrinks it - called by the survivors only, the
// excluded rank is never waited on. A set that gained ranks (a readmission),
// or a rank that did not take part at its previous iteration, has no such
// shared communicator: the rejoiner missed operations (the shrinks among
// them), so a fresh communicator is built from an id in the store -
// unless `grow` (NcclFeatures::grow) and the set only gained ranks: then
// the members of the previous set grow its communicator (ncclCommGrow keeps
// their numbers) and the joiners enter it with the id the coordinator got
// from ncclCommGetUniqueId. Grow only when the lowest rank of the new set
// was in the previous one: the id is then published by the same rank
// either way (the lowest of the new set), and a joiner - which does not
// know the group's previous set - learns from that record (ReadmissionRecord)
// whether to grow or to init. A previous set of one is rebuilt by an init
// (its one-rank communicator saves nothing there). `previous` may be in communicator order.
CommPlan PlanCommunicator(bool previously_participating, const std::vector<uint32_t>& previous,
                          bool participating, const std::vector<uint32_t>& now, bool grow = false);

// What the lowest rank of a readmitted set publishes under CommIdKey: the
// id and how to use it. kInit: an ncclUniqueId for ncclCommInitRank, ranks
// numbered by their position in the ascending set. kGrow: the id of
// ncclCommGetUniqueId on the previous communicator, whose order is
// `parent_order`; a joiner calls ncclCommGrow(NULL, ..., its position in
// OrderAfterGrow(parent_order, set)).
struct ReadmissionRecord {
  CommPlan::How how = CommPlan::How::kInit;  // kInit or kGrow
  std::string id;                            // the ncclUniqueId's bytes
  std::vector<uint32_t> parent_order;        // kGrow only
};
std::string EncodeRecord(const ReadmissionRecord& record);
// nullopt when `bytes` is no record with an id of `id_bytes` bytes; *error says why.
std::optional<ReadmissionRecord> DecodeRecord(const std::string& bytes, size_t id_bytes, std::string* error);

// The rendezvous key under which the lowest rank of `set` publishes the
// ncclUniqueId of the communicator it builds for `version`. Names the run,
// the version and the set (as the Gloo backend's prefix does), so an id of
// another build - an older version, a rank that applied another membership,
// an earlier run of the same job id - is never read as this one's. A build
// at a later slot than the version's first (the group put the switch off,
// or the first build failed) names that iteration too, `retry_iteration`:
// the members agree on it in band, and an id left by the failed attempt is
// never read by the retry.
std::string CommIdKey(const std::string& run_id, uint64_t version, const std::vector<uint32_t>& set,
                      std::optional<uint64_t> retry_iteration = std::nullopt);

// The key of the full communicator's id, built once by every rank at start:
// apart from every CommIdKey, so a later readmission of everyone (a new
// version over the whole world) never reads it.
std::string FullCommIdKey(const std::string& run_id, uint32_t world_size);

// A bounded most-recently-used cache of communicators keyed by active set.
// `release(handle, healthy)` is called exactly once per handle that leaves
// the cache (evicted, replaced, erased, or at destruction); healthy = false
// when it was erased after an error, so the owner aborts instead of
// finalizing. The entry marked current (in use this iteration) and the one
// marked pending (built ahead of a switch) are never evicted, so the bound
// is max(capacity, those two).
template <class Handle>
class CommCache {
 public:
  struct Entry {
    std::vector<uint32_t> ranks;
    uint64_t version = 0;
    Handle handle{};
  };
  using Release = std::function<void(Handle&, bool healthy)>;

  CommCache(size_t capacity, Release release) : capacity_(capacity), release_(std::move(release)) {}
  ~CommCache() {
    for (Entry& e : entries_) release_(e.handle, true);
  }
  CommCache(const CommCache&) = delete;
  CommCache& operator=(const CommCache&) = delete;

  Entry* Find(const std::vector<uint32_t>& ranks) {
    for (Entry& e : entries_)
      if (e.ranks == ranks) return &e;
    return nullptr;
  }

  // Inserts (most recent), releasing an older entry of the same set first
  // (its history may differ from the other members'), then evicts the least
  // recently used entries that are neither current nor pending.
  Entry* Insert(std::vector<uint32_t> ranks, uint64_t version, Handle handle) {
    Erase(ranks, true);
    entries_.push_front(Entry{std::move(ranks), version, std::move(handle)});
    Entry* inserted = &entries_.front();
    Trim(inserted);
    return inserted;
  }

  void Touch(const Entry* e) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (&*it == e) {
        entries_.splice(entries_.begin(), entries_, it);
        return;
      }
    }
  }

  // Releases the entry of `ranks` if any (healthy = false: after an error).
  void Erase(const std::vector<uint32_t>& ranks, bool healthy) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->ranks == ranks) {
        if (&*it == current_) current_ = nullptr;
        if (&*it == pending_) pending_ = nullptr;
        release_(it->handle, healthy);
        entries_.erase(it);
        return;
      }
    }
  }

  void SetCurrent(Entry* e) { current_ = e; Trim(nullptr); }
  void SetPending(Entry* e) { pending_ = e; Trim(nullptr); }
  Entry* Pending() const { return pending_; }
  size_t Size() const { return entries_.size(); }

 private:
  void Trim(const Entry* keep) {
    const size_t bound = capacity_ == 0 ? 1 : capacity_;
    for (auto it = entries_.end(); entries_.size() > bound && it != entries_.begin();) {
      --it;
      if (&*it == current_ || &*it == pending_ || &*it == keep) continue;
      release_(it->handle, true);
      it = entries_.erase(it);
    }
  }

  size_t capacity_;
  Release release_;
  std::list<Entry> entries_;  // most recently used first
  Entry* current_ = nullptr;
  Entry* pending_ = nullptr;
};

}  // namespace straggler::detail
