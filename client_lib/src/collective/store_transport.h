// detail::AgreementTransport for every backend: the store half (the ready
// and join keys of readmitted ranks, agreement.h) over the rendezvous store
// (stragglerd's DaemonStore, or a trainer's own), the in-band all-reduce through the backend's function.
// Header-only: the backends are separate shared libraries and this is not
// part of the public API.
//
// Not thread-safe beyond what the store promises; used by the one thread
// that drives a PartialAllReduce.
#pragma once


#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "agreement.h"
#include "straggler/gloo_store.h"

namespace straggler::detail {

// The rendezvous store a backend's `options` name: the trainer's own
// (rendezvous_store), else stragglerd's (DaemonStore).
template <class Options>
std::shared_ptr<gloo::rendezvous::Store> RendezvousStoreFor(const Options& options) {
  if (options.rendezvous_store) return options.rendezvous_store;
  return std::make_shared<DaemonStore>(options.rendezvous_endpoint, options.job_id, options.key_ttl,
                                       options.collective_timeout);
}

class StoreAgreementTransport final : public AgreementTransport {
 public:
  using MinOverPreviousFn = std::function<bool(uint64_t iteration, std::span<uint64_t> words)>;
  // `store` and whatever `min_over_previous` uses must outlive this.
  StoreAgreementTransport(gloo::rendezvous::Store& store, MinOverPreviousFn min_over_previous)
      : store_(store), min_over_previous_(std::move(min_over_previous)) {}

  bool MinOverPrevious(uint64_t iteration, std::span<uint64_t> words) override {
    return min_over_previous_(iteration, words);
  }

  void Publish(const std::string& key, const std::string& value) override {
    try {
      store_.set(key, std::vector<char>(value.begin(), value.end()));
    } catch (const std::exception&) {
      // Best effort (agreement.h): the joiner's bounded wait runs out and it
      // stays out; the group's build then fails within collective_timeout.
    }
  }

  std::optional<std::string> Await(const std::string& key, std::chrono::milliseconds timeout) override {
    try {
      store_.wait({key}, std::max(timeout, std::chrono::milliseconds(1)));
      const std::vector<char> v = store_.get(key);
      return std::string(v.begin(), v.end());
    } catch (const std::exception&) {
      return std::nullopt;  // not there in time, or the daemon is unreachable
    }
  }

 private:
  gloo::rendezvous::Store& store_;
  MinOverPreviousFn min_over_previous_;
};

}  // namespace straggler::detail
