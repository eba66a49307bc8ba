// The values the etcd client (etcd_client.h) reads and writes, and the
// interfaces of its two kinds of streams: etcd's KeyValue, a transaction's
// compares and operations, a lease, a watch event; LeaseKeeper and Watch.
// Apart from EtcdClient so that the stream implementations (etcd_streams.h)
// need no more than these.
//
// Thread safety: the structs are plain values; LeaseKeeper and Watch are
// thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace straggler::cluster {

using Clock = std::chrono::steady_clock;

// etcd's mvccpb.KeyValue.
struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

// One condition of a transaction on one key (etcd's Compare). etcd reads an
// absent key's create_revision, mod_revision, version and lease as 0.
struct Compare {
  enum class Target { kVersion, kCreateRevision, kModRevision, kValue, kLease };
  enum class Op { kEqual, kGreater, kLess, kNotEqual };
  std::string key;
  Target target = Target::kCreateRevision;
  Op op = Op::kEqual;
  int64_t number = 0;  // every target but kValue
  std::string value;   // kValue

  static Compare Absent(std::string key);
  static Compare CreateRevisionIs(std::string key, int64_t revision);
  static Compare ModRevisionIs(std::string key, int64_t revision);
  static Compare ValueIs(std::string key, std::string value);
  static Compare LeaseIs(std::string key, int64_t lease);
};

// One operation of a transaction's branch.
struct TxnOp {
  enum class Kind { kGet, kPut, kDelete };
  Kind kind = Kind::kGet;
  std::string key;
  std::string value;  // kPut
  int64_t lease = 0;  // kPut: 0 for none

  static TxnOp Get(std::string key);
  static TxnOp Put(std::string key, std::string value, int64_t lease = 0);
  static TxnOp Delete(std::string key);
};

struct RangeResult {
  int64_t revision = 0;  // the store's revision the read saw
  std::vector<KeyValue> kvs;
};

struct TxnResult {
  bool succeeded = false;  // every compare held: the success branch ran
  int64_t revision = 0;    // the store's revision after the transaction
  // One entry per op of the branch that ran, in order: a Get's keys (none
  // when absent); empty for a Put or Delete.
  std::vector<std::vector<KeyValue>> results;
};

struct Lease {
  int64_t id = 0;
  int64_t ttl_seconds = 0;  // as granted: etcd raises a short TTL to its minimum
  // Local time the grant request was sent. etcd starts the lease's TTL
  // when it handles the request, which is later: sent + TTL is a time before
  // which the lease surely still exists (docs/cluster.md, "Local deadline").
  Clock::time_point sent;
};

// What etcd says of a lease (LeaseTimeToLive).
struct LeaseStatus {
  int64_t ttl_seconds = -1;  // seconds left; -1 once expired, revoked or unknown
  int64_t granted_ttl_seconds = 0;
  std::vector<std::string> keys;  // the keys attached to it
};

struct WatchEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  KeyValue kv;  // for kDelete: the key, mod_revision = the delete's revision
};

// Keeps one lease alive over etcd's LeaseKeepAlive stream, from a thread of
// its own: one request every TTL/3, the next only once the answer to the
// previous came back. A broken stream is reopened with backoff until etcd
// answers that the lease is gone (Lost()) or the keeper is destroyed.
// Destroying it stops the renewals but does not revoke the lease; it may
// wait up to TTL/3 for a reconnect attempt to end.
// Thread-safe.
class LeaseKeeper {
 public:
  virtual ~LeaseKeeper() = default;
  virtual int64_t id() const = 0;
  // The local time before which the lease surely exists: the send time of
  // the latest request etcd renewed (or of the grant) + its TTL. Never
  // moves backward.
  virtual Clock::time_point Deadline() const = 0;
  // etcd answered that the lease no longer exists: it will not come back.
  virtual bool Lost() const = 0;
  // Renewals etcd confirmed since the keeper started.
  virtual int64_t Renewals() const = 0;
  // The last stream error (naming the endpoint), OK when none yet.
  virtual absl::Status LastError() const = 0;
};

// A watch of a key prefix on its own thread. Events arrive in revision
// order through the callback given to WatchPrefix, called on the watch's
// thread, never after the Watch is destroyed (so the callback must not
// destroy it). When the stream breaks (etcd restarted or unreachable) the
// watch reopens it, with backoff up to 1 s, from the revision after the last
// event delivered: each event arrives once. It ends only when etcd cancels
// it, e.g. because that revision was compacted away: then `on_end` runs
// once with the reason and the caller reads the state afresh. Destroying it
// may wait up to 1 s for a reconnect attempt. Thread-safe.
class Watch {
 public:
  using OnEvents = std::function<void(int64_t revision, const std::vector<WatchEvent>& events)>;
  using OnEnd = std::function<void(const absl::Status& reason)>;
  virtual ~Watch() = default;
  // OK while the stream runs; why it broke while reconnecting; why it ended.
  virtual absl::Status Status() const = 0;
  // Times a broken stream was reopened and etcd confirmed the watch again.
  virtual int64_t Resumes() const = 0;
};

// The end of etcd's range of every key starting with `prefix`: the prefix
// with its last byte below 0xff incremented ("a/" -> "a0"); "\0" (every key
// from `prefix` on) when each byte is 0xff.
std::string PrefixRangeEnd(absl::string_view prefix);

}  // namespace straggler::cluster
