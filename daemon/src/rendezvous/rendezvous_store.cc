#include "rendezvous/rendezvous_store.h"

#include <algorithm>
#include <charconv>
#include <string_view>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "straggler/common/validate.h"

namespace straggler::daemon {
namespace {

// The timer thread also sweeps expired keys at least this often, so a job
// that stops using the store gives its memory back without a request.
constexpr auto kSweepInterval = std::chrono::seconds(1);
// Error messages list at most this many missing keys.
constexpr size_t kKeysNamed = 4;

// Keys are any bytes a client chose: escaped and cut like every value a
// message echoes (validate.h Quoted).
std::string QuotedKeys(const std::vector<std::string>& keys) {
  std::vector<std::string> shown;
  for (size_t i = 0; i < keys.size() && i < kKeysNamed; ++i)
    shown.push_back(common::Quoted(keys[i]));
  std::string s = absl::StrJoin(shown, ", ");
  if (keys.size() > kKeysNamed) absl::StrAppend(&s, " and ", keys.size() - kKeysNamed, " more");
  return s;
}

}  // namespace

RendezvousStore::RendezvousStore(const RendezvousConfig& config) : config_(config) {
  timer_ = std::thread([this] { TimerLoop(); });
}

RendezvousStore::~RendezvousStore() {
  Close(absl::UnavailableError("stragglerd is shutting down"));
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  timer_.join();
}

void RendezvousStore::ApplyConfig(const RendezvousConfig& config) {
  absl::MutexLock lock(&mu_);
  config_ = config;
}

absl::Status RendezvousStore::ValidateJobKey(const std::string& job, const std::string& key) const {
  if (absl::Status s = common::ValidateJobId("job_id", job); !s.ok()) return s;
  if (key.empty())
    return absl::InvalidArgumentError(
        absl::StrCat("job ", common::Quoted(job), ": empty rendezvous key"));
  if (key.size() > config_.max_key_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job ", common::Quoted(job), ": rendezvous key ", common::Quoted(key), " of ", key.size(),
        " bytes exceeds rendezvous.max_key_bytes=", config_.max_key_bytes));
  }
  return absl::OkStatus();
}

RendezvousStore::Clock::time_point RendezvousStore::ExpiryLocked(
    std::optional<std::chrono::milliseconds> ttl, Clock::time_point now) const {
  const std::chrono::milliseconds max = std::chrono::seconds(config_.max_ttl_seconds);
  std::chrono::milliseconds t = std::chrono::seconds(config_.default_ttl_seconds);
  if (ttl && ttl->count() > 0) t = std::min(*ttl, max);
  return now + t;
}

absl::StatusOr<RendezvousStore::JobKv*> RendezvousStore::JobForWriteLocked(const std::string& job,
                                                                          Clock::time_point now) {
  auto it = jobs_.find(job);
  if (it != jobs_.end()) return &it->second;
  if (jobs_.size() >= config_.max_jobs) {
    // Expired jobs may still hold a slot; sweep before refusing.
    for (auto j = jobs_.begin(); j != jobs_.end();) {
      DropExpiredLocked(j->second, now);
      j = j->second.keys.empty() && j->second.waiters.empty() ? jobs_.erase(j) : std::next(j);
    }
    if (jobs_.size() >= config_.max_jobs) {
      return absl::ResourceExhaustedError(
          absl::StrCat("rendezvous holds keys of ", jobs_.size(), " jobs (rendezvous.max_jobs=",
                       config_.max_jobs, "); job ", common::Quoted(job), " not admitted"));
    }
  }
  return &jobs_[job];
}

