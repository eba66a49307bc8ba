#include "cluster/etcd_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cluster/etcd_streams.h"
#include "etcdserverpb/rpc.grpc.pb.h"

namespace straggler::cluster {
namespace {

namespace pb = ::etcdserverpb;

std::vector<KeyValue> FromProto(const google::protobuf::RepeatedPtrField<::mvccpb::KeyValue>& kvs) {
  std::vector<KeyValue> out;
  out.reserve(kvs.size());
  for (const auto& kv : kvs) out.push_back(detail::FromProto(kv));
  return out;
}

void ToProto(const Compare& c, pb::Compare* out) {
  out->set_key(c.key);
  switch (c.op) {
    case Compare::Op::kEqual: out->set_result(pb::Compare::EQUAL); break;
    case Compare::Op::kGreater: out->set_result(pb::Compare::GREATER); break;
    case Compare::Op::kLess: out->set_result(pb::Compare::LESS); break;
    case Compare::Op::kNotEqual: out->set_result(pb::Compare::NOT_EQUAL); break;
  }
  switch (c.target) {
    case Compare::Target::kVersion:
      out->set_target(pb::Compare::VERSION);
      out->set_version(c.number);
      break;
    case Compare::Target::kCreateRevision:
      out->set_target(pb::Compare::CREATE);
      out->set_create_revision(c.number);
      break;
    case Compare::Target::kModRevision:
      out->set_target(pb::Compare::MOD);
      out->set_mod_revision(c.number);
      break;
    case Compare::Target::kValue:
      out->set_target(pb::Compare::VALUE);
      out->set_value(c.value);
      break;
    case Compare::Target::kLease:
      out->set_target(pb::Compare::LEASE);
      out->set_lease(c.number);
      break;
  }
}

void ToProto(const TxnOp& op, pb::RequestOp* out) {
  switch (op.kind) {
    case TxnOp::Kind::kGet: out->mutable_request_range()->set_key(op.key); break;
    case TxnOp::Kind::kPut: {
      pb::PutRequest* put = out->mutable_request_put();
      put->set_key(op.key);
      put->set_value(op.value);
      put->set_lease(op.lease);
      break;
    }
    case TxnOp::Kind::kDelete: out->mutable_request_delete_range()->set_key(op.key); break;
  }
}

// One member's host:port (an http:// prefix and a trailing / dropped), or an
// error naming it.
absl::StatusOr<std::string> CheckMember(absl::string_view given) {
  absl::string_view e = absl::StripAsciiWhitespace(given);
  if (absl::StartsWith(e, "https://")) {
    return absl::UnimplementedError(
        absl::StrCat("etcd endpoint '", given, "': TLS to etcd is not supported yet"));
  }
  absl::ConsumePrefix(&e, "http://");
  absl::ConsumeSuffix(&e, "/");
  size_t colon = e.rfind(':');
  uint32_t port = 0;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(e.substr(colon + 1), &port) || port == 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd endpoint '", given, "' is not host:port (e.g. 127.0.0.1:2379)"));
  }
  return std::string(e);
}

bool IsIp(absl::string_view member, int family) {
  std::string host(member.substr(0, member.rfind(':')));
  if (family == AF_INET6) {
    if (host.size() < 2 || host.front() != '[' || host.back() != ']') return false;
    host = host.substr(1, host.size() - 2);
  }
  unsigned char buf[sizeof(in6_addr)];
  return inet_pton(family, host.c_str(), buf) == 1;
}

// The gRPC target of the members: one as it is (a DNS name's every record
// is tried), several only as IP literals of one family ("ipv4:a:1,b:2"):
// gRPC C++ has no resolver for a list of names. Members are tried in order.
absl::StatusOr<std::string> Target(const std::vector<std::string>& members,
                                   absl::string_view given) {
  if (members.size() == 1) return members[0];
  for (int family : {AF_INET, AF_INET6}) {
    if (std::all_of(members.begin(), members.end(),
                    [&](const std::string& m) { return IsIp(m, family); })) {
      return absl::StrCat(family == AF_INET ? "ipv4:" : "ipv6:", absl::StrJoin(members, ","));
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("etcd endpoints '", given, "': several members must all be IPv4 or all ",
                   "IPv6 addresses; for names, give one DNS name with a record per member"));
}

grpc::ChannelArguments ChannelArgs() {
  grpc::ChannelArguments args;
  // gRPC's default reconnect backoff grows to 120 s: an etcd back from a
  // restart would wait that long for its replicas. etcd is this process's
  // one dependency and is on the local network: retry at least every second.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // gRPC takes this as the connect timeout too (default 20 s). An attempt
  // made while etcd restarts (its port bound, not yet serving) was seen to
  // stall for seconds (docs/cluster.md, "Threads and connections"): cut it
  // after 1 s and try again. (100 ms cut handshakes with a busy etcd short.)
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);
  // A connection that stalls without breaking (packets dropped) is found
  // by pings rather than after TCP's minutes: every 10 s while a call is
  // open (etcd refuses pings more often than --grpc-keepalive-min-time, 5 s
  // by default), 3 s for the answer.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 3000);
  // A read of a job's rendezvous keys (jobs/<job>/rendezvous/, up to
  // rendezvous.max_bytes_per_job, 64 MiB) passes gRPC's default 4 MiB; etcd
  // sends answers of any size (its --max-request-bytes bounds requests).
  args.SetMaxReceiveMessageSize(-1);
  return args;
}

class Client final : public EtcdClient {
 public:
  Client(std::string endpoints, const std::string& target, std::chrono::milliseconds timeout)
      : endpoint_(std::move(endpoints)),
        timeout_(timeout),
        channel_(grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(),
                                           ChannelArgs())),
        kv_(pb::KV::NewStub(channel_)),
        lease_(pb::Lease::NewStub(channel_)) {}

