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
#include <cstdlib>
#include <list>
#include <sstream>

#include "agreement.h"
#include "group_plan.h"
#include "nccl_plan.h"  // SetText, SetKey
#include "straggler/collective.h"
#include "straggler/collective_gloo.h"
#include "store_transport.h"
#include "straggler/gloo_store.h"

namespace straggler {
namespace {

using detail::SetText;

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
  // `job_switch` and `group`: a data-parallel group of a hybrid job (the
  // plan comes from the job's switch); null: the flat backend (own agreement).
  GlooPartialAllReduce(Client& client, GlooOptions options,
                       std::shared_ptr<gloo::transport::Device> device,
                       std::shared_ptr<JobSwitch> job_switch = nullptr,
                       std::optional<DataParallelGroup> group = std::nullopt)
      : client_(client),
        options_(std::move(options)),
        device_(std::move(device)),
        switch_(std::move(job_switch)),
        group_(std::move(group)),
        store_(detail::RendezvousStoreFor(options_)),
        agreement_(options_.rank, options_.run_id, /*previous_active=*/{},
                   /*previously_participating=*/false) {}

  StepPlan BeginIteration(uint64_t iteration) override {
    // Until this iteration has its context, no collective may use the last
    // one (RequireContext), whatever throws below.
    current_ = nullptr;
    StepPlan plan = detail::PlanOf(iteration, agreement_, client_, options_, transport_, switch_.get(), group_,
                                   group_active_);
    // The context: kept only when this rank used the same active set at its
    // previous iteration - then every member has it (they were all in step
    // with this rank). Otherwise a fresh one for this version, so a member
    // whose cache differs (it was excluded meanwhile, or evicted) can never
    // pair with a stale address.
    if (plan.participating) {
      const bool same = agreement_.previously_participating() &&
                        agreement_.previous_active() == plan.active_ranks;
      CachedContext* cached = Find(plan.active_ranks);
      if (same && cached != nullptr) {
        current_ = cached;
      } else {
        current_ = Build(iteration, plan.version, plan.active_ranks);
      }
      Touch(current_);
    }
    agreement_.Commit(std::move(plan));
    return agreement_.plan();
  }

  AllReduceResult AllReduceAverage(std::span<float> data) override { return Average(data); }
  AllReduceResult AllReduceAverage(std::span<double> data) override { return Average(data); }

  bool SyncParameters(const std::vector<ParameterBuffer>& buffers) override {
    RequireBegun("SyncParameters");
    if (!agreement_.plan().participating) return false;
    RequireContext("SyncParameters");
    if (!agreement_.plan().sync_parameters) return false;
    if (current_->context == nullptr) return true;  // a set of one: nothing to send
    const auto root = static_cast<int>(
        std::find(current_->ranks.begin(), current_->ranks.end(), agreement_.plan().root) -
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
        throw Failure("broadcast of parameters from rank " + std::to_string(agreement_.plan().root), e);
      }
    }
    return true;
  }

  const StepPlan& Plan() const override { return agreement_.plan(); }

 private:
  template <class T>
  AllReduceResult Average(std::span<T> data) {
    AllReduceResult r = agreement_.AverageResult();
    if (!agreement_.plan().participating) return r;  // excluded: no collective at all
    RequireContext("AllReduceAverage");
    r.participated = true;
    if (current_->context != nullptr && !data.empty()) {
      try {
        AllReduce(*current_, data, &gloo::sum<T>);
      } catch (const std::exception& e) {
        throw Failure("allreduce", e);
      }
    }
    const T n = static_cast<T>(r.active_ranks);
    for (T& x : data) x /= n;
    return r;
  }

  // One all-reduce of `data` in place on `c`'s context (not a set of one),
  // with the next tag of its members' shared sequence.
  template <class T>
  void AllReduce(CachedContext& c, std::span<T> data, void (*fn)(void*, const void*, const void*, size_t)) {
    gloo::AllreduceOptions opts(c.context);
    opts.setOutput(data.data(), data.size());
    opts.setReduceFunction(fn);
    opts.setTag(c.next_tag++);
    opts.setTimeout(options_.collective_timeout);
    gloo::allreduce(opts);
  }

  void RequireBegun(const char* what) const { agreement_.RequireBegun(what); }

  // The in-band agreement (agreement.h): on the context of the previous
  // set, which every member used at its previous iteration and which is the
  // most recently used entry of each member's cache (never evicted). None
  // after a failure dropped it: no channel, the rank decides alone.
  bool MinOverPrevious(uint64_t iteration, std::span<uint64_t> words) {
    CachedContext* c = Find(agreement_.previous_active());
    if (c == nullptr || c->context == nullptr) return false;
    try {
      AllReduce(*c, words, &gloo::min<uint64_t>);
    } catch (const std::exception& e) {
      Drop(agreement_.previous_active());
      throw CollectiveError(agreement_.AgreementFailureText("Gloo", iteration, options_.collective_timeout) +
                            ": " + e.what());
    }
    return true;
  }

  // The last BeginIteration threw while building its context: the plan still
  // is the previous iteration's, and averaging on it would pair with ranks
  // that moved on. Never pretend to average.
  void RequireContext(const char* what) const {
    if (current_ == nullptr) {
      throw CollectiveError(std::string(what) + " after a failed BeginIteration: no context of ranks " +
                            detail::SetText(agreement_.plan().active_ranks) +
                            " for this iteration; call BeginIteration again");
    }
  }

