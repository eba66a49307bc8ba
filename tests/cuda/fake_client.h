// A straggler::Client that keeps what is reported, for the GPU timer tests:
// they check what the timer hands to Client::Report, not the wire.
#pragma once

#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "straggler/client.h"

namespace straggler::testing {

struct ReportedIteration {
  uint32_t rank;
  uint64_t epoch;
  uint64_t iteration;
  double seconds;
};

class FakeClient final : public Client {
 public:
  bool Report(uint32_t rank, uint64_t epoch, uint64_t iteration, double compute_seconds,
              std::optional<double>, std::optional<double>) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (refuse_) return false;
    reports_.push_back({rank, epoch, iteration, compute_seconds});
    return true;
  }
  MembershipView CurrentMembership() const override { return {}; }
  MembershipView MembershipFor(uint64_t, std::chrono::milliseconds,
                               std::optional<uint32_t>) override {
    return {};
  }
  std::optional<MembershipView> ReadmissionAfter(uint64_t, std::optional<uint32_t>) override {
    return std::nullopt;
  }
  void OnMembershipChange(MembershipCallback) override {}
  bool Flush(std::chrono::milliseconds) override { return true; }
  ClientStats Stats() const override { return {}; }
  uint32_t FirstRank() const override { return 3; }

  std::vector<ReportedIteration> Reports() const {
    std::lock_guard<std::mutex> lock(mu_);
    return reports_;
  }
  void SetRefuse(bool refuse) {
    std::lock_guard<std::mutex> lock(mu_);
    refuse_ = refuse;
  }

 private:
  mutable std::mutex mu_;
  std::vector<ReportedIteration> reports_;
  bool refuse_ = false;
};

// Polls `done` until it holds or 20 s passed (a generous bound for a loaded
// CI machine: the outcome is asserted, never how long it took).
template <typename Pred>
bool WaitUntil(Pred done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace straggler::testing
