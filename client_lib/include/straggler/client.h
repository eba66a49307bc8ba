// straggler::Client — the thin library a trainer rank links to report
// per-iteration compute times to stragglerd (or the node's agent) and to learn
// which ranks take part in the collectives.
//
//   auto client = straggler::Client::Create(straggler::ClientOptions::FromEnv());
//   for (uint64_t it = 0; ...; ++it) {
//     auto m = client->MembershipFor(it, std::chrono::seconds(5));   // who reduces at `it`
//     {
//       straggler::ComputeTimer t(*client, epoch, it);  // reports on scope exit
//       forward_backward();
//     }
//     if (m.ok && !m.IsExcluded(rank)) allreduce_among(m);
//   }
//
// Report() never blocks and never allocates: it enqueues into a bounded
// lock-free queue that a background thread drains over one gRPC stream
// (reconnecting with exponential backoff and jitter). In a client that uses
// MembershipFor() it wakes that thread (one futex wake while it sleeps), so
// the report's round trip overlaps the rest of the step; otherwise it makes
// no system call and the thread takes reports within
// ClientOptions::max_send_delay. When the queue is full
// the report is dropped and counted (Stats().dropped).
//
// Thread safety: every method may be called from any thread concurrently.
// Membership callbacks run on the client's background thread.
// No gRPC or protobuf type appears in this header.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace straggler {

struct ClientOptions {
  // "host:port", "dns:///host:port" or "unix:///run/straggler/agent.sock";
  // or several daemon replicas comma-separated (docs/client.md, "The stream
  // session": a random first one, redirects to a job's owner followed).
  std::string endpoint = "127.0.0.1:7070";
  // FromEnv: STRAGGLER_JOB_ID, else TORCHELASTIC_RUN_ID when torchrun names
  // a launch there (--rdzv_id, --standalone; not "none") and it is a valid
  // job id. Validate refuses "" naming STRAGGLER_JOB_ID.
  std::string job_id;
  // Which launch of the job this is (docs/runs.md). A new run of a job id
  // starts fresh at the daemon (memberships, states, progress) and in the
  // rendezvous keys. Every rank of one launch must use the same value.
  // FromEnv: STRAGGLER_RUN_ID, else TORCHELASTIC_RUN_ID ("" and "none" are
  // unset); straggler.torch derives one per launch when neither is set.
  // Same characters as job_id; "" = the job's default run.
  std::string run_id;
  // Ranks this client reports for (usually one). Report() for another rank is
  // rejected locally.
  std::vector<uint32_t> ranks;
  uint32_t world_size = 0;
  uint32_t local_rank = 0;
  // The GPU this process computes on, sent in the stream's hello so the
  // node's agent can attach that GPU's telemetry (docs/agent.md#gpu-telemetry):
  // CUDA_VISIBLE_DEVICES verbatim ("" = unset) and, when the trainer knows
  // it, the GPU's UUID ("GPU-8f3a...", what nvidia-smi -L prints), which wins.
  std::string cuda_visible_devices;
  std::string gpu_uuid;
  // The rank's place in a hybrid-parallel job, sent in the hello
  // (docs/topology.md; straggler/topology.h computes both from a
  // Megatron-style layout). peer_group: the ranks doing the same work, which
  // detection compares this rank with ("stage2"); "" = the default group,
  // 0 to 64 bytes of A-Z a-z 0-9 . _ -. replica: the rank's data-parallel
  // index, < world_size; nullopt = a replica of its own (pure data
  // parallelism). Every rank this client serves gets the same values.
  std::string peer_group;           // STRAGGLER_PEER_GROUP
  std::optional<uint32_t> replica;  // STRAGGLER_REPLICA
  // The model of the GPU this process computes on ("NVIDIA H100 80GB HBM3",
  // as torch.cuda.get_device_name() says; the Python client fills it from
  // there when CUDA is available): ranks of different models are never
  // peers in detection. "" = unknown; at most 96 bytes of printable ASCII.
  std::string gpu_model;            // STRAGGLER_GPU_MODEL
  std::string node;                   // default: host name
  uint64_t iterations_per_epoch = 0;  // 0 = unknown
  // This trainer does not act on membership (monitoring only, as
  // straggler.torch.monitor): the hello says so for every served rank, and
  // the daemon shows a slow one as a straggler "monitoring only", never
  // excludes it, and judges it with its peers, since it keeps taking part
  // (docs/membership.md, "Monitoring only"). The first MembershipFor() or
  // ReadmissionAfter() (a partial all-reduce asks them) clears the mark:
  // a later hello on the stream tells the daemon, and from then on the
  // ranks may be excluded as any.
  bool monitor_only = false;
  size_t queue_capacity = 4096;       // rounded up to a power of two
  size_t max_batch = 256;             // reports per ReportBatch
  // Reconnect delays: from backoff_initial, doubling per failure, spread
  // uniformly in [initial, cap]. The cap bounds how late a daemon that comes
  // (back) up is found (issue 28: 5 s let it be 9.6 s); stream::Backoff's.
  std::chrono::milliseconds backoff_initial{100};
  std::chrono::milliseconds backoff_max{2000};
  // Longest a report waits in the queue when nothing wakes the sender. Once
  // MembershipFor() has been called, Report() wakes a sleeping sender (its
  // next MembershipFor waits for that report's acknowledgement); before, it
  // does not (a wake-up is a system call), and a monitoring-only trainer's
  // reports reach the daemon within this delay. Flush() and a queue filling
  // up always wake it. At least 1 ms.
  std::chrono::milliseconds max_send_delay{20};
  // TLS to the daemon or agent (docs/security.md): PEM files. TLS is on when
  // any is set; all empty = plaintext. tls_ca_file verifies the server ("" =
  // the system's roots); tls_cert_file + tls_key_file are this client's
  // certificate for a daemon that requires mutual TLS. Read by Create().
  std::string tls_ca_file;    // STRAGGLER_TLS_CA
  std::string tls_cert_file;  // STRAGGLER_TLS_CERT
  std::string tls_key_file;   // STRAGGLER_TLS_KEY
  // Set by FromEnv when a variable does not parse ("WORLD_SIZE='eight' is not
  // an unsigned integer"); Validate() reports it first. Empty otherwise.
  std::string env_error;