absl::Status RendezvousStore::RoomLocked(const std::string& job, const JobKv& kv,
                                         const std::string& key, size_t value_bytes) const {
  auto it = kv.keys.find(key);
  const bool is_new = it == kv.keys.end();
  if (is_new && kv.keys.size() >= config_.max_keys_per_job) {
    return absl::ResourceExhaustedError(
        absl::StrCat("job ", common::Quoted(job), " holds ", kv.keys.size(),
                     " rendezvous keys (rendezvous.max_keys_per_job=", config_.max_keys_per_job,
                     "); key ", common::Quoted(key), " not stored"));
  }
  // A replaced value gives its bytes back.
  const uint64_t freed = is_new ? 0 : key.size() + it->second.value.size();
  if (kv.bytes - freed + key.size() + value_bytes > config_.max_bytes_per_job) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job ", common::Quoted(job), " holds ", kv.bytes,
        " bytes of rendezvous keys and values (rendezvous.max_bytes_per_job=",
        config_.max_bytes_per_job, "); key ", common::Quoted(key), " with a value of ",
        value_bytes, " bytes not stored"));
  }
  return absl::OkStatus();
}

absl::Status RendezvousStore::PutLocked(const std::string& job, JobKv& kv, const std::string& key,
                                        std::string value,
                                        std::optional<std::chrono::milliseconds> ttl,
                                        Clock::time_point now,
                                        std::vector<Completion>* completions) {
  if (!RoomLocked(job, kv, key, value.size()).ok()) {
    // Expired keys still hold their room until swept: sweep before refusing.
    DropExpiredLocked(kv, now);
    if (absl::Status s = RoomLocked(job, kv, key, value.size()); !s.ok()) {
      EraseIfEmptyLocked(job);  // invalidates kv: return at once
      return s;
    }
  }
  auto [it, inserted] = kv.keys.try_emplace(key);
  if (!inserted) kv.bytes -= key.size() + it->second.value.size();
  kv.bytes += key.size() + value.size();
  it->second.value = std::move(value);
  it->second.expires = ExpiryLocked(ttl, now);
  // A waiter can only complete through a key it waits on; checking each of
  // the job's waiters keeps the index simple (waits per job are few: one per
  // rank building a context).
  std::vector<uint64_t> ready;
  for (uint64_t id : kv.waiters) {
    const Waiter& w = waiters_.at(id);
    if (std::find(w.keys.begin(), w.keys.end(), key) == w.keys.end()) continue;
    if (MissingLocked(&kv, w.keys, now).empty()) ready.push_back(id);
  }
  for (uint64_t id : ready) completions->push_back(TakeWaiterLocked(id, absl::OkStatus()));
  return absl::OkStatus();
}

absl::Status RendezvousStore::Set(const std::string& job, const std::string& key, std::string value,
                                  std::optional<std::chrono::milliseconds> ttl) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = ValidateJobKey(job, key); !s.ok()) return s;
    if (value.size() > config_.max_value_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job ", common::Quoted(job), ": value of ", value.size(), " bytes for rendezvous key ",
          common::Quoted(key), " exceeds rendezvous.max_value_bytes=", config_.max_value_bytes));
    }
    const Clock::time_point now = Clock::now();
    absl::StatusOr<JobKv*> kv = JobForWriteLocked(job, now);
    if (!kv.ok()) return kv.status();
    absl::Status s = PutLocked(job, **kv, key, std::move(value), ttl, now, &completions);
    if (!s.ok()) return s;
  }
  for (auto& [done, status] : completions) done(status);
  return absl::OkStatus();
}

absl::StatusOr<std::chrono::milliseconds> RendezvousStore::CheckSet(
    const std::string& job, const std::string& key, size_t value_bytes,
    std::optional<std::chrono::milliseconds> ttl) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = ValidateJobKey(job, key); !s.ok()) return s;
  if (value_bytes > config_.max_value_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job ", common::Quoted(job), ": value of ", value_bytes, " bytes for rendezvous key ",
        common::Quoted(key), " exceeds rendezvous.max_value_bytes=", config_.max_value_bytes));
  }
  const Clock::time_point now = Clock::now();
  return std::chrono::duration_cast<std::chrono::milliseconds>(ExpiryLocked(ttl, now) - now);
}

