#include "cluster/etcd_streams.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "etcdserverpb/rpc.grpc.pb.h"

namespace straggler::cluster::detail {
namespace {

namespace pb = ::etcdserverpb;

// What a Keeper and a WatchStream share: a thread that runs one stream after
// another over `channel_`, and how it stops. The derived destructor calls
// StopAndJoin() first, while the members the thread uses still exist.
class StreamThread {
 public:
  StreamThread(const StreamThread&) = delete;
  StreamThread& operator=(const StreamThread&) = delete;

 protected:
  explicit StreamThread(std::shared_ptr<grpc::Channel> channel) : channel_(std::move(channel)) {}
  ~StreamThread() = default;

  // Stops the thread: cancels the stream in flight (ctx_) and joins.
  void StopAndJoin() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      if (ctx_ != nullptr) ctx_->TryCancel();
    }
    if (thread_.joinable()) thread_.join();
  }

  // Waits `d` or until stopping; true when stopping.
  bool WaitStop(std::chrono::milliseconds d) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::FromChrono(d));
  }

  // Between a broken stream and the next: waits `backoff`, then polls the
  // channel until it connects or `poll` passes. A new stream alone was seen
  // to leave a connection to a restarted etcd unnoticed for seconds: with
  // the synchronous API, nothing polls the connecting socket but gRPC's
  // backup poller (docs/cluster.md). True when stopping.
  bool PauseBeforeReopen(std::chrono::milliseconds backoff, std::chrono::milliseconds poll) {
    if (WaitStop(backoff)) return true;
    channel_->WaitForConnected(std::chrono::system_clock::now() + poll);
    return false;
  }

  const std::shared_ptr<grpc::Channel> channel_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The stream in flight, for StopAndJoin to cancel; the thread sets it.
  grpc::ClientContext* ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread thread_;
};

class Keeper final : public LeaseKeeper, private StreamThread {
 public:
  Keeper(std::shared_ptr<grpc::Channel> channel, std::string endpoint, const Lease& lease,
         std::shared_ptr<EtcdStats> stats)
      : StreamThread(channel),
        stats_(std::move(stats)),
        stub_(pb::Lease::NewStub(channel)),
        endpoint_(std::move(endpoint)),
        id_(lease.id),
        // etcd's own client renews every TTL/3: two requests may be lost
        // before the lease is at risk.
        interval_(std::chrono::milliseconds(lease.ttl_seconds * 1000 / 3)),
        deadline_(lease.sent + std::chrono::seconds(lease.ttl_seconds)) {
    thread_ = std::thread([this] { Run(); });
  }

  ~Keeper() override { StopAndJoin(); }

  int64_t id() const override { return id_; }
  Clock::time_point Deadline() const override {
    absl::MutexLock lock(&mu_);
    return deadline_;
  }
  bool Lost() const override {
    absl::MutexLock lock(&mu_);
    return lost_;
  }
  int64_t Renewals() const override {
    absl::MutexLock lock(&mu_);
    return renewals_;
  }
  absl::Status LastError() const override {
    absl::MutexLock lock(&mu_);
    return last_error_;
  }

 private:
  // Streams until stopped or the lease is lost; a broken stream is reopened
  // after a backoff that doubles from 100 ms up to the renewal interval, so
  // an etcd back from a restart is found within one interval.
  void Run() {
    std::chrono::milliseconds backoff(100);
    while (true) {
      grpc::ClientContext ctx;
      {
        absl::MutexLock lock(&mu_);
        if (stopping_ || lost_) return;
        ctx_ = &ctx;
      }
      bool renewed = Stream(ctx);
      {
        absl::MutexLock lock(&mu_);
        ctx_ = nullptr;
        if (stopping_ || lost_) return;
      }
      if (renewed) backoff = std::chrono::milliseconds(100);
      if (PauseBeforeReopen(backoff, interval_)) return;
      backoff = std::min(backoff * 2, std::max(interval_, std::chrono::milliseconds(100)));
    }
  }

