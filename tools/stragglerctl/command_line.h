// stragglerctl's command line: the global flags (Globals: where the daemon
// is, TLS, token, output) and every subcommand with its arguments
// (Command), defined on a CLI::App. main.cc parses and dispatches.
//
//   Globals g;
//   Command c;
//   CLI::App app{"stragglerctl"};
//   AddCommands(app, &g, &c);
//   app.parse(argc, argv);            // g and c hold what the command line said
//   if (c.events->parsed()) ...
//
// `g` and `c` must outlive the parse (the flags write into them). Not
// thread-safe (as CLI::App).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "straggler/common/channel_security.h"
#include "straggler/v1/straggler.pb.h"
#include "top.h"

namespace stragglerctl {

struct Globals {
  std::string daemon;
  straggler::ChannelSecurity tls;  // all empty: plaintext
  std::string token;               // from --token-file; "" = send none
  std::string output = "table";
  int timeout_ms = 5000;
  bool json() const { return output == "json"; }
};

// The subcommands (exactly one is parsed) and the arguments they share or own.
struct Command {
  std::string token_file;  // --token-file; main reads it into Globals::token
  std::string job;         // JOB of every per-job subcommand
  uint32_t rank = 0;       // RANK of worker and override

  CLI::App* jobs = nullptr;
  CLI::App* job_cmd = nullptr;
  std::string run;  // job --run
  CLI::App* workers = nullptr;
  CLI::App* worker = nullptr;
  CLI::App* membership = nullptr;
  CLI::App* watch = nullptr;
  CLI::App* top = nullptr;
  TopOptions top_options;

  CLI::App* events = nullptr;
  uint64_t since_sequence = 0;
  uint32_t limit = 0;
  std::vector<std::string> event_kinds;  // short names of v1::EventKind
  std::string event_run;
  CLI::Option* o_event_run = nullptr;
  uint32_t event_rank = 0;
  CLI::Option* o_event_rank = nullptr;
  bool follow = false;
  int follow_interval_ms = 1000;

  CLI::App* policy = nullptr;
  straggler::v1::PolicyConfig policy_given;  // only the flags given (policy_flags.h)
  bool policy_any = false;

  CLI::App* override_cmd = nullptr;
  std::string action;  // include | exclude | none
  std::string reason;

  CLI::App* export_cmd = nullptr;
  std::string export_format;
  uint64_t since_iteration = 0;
  uint32_t export_limit = 0;
  std::string output_file;

  CLI::App* reset = nullptr;
};

// The daemon's address when neither --daemon nor $STRAGGLERCTL_DAEMON says.
inline constexpr const char* kDefaultDaemon = "127.0.0.1:7070";

// Defines the global flags (defaults from the environment:
// $STRAGGLERCTL_DAEMON, $STRAGGLER_TLS_*, $STRAGGLER_TOKEN_FILE) and every
// subcommand on `app`, which then requires exactly one subcommand.
void AddCommands(CLI::App& app, Globals* g, Command* c);

}  // namespace stragglerctl
