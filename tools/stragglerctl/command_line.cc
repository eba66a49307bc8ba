#include "command_line.h"

#include <cstdlib>

#include "policy_flags.h"
#include "straggler/v1/enum_names.h"

namespace stragglerctl {
namespace v1 = straggler::v1;

namespace {

// --daemon, --output, --timeout-ms, TLS and the token file.
void AddGlobalFlags(CLI::App& app, Globals* g, Command* c) {
  // Not STRAGGLER_ENDPOINT: that is the trainers' variable, and on a node with
  // an agent it names the agent's socket, which has no query/admin service.
  const char* env = std::getenv("STRAGGLERCTL_DAEMON");
  g->daemon = env != nullptr && *env != '\0' ? env : kDefaultDaemon;

  app.require_subcommand(1);
  app.fallthrough();  // global flags may follow the subcommand
  app.add_option("--daemon", g->daemon,
                 "stragglerd's gRPC address, host:port or unix:///path, or several "
                 "replicas comma-separated (default: "
                 "$STRAGGLERCTL_DAEMON, else 127.0.0.1:7070; $STRAGGLER_ENDPOINT, the "
                 "trainers' variable, is not read)");
  app.add_option("--output,-o", g->output, "output format")
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();
  app.add_option("--timeout-ms", g->timeout_ms, "deadline of each call in milliseconds")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  g->tls = straggler::ChannelSecurityFromEnv();
  app.add_option("--tls-ca", g->tls.ca_file,
                 "PEM CA that signed the daemon's certificate; turns TLS on "
                 "(default: $STRAGGLER_TLS_CA)");
  app.add_option("--tls-cert", g->tls.cert_file,
                 "PEM client certificate, for a daemon that requires mutual TLS "
                 "(default: $STRAGGLER_TLS_CERT)");
  app.add_option("--tls-key", g->tls.key_file,
                 "PEM private key of --tls-cert (default: $STRAGGLER_TLS_KEY)");
  const char* token_env = std::getenv("STRAGGLER_TOKEN_FILE");
  c->token_file = token_env != nullptr ? token_env : "";
  app.add_option("--token-file", c->token_file,
                 "file holding the bearer token the daemon's auth.token_file names; "
                 "needed for policy/override/reset (and for reads with auth.protect_reads) "
                 "(default: $STRAGGLER_TOKEN_FILE)");
}

// The read-only views: jobs, job, workers, worker, membership, watch, top.
void AddViewCommands(CLI::App& app, Command* c) {
  c->jobs = app.add_subcommand("jobs", "list jobs");
  c->job_cmd = app.add_subcommand("job", "show one job");
  c->job_cmd->add_option("JOB", c->job, "job id")->required();
  c->job_cmd->add_option("--run", c->run,
                      "an earlier run's last state (the job's earlier_runs; docs/runs.md)");
  c->workers = app.add_subcommand("workers", "list the ranks of a job");
  c->workers->add_option("JOB", c->job, "job id")->required();
  c->worker = app.add_subcommand("worker", "show one rank of a job");
  c->worker->add_option("JOB", c->job, "job id")->required();
  c->worker->add_option("RANK", c->rank, "rank")->required();
  c->membership = app.add_subcommand("membership", "show the job's current membership");
  c->membership->add_option("JOB", c->job, "job id")->required();
  c->watch = app.add_subcommand("watch", "stream membership versions until Ctrl-C");
  c->watch->add_option("JOB", c->job, "job id")->required();

  c->top = app.add_subcommand("top", "live view of a job's ranks and events until Ctrl-C");
  c->top->add_option("job", c->top_options.job, "job id")->required();
  c->top->add_option("--interval-ms", c->top_options.interval_ms, "time between refreshes")
      ->capture_default_str()
      ->check(CLI::Range(100, 3600000));
  c->top->add_option("--events", c->top_options.events, "newest events shown")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
}

void AddEventsCommand(CLI::App& app, Command* c) {
  c->events = app.add_subcommand("events", "list a job's events");
  c->events->add_option("JOB", c->job, "job id (\"\" = all jobs)")->required();
  c->events->add_option("--since-sequence", c->since_sequence, "only events with a larger sequence");
  c->events->add_option("--limit", c->limit,
                     "at most this many (0 = daemon default, 1000); with --follow: per poll");
  c->events
      ->add_option("--kind", c->event_kinds,
                   "only events of these kinds (repeat or comma-separate)")
      ->delimiter(',')
      ->check(CLI::IsMember(v1::EnumShortNames(v1::EventKind_descriptor())));
  c->o_event_run =
      c->events->add_option("--run", c->event_run, "only events of this run of the job (docs/runs.md)");
  c->o_event_rank = c->events->add_option(
      "--rank", c->event_rank, "only events about this rank (job-wide events name no rank)");
  c->events->add_flag("--follow,-f", c->follow,
                   "print the events, then poll for new ones and print them as they come, one "
                   "line each, until Ctrl-C");
  c->events->add_option("--interval-ms", c->follow_interval_ms, "with --follow: time between polls")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
}

// What changes or exports a job: policy, override, export, reset.
void AddChangeCommands(CLI::App& app, Command* c) {
  c->policy = app.add_subcommand(
      "policy", "show a job's policy, or change the fields given as flags (the rest are kept)");
  c->policy->add_option("JOB", c->job, "job id")->required();
  AddPolicyFlags(c->policy, &c->policy_given, &c->policy_any);

  c->override_cmd = app.add_subcommand("override", "force a rank in or out, or clear that");
  c->override_cmd->add_option("JOB", c->job, "job id")->required();
  c->override_cmd->add_option("RANK", c->rank, "rank")->required();
  c->override_cmd->add_option("ACTION", c->action, "include | exclude | none")
      ->required()
      ->check(CLI::IsMember({"include", "exclude", "none"}));
  c->override_cmd->add_option("--reason", c->reason, "why (kept in the event journal)");

  c->export_cmd = app.add_subcommand(
      "export", "write a job's recent reports (CSV for straggler-replay, or JSON)");
  c->export_cmd->add_option("JOB", c->job, "job id")->required();
  c->export_cmd->add_option("--format", c->export_format, "csv (default; json with --output json)")
      ->check(CLI::IsMember({"csv", "json"}));
  c->export_cmd->add_option("--since-iteration", c->since_iteration,
                         "only reports with iteration >= this");
  c->export_cmd->add_option("--limit", c->export_limit,
                         "at most this many, the oldest iterations first (0 = all kept)");
  c->export_cmd->add_option("--output-file", c->output_file, "write here instead of stdout");

  c->reset = app.add_subcommand("reset", "forget a job's per-rank state; include everyone");
  c->reset->add_option("JOB", c->job, "job id")->required();
}

}  // namespace

void AddCommands(CLI::App& app, Globals* g, Command* c) {
  AddGlobalFlags(app, g, c);
  AddViewCommands(app, c);
  AddEventsCommand(app, c);
  AddChangeCommands(app, c);
}

}  // namespace stragglerctl
