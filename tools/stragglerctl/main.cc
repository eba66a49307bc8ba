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
// 127.0.0.1:7070 (never a trainer's $STRAGGLER_ENDPOINT).
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
#include "policy_flags.h"
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
constexpr const char* kDefaultDaemon = "127.0.0.1:7070";

struct Globals {
  std::string daemon;
  straggler::ChannelSecurity tls;  // all empty: plaintext
  std::string token;               // from --token-file; "" = send none
  std::string output = "table";
  int timeout_ms = 5000;
  bool json() const { return output == "json"; }
};

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
  Ctl(const Globals& g, const std::shared_ptr<grpc::ChannelCredentials>& credentials)
      : g_(g),
        channel_(grpc::CreateCustomChannel(g.daemon, credentials, ChannelArgs())),
        query_(v1::QueryService::NewStub(channel_)),
        admin_(v1::AdminService::NewStub(channel_)) {}

  // No 4 MB cap on responses: an export of a large ring exceeds it.
  static grpc::ChannelArguments ChannelArgs() {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
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

  // One unary call under the --timeout-ms deadline.
  template <typename Stub, typename Request, typename Response>
  grpc::Status Call(Stub& stub,
                    grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
                    const Request& request, Response* response) const {
    grpc::ClientContext ctx;
    Deadline(ctx);
    return (stub.*method)(&ctx, request, response);
  }

  // One unary call and its answer (Show): what most commands are.
  template <typename Stub, typename Request, typename Response, typename Print>
  int CallAndShow(Stub& stub,
                  grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
                  const Request& request, Print print) const {
    Response response;
    const grpc::Status status = Call(stub, method, request, &response);
    return Show(status, response, print);
  }

  int Jobs() {
    return CallAndShow(*query_, &v1::QueryService::Stub::ListJobs, v1::ListJobsRequest{},
                       stragglerctl::PrintJobs);
  }

  int Job(const std::string& job, const std::string& run) {
    v1::GetJobRequest req = ForJob<v1::GetJobRequest>(job);
    req.set_run_id(run);
    return CallAndShow(*query_, &v1::QueryService::Stub::GetJob, req, stragglerctl::PrintJob);
  }

  int Workers(const std::string& job) {
    return CallAndShow(*query_, &v1::QueryService::Stub::ListWorkers,
                       ForJob<v1::ListWorkersRequest>(job), stragglerctl::PrintWorkers);
  }

  int Worker(const std::string& job, uint32_t rank) {
    auto req = ForJob<v1::GetWorkerRequest>(job);
    req.set_rank(rank);
    return CallAndShow(*query_, &v1::QueryService::Stub::GetWorker, req, stragglerctl::PrintWorker);
  }

  int Membership(const std::string& job) {
    return CallAndShow(*query_, &v1::QueryService::Stub::GetMembership,
                       ForJob<v1::GetMembershipRequest>(job), stragglerctl::PrintMembership);
  }

  // One page of events; the daemon filters by kind and rank.
  int Events(const v1::ListEventsRequest& req) {
    return CallAndShow(*query_, &v1::QueryService::Stub::ListEvents, req, stragglerctl::PrintEvents);
  }

  // `events --follow`: every page from req's since_sequence on, then a poll
  // every `interval_ms` from the cursor the last answer gave (last_sequence:
  // also past events the filter skipped), one line per event, until SIGINT or
  // SIGTERM (blocked by the caller, so sigtimedwait takes them here).
  int FollowEvents(v1::ListEventsRequest req, int interval_ms, const sigset_t& signals) {
    const int page = req.limit() > 0 ? static_cast<int>(req.limit()) : 1000;  // daemon default
    for (;;) {
      v1::ListEventsResponse r;
      auto s = Call(*query_, &v1::QueryService::Stub::ListEvents, req, &r);
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
    auto reader = query_->WatchMembership(&ctx, req);
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
    return stragglerctl::RunTop(
        *query_, options, [this](grpc::ClientContext& ctx) { Deadline(ctx); }, signals, std::cout,
        [this](const grpc::Status& s) { return Fail(s, g_); });
  }

  int SetPolicy(const std::string& job, const v1::PolicyConfig& policy) {
    auto req = ForJob<v1::SetPolicyRequest>(job);
    *req.mutable_policy() = policy;
    auto print = [](const v1::Job& j, std::ostream& out) {
      out << "policy of job " << j.job_id() << " is now:\n";
      stragglerctl::PrintPolicy(j.policy(), out);
    };
    return CallAndShow(*admin_, &v1::AdminService::Stub::SetPolicy, req, print);
  }

  int ShowPolicy(const std::string& job) {
    v1::Job r;
    const grpc::Status s =
        Call(*query_, &v1::QueryService::Stub::GetJob, ForJob<v1::GetJobRequest>(job), &r);
    return Show(s, r.policy(), stragglerctl::PrintPolicy);  // the job's policy only
  }

  int Override(const std::string& job, uint32_t rank, v1::RankOverride o,
               const std::string& reason) {
    auto req = ForJob<v1::SetRankOverrideRequest>(job);
    req.set_rank(rank);
    req.set_override(o);
    req.set_reason(reason);
    const int rc = CallAndShow(*admin_, &v1::AdminService::Stub::SetRankOverride, req,
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
    auto s = Call(*query_, &v1::QueryService::Stub::GetJob, ForJob<v1::GetJobRequest>(job), &j);
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
    auto s = Call(*query_, &v1::QueryService::Stub::ExportReports, req, &r);
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
    return CallAndShow(*admin_, &v1::AdminService::Stub::ResetJob, ForJob<v1::ResetJobRequest>(job),
                       stragglerctl::PrintJob);
  }

 private:
  Globals g_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::QueryService::Stub> query_;
  std::unique_ptr<v1::AdminService::Stub> admin_;
};

}  // namespace

int main(int argc, char** argv) {
  Globals g;
  // Not STRAGGLER_ENDPOINT: that is the trainers' variable, and on a node with
  // an agent it names the agent's socket, which has no query/admin service.
  const char* env = std::getenv("STRAGGLERCTL_DAEMON");
  g.daemon = env != nullptr && *env != '\0' ? env : kDefaultDaemon;

  CLI::App app{"stragglerctl: query and steer a stragglerd daemon"};
  app.require_subcommand(1);
  app.fallthrough();  // global flags may follow the subcommand
  app.add_option("--daemon", g.daemon,
                 "stragglerd's gRPC address, host:port or unix:///path (default: "
                 "$STRAGGLERCTL_DAEMON, else 127.0.0.1:7070; $STRAGGLER_ENDPOINT, the "
                 "trainers' variable, is not read)");
  app.add_option("--output,-o", g.output, "output format")
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();
  app.add_option("--timeout-ms", g.timeout_ms, "deadline of each call in milliseconds")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  g.tls = straggler::ChannelSecurityFromEnv();
  app.add_option("--tls-ca", g.tls.ca_file,
                 "PEM CA that signed the daemon's certificate; turns TLS on "
                 "(default: $STRAGGLER_TLS_CA)");
  app.add_option("--tls-cert", g.tls.cert_file,
                 "PEM client certificate, for a daemon that requires mutual TLS "
                 "(default: $STRAGGLER_TLS_CERT)");
  app.add_option("--tls-key", g.tls.key_file,
                 "PEM private key of --tls-cert (default: $STRAGGLER_TLS_KEY)");
  const char* token_env = std::getenv("STRAGGLER_TOKEN_FILE");
  std::string token_file = token_env != nullptr ? token_env : "";
  app.add_option("--token-file", token_file,
                 "file holding the bearer token the daemon's auth.token_file names; "
                 "needed for policy/override/reset (and for reads with auth.protect_reads) "
                 "(default: $STRAGGLER_TOKEN_FILE)");

  std::string job;
  uint32_t rank = 0;

  auto* jobs = app.add_subcommand("jobs", "list jobs");
  auto* job_cmd = app.add_subcommand("job", "show one job");
  job_cmd->add_option("JOB", job, "job id")->required();
  std::string run;
  job_cmd->add_option("--run", run,
                      "an earlier run's last state (the job's earlier_runs; docs/runs.md)");
  auto* workers = app.add_subcommand("workers", "list the ranks of a job");
  workers->add_option("JOB", job, "job id")->required();
  auto* worker = app.add_subcommand("worker", "show one rank of a job");
  worker->add_option("JOB", job, "job id")->required();
  worker->add_option("RANK", rank, "rank")->required();
  auto* membership = app.add_subcommand("membership", "show the job's current membership");
  membership->add_option("JOB", job, "job id")->required();
  auto* watch = app.add_subcommand("watch", "stream membership versions until Ctrl-C");
  watch->add_option("JOB", job, "job id")->required();

  auto* top = app.add_subcommand("top", "live view of a job's ranks and events until Ctrl-C");
  stragglerctl::TopOptions top_options;
  top->add_option("job", top_options.job, "job id")->required();
  top->add_option("--interval-ms", top_options.interval_ms, "time between refreshes")
      ->capture_default_str()
      ->check(CLI::Range(100, 3600000));
  top->add_option("--events", top_options.events, "newest events shown")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  auto* events = app.add_subcommand("events", "list a job's events");
  events->add_option("JOB", job, "job id (\"\" = all jobs)")->required();
  uint64_t since_sequence = 0;
  uint32_t limit = 0;
  events->add_option("--since-sequence", since_sequence, "only events with a larger sequence");
  events->add_option("--limit", limit,
                     "at most this many (0 = daemon default, 1000); with --follow: per poll");
  std::vector<std::string> event_kinds;
  events
      ->add_option("--kind", event_kinds,
                   "only events of these kinds (repeat or comma-separate)")
      ->delimiter(',')
      ->check(CLI::IsMember(v1::EnumShortNames(v1::EventKind_descriptor())));
  std::string event_run;
  auto* o_event_run =
      events->add_option("--run", event_run, "only events of this run of the job (docs/runs.md)");
  uint32_t event_rank = 0;
  auto* o_event_rank = events->add_option(
      "--rank", event_rank, "only events about this rank (job-wide events name no rank)");
  bool follow = false;
  events->add_flag("--follow,-f", follow,
                   "print the events, then poll for new ones and print them as they come, one "
                   "line each, until Ctrl-C");
  int follow_interval_ms = 1000;
  events->add_option("--interval-ms", follow_interval_ms, "with --follow: time between polls")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();

  auto* policy = app.add_subcommand(
      "policy", "show a job's policy, or change the fields given as flags (the rest are kept)");
  policy->add_option("JOB", job, "job id")->required();
  v1::PolicyConfig policy_given;
  bool policy_any = false;
  stragglerctl::AddPolicyFlags(policy, &policy_given, &policy_any);

  auto* override_cmd = app.add_subcommand("override", "force a rank in or out, or clear that");
  override_cmd->add_option("JOB", job, "job id")->required();
  override_cmd->add_option("RANK", rank, "rank")->required();
  std::string action;
  override_cmd->add_option("ACTION", action, "include | exclude | none")
      ->required()
      ->check(CLI::IsMember({"include", "exclude", "none"}));
  std::string reason;
  override_cmd->add_option("--reason", reason, "why (kept in the event journal)");

  auto* export_cmd = app.add_subcommand(
      "export", "write a job's recent reports (CSV for straggler-replay, or JSON)");
  export_cmd->add_option("JOB", job, "job id")->required();
  std::string export_format;
  export_cmd->add_option("--format", export_format, "csv (default; json with --output json)")
      ->check(CLI::IsMember({"csv", "json"}));
  uint64_t since_iteration = 0;
  export_cmd->add_option("--since-iteration", since_iteration,
                         "only reports with iteration >= this");
  uint32_t export_limit = 0;
  export_cmd->add_option("--limit", export_limit,
                         "at most this many, the oldest iterations first (0 = all kept)");
  std::string output_file;
  export_cmd->add_option("--output-file", output_file, "write here instead of stdout");

  auto* reset = app.add_subcommand("reset", "forget a job's per-rank state; include everyone");
  reset->add_option("JOB", job, "job id")->required();

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
  if (watch->parsed() || top->parsed() || (events->parsed() && follow))
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  std::string error;
  if (!token_file.empty() && !straggler::ReadBearerToken(token_file, &g.token, &error)) {
    std::cerr << "stragglerctl: " << error << '\n';
    return kExitUsage;
  }
  const std::shared_ptr<grpc::ChannelCredentials> credentials =
      straggler::MakeChannelCredentials(g.tls, g.daemon, &error);
  if (!credentials) {
    std::cerr << "stragglerctl: " << error << '\n';
    return kExitUsage;
  }
  Ctl ctl(g, credentials);
  if (jobs->parsed()) return ctl.Jobs();
  if (job_cmd->parsed()) return ctl.Job(job, run);
  if (workers->parsed()) return ctl.Workers(job);
  if (worker->parsed()) return ctl.Worker(job, rank);
  if (membership->parsed()) return ctl.Membership(job);
  if (watch->parsed()) return ctl.Watch(job, stop_signals);
  if (top->parsed()) {
    // Redraws only on a terminal; piped, each frame follows the last.
    top_options.clear_screen = isatty(STDOUT_FILENO) != 0;
    return ctl.Top(top_options, stop_signals);
  }
  if (events->parsed()) {
    v1::ListEventsRequest req;
    req.set_job_id(job);
    req.set_since_sequence(since_sequence);
    req.set_limit(limit);
    for (const std::string& kind : event_kinds) {
      // IsMember admitted only kinds.
      req.add_kinds(static_cast<v1::EventKind>(
          *v1::ParseEnumShortName(v1::EventKind_descriptor(), kind)));
    }
    if (o_event_rank->count()) req.set_rank(event_rank);
    if (o_event_run->count()) req.set_run_id(event_run);
    return follow ? ctl.FollowEvents(req, follow_interval_ms, stop_signals) : ctl.Events(req);
  }
  if (reset->parsed()) return ctl.Reset(job);
  if (export_cmd->parsed()) {
    if (export_format.empty()) export_format = g.json() ? "json" : "csv";
    return ctl.Export(job, export_format, since_iteration, export_limit, output_file);
  }
  if (override_cmd->parsed()) {
    v1::RankOverride o = action == "include"   ? v1::RANK_OVERRIDE_FORCE_INCLUDE
                         : action == "exclude" ? v1::RANK_OVERRIDE_FORCE_EXCLUDE
                                               : v1::RANK_OVERRIDE_NONE;
    return ctl.Override(job, rank, o, reason);
  }
  if (policy->parsed()) {
    return policy_any ? ctl.SetPolicy(job, policy_given) : ctl.ShowPolicy(job);
  }
  return kExitUsage;
}
