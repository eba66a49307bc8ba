// RendezvousStore: the job-scoped key-value store behind RendezvousService.
// The collective layer of a training job bootstraps its communicators through
// it (each rank Sets its address, Waits for its peers' keys, Gets them), so
// stragglerd is the job's only server.
//
//   RendezvousStore store(config.rendezvous);
//   store.Set("job", "gloo/v3/0", bytes, std::nullopt);
//   store.Wait("job", {"gloo/v3/1"}, 5s, [](absl::Status s) { /* finish the RPC */ });
//   auto entries = store.Get("job", {"gloo/v3/1"}, max_message_bytes);
//
// Every key belongs to a job and expires after its TTL; key and value sizes,
// keys and bytes per job, jobs and held waits are bounded (RendezvousConfig),
// and so are the keys and the answer of one Get; each refusal names the
// value and the limit. Wait never blocks the caller: it
// registers a callback that runs exactly once — at once when the keys are
// there, later from the Set that completes them, from the store's timer
// thread at the deadline, from Cancel, or from Close.
//
// Thread-safe: every method may be called from any thread. Callbacks run
// without the store's lock held, so they may call back into the store.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "config/config.h"

namespace straggler::daemon {

class RendezvousStore {
 public:
  using Clock = std::chrono::steady_clock;
  using WaitDone = std::function<void(const absl::Status&)>;
  using KeyValue = std::pair<std::string, std::string>;
  // What one entry of a Get's answer costs beyond its key and value bytes
  // (protobuf framing: three tags and three length varints of <= 5 bytes).
  static constexpr size_t kGetEntryOverhead = 20;

  explicit RendezvousStore(const RendezvousConfig& config);
  ~RendezvousStore();  // Close(UNAVAILABLE) and join the timer thread
  RendezvousStore(const RendezvousStore&) = delete;
  RendezvousStore& operator=(const RendezvousStore&) = delete;

  // New limits for later requests (SIGHUP).
  void ApplyConfig(const RendezvousConfig& config) ABSL_LOCKS_EXCLUDED(mu_);

