// The Gloo backend of PartialAllReduce: one Gloo context per active set,
// built at the switch iteration by that set's members only, through a
// PrefixStore over the daemon's rendezvous store.
#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <list>
#include <sstream>

#include "straggler/collective.h"
#include "straggler/gloo_store.h"

namespace straggler {
namespace {

std::string SetText(const std::vector<uint32_t>& ranks) {
  std::ostringstream out;
  out << "{";
  for (size_t i = 0; i < ranks.size(); ++i) out << (i ? "," : "") << ranks[i];
  out << "}";
  return out.str();
}

// A context and the op counter its members share: every member issues the
// same sequence of collectives on it (all built it at the same iteration),
// so the counter gives each op the same tag on every member.
struct CachedContext {
  std::vector<uint32_t> ranks;
  uint64_t built_for_version = 0;
  std::shared_ptr<gloo::Context> context;  // null for a set of one rank
  uint32_t next_tag = 0;
};

class GlooPartialAllReduce final : public PartialAllReduce {
 public:
  GlooPartialAllReduce(Client& client, GlooOptions options,
                       std::shared_ptr<gloo::transport::Device> device)
      : client_(client),
        options_(std::move(options)),
        device_(std::move(device)),
        store_(options_.rendezvous_endpoint, options_.job_id, options_.key_ttl,
               options_.collective_timeout) {}

  StepPlan BeginIteration(uint64_t iteration) override {
    if (begun_ && iteration <= plan_.iteration) {
      throw CollectiveError("BeginIteration(" + std::to_string(iteration) +
                            ") after iteration " + std::to_string(plan_.iteration) +
                            ": iterations must increase");
    }
    MembershipView m = client_.MembershipFor(iteration, options_.membership_timeout, options_.rank);
    const bool certain = m.ok;
    if (!certain && applied_) {
      // Never guess: a version this rank has received but cannot prove final
      // may not have reached the other ranks (the daemon may have died while
      // pushing it). The last applied membership is the one every rank that
      // was in step at the previous iteration holds.
      m = *applied_;
    }
    // (No applied membership and no answer: the first iteration of a rank
    // whose daemon is down. MembershipFor then returns the best known, which
    // is version 0 - everyone - unless a directive arrived: the same choice
    // every other rank in that position makes.)
    const std::vector<uint32_t> active = m.ActiveRanks();
    const bool participating = !m.IsExcluded(options_.rank);

    StepPlan plan;
    plan.iteration = iteration;
    plan.version = m.version;
    plan.effective_iteration = m.effective_iteration;
    plan.certain = certain;
    plan.participating = participating;
    plan.active_ranks = active;
    plan.root = active.empty() ? 0 : active.front();
    // Ranks that were not active at this rank's previous iteration need the
    // parameters. Every active rank computes the same answer: those active
    // before all applied the same previous membership, and a rejoiner was
    // not active in its previous one.
    for (uint32_t r : active) {
      if (!std::binary_search(previous_active_.begin(), previous_active_.end(), r) ||
          !previously_participating_) {
        plan.sync_parameters = participating;
        break;
      }
    }

    // The context: kept only when this rank used the same active set at its
    // previous iteration - then every member has it (they were all in step
    // with this rank). Otherwise a fresh one for this version, so a member
    // whose cache differs (it was excluded meanwhile, or evicted) can never
    // pair with a stale address.
    current_ = nullptr;
    if (participating) {
      const bool same = previously_participating_ && previous_active_ == active;
      CachedContext* cached = Find(active);
      if (same && cached != nullptr) {
        current_ = cached;
      } else {
        current_ = Build(iteration, m, active);
      }
      Touch(current_);
    }

    applied_ = m;
    previous_active_ = active;
    previously_participating_ = participating;
    plan_ = std::move(plan);
    begun_ = true;
    return plan_;
  }

  AllReduceResult AllReduceAverage(std::span<float> data) override { return Average(data); }
  AllReduceResult AllReduceAverage(std::span<double> data) override { return Average(data); }

  bool SyncParameters(const std::vector<ParameterBuffer>& buffers) override {
    RequireBegun("SyncParameters");
    if (!plan_.participating || !plan_.sync_parameters) return false;
    if (current_->context == nullptr) return true;  // a set of one: nothing to send
    const auto root = static_cast<int>(
        std::find(current_->ranks.begin(), current_->ranks.end(), plan_.root) -
        current_->ranks.begin());
    for (const ParameterBuffer& b : buffers) {
      if (b.bytes == 0) continue;
      try {
        gloo::BroadcastOptions opts(current_->context);
        opts.setOutput(static_cast<uint8_t*>(b.data), b.bytes);
        opts.setRoot(root);
        opts.setTag(current_->next_tag++);
        opts.setTimeout(options_.collective_timeout);
        gloo::broadcast(opts);
      } catch (const std::exception& e) {
        throw Failure("broadcast of parameters from rank " + std::to_string(plan_.root), e);
      }
    }
    return true;
  }

  const StepPlan& Plan() const override { return plan_; }