  CollectiveError Failure(const std::string& op, const std::exception& e) {
    CollectiveError error(agreement_.FailureText("Gloo", op, options_.collective_timeout) + ": " +
                          e.what());
    Drop(agreement_.plan().active_ranks);
    return error;
  }

  // After a failed collective a context cannot be trusted (its members may
  // have issued different numbers of operations, so their tags no longer
  // match): drop it. The next BeginIteration then has no channel to agree
  // on and decides alone (agreement.h); the set is rebuilt under fresh keys
  // (the prefix names the iteration), or left when the daemon excludes the
  // member that is gone.
  void Drop(const std::vector<uint32_t>& ranks) {
    if (current_ != nullptr && current_->ranks == ranks) current_ = nullptr;
    cache_.remove_if([&](const CachedContext& c) { return c.ranks == ranks; });
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

  CachedContext* Build(uint64_t iteration, uint64_t version, const std::vector<uint32_t>& active) {
    // Replace any older context for this set: it may hold addresses the
    // other members no longer listen on.
    Drop(active);
    CachedContext c;
    c.ranks = active;
    c.built_for_version = version;
    if (active.size() > 1) {
      const int index = static_cast<int>(
          std::find(active.begin(), active.end(), options_.rank) - active.begin());
      // The prefix names the run, the version and the set: keys of another
      // build (an older version, or a rank that applied another membership)
      // can never be read as this one's. Not the daemon's incarnation: ranks
      // may hold version 0 as the local placeholder (incarnation 0) or as the
      // daemon's copy, and must still agree on the prefix.
      // The iteration too: every member builds at the same (agreed)
      // iteration, and a build retried after a failure uses fresh keys
      // instead of the failed attempt's.
      // A group's contexts are named by the group too (its sets are disjoint
      // from other groups' anyway; the name makes the keys readable).
      const std::string prefix = "gloo/" + options_.run_id + (group_ ? "/g" + group_->name : "") + "/v" +
                                 std::to_string(version) +
                                 "/i" + std::to_string(iteration) + "/" + detail::SetKey(active);
      try {
        auto ctx = std::make_shared<gloo::rendezvous::Context>(index, static_cast<int>(active.size()));
        ctx->setTimeout(options_.collective_timeout);
        gloo::rendezvous::PrefixStore store(prefix, *store_);
        ctx->connectFullMesh(store, device_);
        c.context = std::move(ctx);
      } catch (const std::exception& e) {
        throw CollectiveError("iteration " + std::to_string(iteration) +
                              ": building the Gloo context of ranks " + SetText(active) +
                              (group_ ? " of data-parallel group '" + group_->name + "'" : "") +
                              " (membership version " + std::to_string(version) +
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
  const std::shared_ptr<JobSwitch> switch_;           // null: the flat backend
  const std::optional<DataParallelGroup> group_;
  // The trainer's own store (GlooOptions::rendezvous_store) or stragglerd's.
  std::shared_ptr<gloo::rendezvous::Store> store_;
  // After store_ (it holds a reference to it).
  detail::StoreAgreementTransport transport_{
      *store_, [this](uint64_t it, std::span<uint64_t> words) { return MinOverPrevious(it, words); }};

  detail::GroupActiveCache group_active_;  // a group's active members per job plan
  std::list<CachedContext> cache_;  // most recently used first; bounded
  CachedContext* current_ = nullptr;  // the context of the current iteration
  detail::Agreement agreement_;
};

}  // namespace

std::string RendezvousEndpointFor(const ClientOptions& client) {
  if (const char* v = std::getenv("STRAGGLER_RENDEZVOUS_ENDPOINT"); v != nullptr && *v != '\0')
    return v;
  if (client.endpoint.rfind("unix:", 0) == 0) return "";
  return client.endpoint;
}

std::string GlooOptions::Validate() const {
  // With a store of the trainer's own, no daemon address is needed.
  std::string common = detail::ValidateCommonOptions(*this, /*uses_endpoint=*/!rendezvous_store);
  if (!common.empty()) return common;
  if (hostname.empty()) return "hostname is empty";
  return "";
}

namespace {

std::unique_ptr<PartialAllReduce> CreateGloo(Client& client, const GlooOptions& options,
                                             std::shared_ptr<JobSwitch> job_switch,
                                             std::optional<DataParallelGroup> group, std::string* error) {
  auto fail = [&](std::string why) { return detail::Refuse<PartialAllReduce>(error, std::move(why)); };
  if (std::string why = detail::ValidateFactoryInput(options, job_switch.get(), group); !why.empty()) return fail(why);
  std::shared_ptr<gloo::transport::Device> device;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return fail("cannot create the Gloo TCP device on hostname='" + options.hostname + "': " + e.what());
  }
  return std::make_unique<GlooPartialAllReduce>(client, options, std::move(device), std::move(job_switch),
                                                std::move(group));
}

}  // namespace

std::unique_ptr<PartialAllReduce> CreateGlooPartialAllReduce(Client& client,
                                                             const GlooOptions& options,
                                                             std::string* error) {
  return CreateGloo(client, options, nullptr, std::nullopt, error);
}

std::unique_ptr<PartialAllReduce> CreateGlooGroupPartialAllReduce(Client& client,
                                                                  std::shared_ptr<JobSwitch> job_switch,
                                                                  const DataParallelGroup& group,
                                                                  const GlooOptions& options,
                                                                  std::string* error) {
  return CreateGloo(client, options, std::move(job_switch), group, error);
}

}  // namespace straggler