  const std::string& endpoint() const override { return endpoint_; }

  absl::StatusOr<RangeResult> Get(absl::string_view key) override {
    pb::RangeRequest req;
    req.set_key(std::string(key));
    return Range(req, "Range");
  }

  absl::StatusOr<RangeResult> GetPrefix(absl::string_view prefix) override {
    pb::RangeRequest req;
    req.set_key(std::string(prefix));
    req.set_range_end(PrefixRangeEnd(prefix));
    return Range(req, "Range(prefix)");
  }

  absl::StatusOr<int64_t> Put(absl::string_view key, absl::string_view value,
                              int64_t lease) override {
    pb::PutRequest req;
    req.set_key(std::string(key));
    req.set_value(std::string(value));
    req.set_lease(lease);
    pb::PutResponse resp;
    grpc::Status s = Timed(
        [&](grpc::ClientContext& ctx) { return kv_->Put(&ctx, req, &resp); });
    if (!s.ok()) return detail::CallError(endpoint_, absl::StrCat("Put ", key), s);
    return resp.header().revision();
  }

  absl::StatusOr<int64_t> Delete(absl::string_view key) override {
    pb::DeleteRangeRequest req;
    req.set_key(std::string(key));
    return DeleteRange(req);
  }

  absl::StatusOr<int64_t> DeletePrefix(absl::string_view prefix) override {
    pb::DeleteRangeRequest req;
    req.set_key(std::string(prefix));
    req.set_range_end(PrefixRangeEnd(prefix));
    return DeleteRange(req);
  }

  absl::StatusOr<TxnResult> Txn(const std::vector<Compare>& compares,
                                const std::vector<TxnOp>& success,
                                const std::vector<TxnOp>& failure) override {
    pb::TxnRequest req;
    for (const Compare& c : compares) ToProto(c, req.add_compare());
    for (const TxnOp& op : success) ToProto(op, req.add_success());
    for (const TxnOp& op : failure) ToProto(op, req.add_failure());
    pb::TxnResponse resp;
    grpc::Status s = Timed(
        [&](grpc::ClientContext& ctx) { return kv_->Txn(&ctx, req, &resp); });
    if (!s.ok()) return detail::CallError(endpoint_, "Txn", s);
    TxnResult out;
    out.succeeded = resp.succeeded();
    out.revision = resp.header().revision();
    for (const pb::ResponseOp& r : resp.responses()) {
      out.results.push_back(r.has_response_range() ? FromProto(r.response_range().kvs())
                                                   : std::vector<KeyValue>{});
    }
    return out;
  }

  absl::Status Compact(int64_t revision) override {
    pb::CompactionRequest req;
    req.set_revision(revision);
    pb::CompactionResponse resp;
    grpc::Status s = Timed(
        [&](grpc::ClientContext& ctx) { return kv_->Compact(&ctx, req, &resp); });
    if (!s.ok()) return detail::CallError(endpoint_, absl::StrCat("Compact ", revision), s);
    return absl::OkStatus();
  }