  // RANK, WORLD_SIZE, LOCAL_RANK (as set by torchrun and other launchers),
  // CUDA_VISIBLE_DEVICES, STRAGGLER_ENDPOINT, STRAGGLER_JOB_ID, STRAGGLER_NODE,
  // STRAGGLER_PEER_GROUP, STRAGGLER_REPLICA,
  // STRAGGLER_RUN_ID / TORCHELASTIC_RUN_ID (run_id above),
  // STRAGGLER_ITERATIONS_PER_EPOCH, STRAGGLER_GPU_UUID, STRAGGLER_TLS_CA,
  // STRAGGLER_TLS_CERT, STRAGGLER_TLS_KEY. Missing RANK/WORLD_SIZE leave defaults;
  // Validate() then tells what is missing. A variable that is set but does
  // not parse is recorded in env_error (FromEnv itself never fails).
  static ClientOptions FromEnv();
  // Empty string when usable, else what is wrong, naming the value.
  std::string Validate() const;
};

// What a trainer may say about a step beside its compute time; unset = not
// measured. The times are apart from compute_seconds (forward + backward)
// and from each other: step - compute - collective wait holds input wait +
// optimizer + the rest (docs/client.md, "Work and phases").
struct StepDetails {
  std::optional<double> step_seconds;             // this step's start to the next's, waits included
  std::optional<double> collective_wait_seconds;  // blocked in collectives on slower peers
  std::optional<double> input_wait_seconds;       // blocked on the data loader and the copy to the device
  std::optional<double> optimizer_seconds;        // the optimizer step
  // The step's work, > 0, in a unit the job chooses and every rank uses:
  // tokens, samples, or a cost such as the sum of squared sequence lengths.
  std::optional<double> work;
};

struct ExcludedRankInfo {
  uint32_t rank = 0;
  // "straggler", "unresponsive", "forced", "probation_end", "replica" (out
  // with its data-parallel replica, whose culprit is another rank)
  std::string reason;
  std::string detail;
  // For a rank that declared a replica (docs/hybrid.md): the rank whose state
  // took the replica out (this rank unless reason is "replica"), that rank's
  // peer group, and the replica. Unset in a pure data-parallel job.
  std::optional<uint32_t> culprit = std::nullopt;
  std::string culprit_group = {};
  std::optional<uint32_t> replica = std::nullopt;
};

// One version of the job's membership. Version 0 (before any decision)
// excludes nobody.
struct MembershipView {
  bool ok = true;  // false: MembershipFor timed out; fields hold the last known
  uint64_t version = 0;
  uint64_t effective_iteration = 0;
  uint32_t world_size = 0;
  uint32_t lead_iterations = 2;
  uint64_t incarnation = 0;  // the daemon run that published it
  std::vector<ExcludedRankInfo> excluded;  // ascending by rank

  bool IsExcluded(uint32_t rank) const;
  std::vector<uint32_t> ActiveRanks() const;  // 0..world_size-1 minus excluded
};

