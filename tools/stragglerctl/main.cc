// stragglerctl — the operator's command line for stragglerd. It speaks the
// straggler.v1 gRPC services directly (QueryService, AdminService):
//
//   stragglerctl jobs
//   stragglerctl workers resnet-42
//   stragglerctl watch resnet-42                     # one line per membership version
//   stragglerctl top resnet-42                       # live ranks and events until Ctrl-C
//   stragglerctl events resnet-42 --kind state_change --rank 3 --follow
//   stragglerctl policy resnet-42 --limit 8 --threshold-factor 2.5
//   stragglerctl override resnet-42 3 exclude --reason "bad NIC"
//   stragglerctl --output json membership resnet-42  # proto3 JSON, same schema as REST
//   stragglerctl export resnet-42 --output-file trace.csv  # for straggler-replay
//
// TLS and the bearer token of a secured daemon (docs/security.md):
//   stragglerctl --tls-ca ca.pem --token-file /etc/stragglerd/token reset resnet-42
//
// The daemon's address is --daemon, else $STRAGGLERCTL_DAEMON, else
// 127.0.0.1:7070 (never a trainer's $STRAGGLER_ENDPOINT): one address, or
// several replicas comma-separated (docs/cluster.md). Each call starts where
// the last one ended, follows a replica's redirect to the job's owner and
// tries the next address when one cannot be reached, within --timeout-ms.
//
// Exit status: 0 ok, 1 the daemon answered with an error, 2 bad command line
// (or a TLS/token file that cannot be read), 3 the daemon could not be reached. Errors go to stderr as
// "stragglerctl: <GRPC_CODE>: <message>" so scripts can match on the code.
#include "absl/status/status.h"
#include <grpcpp/grpcpp.h>
#include <google/protobuf/util/json_util.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "straggler/common/channel_security.h"
#include "straggler/stream/channel_pool.h"
#include "straggler/stream/routing.h"
#include "command_line.h"
#include "render.h"
#include "top.h"
#include "straggler/v1/enum_names.h"
#include "straggler/v1/requests.h"
#include "straggler/v1/straggler.grpc.pb.h"

namespace {
namespace v1 = straggler::v1;
using straggler::v1::requests::ForJob;

constexpr int kExitOk = 0;
constexpr int kExitRpcError = 1;
constexpr int kExitUsage = 2;
constexpr int kExitUnreachable = 3;

using stragglerctl::Command;
using stragglerctl::Globals;

// gRPC's codes are absl's (same numbering); absl names them.
std::string CodeName(grpc::StatusCode code) {
  const std::string name(absl::StatusCodeToString(static_cast<absl::StatusCode>(code)));
  return name.empty() ? "CODE_" + std::to_string(static_cast<int>(code)) : name;
}

// `reached`: the daemon answered before failing (a watch it ended), so an
// UNAVAILABLE is not about where we tried to connect.
int Fail(const grpc::Status& status, const Globals& g, bool reached = false) {
  std::string message = status.error_message();
  // gRPC's own "failed to connect" text does not say where we tried to connect.
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE && !reached)
    message = "daemon at " + g.daemon + " unreachable: " + message;
  // gRPC answers a service the server does not have with UNIMPLEMENTED and no
  // text at all: the usual cause is an endpoint that is a gRPC server, but not
  // stragglerd (a straggler-agent's socket, which serves only the trainers' API).
  if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
    message = g.daemon + " is not a stragglerd query/admin service (a straggler-agent socket?); "
              "point --daemon or $STRAGGLERCTL_DAEMON at stragglerd's gRPC address" +
              (message.empty() ? "" : " (" + message + ")");
  }
  std::cerr << "stragglerctl: " << CodeName(status.error_code()) << ": " << message << '\n';
  return status.error_code() == grpc::StatusCode::UNAVAILABLE ? kExitUnreachable : kExitRpcError;
}