  // ttl: nullopt or zero = default_ttl_seconds; capped at max_ttl_seconds.
  // RESOURCE_EXHAUSTED when a new key would pass max_keys_per_job or the
  // job's keys and values would pass max_bytes_per_job.
  absl::Status Set(const std::string& job, const std::string& key, std::string value,
                   std::optional<std::chrono::milliseconds> ttl) ABSL_LOCKS_EXCLUDED(mu_);
  // The entries of `keys` in the order of their first appearance, each key
  // once (a key asked for twice is answered once: a request of a few bytes
  // must not copy a large value over and over). NOT_FOUND names the first
  // missing key; INVALID_ARGUMENT for more than max_keys_per_job keys;
  // RESOURCE_EXHAUSTED, before any value is copied, when the answer
  // (key + value + kGetEntryOverhead per entry) would pass
  // `max_response_bytes` (the daemon's limits.max_message_bytes).
  absl::StatusOr<std::vector<KeyValue>> Get(const std::string& job,
                                            const std::vector<std::string>& keys,
                                            size_t max_response_bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // What Set would refuse before it stores anything (the key, the value's
  // size), else the TTL the key would get: for a caller that makes the key
  // durable elsewhere first (a replica writes it to etcd, docs/cluster.md).
  // Room for the key is checked by Set itself.
  absl::StatusOr<std::chrono::milliseconds> CheckSet(
      const std::string& job, const std::string& key, size_t value_bytes,
      std::optional<std::chrono::milliseconds> ttl) ABSL_LOCKS_EXCLUDED(mu_);
  // Sets each entry that `job` does not hold yet (a key set here since
  // stays), expiring after its `ttl`, completing the waits it completes:
  // a replica taking a job over loads its keys from etcd. Entries the
  // limits refuse are skipped; returns how many were set.
  struct Restored {
    std::string key;
    std::string value;
    std::chrono::milliseconds ttl;
  };
  size_t Restore(const std::string& job, std::vector<Restored> entries) ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets `job`'s keys and ends its waits with `status` (a replica that
  // lost the job: a redirect to the new owner).
  void DropJob(const std::string& job, const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // Adds `delta` to the decimal counter under `key` (missing = 0).
  absl::StatusOr<int64_t> Add(const std::string& job, const std::string& key, int64_t delta,
                              std::optional<std::chrono::milliseconds> ttl)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Calls `done` once (see the file comment): OK when every key is set,
  // DEADLINE_EXCEEDED naming the missing keys after `timeout` (nullopt/zero
  // or longer than max_wait_seconds: max_wait_seconds), CANCELLED after
  // Cancel, UNAVAILABLE after Close, or an error for a bad request. Returns
  // an id for Cancel; 0 when `done` has already run.
  uint64_t Wait(const std::string& job, const std::vector<std::string>& keys,
                std::optional<std::chrono::milliseconds> timeout, WaitDone done)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the wait `id` with CANCELLED (no-op once it has ended).
  void Cancel(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends every wait held now with `status` (not OK); later Waits are held.
  void EndWaits(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends every wait with `status`; later Waits end with it at once.
  void Close(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);

  // Live (unexpired) keys of `job` and the bytes (keys + values) they hold;
  // for tests and metrics.
  size_t KeyCount(const std::string& job) ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t ByteCount(const std::string& job) ABSL_LOCKS_EXCLUDED(mu_);
  size_t WaiterCount() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    std::string value;
    Clock::time_point expires;
  };
  struct JobKv {
    std::unordered_map<std::string, Entry> keys;
    uint64_t bytes = 0;  // sum of key + value sizes over `keys` (max_bytes_per_job)
    std::set<uint64_t> waiters;
  };
  struct Waiter {
    std::string job;
    std::vector<std::string> keys;
    Clock::time_point deadline;
    std::chrono::milliseconds timeout;
    WaitDone done;
  };
  using Completion = std::pair<WaitDone, absl::Status>;

  absl::Status ValidateJobKey(const std::string& job, const std::string& key) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // reads config_
  Clock::time_point ExpiryLocked(std::optional<std::chrono::milliseconds> ttl,
                                 Clock::time_point now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's entry for a write, creating it within max_jobs.
  absl::StatusOr<JobKv*> JobForWriteLocked(const std::string& job, Clock::time_point now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stores key (within max_keys_per_job and max_bytes_per_job, expiring
  // after `ttl` as ExpiryLocked says) and collects the waits it completes.
  // A refusal leaves no empty job behind.
  absl::Status PutLocked(const std::string& job, JobKv& kv, const std::string& key,
                         std::string value, std::optional<std::chrono::milliseconds> ttl,
                         Clock::time_point now, std::vector<Completion>* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `key` with a value of `value_bytes` fits the job's key and byte
  // limits (expired keys still counted), else the refusal naming them.
  absl::Status RoomLocked(const std::string& job, const JobKv& kv, const std::string& key,
                          size_t value_bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `kv` (a job of jobs_, or null) is read under mu_.
  std::vector<std::string> MissingLocked(const JobKv* kv, const std::vector<std::string>& keys,
                                         Clock::time_point now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropExpiredLocked(JobKv& kv, Clock::time_point now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseIfEmptyLocked(const std::string& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Completion TakeWaiterLocked(uint64_t id, absl::Status status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status TimeoutStatus(const Waiter& w, const std::vector<std::string>& missing) const;
  void TimerLoop() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex mu_;
  absl::CondVar cv_;  // with mu_: wakes the timer thread (new deadline, close)
  RendezvousConfig config_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<std::string, JobKv> jobs_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<uint64_t, Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  std::multimap<Clock::time_point, uint64_t> deadlines_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::optional<absl::Status> closed_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread timer_;
};

}  // namespace straggler::daemon