 private:
  template <class T>
  AllReduceResult Average(std::span<T> data) {
    RequireBegun("AllReduceAverage");
    AllReduceResult r;
    r.version = plan_.version;
    r.active_ranks = static_cast<uint32_t>(plan_.active_ranks.size());
    if (!plan_.participating) return r;  // excluded: no collective at all
    r.participated = true;
    if (current_->context != nullptr && !data.empty()) {
      try {
        gloo::AllreduceOptions opts(current_->context);
        opts.setOutput(data.data(), data.size());
        void (*fn)(void*, const void*, const void*, size_t) = &gloo::sum<T>;
        opts.setReduceFunction(fn);
        opts.setTag(current_->next_tag++);
        opts.setTimeout(options_.collective_timeout);
        gloo::allreduce(opts);
      } catch (const std::exception& e) {
        throw Failure("allreduce", e);
      }
    }
    const T n = static_cast<T>(r.active_ranks);
    for (T& x : data) x /= n;
    return r;
  }

  void RequireBegun(const char* what) const {
    if (!begun_) throw CollectiveError(std::string(what) + " before the first BeginIteration");
  }

  CollectiveError Failure(const std::string& op, const std::exception& e) {
    // The context is kept as it is: rebuilding it under the same version
    // would read the first build's (stale) rendezvous keys. The next change
    // of membership builds a fresh one; until then the caller decides (a
    // failed step usually means restarting from a checkpoint).
    return CollectiveError(
        "iteration " + std::to_string(plan_.iteration) + ": Gloo " + op + " among ranks " +
        SetText(plan_.active_ranks) + " (membership version " + std::to_string(plan_.version) +
        (plan_.certain ? ", certain" : ", kept after MembershipFor timed out") + ") failed within " +
        std::to_string(options_.collective_timeout.count()) +
        " ms; a peer is gone or applied another membership: " + e.what());
  }

  CachedContext* Find(const std::vector<uint32_t>& ranks) {
    for (CachedContext& c : cache_)
      if (c.ranks == ranks) return &c;
    return nullptr;
  }

  void Touch(CachedContext* c) {
    for (auto it = cache_.begin(); it != cache_.end(); ++it) {
      if (&*it == c) {
        cache_.splice(cache_.begin(), cache_, it);
        return;
      }
    }
  }

  CachedContext* Build(uint64_t iteration, const MembershipView& m,
                       const std::vector<uint32_t>& active) {
    // Replace any older context for this set: it may hold addresses the
    // other members no longer listen on.
    cache_.remove_if([&](const CachedContext& c) { return c.ranks == active; });
    CachedContext c;
    c.ranks = active;
    c.built_for_version = m.version;
    if (active.size() > 1) {
      const int index = static_cast<int>(
          std::find(active.begin(), active.end(), options_.rank) - active.begin());
      // The prefix names the run, the version and the set: keys of another
      // build (an older version, or a rank that applied another membership)
      // can never be read as this one's. Not the daemon's incarnation: ranks
      // may hold version 0 as the local placeholder (incarnation 0) or as the
      // daemon's copy, and must still agree on the prefix.
      const std::string prefix = "gloo/" + options_.run_id + "/v" + std::to_string(m.version) +
                                 "/" + SetText(active);
      try {
        auto ctx = std::make_shared<gloo::rendezvous::Context>(index, static_cast<int>(active.size()));
        ctx->setTimeout(options_.collective_timeout);
        gloo::rendezvous::PrefixStore store(prefix, store_);
        ctx->connectFullMesh(store, device_);
        c.context = std::move(ctx);
      } catch (const std::exception& e) {
        throw CollectiveError("iteration " + std::to_string(iteration) +
                              ": building the Gloo context of ranks " + SetText(active) +
                              " (membership version " + std::to_string(m.version) +
                              ") failed within " +
                              std::to_string(options_.collective_timeout.count()) + " ms: " + e.what());
      }
    }
    cache_.push_front(std::move(c));
    while (cache_.size() > std::max<size_t>(1, options_.max_cached_contexts)) cache_.pop_back();
    return &cache_.front();
  }

  Client& client_;
  const GlooOptions options_;
  std::shared_ptr<gloo::transport::Device> device_;
  DaemonStore store_;

  std::list<CachedContext> cache_;  // most recently used first; bounded
  CachedContext* current_ = nullptr;  // the context of the current iteration
  std::optional<MembershipView> applied_;
  std::vector<uint32_t> previous_active_;
  bool previously_participating_ = false;
  bool begun_ = false;
  StepPlan plan_;
};

}  // namespace

std::string GlooOptions::Validate() const {
  if (job_id.empty()) return "job_id is empty";
  if (world_size == 0) return "world_size=0 must be > 0";
  if (rank >= world_size) {
    return "rank=" + std::to_string(rank) + " must be < world_size=" + std::to_string(world_size);
  }
  if (rendezvous_endpoint.empty()) return "rendezvous_endpoint is empty";
  if (hostname.empty()) return "hostname is empty";
  if (collective_timeout.count() <= 0) {
    return "collective_timeout=" + std::to_string(collective_timeout.count()) + "ms must be > 0";
  }
  if (membership_timeout.count() < 0) {
    return "membership_timeout=" + std::to_string(membership_timeout.count()) + "ms must be >= 0";
  }
  return "";
}

std::unique_ptr<PartialAllReduce> CreateGlooPartialAllReduce(Client& client,
                                                             const GlooOptions& options,
                                                             std::string* error) {
  auto fail = [&](const std::string& why) -> std::unique_ptr<PartialAllReduce> {
    if (error) *error = why;
    return nullptr;
  };
  if (std::string why = options.Validate(); !why.empty()) return fail(why);
  std::shared_ptr<gloo::transport::Device> device;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return fail("cannot create the Gloo TCP device on hostname='" + options.hostname + "': " + e.what());
  }
  return std::make_unique<GlooPartialAllReduce>(client, options, std::move(device));
}

}  // namespace straggler