void PrintJson(const google::protobuf::Message& m, bool one_line) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = !one_line;
  // Zero values are information here (counter 0, excluded false); the proto3
  // JSON mapping allows printing them and it spares scripts a default table.
  options.always_print_primitive_fields = true;
  std::string out;
  auto status = google::protobuf::util::MessageToJsonString(m, &out, options);
  if (!status.ok()) {
    std::cerr << "stragglerctl: INTERNAL: cannot render JSON: " << status.ToString() << '\n';
    return;
  }
  std::cout << out;
  if (one_line || out.empty() || out.back() != '\n') std::cout << '\n';
  std::cout.flush();
}

class Ctl {
 public:
  // `pool`: the daemon's addresses (--daemon, one or several replicas); an
  // unreachable one is tried once per call, the next after the backoff.
  explicit Ctl(const Globals& g, std::shared_ptr<straggler::stream::ChannelPool> pool)
      : g_(g),
        router_(pool, {.max_failures = static_cast<uint32_t>(pool->addresses().size())},
                [this](grpc::ClientContext& ctx) { Authorize(ctx); }) {}

  // No 4 MB cap on responses: an export of a large ring exceeds it.
  static grpc::ChannelArguments ChannelArgs() {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    straggler::stream::BoundReconnectBackoff({}, args);
    return args;
  }