struct ClientStats {
  uint64_t enqueued = 0;       // accepted into the queue (drops not included)
  uint64_t dropped = 0;        // queue full
  // Report() calls that woke the client's sleeping sender thread, one futex
  // wake each, microseconds on the caller (BENCHMARKS.md, "Client Report()"):
  // in a client that uses MembershipFor, each report made while the sender
  // sleeps; otherwise every wake-stride-th report of a burst (so that it
  // fills batches).
  uint64_t report_wakes = 0;
  uint64_t sent = 0;           // written to a stream at least once
  uint64_t acked = 0;          // accepted by the daemon
  uint64_t rejected = 0;       // rejected by the daemon or agent (see last_rejection)
  uint64_t duplicates = 0;     // already taken by the daemon (resent after a reconnect)
  uint64_t reconnects = 0;
  bool connected = false;
  // Connected to a straggler-agent whose own stream to the daemon is down
  // (Directive.upstream_unavailable); always false when talking to the daemon.
  bool upstream_unavailable = false;
  std::string last_rejection;  // the daemon's message naming the value
};

class Client {
 public:
  // Fails (nullptr + *error) only on invalid options or an unreadable TLS
  // file; an unreachable endpoint is not an error (the client keeps retrying
  // in the background).
  static std::unique_ptr<Client> Create(const ClientOptions& options, std::string* error = nullptr);
  virtual ~Client() = default;  // flushes for at most 1 s, then closes

  // Enqueues one iteration's compute time. Never blocks. Returns false when
  // the report was dropped (queue full, or rank not served by this client).
  virtual bool Report(uint32_t rank, uint64_t epoch, uint64_t iteration, double compute_seconds,
                      std::optional<double> step_seconds,
                      std::optional<double> collective_wait_seconds = std::nullopt) = 0;
  // The same with any of StepDetails (work, input wait, optimizer time; the
  // daemon refuses a report whose work is not > 0 or whose phase is
  // negative or not finite, naming the value: Stats().last_rejection).
  // Never blocks. This default forwards step and collective-wait times to
  // the call above and drops the rest; the library's client sends them all.
  virtual bool Report(uint32_t rank, uint64_t epoch, uint64_t iteration, double compute_seconds,
                      const StepDetails& details) {
    return Report(rank, epoch, iteration, compute_seconds, details.step_seconds,
                  details.collective_wait_seconds);
  }
  // The same without step and collective-wait times (one virtual call, see
  // ReportForRank). A separate overload rather than defaulted arguments:
  // GCC builds a std::optional argument with a one-byte store and passes it
  // in a register loaded from the same place, a failed store-to-load
  // forwarding per argument that doubled the call's cost (BENCHMARKS.md).
  bool Report(uint32_t rank, uint64_t epoch, uint64_t iteration, double compute_seconds) {
    return ReportForRank(rank, epoch, iteration, compute_seconds);
  }
  // Report() for the client's first rank (one virtual call, see
  // ReportForFirstRank).
  bool Report(uint64_t epoch, uint64_t iteration, double compute_seconds) {
    return ReportForFirstRank(epoch, iteration, compute_seconds);
  }

  // The newest membership received. Lock-free.
  virtual MembershipView CurrentMembership() const = 0;

  // The membership in force at `iteration` for `rank` (default: first rank),
  // by the switch rule: the newest version whose effective_iteration <=
  // iteration. Certain once the daemon has processed this rank's report of
  // iteration + 1 - lead (immediately for iteration < lead; the lead is the
  // daemon's, from the stream's first directive, and 1 until then), and at once at
  // the effective iteration of a held version that readmits `rank` (see
  // ReadmissionAfter): waits for that up to `timeout`; on timeout returns the
  // best known answer with ok = false.
  // `rank` must be served by this client (else: best known, ok = false).
  // A client created monitor_only acts on membership from its first call:
  // the daemon hears so in the stream's next hello (ClientOptions).
  // When a wait has already timed out while the client was disconnected (or
  // its agent said the daemon is unreachable, Stats().upstream_unavailable),
  // later calls return at once (ok = false) until the stream reaches the
  // daemon again, so a job whose daemon is gone does not lose `timeout` at
  // every step.
  virtual MembershipView MembershipFor(uint64_t iteration, std::chrono::milliseconds timeout,
                                       std::optional<uint32_t> rank = std::nullopt) = 0;

  // For `rank` (default: first rank) excluded at `iteration`: the first
  // version received after the one in force there that includes it again, or
  // nullopt (not excluded there, or no such version yet). Its
  // effective_iteration E is where the rank rejoins, and MembershipFor(E)
  // is certain for it without waiting for reports near E, so a rank that
  // fell behind while excluded skips its remaining shadow iterations and
  // goes straight to E (its parameters come from the group there). Known
  // limit: a rank already past E (an excluded rank that ran ahead) gets
  // nullopt.
  virtual std::optional<MembershipView> ReadmissionAfter(
      uint64_t iteration, std::optional<uint32_t> rank = std::nullopt) = 0;

