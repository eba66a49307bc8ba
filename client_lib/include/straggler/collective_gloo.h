// straggler::CreateGlooPartialAllReduce — the CPU (Gloo, TCP) backend of
// PartialAllReduce (straggler/collective.h), in libstraggler_collective,
// built where Gloo was found. As collective_nccl.h is the GPU backend's, this
// is the Gloo backend's header: its options and its factories. It includes
// no Gloo header (gloo_store.h is the Gloo glue).
//
//   straggler::GlooOptions o;  // rendezvous_endpoint, job_id, rank, world_size, hostname
//   auto reducer = straggler::CreateGlooPartialAllReduce(*client, o, &error);
//   // ... the loop of collective.h
//
// Thread safety: as PartialAllReduce - one thread (the training loop) uses it.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "straggler/client.h"
#include "straggler/collective.h"

namespace straggler {

// The shared fields (rendezvous_endpoint, job_id, rank, world_size, timeouts,
// agreement_interval, run_id, key_ttl) are CollectiveOptions'
// (straggler/collective.h).
struct GlooOptions : CollectiveOptions {
  // Address the Gloo TCP transport binds to and announces to peers.
  std::string hostname = "127.0.0.1";
  // Gloo contexts kept at once (each holds world-size sockets).
  size_t max_cached_contexts = 4;
  // A rendezvous store of the trainer's own (straggler.torch passes the store
  // torch.distributed.init_process_group made). When set, the Gloo contexts
  // and the agreement's keys go through it instead of stragglerd's
  // RendezvousService, so the job needs no daemon to start or to go on, and
  // rendezvous_endpoint is unused. Every rank of the launch must use the
  // same store under the same prefix, one that no other launch writes to (a
  // store per launch, or a prefix naming job and run): the keys name only
  // run_id, not the job. What the backend relies on: set() publishes;
  // wait(keys, timeout) returns once every key is set or throws after
  // `timeout` (collective_timeout for a context, the agreement's own bounds
  // for its keys); get() of a key wait() saw returns its value. An exception
  // while building a context is a CollectiveError; the agreement takes one
  // for a key not there in time. Called only from the thread inside
  // BeginIteration, never from Gloo's or the client's threads; a store
  // shared by several PartialAllReduce objects of one process (threads as
  // ranks) must allow concurrent calls.
  std::shared_ptr<gloo::rendezvous::Store> rendezvous_store;

  // Empty when usable, else what is wrong, naming the value.
  std::string Validate() const;
};

// The Gloo (CPU, TCP) backend. `client` reports for options.rank and must
// outlive the result. Fails (nullptr + *error) only on invalid options or
// when the transport cannot bind options.hostname; an unreachable daemon is
// noticed at the first context build.
std::unique_ptr<PartialAllReduce> CreateGlooPartialAllReduce(Client& client,
                                                             const GlooOptions& options,
                                                             std::string* error = nullptr);

// The Gloo backend of one data-parallel group of a hybrid job: its collectives
// span the group's active members only; BeginIteration takes the plan from
// `job_switch` (StepPlan.active_ranks, root and sync_parameters are the
// group's; root is the member of the lowest active replica). `options` as for
// the flat backend (rank, world_size: the job's). nullptr + *error on
// invalid options or group.
std::unique_ptr<PartialAllReduce> CreateGlooGroupPartialAllReduce(Client& client,
                                                                  std::shared_ptr<JobSwitch> job_switch,
                                                                  const DataParallelGroup& group,
                                                                  const GlooOptions& options,
                                                                  std::string* error = nullptr);

}  // namespace straggler