  void Deadline(grpc::ClientContext& ctx) const {
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(g_.timeout_ms));
    Authorize(ctx);
  }

  // Every call carries the token when there is one: reads need it on a
  // daemon with auth.protect_reads.
  void Authorize(grpc::ClientContext& ctx) const {
    if (!g_.token.empty()) ctx.AddMetadata("authorization", straggler::BearerAuthorization(g_.token));
  }

  template <typename Response, typename Print>
  int Show(const grpc::Status& status, const Response& response, Print print) const {
    if (!status.ok()) return Fail(status, g_);
    if (g_.json()) {
      PrintJson(response, false);
    } else {
      print(response, std::cout);
    }
    return kExitOk;
  }

  // One unary call under the --timeout-ms deadline, sent to the job's owner
  // among the replicas (a redirect followed, the next address tried when
  // one cannot be reached: straggler/stream/routing.h).
  template <typename Stub, typename Request, typename Response>
  grpc::Status Call(grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
                    const Request& request, Response* response) {
    return router_.Call(
        [&](const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext& ctx) {
          Stub stub(channel);
          response->Clear();
          return (stub.*method)(&ctx, request, response);
        },
        std::chrono::system_clock::now() + std::chrono::milliseconds(g_.timeout_ms));
  }

  // One unary call and its answer (Show): what most commands are.
  template <typename Stub, typename Request, typename Response, typename Print>
  int CallAndShow(grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
                  const Request& request, Print print) {
    Response response;
    const grpc::Status status = Call(method, request, &response);
    return Show(status, response, print);
  }

  int Jobs() {
    return CallAndShow(&v1::QueryService::Stub::ListJobs, v1::ListJobsRequest{},
                       stragglerctl::PrintJobs);
  }

  int Job(const std::string& job, const std::string& run) {
    v1::GetJobRequest req = ForJob<v1::GetJobRequest>(job);
    req.set_run_id(run);
    return CallAndShow(&v1::QueryService::Stub::GetJob, req, stragglerctl::PrintJob);
  }

  int Workers(const std::string& job) {
    return CallAndShow(&v1::QueryService::Stub::ListWorkers,
                       ForJob<v1::ListWorkersRequest>(job), stragglerctl::PrintWorkers);
  }

  int Worker(const std::string& job, uint32_t rank) {
    auto req = ForJob<v1::GetWorkerRequest>(job);
    req.set_rank(rank);
    return CallAndShow(&v1::QueryService::Stub::GetWorker, req, stragglerctl::PrintWorker);
  }

  int Membership(const std::string& job) {
    return CallAndShow(&v1::QueryService::Stub::GetMembership,
                       ForJob<v1::GetMembershipRequest>(job), stragglerctl::PrintMembership);
  }

  // One page of events; the daemon filters by kind and rank.
  int Events(const v1::ListEventsRequest& req) {
    return CallAndShow(&v1::QueryService::Stub::ListEvents, req, stragglerctl::PrintEvents);
  }

  // `events --follow`: every page from req's since_sequence on, then a poll
  // every `interval_ms` from the cursor the last answer gave (last_sequence:
  // also past events the filter skipped), one line per event, until SIGINT or
  // SIGTERM (blocked by the caller, so sigtimedwait takes them here).
  int FollowEvents(v1::ListEventsRequest req, int interval_ms, const sigset_t& signals) {
    const int page = req.limit() > 0 ? static_cast<int>(req.limit()) : 1000;  // daemon default
    for (;;) {
      v1::ListEventsResponse r;
      auto s = Call(&v1::QueryService::Stub::ListEvents, req, &r);
      if (!s.ok()) return Fail(s, g_);
      for (const v1::Event& e : r.events()) {
        if (g_.json()) {
          PrintJson(e, true);
        } else {
          stragglerctl::PrintEventLine(e, std::cout);
        }
      }
      std::cout.flush();
      req.set_since_sequence(std::max(req.since_sequence(), r.last_sequence()));
      if (r.events_size() >= page) continue;  // a full page: more are waiting
      const timespec wait{interval_ms / 1000, (interval_ms % 1000) * 1000L * 1000L};
      if (sigtimedwait(&signals, nullptr, &wait) > 0) return kExitOk;
    }
  }

  // Streams until the server ends the stream or SIGINT/SIGTERM arrives. The
  // caller has blocked both signals in every thread; a helper thread waits for
  // them with sigtimedwait and cancels the call, which is the only safe way to
  // stop a blocking gRPC read from a signal.
  int Watch(const std::string& job, const sigset_t& signals) {
    grpc::ClientContext ctx;  // no deadline: watching is open-ended
    Authorize(ctx);
    v1::WatchMembershipRequest req;
    req.set_job_id(job);
    std::atomic<bool> done{false};
    std::atomic<bool> interrupted{false};
    std::thread waiter([&] {
      const timespec tick{0, 200 * 1000 * 1000};
      while (!done.load()) {
        if (sigtimedwait(&signals, nullptr, &tick) > 0) {
          interrupted.store(true);
          ctx.TryCancel();
          return;
        }
      }
    });
    // The job's owner first (a routed read), where the watch is served.
    v1::Job owner_probe;
    if (auto s = Call(&v1::QueryService::Stub::GetJob, ForJob<v1::GetJobRequest>(job),
                      &owner_probe);
        !s.ok()) {
      done.store(true);
      waiter.join();
      return Fail(s, g_);
    }
    auto query = v1::QueryService::NewStub(router_.pool()->Get(router_.Address()));
    auto reader = query->WatchMembership(&ctx, req);
    v1::Membership m;
    bool reached = false;
    while (reader->Read(&m)) {
      reached = true;
      if (g_.json()) {
        PrintJson(m, true);
      } else {
        stragglerctl::PrintMembershipLine(m, std::cout);
        std::cout.flush();
      }
    }
    grpc::Status status = reader->Finish();
    done.store(true);
    waiter.join();
    if (interrupted.load()) return kExitOk;
    // The daemon going away ends the watch with its status (exit 3 for
    // UNAVAILABLE: it is not reachable any more).
    if (!status.ok()) return Fail(status, g_, reached);
    return kExitOk;
  }

  int Top(const stragglerctl::TopOptions& options, const sigset_t& signals) {
    // The job's owner first (a routed read); top then reads from it alone.
    v1::Job owner_probe;
    if (auto s = Call(&v1::QueryService::Stub::GetJob, ForJob<v1::GetJobRequest>(options.job),
                      &owner_probe);
        !s.ok()) {
      return Fail(s, g_);
    }
    auto query = v1::QueryService::NewStub(router_.pool()->Get(router_.Address()));
    return stragglerctl::RunTop(
        *query, options, [this](grpc::ClientContext& ctx) { Deadline(ctx); }, signals, std::cout,
        [this](const grpc::Status& s) { return Fail(s, g_); });
  }

  int SetPolicy(const std::string& job, const v1::PolicyConfig& policy) {
    auto req = ForJob<v1::SetPolicyRequest>(job);
    *req.mutable_policy() = policy;
    auto print = [](const v1::Job& j, std::ostream& out) {
      out << "policy of job " << j.job_id() << " is now:\n";
      stragglerctl::PrintPolicy(j.policy(), out);
    };
    return CallAndShow(&v1::AdminService::Stub::SetPolicy, req, print);
  }

  int ShowPolicy(const std::string& job) {
    v1::Job r;
    const grpc::Status s =
        Call(&v1::QueryService::Stub::GetJob, ForJob<v1::GetJobRequest>(job), &r);
    return Show(s, r.policy(), stragglerctl::PrintPolicy);  // the job's policy only
  }

  int Override(const std::string& job, uint32_t rank, v1::RankOverride o,
               const std::string& reason) {
    auto req = ForJob<v1::SetRankOverrideRequest>(job);
    req.set_rank(rank);
    req.set_override(o);
    req.set_reason(reason);
    const int rc = CallAndShow(&v1::AdminService::Stub::SetRankOverride, req,
                               stragglerctl::PrintMembership);
    if (rc == kExitOk) NoteWithheld(job);  // Show: kExitOk only for an answer
    return rc;
  }

  // An accepted override whose membership change the daemon withholds (the
  // membership gate: some rank it concerns has no report stream) would
  // otherwise look ignored: say so on stderr. Best effort - a failed read
  // changes nothing about the override.
  void NoteWithheld(const std::string& job) {
    v1::Job j;
    auto s = Call(&v1::QueryService::Stub::GetJob, ForJob<v1::GetJobRequest>(job), &j);
    if (!s.ok() || !j.membership_withheld()) return;
    std::cerr << "stragglerctl: note: the membership change is withheld: " << j.detached_ranks()
              << " of " << j.world_size() << " ranks of job " << job
              << " have no report stream; it is published when they reconnect or turn "
                 "unresponsive (see the MEMBERSHIP_WITHHELD event)\n";
  }

  // Recent reports as CSV (straggler-replay's trace format) or proto JSON,
  // to `file` ("" = stdout).
  int Export(const std::string& job, const std::string& format, uint64_t since_iteration,
             uint32_t limit, const std::string& file) {
    auto req = ForJob<v1::ExportReportsRequest>(job);
    req.set_since_iteration(since_iteration);
    req.set_limit(limit);
    v1::ExportReportsResponse r;
    auto s = Call(&v1::QueryService::Stub::ExportReports, req, &r);
    if (!s.ok()) return Fail(s, g_);
    if (r.dropped_before() > 0) {
      std::cerr << "stragglerctl: note: " << r.dropped_before()
                << " older reports of job " << job
                << " are no longer kept (limits.recent_reports_per_job)\n";
    }
    std::ofstream file_out;
    if (!file.empty()) {
      file_out.open(file, std::ios::out | std::ios::trunc);
      if (!file_out) {
        std::cerr << "stragglerctl: cannot write " << file << '\n';
        return kExitUsage;
      }
    }
    std::ostream& out = file.empty() ? std::cout : file_out;
    if (format == "json") {
      google::protobuf::util::JsonPrintOptions options;
      options.add_whitespace = true;
      options.always_print_primitive_fields = true;
      std::string text;
      if (auto js = google::protobuf::util::MessageToJsonString(r, &text, options); !js.ok()) {
        std::cerr << "stragglerctl: INTERNAL: cannot render JSON: " << js.ToString() << '\n';
        return kExitRpcError;
      }
      out << text;
      if (text.empty() || text.back() != '\n') out << '\n';
    } else {
      stragglerctl::PrintReportsCsv(r, out);
    }
    out.flush();
    if (!out) {
      std::cerr << "stragglerctl: cannot write " << (file.empty() ? "stdout" : file) << '\n';
      return kExitUsage;
    }
    return kExitOk;
  }

  int Reset(const std::string& job) {
    return CallAndShow(&v1::AdminService::Stub::ResetJob, ForJob<v1::ResetJobRequest>(job),
                       stragglerctl::PrintJob);
  }

 private:
  Globals g_;
  straggler::stream::UnaryRouter router_;
};

