#include "straggler/gloo_store.h"

#include <grpcpp/grpcpp.h>

#include <gloo/common/error.h>

#include <algorithm>
#include <sstream>

#include "straggler/common/channel_security.h"
#include "straggler/stream/channel_pool.h"
#include "straggler/stream/routing.h"
#include "straggler/v1/straggler.grpc.pb.h"

namespace straggler {
namespace {

namespace pb = straggler::v1;

// A unary call that is not a Wait answers within this (Set/Get are
// in-memory on the daemon); longer means the daemon is unreachable.
constexpr std::chrono::milliseconds kCallDeadline{10000};
// A Wait's own deadline on top of the time it asks the server to hold it, so
// the server's DEADLINE_EXCEEDED (which names the keys) arrives first.
constexpr auto kWaitSlack = std::chrono::seconds(5);

void ToDuration(std::chrono::milliseconds ms, google::protobuf::Duration* d) {
  d->set_seconds(ms.count() / 1000);
  d->set_nanos(static_cast<int32_t>((ms.count() % 1000) * 1000000));
}

std::string Join(const std::vector<std::string>& keys) {
  std::ostringstream out;
  for (size_t i = 0; i < keys.size(); ++i) out << (i ? ", '" : "'") << keys[i] << "'";
  return out.str();
}

}  // namespace

struct DaemonStore::Impl {
  std::string endpoint;
  std::string job;
  std::chrono::milliseconds ttl;
  std::chrono::milliseconds get_timeout;
  // Several addresses (replicas), a random first one, a redirect followed
  // to the job's owner, the next address with backoff otherwise
  // (straggler/stream/routing.h): the same rules as the ingest stream.
  std::unique_ptr<stream::UnaryRouter> router;

  [[noreturn]] void Fail(const char* what, const std::vector<std::string>& keys,
                         const grpc::Status& s, const std::string& at) const {
    throw gloo::IoException("rendezvous " + std::string(what) + " of " + Join(keys) + " for job '" +
                            job + "' at stragglerd " + at + " failed: " +
                            std::to_string(s.error_code()) + " " + s.error_message());
  }

  // One call tried until the job's owner answers it or `budget` passes.
  template <typename Request, typename Response>
  grpc::Status Call(grpc::Status (pb::RendezvousService::Stub::*method)(grpc::ClientContext*,
                                                                        const Request&, Response*),
                    const Request& req, Response* resp, std::chrono::milliseconds budget,
                    std::string* at) {
    return router->Call(
        [&](const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext& ctx) {
          ctx.set_deadline(std::min(ctx.deadline(), std::chrono::system_clock::now() + kCallDeadline));
          resp->Clear();
          return (pb::RendezvousService::NewStub(channel).get()->*method)(&ctx, req, resp);
        },
        std::chrono::system_clock::now() + budget, at);
  }
};

DaemonStore::DaemonStore(const std::string& endpoint, std::string job_id,
                         std::chrono::milliseconds ttl, std::chrono::milliseconds get_timeout)
    : impl_(std::make_unique<Impl>()) {
  impl_->endpoint = endpoint;
  impl_->job = std::move(job_id);
  impl_->ttl = ttl;
  impl_->get_timeout = get_timeout;
  // TLS from STRAGGLER_TLS_CA/_CERT/_KEY, as the trainer's Client: a job
  // reaches one daemon with one set of credentials.
  std::string error;
  auto credentials = MakeChannelCredentials(ChannelSecurityFromEnv(), endpoint, &error);
  if (!credentials) {
    throw gloo::IoException("rendezvous store for job '" + impl_->job + "' at stragglerd " +
                            endpoint + ": " + error);
  }
  stream::UnaryRouter::Options options;
  grpc::ChannelArguments args;
  stream::BoundReconnectBackoff(options.backoff, args);
  auto pool = stream::ChannelPool::Make(endpoint, credentials, args);
  if (!pool.ok()) {
    throw gloo::IoException("rendezvous store for job '" + impl_->job + "': " +
                            std::string(pool.status().message()));
  }
  impl_->router = std::make_unique<stream::UnaryRouter>(*std::move(pool), options);
}

DaemonStore::~DaemonStore() = default;

std::string DaemonStore::address() const { return impl_->router->Address(); }

void DaemonStore::set(const std::string& key, const std::vector<char>& data) {
  pb::RendezvousSetRequest req;
  req.set_job_id(impl_->job);
  req.set_key(key);
  req.set_value(data.data(), data.size());
  ToDuration(impl_->ttl, req.mutable_ttl());
  pb::RendezvousSetResponse resp;
  // A daemon that is restarting, or a failover to another replica, should
  // not fail a context build at once: retried within get_timeout.
  std::string at;
  if (grpc::Status s = impl_->Call(&pb::RendezvousService::Stub::Set, req, &resp,
                                   std::max(impl_->get_timeout, kCallDeadline), &at);
      !s.ok()) {
    impl_->Fail("Set", {key}, s, at);
  }
}

std::vector<char> DaemonStore::get(const std::string& key) {
  wait({key}, impl_->get_timeout);
  pb::RendezvousGetRequest req;
  req.set_job_id(impl_->job);
  req.add_keys(key);
  pb::RendezvousGetResponse resp;
  std::string at;
  if (grpc::Status s = impl_->Call(&pb::RendezvousService::Stub::Get, req, &resp,
                                   std::max(impl_->get_timeout, kCallDeadline), &at);
      !s.ok()) {
    impl_->Fail("Get", {key}, s, at);
  }
  const std::string& v = resp.entries(0).value();
  return std::vector<char>(v.begin(), v.end());
}

void DaemonStore::wait(const std::vector<std::string>& keys) { wait(keys, impl_->get_timeout); }

void DaemonStore::wait(const std::vector<std::string>& keys,
                       const std::chrono::milliseconds& timeout) {
  if (keys.empty()) return;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // The daemon caps one Wait at rendezvous.max_wait_seconds; a longer
  // timeout is served by asking again for the rest. A Wait the owner's
  // failover broke (UNAVAILABLE) is asked again of the new owner by the
  // router, which finds the keys there (docs/cluster.md, "The rendezvous
  // store at a failover").
  for (;;) {
    const auto left = std::max(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   deadline - std::chrono::steady_clock::now()),
                               std::chrono::milliseconds(1));
    pb::RendezvousWaitRequest req;
    req.set_job_id(impl_->job);
    for (const auto& k : keys) req.add_keys(k);
    ToDuration(left, req.mutable_timeout());
    pb::RendezvousWaitResponse resp;
    std::string at;
    grpc::Status s = impl_->router->Call(
        [&](const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext& ctx) {
          // The request's timeout counts from now, on whichever replica.
          const auto now = std::chrono::steady_clock::now();
          ToDuration(std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now),
                              std::chrono::milliseconds(1)),
                     req.mutable_timeout());
          return pb::RendezvousService::NewStub(channel)->Wait(&ctx, req, &resp);
        },
        std::chrono::system_clock::now() + left + kWaitSlack, &at);
    if (s.ok()) return;
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
        std::chrono::steady_clock::now() < deadline) {
      continue;
    }
    impl_->Fail("Wait", keys, s, at);
  }
}

}  // namespace straggler
