#include "agreement.h"

#include <algorithm>
#include <thread>
#include <climits>
#include <cstdio>
#include <cstdint>

#include "../parse_unsigned.h"
#include "nccl_plan.h"  // SetText

namespace straggler::detail {

namespace {

// FNV-1a over the version and the active set: ranks that propose the same
// words propose the same membership (versions are unique within a daemon
// run; the set guards against two runs that reused a number).
uint64_t Fingerprint(const MembershipView& m) {
  uint64_t h = 14695981039346656037ull;  // the FNV-1a 64-bit offset basis
  auto mix = [&](uint64_t x) {
    for (int i = 0; i < 8; ++i) {
      h ^= (x >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  mix(m.version);
  mix(m.world_size);
  for (const ExcludedRankInfo& e : m.excluded) mix(e.rank);
  return h;
}

std::optional<uint64_t> ParseIteration(const std::string& s) {
  uint64_t v = 0;
  if (!ParseUnsigned(s, &v)) return std::nullopt;
  return v;
}

// The value of `key` as an iteration once it is at least `at_least`, waiting
// up to `wait` (a value below is an earlier attempt's: polled until it is
// replaced). The last value seen, or nullopt, when that does not happen.
std::optional<uint64_t> AwaitAtLeast(AgreementTransport& transport, const std::string& key,
                                     uint64_t at_least, std::chrono::milliseconds wait);

}  // namespace

std::string JoinKey(const std::string& run_id, uint32_t rank, uint64_t version) {
  return "agree/" + run_id + "/join/r" + std::to_string(rank) + "/v" + std::to_string(version);
}

std::string ReadyKey(const std::string& run_id, uint32_t rank, uint64_t version) {
  return "agree/" + run_id + "/ready/r" + std::to_string(rank) + "/v" + std::to_string(version);
}

bool IsSlot(uint64_t iteration, uint32_t interval) {
  return interval <= 1 || iteration % interval == 0;
}

uint64_t FirstSlotFrom(uint64_t iteration, uint32_t interval) {
  if (interval <= 1 || iteration % interval == 0) return iteration;
  return iteration + (interval - iteration % interval);
}

std::array<uint64_t, 4> ProposalWords(const MembershipView& m) {
  const uint64_t f = Fingerprint(m);
  return {m.version, ~m.version, f, ~f};
}

bool Unanimous(std::span<const uint64_t> words) {
  return words.size() == 4 && words[0] == ~words[1] && words[2] == ~words[3];
}

Agreement::Agreement(uint32_t rank, std::string run_id, std::vector<uint32_t> previous_active,
                     bool previously_participating)
    : rank_(rank),
      run_id_(std::move(run_id)),
      previous_active_(std::move(previous_active)),
      previously_participating_(previously_participating) {
  if (previously_participating_ && !previous_active_.empty()) {
    // Every rank starts on the same communicator of everyone: version 0.
    MembershipView everyone;
    everyone.world_size = static_cast<uint32_t>(previous_active_.size());
    applied_ = everyone;
  }
}

StepPlan Agreement::Decide(uint64_t iteration, Client& client, const AgreementOptions& options,
                           AgreementTransport& transport) {
  if (begun_ && iteration <= plan_.iteration) {
    throw CollectiveError("BeginIteration(" + std::to_string(iteration) + ") after iteration " +
                          std::to_string(plan_.iteration) + ": iterations must increase");
  }
  if (begun_ && previously_participating_ && !IsSlot(iteration, options.interval)) {
    // Between switch slots the set stays: nothing to ask, nothing to agree.
    StepPlan plan = plan_;
    plan.iteration = iteration;
    plan.certain = true;  // (nothing asked: the applied set is the agreed one)
    plan.sync_parameters = false;
    plan.rejoin_iteration.reset();
    const MembershipView newest = client.CurrentMembership();
    plan.deferred_version =
        newest.version > plan_.version && newest.effective_iteration <= iteration ? newest.version : 0;
    decided_ = *applied_;
    return plan;
  }
  MembershipView m = client.MembershipFor(iteration, options.membership, rank_);
  const bool certain = m.ok;
  if (!certain && applied_) {
    // Never guess: a version this rank has received but cannot prove final
    // may not have reached the other ranks (the daemon may have died while
    // pushing it). Propose the last applied membership instead.
    m = *applied_;
  }
  // (No applied membership and no answer: the first iteration of a Gloo
  // rank whose daemon is down. MembershipFor then returns the best known,
  // which is version 0 - everyone - unless a directive arrived.)
  uint64_t deferred = 0;
  std::optional<uint64_t> rejoin;
  if (previously_participating_ && applied_) {
    const bool root = !previous_active_.empty() && rank_ == previous_active_.front();
    // Ranks the proposal takes back: they have no communicator with this set.
    std::vector<uint32_t> joiners;
    for (uint32_t r : m.ActiveRanks()) {
      if (!std::binary_search(previous_active_.begin(), previous_active_.end(), r)) joiners.push_back(r);
    }
    bool unanimous = true;
    bool joiners_ready = true;
    if (previous_active_.size() > 1) {
      // The 5th word carries the root's view of the joiners (the others add
      // the neutral maximum): every member learns it from the same minimum.
      std::array<uint64_t, 5> words{};
      const std::array<uint64_t, 4> proposal = ProposalWords(m);
      std::copy(proposal.begin(), proposal.end(), words.begin());
      words[4] = root ? (JoinersReady(iteration, m, joiners, options.interval, transport) ? 1 : 0) : UINT64_MAX;
      // (No communicator left after an error: each rank decides alone, as
      // the set's next build fails within the timeout if they differ.)
      if (transport.MinOverPrevious(iteration, words)) {
        unanimous = Unanimous(std::span<const uint64_t>(words.data(), 4));
        joiners_ready = words[4] == 1;
      }
    } else if (root) {
      joiners_ready = JoinersReady(iteration, m, joiners, options.interval, transport);
    }
    if (!unanimous || !joiners_ready) {
      // Some rank of the previous set proposed another membership (it was
      // not certain of this one, or knows a newer one), or a rank it takes
      // back is not waiting for it at or before this iteration: all of them
      // keep the last applied one here and propose again at the next slot.
      if (m.version != applied_->version) deferred = m.version;
      m = *applied_;
    } else if (root) {
      // Tell the ranks this version takes back where the group applies it.
      for (uint32_t r : joiners) transport.Publish(JoinKey(run_id_, r, m.version), std::to_string(iteration));
    }
  } else if (applied_ && !m.IsExcluded(rank_)) {
    // A joiner: it applies this version where the group does, never alone.
    // It says where it waits (the group takes it in there or later, never
    // earlier: it cannot go back), then waits for the group's iteration. At
    // the first slot from the version's effective iteration, where the group
    // normally takes it in, as long as a context build would wait; later
    // (the group put the switch off) shorter, so the rank keeps stepping.
    transport.Publish(ReadyKey(run_id_, rank_, m.version), std::to_string(iteration));
    const auto wait = iteration == FirstSlotFrom(m.effective_iteration, options.interval)
                          ? options.collective
                          : options.membership;
    const std::optional<uint64_t> join =
        AwaitAtLeast(transport, JoinKey(run_id_, rank_, m.version), iteration, wait);
    if (!join || *join != iteration) {
      deferred = m.version;
      if (join && *join > iteration) rejoin = *join;
      m = *applied_;
    }
  }
  NoteDeferral(iteration, deferred, m.version);
  StepPlan plan;
  plan.iteration = iteration;
  plan.version = m.version;
  plan.effective_iteration = m.effective_iteration;
  plan.certain = certain;
  plan.deferred_version = deferred;
  plan.participating = !m.IsExcluded(rank_);
  plan.active_ranks = m.ActiveRanks();
  plan.root = plan.active_ranks.empty() ? 0 : plan.active_ranks.front();
  // Ranks that were not active at this rank's previous iteration need the
  // parameters. Every active rank computes the same answer: those active
  // before all applied the same previous membership, and a joiner was not
  // active in its previous one.
  for (uint32_t r : plan.active_ranks) {
    if (!begun_ || !previously_participating_ ||
        !std::binary_search(previous_active_.begin(), previous_active_.end(), r)) {
      plan.sync_parameters = plan.participating;
      break;
    }
  }
  if (!plan.participating) {
    if (rejoin) {
      plan.rejoin_iteration = rejoin;
    } else if (!deferred) {
      if (std::optional<MembershipView> back = client.ReadmissionAfter(iteration, rank_)) {
        plan.rejoin_iteration = back->effective_iteration;
        // Where this rank is: it can skip forward to any later iteration, so
        // the group may take it in from here on (at the effective iteration,
        // normally) - and not earlier, were this rank ahead of the group.
        // Once per version: a shadow step need not pay a store round trip,
        // and a rank that steps on without skipping waits at the effective
        // iteration, where the joiner path says where it is again.
        if (back->version != ready_published_) {
          ready_published_ = back->version;
          transport.Publish(ReadyKey(run_id_, rank_, back->version), std::to_string(iteration));
        }
      }
    }
  }
  decided_ = std::move(m);
  return plan;
}

namespace {

std::optional<uint64_t> AwaitAtLeast(AgreementTransport& transport, const std::string& key,
                                     uint64_t at_least, std::chrono::milliseconds wait) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  std::optional<uint64_t> seen;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return seen;
    const std::optional<std::string> v = transport.Await(key, left);
    if (v) {
      seen = ParseIteration(*v);
      if (seen && *seen >= at_least) return seen;
    }
    // An earlier attempt's value (or a store that cannot be reached): ask
    // again shortly, until the deadline.
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace

void Agreement::NoteDeferral(uint64_t iteration, uint64_t deferred, uint64_t applied) {
  // A put-off switch is normal for an iteration or two (a rank reconnecting
  // to a restarted daemon); one that lasts means a rank of the set cannot
  // be certain (cut off from stragglerd, or its agent's upstream down) and
  // holds everyone - the straggler too - on the old membership. Say so once
  // per version, on stderr like the client's other warnings, and say when
  // it ends.
  if (deferred != 0) {
    if (deferred != deferred_version_) {
      deferred_version_ = deferred;
      deferred_since_ = iteration;
      deferred_count_ = 0;
      deferral_reported_ = false;
    }
    if (++deferred_count_ == kReportDeferralAfter && !deferral_reported_) {
      deferral_reported_ = true;
      std::fprintf(stderr,
                   "straggler collective: rank %u: membership version %llu put off since iteration "
                   "%llu (%u times): %s; every rank keeps version %llu until then\n",
                   rank_, static_cast<unsigned long long>(deferred),
                   static_cast<unsigned long long>(deferred_since_), deferred_count_,
                   previously_participating_
                       ? "a rank of the previous active set has not proposed it (not certain of it: "
                         "cut off from stragglerd?)"
                       : "this readmitted rank waits for the group to take it in",
                   static_cast<unsigned long long>(applied));
    }
  } else if (deferred_version_ != 0) {
    if (deferral_reported_) {
      std::fprintf(stderr,
                   "straggler collective: rank %u: applied version %llu at iteration %llu after "
                   "%u iterations put off\n",
                   rank_, static_cast<unsigned long long>(applied),
                   static_cast<unsigned long long>(iteration), deferred_count_);
    }
    deferred_version_ = 0;
  }
}

bool Agreement::JoinersReady(uint64_t iteration, const MembershipView& m,
                             const std::vector<uint32_t>& joiners, uint32_t interval,
                             AgreementTransport& transport) const {
  // At the version's first slot the joiners wait by the rule (the daemon
  // makes that no earlier than their own last report + lead, so they are
  // not past it): no lookup, and no race with a joiner that has not yet
  // stepped since it learnt of the version. Later (the switch was put off),
  // only where each has said it is.
  if (joiners.empty() || iteration == FirstSlotFrom(m.effective_iteration, interval)) return true;
  for (uint32_t r : joiners) {
    const std::optional<std::string> v =
        transport.Await(ReadyKey(run_id_, r, m.version), std::chrono::milliseconds(1));
    const std::optional<uint64_t> at = v ? ParseIteration(*v) : std::nullopt;
    if (!at || *at > iteration) return false;
  }
  return true;
}

void Agreement::Commit(StepPlan plan) {
  applied_ = decided_;
  previous_active_ = plan.active_ranks;
  previously_participating_ = plan.participating;
  plan_ = std::move(plan);
  begun_ = true;
}

AllReduceResult Agreement::AverageResult() const {
  RequireBegun("AllReduceAverage");
  AllReduceResult r;
  r.version = plan_.version;
  r.active_ranks = static_cast<uint32_t>(plan_.active_ranks.size());
  return r;
}

void Agreement::RequireBegun(const char* what) const {
  if (!begun_) throw CollectiveError(std::string(what) + " before the first BeginIteration");
}

std::string Agreement::FailureText(std::string_view backend, std::string_view op,
                                   std::chrono::milliseconds timeout) const {
  return "iteration " + std::to_string(plan_.iteration) + ": " + std::string(backend) + " " +
         std::string(op) + " among ranks " + SetText(plan_.active_ranks) +
         " (membership version " + std::to_string(plan_.version) +
         (plan_.certain ? ", certain" : ", kept after MembershipFor timed out") +
         ") failed within " + std::to_string(timeout.count()) +
         " ms; a peer is gone or applied another membership";
}

std::string Agreement::AgreementFailureText(std::string_view backend, uint64_t iteration,
                                            std::chrono::milliseconds timeout) const {
  return "iteration " + std::to_string(iteration) + ": " + std::string(backend) +
         " agreement on the membership among ranks " + SetText(previous_active_) +
         " (applied version " + std::to_string(plan_.version) + ") failed within " +
         std::to_string(timeout.count()) + " ms; a peer is gone or stopped stepping";
}

std::string ValidateCommonOptions(const CollectiveOptions& o, bool uses_endpoint) {
  if (o.job_id.empty())
    return "job_id is empty: give the client's job id (ClientOptions::job_id, "
           "STRAGGLER_JOB_ID)";
  if (o.world_size == 0) return "world_size=0 must be > 0";
  if (o.rank >= o.world_size) {
    return "rank=" + std::to_string(o.rank) +
           " must be < world_size=" + std::to_string(o.world_size);
  }
  if (uses_endpoint && o.rendezvous_endpoint.empty()) {
    return "rendezvous_endpoint is empty: name stragglerd's gRPC address (the rendezvous store "
           "is served by the daemon, not by the node agent), e.g. with "
           "STRAGGLER_RENDEZVOUS_ENDPOINT";
  }
  if (o.collective_timeout.count() <= 0) {
    return "collective_timeout=" + std::to_string(o.collective_timeout.count()) + "ms must be > 0";
  }
  if (o.membership_timeout.count() < 0) {
    return "membership_timeout=" + std::to_string(o.membership_timeout.count()) +
           "ms must be >= 0";
  }
  if (o.agreement_interval == 0) return "agreement_interval=0 must be >= 1 (1: every iteration)";
  if (o.agreement_interval > kMaxAgreementInterval) {
    return "agreement_interval=" + std::to_string(o.agreement_interval) + " must be <= " +
           std::to_string(kMaxAgreementInterval);
  }
  return "";
}

}  // namespace straggler::detail