  // One LeaseKeepAlive stream: request, answer, wait, until it breaks, the
  // lease is gone or the keeper stops. True when etcd renewed at least once.
  bool Stream(grpc::ClientContext& ctx) {
    auto stream = stub_->LeaseKeepAlive(&ctx);
    pb::LeaseKeepAliveRequest req;
    req.set_id(id_);
    bool renewed = false;
    bool broken = false;
    while (true) {
      // Taken before the write: etcd renews when it handles the request,
      // later than this, so sent + TTL is not past etcd's expiry.
      Clock::time_point sent = Clock::now();
      pb::LeaseKeepAliveResponse resp;
      if (!stream->Write(req) || !stream->Read(&resp)) {
        broken = true;
        break;
      }
      stats_->Record(Clock::now() - sent, true);
      {
        absl::MutexLock lock(&mu_);
        if (resp.ttl() <= 0) {
          lost_ = true;
          last_error_ = absl::NotFoundError(
              absl::StrCat("etcd ", endpoint_, " LeaseKeepAlive: lease ", id_, " is gone"));
          break;
        }
        deadline_ = std::max(deadline_, sent + std::chrono::seconds(resp.ttl()));
        ++renewals_;
        renewed = true;
      }
      if (WaitStop(interval_)) break;
    }
    if (!broken) ctx.TryCancel();
    grpc::Status s = stream->Finish();
    if (broken && !s.ok()) {
      absl::MutexLock lock(&mu_);
      if (!stopping_) {
        last_error_ = CallError(endpoint_, "LeaseKeepAlive", s);
        stats_->StreamBroken();
      }
    }
    return renewed;
  }

  const std::shared_ptr<EtcdStats> stats_;
  const std::unique_ptr<pb::Lease::Stub> stub_;
  const std::string endpoint_;
  const int64_t id_;
  const std::chrono::milliseconds interval_;
  Clock::time_point deadline_ ABSL_GUARDED_BY(mu_);
  bool lost_ ABSL_GUARDED_BY(mu_) = false;
  int64_t renewals_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status last_error_ ABSL_GUARDED_BY(mu_);
};

WatchEvent FromProto(const ::mvccpb::Event& e) {
  return WatchEvent{e.type() == ::mvccpb::Event::DELETE ? WatchEvent::Type::kDelete
                                                        : WatchEvent::Type::kPut,
                    detail::FromProto(e.kv())};
}

// One watch over as many Watch streams as it takes: a stream that breaks
// after etcd confirmed the watch is reopened from the revision after the
// last one delivered, so no event is lost or repeated.
class WatchStream final : public Watch, private StreamThread {
 public:
  WatchStream(std::shared_ptr<grpc::Channel> channel, std::string endpoint, std::string prefix,
              int64_t start_revision, std::shared_ptr<EtcdStats> stats, OnEvents on_events,
              OnEnd on_end)
      : StreamThread(channel),
        stats_(std::move(stats)),
        stub_(pb::Watch::NewStub(channel)),
        endpoint_(std::move(endpoint)),
        prefix_(std::move(prefix)),
        on_events_(std::move(on_events)),
        on_end_(std::move(on_end)),
        next_revision_(start_revision) {}

  ~WatchStream() override { StopAndJoin(); }

  // Starts the watch's thread and waits for etcd's confirmation.
  absl::Status Start(std::chrono::milliseconds timeout) {
    thread_ = std::thread([this] { Run(); });
    absl::MutexLock lock(&mu_);
    if (!mu_.AwaitWithTimeout(absl::Condition(this, &WatchStream::Settled),
                              absl::FromChrono(timeout))) {
      return absl::DeadlineExceededError(absl::StrCat("etcd ", endpoint_, " Watch ", prefix_,
                                                      ": not created within ", timeout.count(),
                                                      " ms"));
    }
    return created_ ? absl::OkStatus() : status_;
  }

  absl::Status Status() const override {
    absl::MutexLock lock(&mu_);
    return status_;
  }

  int64_t Resumes() const override {
    absl::MutexLock lock(&mu_);
    return resumes_;
  }

 private:
  enum class Outcome { kBroken, kStopped, kFatal };

  void Run() {
    std::chrono::milliseconds backoff(100);
    while (true) {
      absl::Status reason;
      Outcome outcome = Stream(reason);
      bool report = false;
      {
        absl::MutexLock lock(&mu_);
        status_ = reason;
        // Before etcd confirmed the watch, WatchPrefix returns the error.
        if (outcome != Outcome::kBroken || !created_) {
          ended_ = true;
          report = outcome == Outcome::kFatal && created_;
        }
      }
      if (report && on_end_) on_end_(reason);
      {
        absl::MutexLock lock(&mu_);
        if (ended_) return;
      }
      if (PauseBeforeReopen(backoff, std::chrono::seconds(1))) return;
      backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
    }
  }