  using MembershipCallback = std::function<void(const MembershipView&)>;
  // Registers `callback`, called (on the background thread) for each new
  // membership version, in ascending order; not for versions received before
  // registration (read CurrentMembership() after registering). Several
  // callbacks may be registered; an empty one is ignored. A callback that
  // throws is logged and the others still run.
  // CurrentMembership()/MembershipFor() may return a version before its
  // callbacks have run. A callback must not destroy the Client, and whatever
  // it captures must outlive the Client.
  virtual void OnMembershipChange(MembershipCallback callback) = 0;

  // Blocks until every report enqueued so far was acknowledged (accepted or
  // rejected) by the daemon or `timeout` passed; returns whether all were.
  virtual bool Flush(std::chrono::milliseconds timeout) = 0;

  virtual ClientStats Stats() const = 0;
  virtual uint32_t FirstRank() const = 0;

 protected:
  // What Report(epoch, iteration, compute_seconds) calls. This default
  // reports for FirstRank() through the full Report() (two virtual calls);
  // the library's client overrides it (and ReportForRank) with a direct
  // path. An implementation of Client need not override either.
  virtual bool ReportForFirstRank(uint64_t epoch, uint64_t iteration, double compute_seconds) {
    return Report(FirstRank(), epoch, iteration, compute_seconds, std::nullopt);
  }
  // What Report(rank, epoch, iteration, compute_seconds) calls; the default
  // forwards to the full Report() with neither optional time.
  virtual bool ReportForRank(uint32_t rank, uint64_t epoch, uint64_t iteration,
                             double compute_seconds) {
    return Report(rank, epoch, iteration, compute_seconds, std::nullopt);
  }
};

// Measures the wall time of a scope on the calling thread and reports it as
// the compute time of (epoch, iteration) when the scope ends. Two optional
// marks split the scope into phases (docs/client.md, "Work and phases"):
//
//   {
//     straggler::ComputeTimer t(*client, epoch, it);
//     Batch b = loader.next();      // input wait: construction -> InputReady()
//     t.InputReady();
//     forward_backward(b);          // compute: InputReady() -> OptimizerStart()
//     t.OptimizerStart();
//     optimizer.step();             // optimizer: OptimizerStart() -> scope end
//     t.SetWork(b.tokens());
//   }
//
// Without marks or work it reports as before (the short Report(), no
// details). Not thread-safe: one timer belongs to one thread's scope.
class ComputeTimer {
 public:
  using Clock = std::chrono::steady_clock;

  ComputeTimer(Client& client, uint64_t epoch, uint64_t iteration)
      : client_(client), epoch_(epoch), iteration_(iteration), start_(Clock::now()) {}
  ~ComputeTimer() {
    if (cancelled_) return;
    const Clock::time_point end = Clock::now();
    if (!input_ready_ && !optimizer_start_ && !work_) {
      client_.Report(epoch_, iteration_, Seconds(start_, end));
      return;
    }
    const Clock::time_point compute_start = input_ready_.value_or(start_);
    const Clock::time_point compute_end = optimizer_start_.value_or(end);
    StepDetails details;
    if (input_ready_) details.input_wait_seconds = Seconds(start_, *input_ready_);
    if (optimizer_start_) details.optimizer_seconds = Seconds(*optimizer_start_, end);
    details.work = work_;
    client_.Report(client_.FirstRank(), epoch_, iteration_, Seconds(compute_start, compute_end),
                   details);
  }
  // The input phase ends now (the batch is on the device): the time since
  // construction is the step's input wait, not compute. Once; a second call
  // moves the mark.
  void InputReady() { input_ready_ = Clock::now(); }
  // The optimizer step starts now: the time from here to the scope's end is
  // the step's optimizer time, not compute.
  void OptimizerStart() { optimizer_start_ = Clock::now(); }
  // The step's work (> 0, the job's unit; see StepDetails::work).
  void SetWork(double work) { work_ = work; }
  void Cancel() { cancelled_ = true; }
  ComputeTimer(const ComputeTimer&) = delete;
  ComputeTimer& operator=(const ComputeTimer&) = delete;

 private:
  // Never negative: marks made out of order count as zero.
  static double Seconds(Clock::time_point from, Clock::time_point to) {
    return to > from ? std::chrono::duration<double>(to - from).count() : 0.0;
  }

  Client& client_;
  uint64_t epoch_;
  uint64_t iteration_;
  Clock::time_point start_;
  std::optional<Clock::time_point> input_ready_;
  std::optional<Clock::time_point> optimizer_start_;
  std::optional<double> work_;
  bool cancelled_ = false;
};

}  // namespace straggler