  absl::StatusOr<Lease> GrantLease(int64_t ttl_seconds) override {
    if (ttl_seconds <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("lease TTL ", ttl_seconds, " s must be > 0 (etcd ", endpoint_, ")"));
    }
    pb::LeaseGrantRequest req;
    req.set_ttl(ttl_seconds);
    pb::LeaseGrantResponse resp;
    Lease lease;
    lease.sent = Clock::now();
    grpc::Status s = Timed(
        [&](grpc::ClientContext& ctx) { return lease_->LeaseGrant(&ctx, req, &resp); });
    if (!s.ok()) return detail::CallError(endpoint_, "LeaseGrant", s);
    if (!resp.error().empty() || resp.ttl() <= 0) {
      return absl::InternalError(absl::StrCat("etcd ", endpoint_, " LeaseGrant ttl=", ttl_seconds,
                                              ": granted ttl=", resp.ttl(), " ", resp.error()));
    }
    lease.id = resp.id();
    lease.ttl_seconds = resp.ttl();
    return lease;
  }

  absl::Status RevokeLease(int64_t id) override {
    pb::LeaseRevokeRequest req;
    req.set_id(id);
    pb::LeaseRevokeResponse resp;
    grpc::Status s = Timed(
        [&](grpc::ClientContext& ctx) { return lease_->LeaseRevoke(&ctx, req, &resp); });
    if (!s.ok()) return detail::CallError(endpoint_, absl::StrCat("LeaseRevoke ", id), s);
    return absl::OkStatus();
  }

  absl::StatusOr<LeaseStatus> TimeToLive(int64_t id) override {
    pb::LeaseTimeToLiveRequest req;
    req.set_id(id);
    req.set_keys(true);
    pb::LeaseTimeToLiveResponse resp;
    grpc::Status s = Timed(
        [&](grpc::ClientContext& ctx) { return lease_->LeaseTimeToLive(&ctx, req, &resp); });
    if (!s.ok()) return detail::CallError(endpoint_, absl::StrCat("LeaseTimeToLive ", id), s);
    LeaseStatus out;
    out.ttl_seconds = resp.ttl();
    out.granted_ttl_seconds = resp.grantedttl();
    out.keys.assign(resp.keys().begin(), resp.keys().end());
    return out;
  }

  std::unique_ptr<LeaseKeeper> KeepAlive(const Lease& lease) override {
    return detail::StartLeaseKeeper(channel_, endpoint_, lease, stats_);
  }

  const EtcdStats& stats() const override { return *stats_; }

  absl::StatusOr<std::unique_ptr<Watch>> WatchPrefix(absl::string_view prefix,
                                                     int64_t start_revision,
                                                     Watch::OnEvents on_events,
                                                     Watch::OnEnd on_end) override {
    return detail::StartWatch(channel_, endpoint_, prefix, start_revision, timeout_, stats_,
                              std::move(on_events), std::move(on_end));
  }

 private:
  // One unary call bounded by the call timeout, timed into stats_.
  template <typename Call>
  grpc::Status Timed(Call&& call) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout_);
    const Clock::time_point start = Clock::now();
    grpc::Status s = call(ctx);
    stats_->Record(Clock::now() - start, s.ok());
    return s;
  }

  absl::StatusOr<RangeResult> Range(const pb::RangeRequest& req, absl::string_view call) {
    pb::RangeResponse resp;
    grpc::Status s = Timed(
        [&](grpc::ClientContext& ctx) { return kv_->Range(&ctx, req, &resp); });
    if (!s.ok()) return detail::CallError(endpoint_, absl::StrCat(call, " ", req.key()), s);
    return RangeResult{resp.header().revision(), FromProto(resp.kvs())};
  }

  absl::StatusOr<int64_t> DeleteRange(const pb::DeleteRangeRequest& req) {
    pb::DeleteRangeResponse resp;
    grpc::Status s = Timed(
        [&](grpc::ClientContext& ctx) { return kv_->DeleteRange(&ctx, req, &resp); });
    if (!s.ok()) return detail::CallError(endpoint_, absl::StrCat("DeleteRange ", req.key()), s);
    return resp.deleted();
  }

  const std::string endpoint_;
  const std::chrono::milliseconds timeout_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<pb::KV::Stub> kv_;
  const std::unique_ptr<pb::Lease::Stub> lease_;
  // Shared with the streams, which may outlive the client.
  const std::shared_ptr<EtcdStats> stats_ = std::make_shared<EtcdStats>();
};

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Connect(Options options) {
  std::vector<std::string> members;
  for (absl::string_view given : absl::StrSplit(options.endpoints, ',')) {
    absl::StatusOr<std::string> member = CheckMember(given);
    if (!member.ok()) return member.status();
    members.push_back(*std::move(member));
  }
  absl::StatusOr<std::string> target = Target(members, options.endpoints);
  if (!target.ok()) return target.status();
  const std::string endpoints = absl::StrJoin(members, ",");
  if (options.call_timeout <= std::chrono::milliseconds(0)) {
    return absl::InvalidArgumentError(absl::StrCat("etcd ", endpoints, ": call timeout ",
                                                   options.call_timeout.count(),
                                                   " ms must be > 0"));
  }
  return std::make_unique<Client>(endpoints, *std::move(target), options.call_timeout);
}

}  // namespace straggler::cluster