size_t RendezvousStore::Restore(const std::string& job, std::vector<Restored> entries) {
  std::vector<Completion> completions;
  size_t restored = 0;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return 0;
    const Clock::time_point now = Clock::now();
    for (Restored& e : entries) {
      if (!ValidateJobKey(job, e.key).ok() || e.value.size() > config_.max_value_bytes) continue;
      absl::StatusOr<JobKv*> kv = JobForWriteLocked(job, now);
      if (!kv.ok()) break;
      if (auto it = (*kv)->keys.find(e.key); it != (*kv)->keys.end() && it->second.expires > now) {
        continue;  // set here since: newer than etcd's copy
      }
      if (PutLocked(job, **kv, e.key, std::move(e.value), e.ttl, now, &completions).ok()) {
        ++restored;
      }
    }
  }
  for (auto& [done, status] : completions) done(status);
  return restored;
}

void RendezvousStore::DropJob(const std::string& job, const absl::Status& status) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job);
    if (it == jobs_.end()) return;
    const std::set<uint64_t> ids = it->second.waiters;
    for (uint64_t id : ids) completions.push_back(TakeWaiterLocked(id, status));
    jobs_.erase(job);
  }
  for (auto& [done, s] : completions) done(s);
}

absl::StatusOr<int64_t> RendezvousStore::Add(const std::string& job, const std::string& key,
                                            int64_t delta,
                                            std::optional<std::chrono::milliseconds> ttl) {
  std::vector<Completion> completions;
  int64_t result = 0;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = ValidateJobKey(job, key); !s.ok()) return s;
    const Clock::time_point now = Clock::now();
    absl::StatusOr<JobKv*> kv = JobForWriteLocked(job, now);
    if (!kv.ok()) return kv.status();
    int64_t current = 0;
    if (auto it = (*kv)->keys.find(key); it != (*kv)->keys.end() && it->second.expires > now) {
      const std::string& text = it->second.value;
      auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), current);
      if (ec != std::errc() || end != text.data() + text.size()) {
        return absl::FailedPreconditionError(absl::StrCat("job ", common::Quoted(job),
                                                          ": rendezvous key ", common::Quoted(key),
                                                          " holds a value that is not a counter"));
      }
    }
    if ((delta > 0 && current > INT64_MAX - delta) || (delta < 0 && current < INT64_MIN - delta)) {
      return absl::OutOfRangeError(absl::StrCat("job ", common::Quoted(job), ": counter ",
                                                common::Quoted(key), "=", current, " + ", delta,
                                                " overflows int64"));
    }
    result = current + delta;
    absl::Status s = PutLocked(job, **kv, key, absl::StrCat(result), ttl, now, &completions);
    if (!s.ok()) return s;
  }
  for (auto& [done, status] : completions) done(status);
  return result;
}

absl::StatusOr<std::vector<RendezvousStore::KeyValue>> RendezvousStore::Get(
    const std::string& job, const std::vector<std::string>& keys, size_t max_response_bytes) {
  absl::MutexLock lock(&mu_);
  if (keys.empty())
    return absl::InvalidArgumentError(
        absl::StrCat("job ", common::Quoted(job), ": Get of no keys"));
  // As Wait: a job cannot hold more keys than this, so no Get needs more.
  if (keys.size() > config_.max_keys_per_job) {
    return absl::InvalidArgumentError(
        absl::StrCat("job ", common::Quoted(job), ": Get of ", keys.size(),
                     " keys exceeds rendezvous.max_keys_per_job=", config_.max_keys_per_job));
  }
  const Clock::time_point now = Clock::now();
  auto it = jobs_.find(job);
  // Each key once; the answer's size is known before any value is copied.
  std::unordered_set<std::string_view> seen;
  std::vector<const std::pair<const std::string, Entry>*> found;
  uint64_t bytes = 0;
  for (const std::string& key : keys) {
    if (absl::Status s = ValidateJobKey(job, key); !s.ok()) return s;
    if (!seen.insert(key).second) continue;
    const std::pair<const std::string, Entry>* e = nullptr;
    if (it != jobs_.end()) {
      auto k = it->second.keys.find(key);
      if (k != it->second.keys.end() && k->second.expires > now) e = &*k;
    }
    if (e == nullptr) {
      return absl::NotFoundError(absl::StrCat("job ", common::Quoted(job), ": rendezvous key ",
                                              common::Quoted(key), " is not set"));
    }
    bytes += key.size() + e->second.value.size() + kGetEntryOverhead;
    found.push_back(e);
  }
  if (bytes > max_response_bytes) {
    std::vector<std::string> named;
    for (size_t i = 0; i < found.size() && i < kKeysNamed; ++i) named.push_back(found[i]->first);
    return absl::ResourceExhaustedError(absl::StrCat(
        "job ", common::Quoted(job), ": Get of ", found.size(), " distinct keys (",
        QuotedKeys(named), found.size() > kKeysNamed ? ", ..." : "", ") would answer ", bytes,
        " bytes, more than limits.max_message_bytes=", max_response_bytes,
        "; ask for fewer keys per Get"));
  }
  std::vector<KeyValue> entries;
  entries.reserve(found.size());
  for (const auto* e : found) entries.emplace_back(e->first, e->second.value);
  return entries;
}

