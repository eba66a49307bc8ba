#include "straggler/gloo_store.h"

#include <grpcpp/grpcpp.h>

#include <gloo/common/error.h>

#include <sstream>

#include "straggler/common/channel_security.h"
#include "straggler/v1/straggler.grpc.pb.h"

namespace straggler {
namespace {

namespace pb = straggler::v1;

// A unary call that is not a Wait answers within this (Set/Get are
// in-memory on the daemon); longer means the daemon is unreachable.
constexpr auto kCallDeadline = std::chrono::seconds(10);
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
  std::unique_ptr<pb::RendezvousService::Stub> stub;

  [[noreturn]] void Fail(const char* what, const std::vector<std::string>& keys,
                         const grpc::Status& s) const {
    throw gloo::IoException("rendezvous " + std::string(what) + " of " + Join(keys) + " for job '" +
                            job + "' at stragglerd " + endpoint + " failed: " +
                            std::to_string(s.error_code()) + " " + s.error_message());
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
  impl_->stub = pb::RendezvousService::NewStub(grpc::CreateChannel(endpoint, credentials));
}

DaemonStore::~DaemonStore() = default;

void DaemonStore::set(const std::string& key, const std::vector<char>& data) {
  pb::RendezvousSetRequest req;
  req.set_job_id(impl_->job);
  req.set_key(key);
  req.set_value(data.data(), data.size());
  ToDuration(impl_->ttl, req.mutable_ttl());
  pb::RendezvousSetResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
  // A daemon that is restarting should not fail a context build at once.
  ctx.set_wait_for_ready(true);
  if (grpc::Status s = impl_->stub->Set(&ctx, req, &resp); !s.ok()) impl_->Fail("Set", {key}, s);
}

std::vector<char> DaemonStore::get(const std::string& key) {
  wait({key}, impl_->get_timeout);
  pb::RendezvousGetRequest req;
  req.set_job_id(impl_->job);
  req.add_keys(key);
  pb::RendezvousGetResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
  if (grpc::Status s = impl_->stub->Get(&ctx, req, &resp); !s.ok()) impl_->Fail("Get", {key}, s);
  const std::string& v = resp.entries(0).value();
  return std::vector<char>(v.begin(), v.end());
}

void DaemonStore::wait(const std::vector<std::string>& keys) { wait(keys, impl_->get_timeout); }

void DaemonStore::wait(const std::vector<std::string>& keys,
                       const std::chrono::milliseconds& timeout) {
  if (keys.empty()) return;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // The daemon caps one Wait at rendezvous.max_wait_seconds; a longer
  // timeout is served by asking again for the rest.
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pb::RendezvousWaitRequest req;
    req.set_job_id(impl_->job);
    for (const auto& k : keys) req.add_keys(k);
    ToDuration(std::max(left, std::chrono::milliseconds(1)), req.mutable_timeout());
    pb::RendezvousWaitResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::max(left, std::chrono::milliseconds(1)) +
                     kWaitSlack);
    grpc::Status s = impl_->stub->Wait(&ctx, req, &resp);
    if (s.ok()) return;
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
        std::chrono::steady_clock::now() < deadline) {
      continue;
    }
    impl_->Fail("Wait", keys, s);
  }
}

}  // namespace straggler