// Runs the parsed command on the daemon; the exit status of main.
int Dispatch(Ctl& ctl, const Globals& g, Command& c, const sigset_t& stop_signals) {
  if (c.jobs->parsed()) return ctl.Jobs();
  if (c.job_cmd->parsed()) return ctl.Job(c.job, c.run);
  if (c.workers->parsed()) return ctl.Workers(c.job);
  if (c.worker->parsed()) return ctl.Worker(c.job, c.rank);
  if (c.membership->parsed()) return ctl.Membership(c.job);
  if (c.watch->parsed()) return ctl.Watch(c.job, stop_signals);
  if (c.top->parsed()) {
    // Redraws only on a terminal; piped, each frame follows the last.
    c.top_options.clear_screen = isatty(STDOUT_FILENO) != 0;
    return ctl.Top(c.top_options, stop_signals);
  }
  if (c.events->parsed()) {
    v1::ListEventsRequest req;
    req.set_job_id(c.job);
    req.set_since_sequence(c.since_sequence);
    req.set_limit(c.limit);
    for (const std::string& kind : c.event_kinds) {
      // IsMember admitted only kinds.
      req.add_kinds(static_cast<v1::EventKind>(
          *v1::ParseEnumShortName(v1::EventKind_descriptor(), kind)));
    }
    if (c.o_event_rank->count()) req.set_rank(c.event_rank);
    if (c.o_event_run->count()) req.set_run_id(c.event_run);
    return c.follow ? ctl.FollowEvents(req, c.follow_interval_ms, stop_signals) : ctl.Events(req);
  }
  if (c.reset->parsed()) return ctl.Reset(c.job);
  if (c.export_cmd->parsed()) {
    if (c.export_format.empty()) c.export_format = g.json() ? "json" : "csv";
    return ctl.Export(c.job, c.export_format, c.since_iteration, c.export_limit, c.output_file);
  }
  if (c.override_cmd->parsed()) {
    v1::RankOverride o = c.action == "include"   ? v1::RANK_OVERRIDE_FORCE_INCLUDE
                         : c.action == "exclude" ? v1::RANK_OVERRIDE_FORCE_EXCLUDE
                                                 : v1::RANK_OVERRIDE_NONE;
    return ctl.Override(c.job, c.rank, o, c.reason);
  }
  if (c.policy->parsed()) {
    return c.policy_any ? ctl.SetPolicy(c.job, c.policy_given) : ctl.ShowPolicy(c.job);
  }
  return kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  Globals g;
  Command c;
  CLI::App app{"stragglerctl: query and steer a stragglerd daemon"};
  stragglerctl::AddCommands(app, &g, &c);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitUsage;
  }

  // Block the stop signals before any gRPC thread exists, so that only the
  // watch's waiter thread ever receives them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  if (c.watch->parsed() || c.top->parsed() || (c.events->parsed() && c.follow))
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  std::string error;
  if (!c.token_file.empty() && !straggler::ReadBearerToken(c.token_file, &g.token, &error)) {
    std::cerr << "stragglerctl: " << error << '\n';
    return kExitUsage;
  }
  const std::shared_ptr<grpc::ChannelCredentials> credentials =
      straggler::MakeChannelCredentials(g.tls, g.daemon, &error);
  if (!credentials) {
    std::cerr << "stragglerctl: " << error << '\n';
    return kExitUsage;
  }
  auto pool = straggler::stream::ChannelPool::Make(g.daemon, credentials, Ctl::ChannelArgs());
  if (!pool.ok()) {
    std::cerr << "stragglerctl: --daemon: " << pool.status().message() << '\n';
    return kExitUsage;
  }
  Ctl ctl(g, *std::move(pool));
  return Dispatch(ctl, g, c, stop_signals);
}
