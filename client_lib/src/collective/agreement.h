// The agreement rule of PartialAllReduce (collective.h, docs/collective.md), shared by
// every backend so that Gloo and NCCL ranks can never decide differently:
//
//   * each rank PROPOSES the membership of an iteration: Client::MembershipFor
//     (iteration) when it answers in time (certain), else the membership it
//     applied last - a rank never guesses;
//   * the ranks that took part at their previous iteration (the previous
//     active set P; they all hold its communicator and applied the same
//     membership A there) then AGREE in band: one all-reduce of 40 bytes on
//     P's communicator (min of version and fingerprint, of their
//     complements, and the joiners' readiness below). A proposal every rank of P made is applied; otherwise all
//     of P keep A at this iteration and try again at the next. So a daemon
//     that dies after acknowledging some ranks' reports and not others' - or
//     that restarts and publishes a version before every rank is back - can
//     delay a switch, never split the job;
//   * a rank that was NOT taking part (excluded, readmitted now: a joiner)
//     has no communicator with P. It publishes the iteration it is at
//     (ReadyKey) once it knows of its readmission, and where it waits.
//     P's lowest rank adds "every joiner can be at this iteration" to the
//     agreement (a 5th word, the others add the neutral maximum): true at
//     the version's first slot (the joiners wait there by this rule), later
//     only where each said it is at or before - a joiner cannot go back -
//     so after a put-off switch P takes joiners in only where they can
//     still be, and otherwise puts the switch off like a disagreement. Then that rank publishes the iteration (JoinKey) before
//     building; the joiner applies the version exactly there and stays out
//     (a shadow step) until then. It waits for a JoinKey value at or past its
//     own iteration (older values are earlier attempts') up to
//     collective_timeout at the first slot from the version's effective
//     iteration (where P normally applies it), up to membership_timeout at
//     later ones;
//   * parameters are synchronised when the active set gains a rank that was
//     not active at this rank's previous iteration (or this rank itself was
//     not taking part) - every active rank computes the same answer.
//
//   Agreement a(rank, run_id, /*previous_active=*/{}, /*previously_participating=*/false);
//   StepPlan plan = a.Decide(it, client, timeouts, transport);   // may throw CollectiveError
//   ... set up the communicator of plan.active_ranks, using a.previous_active() ...
//   a.Commit(std::move(plan));                                   // now it is "applied"
//
// If the backend throws between Decide and Commit, nothing is applied: the
// next Decide starts again from the last committed iteration's state.
// Not thread-safe: used by the one thread that drives a PartialAllReduce.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "straggler/client.h"
#include "straggler/collective.h"

namespace straggler::detail {

// What the agreement needs from a backend.
class AgreementTransport {
 public:
  virtual ~AgreementTransport() = default;
  // Replaces each of `words` by its minimum over the ranks of this rank's
  // previous active set, on the communicator they all hold (the one they
  // used at their previous iteration). Called by every rank of that set at
  // the same point of its sequence of collectives, never by another rank.
  // Throws CollectiveError (a member gone, a timeout). Returns false, doing
  // nothing, when this rank no longer has that communicator (aborted after
  // an error): there is no channel left, and the rank decides alone.
  virtual bool MinOverPrevious(uint64_t iteration, std::span<uint64_t> words) = 0;
  // The rendezvous store. Publish is best effort: a failure is only logged
  // by the joiner's wait running out. Await returns nullopt when the key is
  // not there within `timeout` or the store cannot be reached; never throws.
  virtual void Publish(const std::string& key, const std::string& value) = 0;
  virtual std::optional<std::string> Await(const std::string& key, std::chrono::milliseconds timeout) = 0;
};

struct AgreementOptions {
  std::chrono::milliseconds membership{5000};  // MembershipFor; a joiner's later waits
  std::chrono::milliseconds collective{30000};  // a joiner's wait at the effective iteration
  // Switch slots: the set of a rank that took part at its previous
  // iteration changes only at multiples of this (CollectiveOptions::agreement_interval).
  uint32_t interval = 1;
};

class Agreement {
 public:
  // `previous_active` / `previously_participating`: the state a backend
  // treats as "before the first iteration" (Gloo: nothing; NCCL: the full
  // communicator, so that a first set without some rank is a shrink of it,
  // and its ranks agree on the first set in band like at any other
  // iteration, falling back to version 0 - everyone). The first iteration
  // always synchronises parameters. `run_id` names the run in JoinKey.
  Agreement(uint32_t rank, std::string run_id, std::vector<uint32_t> previous_active,
            bool previously_participating);