uint64_t RendezvousStore::Wait(const std::string& job, const std::vector<std::string>& keys,
                               std::optional<std::chrono::milliseconds> timeout, WaitDone done) {
  absl::Status immediate;
  {
    absl::MutexLock lock(&mu_);
    const Clock::time_point now = Clock::now();
    if (closed_) {
      immediate = *closed_;
    } else if (keys.empty()) {
      immediate = absl::InvalidArgumentError(
          absl::StrCat("job ", common::Quoted(job), ": Wait for no keys"));
    } else if (keys.size() > config_.max_keys_per_job) {
      immediate = absl::InvalidArgumentError(
          absl::StrCat("job ", common::Quoted(job), ": Wait for ", keys.size(),
                       " keys exceeds rendezvous.max_keys_per_job=", config_.max_keys_per_job));
    } else {
      for (const std::string& key : keys) {
        immediate = ValidateJobKey(job, key);
        if (!immediate.ok()) break;
      }
    }
    if (immediate.ok()) {
      auto it = jobs_.find(job);
      if (MissingLocked(it == jobs_.end() ? nullptr : &it->second, keys, now).empty()) {
        immediate = absl::OkStatus();
      } else if (waiters_.size() >= config_.max_waiters) {
        immediate = absl::ResourceExhaustedError(
            absl::StrCat("rendezvous holds ", waiters_.size(), " waits (rendezvous.max_waiters=",
                         config_.max_waiters, "); job ", common::Quoted(job), " Wait refused"));
      } else {
        absl::StatusOr<JobKv*> kv = JobForWriteLocked(job, now);
        if (!kv.ok()) {
          immediate = kv.status();
        } else {
          const std::chrono::milliseconds max = std::chrono::seconds(config_.max_wait_seconds);
          std::chrono::milliseconds t = max;
          if (timeout && timeout->count() > 0) t = std::min(*timeout, max);
          const uint64_t id = next_id_++;
          Waiter w{job, keys, now + t, t, std::move(done)};
          deadlines_.emplace(w.deadline, id);
          waiters_.emplace(id, std::move(w));
          (*kv)->waiters.insert(id);
          cv_.SignalAll();
          return id;
        }
      }
    }
  }
  done(immediate);
  return 0;
}

void RendezvousStore::Cancel(uint64_t id) {
  Completion c;
  {
    absl::MutexLock lock(&mu_);
    if (waiters_.count(id) == 0) return;
    c = TakeWaiterLocked(id, absl::CancelledError("rendezvous Wait cancelled by the client"));
  }
  c.first(c.second);
}

void RendezvousStore::EndWaits(const absl::Status& status) {
  std::vector<Completion> completions;
  {
    absl::MutexLock lock(&mu_);
    std::vector<uint64_t> ids;
    for (const auto& [id, w] : waiters_) ids.push_back(id);
    for (uint64_t id : ids) completions.push_back(TakeWaiterLocked(id, status));
  }
  for (auto& [done, s] : completions) done(s);
}

void RendezvousStore::Close(const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    if (!closed_) closed_ = status;
  }
  EndWaits(status);
}

