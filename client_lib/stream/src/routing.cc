// Routing to a job's owner: see straggler/stream/routing.h.
#include "straggler/stream/routing.h"

#include <algorithm>
#include <thread>
#include <utility>

namespace straggler::stream {

std::string RedirectOwner(const grpc::ClientContext& ctx) {
  const auto& trailing = ctx.GetServerTrailingMetadata();
  const auto it = trailing.find(kOwnerGrpcMetadata);
  return it == trailing.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

std::chrono::milliseconds BackoffDelay(const Backoff& b, uint32_t attempt, std::mt19937_64& rng) {
  const int64_t initial = std::max<int64_t>(1, b.initial.count());
  const int64_t max = std::max<int64_t>(initial, b.max.count());
  int64_t cap = initial;
  for (uint32_t i = 0; i < attempt && cap < max; ++i) cap *= 2;
  cap = std::min(cap, max);
  if (b.jitter == Backoff::Jitter::kNarrow) {
    std::uniform_real_distribution<double> jitter(0.8, 1.2);
    return std::chrono::milliseconds(static_cast<int64_t>(static_cast<double>(cap) * jitter(rng)));
  }
  std::uniform_int_distribution<int64_t> dist(initial, cap);
  return std::chrono::milliseconds(dist(rng));
}

void BoundReconnectBackoff(const Backoff& backoff, grpc::ChannelArguments& args) {
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, static_cast<int>(backoff.initial.count()));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, static_cast<int>(backoff.max.count()));
}

AddressCursor::AddressCursor(std::vector<std::string> list) : list_(std::move(list)) {
  std::random_device seed;
  index_ = std::uniform_int_distribution<size_t>(0, list_.size() - 1)(seed);
  current_ = list_[index_];
}

void AddressCursor::Next() {
  if (current_ == list_[index_]) index_ = (index_ + 1) % list_.size();
  current_ = list_[index_];
}

UnaryRouter::UnaryRouter(std::shared_ptr<ChannelPool> pool, Options options,
                         std::function<void(grpc::ClientContext&)> make_context)
    : pool_(std::move(pool)),
      options_(options),
      make_context_(std::move(make_context)),
      rng_(std::random_device{}()),
      cursor_(pool_->addresses()) {}

std::string UnaryRouter::Address() const {
  absl::MutexLock lock(&mu_);
  return cursor_.current();
}

grpc::Status UnaryRouter::Call(const Attempt& attempt,
                               std::chrono::system_clock::time_point deadline,
                               std::string* address) {
  uint32_t failures = 0;
  RedirectRun run(options_.max_redirects);
  for (;;) {
    const std::string at = Address();
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    if (make_context_) make_context_(ctx);
    const grpc::Status status = attempt(pool_->Get(at), ctx);
    if (address != nullptr) *address = at;
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return status;
    const std::string owner = RedirectOwner(ctx);
    const bool redirected = !owner.empty() && owner != at;
    const bool at_once = redirected && run.FollowAtOnce();
    std::chrono::milliseconds pause(0);
    {
      absl::MutexLock lock(&mu_);
      // Another thread may have moved on already: move only from where
      // this attempt went.
      if (cursor_.current() == at) {
        if (redirected) {
          cursor_.MoveTo(owner);
        } else {
          cursor_.Next();
        }
      }
      if (!at_once) pause = BackoffDelay(options_.backoff, failures, rng_);
    }
    if (redirected) redirects_.fetch_add(1, std::memory_order_relaxed);
    if (at_once) continue;  // straight to the owner
    ++failures;
    if (!redirected) run.Reset();
    if (options_.max_failures != 0 && failures >= options_.max_failures) return status;
    if (std::chrono::system_clock::now() + pause >= deadline) return status;
    std::this_thread::sleep_for(pause);
  }
}

}  // namespace straggler::stream