  // The plan of `iteration` by the rule above. Throws CollectiveError when
  // `iteration` is not above the last committed one, or when the in-band
  // agreement fails (then nothing is decided; the next call tries again).
  StepPlan Decide(uint64_t iteration, Client& client, const AgreementOptions& options,
                  AgreementTransport& transport);

  // Records `plan` (the one Decide just returned) as applied: the backend
  // has its communicator. Until then previous_*(), plan() and begun()
  // describe the last committed iteration.
  void Commit(StepPlan plan);

  const std::vector<uint32_t>& previous_active() const { return previous_active_; }
  bool previously_participating() const { return previously_participating_; }
  // The membership behind the last decided plan.
  const MembershipView& membership() const { return decided_; }
  // The last committed plan (default-constructed before the first Commit).
  const StepPlan& plan() const { return plan_; }
  bool begun() const { return begun_; }

  // Throws CollectiveError("<what> before the first BeginIteration").
  void RequireBegun(const char* what) const;
  // AllReduceAverage's answer before its collective: the applied version and
  // the size of its active set, participated false. Throws like
  // RequireBegun("AllReduceAverage") before the first Commit.
  AllReduceResult AverageResult() const;
  // "iteration 12: <backend> <op> among ranks {0,1,3} (membership version 4,
  // certain) failed within 20000 ms; a peer is gone or applied another
  // membership": the common part of every failed-collective error.
  std::string FailureText(std::string_view backend, std::string_view op,
                          std::chrono::milliseconds timeout) const;
  // "iteration 13: <backend> agreement on the membership among ranks
  // {0,1,2} (applied version 4) failed within 20000 ms; a peer is gone or
  // stopped stepping": a failed agreement of `iteration` (run on the
  // previous set, before this iteration's plan exists).
  std::string AgreementFailureText(std::string_view backend, uint64_t iteration,
                                   std::chrono::milliseconds timeout) const;

 private:
  // Whether the lowest rank of the previous set lets the group take
  // `joiners` in at `iteration` (the 5th agreement word).
  bool JoinersReady(uint64_t iteration, const MembershipView& m, const std::vector<uint32_t>& joiners,
                    uint32_t interval, AgreementTransport& transport) const;

  // Tracks a version put off at consecutive decisions; warns on stderr once
  // it was put off kReportDeferralAfter times, and when it ends.
  void NoteDeferral(uint64_t iteration, uint64_t deferred, uint64_t applied);
  static constexpr uint32_t kReportDeferralAfter = 3;

  const uint32_t rank_;
  const std::string run_id_;
  uint64_t ready_published_ = 0;  // the readmission whose ReadyKey the shadow path set
  uint64_t deferred_version_ = 0;  // 0: nothing put off at the last decision
  uint64_t deferred_since_ = 0;
  uint32_t deferred_count_ = 0;
  bool deferral_reported_ = false;
  std::optional<MembershipView> applied_;
  MembershipView decided_;
  std::vector<uint32_t> previous_active_;
  bool previously_participating_;
  bool begun_ = false;
  StepPlan plan_;
};

// The rendezvous key under which the lowest rank of the previous active set
// publishes the iteration at which its ranks apply `version`, which takes
// `rank` back in. Names the run, like every key of the collective layer.
std::string JoinKey(const std::string& run_id, uint32_t rank, uint64_t version);

// Where a joiner says it waits for `version` (the iteration it is at): the
// group takes it in only at that iteration or a later one.
std::string ReadyKey(const std::string& run_id, uint32_t rank, uint64_t version);

// Switch slots (AgreementOptions::interval): whether `iteration` is one, and
// the first one at or after `iteration`.
bool IsSlot(uint64_t iteration, uint32_t interval);
uint64_t FirstSlotFrom(uint64_t iteration, uint32_t interval);

// The 4 words ranks agree on: version and a fingerprint of the active set,
// each also complemented, so one minimum gives both minimum and maximum.
std::array<uint64_t, 4> ProposalWords(const MembershipView& m);
// After the minimum: true when every rank proposed the same words.
bool Unanimous(std::span<const uint64_t> words);

// The checks of the fields every backend's options share (CollectiveOptions):
// empty when fine, else what is wrong, naming the value. `uses_endpoint`:
// false when the rendezvous goes through a store of the trainer's own, so an
// empty rendezvous_endpoint is fine.
std::string ValidateCommonOptions(const CollectiveOptions& options, bool uses_endpoint = true);

}  // namespace straggler::detail