size_t RendezvousStore::KeyCount(const std::string& job) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return 0;
  DropExpiredLocked(it->second, Clock::now());
  return it->second.keys.size();
}

uint64_t RendezvousStore::ByteCount(const std::string& job) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return 0;
  DropExpiredLocked(it->second, Clock::now());
  return it->second.bytes;
}

size_t RendezvousStore::WaiterCount() {
  absl::MutexLock lock(&mu_);
  return waiters_.size();
}

std::vector<std::string> RendezvousStore::MissingLocked(const JobKv* kv,
                                                        const std::vector<std::string>& keys,
                                                        Clock::time_point now) const {
  std::vector<std::string> missing;
  for (const std::string& key : keys) {
    const Entry* e = nullptr;
    if (kv != nullptr) {
      auto it = kv->keys.find(key);
      if (it != kv->keys.end() && it->second.expires > now) e = &it->second;
    }
    if (e == nullptr) missing.push_back(key);
  }
  return missing;
}

void RendezvousStore::DropExpiredLocked(JobKv& kv, Clock::time_point now) {
  std::erase_if(kv.keys, [&kv, now](const auto& e) {
    if (e.second.expires > now) return false;
    kv.bytes -= e.first.size() + e.second.value.size();
    return true;
  });
}

void RendezvousStore::EraseIfEmptyLocked(const std::string& job) {
  auto it = jobs_.find(job);
  if (it != jobs_.end() && it->second.keys.empty() && it->second.waiters.empty()) jobs_.erase(it);
}

RendezvousStore::Completion RendezvousStore::TakeWaiterLocked(uint64_t id, absl::Status status) {
  auto it = waiters_.find(id);
  Waiter w = std::move(it->second);
  waiters_.erase(it);
  for (auto [d, end] = deadlines_.equal_range(w.deadline); d != end; ++d) {
    if (d->second == id) {
      deadlines_.erase(d);
      break;
    }
  }
  if (auto j = jobs_.find(w.job); j != jobs_.end()) {
    j->second.waiters.erase(id);
    EraseIfEmptyLocked(w.job);
  }
  return {std::move(w.done), std::move(status)};
}

absl::Status RendezvousStore::TimeoutStatus(const Waiter& w,
                                            const std::vector<std::string>& missing) const {
  return absl::DeadlineExceededError(absl::StrCat("job ", common::Quoted(w.job),
                                                  ": rendezvous keys still missing after ",
                                                  w.timeout.count(), " ms: ", QuotedKeys(missing)));
}

void RendezvousStore::TimerLoop() {
  mu_.Lock();
  Clock::time_point next_sweep = Clock::now() + kSweepInterval;
  while (!stopping_) {
    Clock::time_point wake = next_sweep;
    if (!deadlines_.empty()) wake = std::min(wake, deadlines_.begin()->first);
    // The steady-clock deadline as a timeout (absl::Time is the wall clock).
    cv_.WaitWithTimeout(&mu_, absl::FromChrono(wake - Clock::now()));
    if (stopping_) break;
    const Clock::time_point now = Clock::now();
    std::vector<Completion> completions;
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      const uint64_t id = deadlines_.begin()->second;
      const Waiter& w = waiters_.at(id);
      auto j = jobs_.find(w.job);
      absl::Status s = TimeoutStatus(w, MissingLocked(j == jobs_.end() ? nullptr : &j->second, w.keys, now));
      completions.push_back(TakeWaiterLocked(id, std::move(s)));
    }
    if (now >= next_sweep) {
      for (auto j = jobs_.begin(); j != jobs_.end();) {
        DropExpiredLocked(j->second, now);
        j = j->second.keys.empty() && j->second.waiters.empty() ? jobs_.erase(j) : std::next(j);
      }
      next_sweep = now + kSweepInterval;
    }
    if (!completions.empty()) {
      mu_.Unlock();
      for (auto& [done, s] : completions) done(s);
      mu_.Lock();
    }
  }
  mu_.Unlock();
}

}  // namespace straggler::daemon