  // One Watch stream from next_revision_ until it breaks, the watch stops,
  // or etcd cancels it (kFatal: compaction, or etcd's own reason).
  Outcome Stream(absl::Status& reason) {
    grpc::ClientContext ctx;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) {
        reason = absl::CancelledError(absl::StrCat("etcd ", endpoint_, " Watch closed"));
        return Outcome::kStopped;
      }
      ctx_ = &ctx;
    }
    auto stream = stub_->Watch(&ctx);
    pb::WatchRequest req;
    pb::WatchCreateRequest* create = req.mutable_create_request();
    create->set_key(prefix_);
    create->set_range_end(PrefixRangeEnd(prefix_));
    create->set_start_revision(next_revision_);
    Outcome outcome = Outcome::kBroken;
    pb::WatchResponse resp;
    if (stream->Write(req)) {
      while (stream->Read(&resp)) {
        if (resp.canceled() || resp.compact_revision() != 0) {
          reason = absl::AbortedError(absl::StrCat(
              "etcd ", endpoint_, " Watch ", prefix_, " canceled: ", resp.cancel_reason(),
              resp.compact_revision() != 0
                  ? absl::StrCat(" (compacted, oldest revision ", resp.compact_revision(), ")")
                  : ""));
          outcome = Outcome::kFatal;
          break;
        }
        if (resp.created()) Created(resp.header().revision());
        Deliver(resp);
      }
    }
    ctx.TryCancel();  // a canceled watch leaves the stream open
    grpc::Status s = stream->Finish();
    absl::MutexLock lock(&mu_);
    ctx_ = nullptr;
    if (stopping_) {
      reason = absl::CancelledError(absl::StrCat("etcd ", endpoint_, " Watch closed"));
      return Outcome::kStopped;
    }
    if (outcome == Outcome::kBroken) {
      stats_->StreamBroken();
      reason = !s.ok() ? CallError(endpoint_, absl::StrCat("Watch ", prefix_), s)
                       : absl::UnavailableError(absl::StrCat("etcd ", endpoint_, " Watch ",
                                                             prefix_, ": stream ended"));
    }
    return outcome;
  }

  // A watch "from now" resumes after the revision etcd created it at.
  void Created(int64_t revision) {
    absl::MutexLock lock(&mu_);
    if (created_) ++resumes_;
    created_ = true;
    status_ = absl::OkStatus();
    if (next_revision_ == 0) next_revision_ = revision + 1;
  }

  void Deliver(const pb::WatchResponse& resp) {
    if (resp.events_size() == 0) return;
    std::vector<WatchEvent> events;
    events.reserve(resp.events_size());
    for (const ::mvccpb::Event& e : resp.events()) events.push_back(FromProto(e));
    // Only this thread writes next_revision_ once the stream runs.
    next_revision_ = events.back().kv.mod_revision + 1;
    on_events_(resp.header().revision(), events);
  }

  bool Settled() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return created_ || ended_; }

  const std::shared_ptr<EtcdStats> stats_;
  const std::unique_ptr<pb::Watch::Stub> stub_;
  const std::string endpoint_;
  const std::string prefix_;
  const OnEvents on_events_;
  const OnEnd on_end_;
  int64_t next_revision_;  // the watch thread's alone
  bool created_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  int64_t resumes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

KeyValue FromProto(const ::mvccpb::KeyValue& kv) {
  return KeyValue{kv.key(), kv.value(), kv.create_revision(), kv.mod_revision(), kv.version(),
                  kv.lease()};
}

absl::Status CallError(absl::string_view endpoint, absl::string_view call, const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat("etcd ", endpoint, " ", call, ": ", s.error_message()));
}

std::unique_ptr<LeaseKeeper> StartLeaseKeeper(std::shared_ptr<grpc::Channel> channel,
                                              std::string endpoint, const Lease& lease,
                                              std::shared_ptr<EtcdStats> stats) {
  return std::make_unique<Keeper>(std::move(channel), std::move(endpoint), lease,
                                  std::move(stats));
}

absl::StatusOr<std::unique_ptr<Watch>> StartWatch(std::shared_ptr<grpc::Channel> channel,
                                                  std::string endpoint, absl::string_view prefix,
                                                  int64_t start_revision,
                                                  std::chrono::milliseconds create_timeout,
                                                  std::shared_ptr<EtcdStats> stats,
                                                  Watch::OnEvents on_events, Watch::OnEnd on_end) {
  auto watch = std::make_unique<WatchStream>(std::move(channel), std::move(endpoint),
                                             std::string(prefix), start_revision,
                                             std::move(stats), std::move(on_events),
                                             std::move(on_end));
  if (absl::Status s = watch->Start(create_timeout); !s.ok()) return s;
  return watch;
}

}  // namespace straggler::cluster::detail
