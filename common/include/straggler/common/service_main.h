// The main() skeleton shared by stragglerd (daemon/src/server/main.cc) and
// straggler-agent (agent/src/main.cc): command line with the same exit codes,
// control signals taken on the main thread only, and the sigwait loop in
// which SIGHUP reloads the config and SIGTERM/SIGINT stop.
//
//   CLI::App app{"...", "stragglerd"};
//   AddServiceFlags(app, {"deploy/stragglerd.yaml", "STRAGGLERD_CONFIG", ready_json, note},
//                   sources.config_file, sources.log_level, ready_file);
//   ... add the service's own options ...
//   if (std::optional<int> rc = ParseCommandLine(app, argc, argv, VERSION)) return *rc;
//   const sigset_t signals = BlockControlSignals();
//   if (std::optional<int> rc = StartService({"stragglerd", VERSION, ready_file},
//                                            load, detail, start, ready)) return *rc;
//   const int sig = ServeUntilStopped(signals, load, apply, rejected);
//
// Header-only; no state beyond the process signal mask and spdlog's level.
#pragma once

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <system_error>

#include <CLI/CLI.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

// The build's version, for --version and the "starting" line: CMake sets it
// on the daemon's and the agent's targets.
#ifndef STRAGGLERD_VERSION
#define STRAGGLERD_VERSION "unknown"
#endif

namespace straggler::common {

// Exit status of a bad command line or a rejected config; the deploy
// manifests and the integration tests tell it apart from a crash (1).
inline constexpr int kExitBadConfig = 2;

// Maps a log_level name (already validated: ValidateLogLevel) to spdlog and
// applies it.
inline void ApplyLogLevel(const std::string& level) {
  spdlog::set_level(spdlog::level::from_str(level));
}

// What the flags both services take say of the service in --help.
struct ServiceFlags {
  const char* sample_config;  // the file that lists every key: "deploy/stragglerd.yaml"
  const char* config_env;     // the environment variable --config overrides
  const char* ready_json;     // the ready file's contents, e.g. {"pid":N}
  const char* ready_note;     // what its addresses are, e.g. "dialable addresses"
};

// Adds --config, --log-level and --ready-file, bound straight into the
// service's config sources (unset stays "not given", so the environment and
// the file still apply).
inline void AddServiceFlags(CLI::App& app, const ServiceFlags& flags,
                            std::optional<std::string>& config_file,
                            std::optional<std::string>& log_level, std::string& ready_file) {
  app.add_option("--config", config_file,
                 absl::StrCat("YAML config file (every key: ", flags.sample_config,
                              "); default: $", flags.config_env,
                              ", else built-in defaults; a directory or a file that cannot be "
                              "read is refused"));
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error (default info)");
  app.add_option("--ready-file", ready_file,
                 absl::StrCat("once serving, atomically write ", flags.ready_json, " here (",
                              flags.ready_note, ")"));
}

// Adds --version as the last option (so --help lists it last), then parses.
// Returns the status main() should exit with when it must not go on: 0 after
// --help or --version (which prints "<app name> <version>"), kExitBadConfig
// after a usage error (CLI11 has printed it). nullopt: parsed, carry on.
inline std::optional<int> ParseCommandLine(CLI::App& app, int argc, char** argv,
                                           const char* version_string) {
  bool version = false;
  app.add_flag("--version", version, "print the version and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kExitBadConfig;
  }
  if (version) {
    std::cout << app.get_name() << " " << version_string << "\n";
    return 0;
  }
  return std::nullopt;
}

// Blocks SIGTERM, SIGINT and SIGHUP in the calling thread and returns that
// set for ServeUntilStopped. Call it before any thread exists (gRPC, tick,
// agent workers): threads inherit the mask, so only the sigwait in
// ServeUntilStopped ever sees these signals and no handler runs on a
// thread holding locks.
inline sigset_t BlockControlSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// Waits on `signals` (from BlockControlSignals) until SIGTERM or SIGINT and
// returns that signal. On each SIGHUP calls load_config() (returning
// absl::StatusOr<Config>, re-reading the same sources: the file may have
// changed, flags have not). A config whose file held no key (Config's
// empty_file: empty, comments only) is an error too: at start it means the
// built-in defaults, but on a reload it is most often a file caught while it
// was being rewritten, and the defaults would turn the admin token off and
// reset every limit. An error is logged as "SIGHUP: config rejected, keeping
// the running one: <message>", rejected(status) is called (a metric) and
// the running config stays; otherwise apply_config(config) is called.
template <typename LoadConfig, typename ApplyConfig, typename Rejected>
int ServeUntilStopped(const sigset_t& signals, LoadConfig load_config, ApplyConfig apply_config,
                      Rejected rejected) {
  for (;;) {
    int sig = 0;
    if (sigwait(&signals, &sig) != 0) continue;
    if (sig != SIGHUP) return sig;
    auto next = load_config();
    if (next.ok() && next->empty_file) {
      next = absl::FailedPreconditionError(absl::StrCat(
          "config file ", next->config_file,
          " holds no key (empty or only comments); a reload needs the whole config, and the "
          "built-in defaults would turn the admin token off and reset every limit (to run on "
          "the defaults, restart with it)"));
    }
    if (!next.ok()) {
      spdlog::error("SIGHUP: config rejected, keeping the running one: {}",
                    std::string(next.status().message()));
      rejected(next.status());
      continue;
    }
    apply_config(*next);
  }
}

// "SIGTERM" or "SIGINT", for the log line naming what stopped the service.
inline const char* StopSignalName(int sig) { return sig == SIGTERM ? "SIGTERM" : "SIGINT"; }

// Writes `contents` to `path` through a temporary file renamed over it, so a
// reader polling for the file (the --ready-file of the tests and deploy
// probes) sees either nothing or the whole of it, never half a line.
// Returns false when the file could not be written or renamed.
inline bool WriteFileAtomically(const std::string& path, const std::string& contents) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << contents;
    if (!out.flush()) return false;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  return !ec;
}

// Names the service in StartService's messages, and where its ready file goes.
struct ServiceStart {
  const char* name;        // "stragglerd", "straggler-agent"
  const char* version;     // the build's version, for the "starting" line
  std::string ready_file;  // --ready-file; "" = none
};

// The start-up both services share once the command line is parsed and the
// signals are blocked. load() returns absl::StatusOr<Config> (a Config has
// log_level and config_file); an error is printed to stderr as "<name>:
// <message>" and the exit status is kExitBadConfig. Otherwise the log level
// is applied and "<name> <version> starting; config: <file or built-in
// defaults><detail(config)>" logged, then start(config) runs (returning
// absl::Status): an error is logged, and exits kExitBadConfig when it is
// FAILED_PRECONDITION (a TLS file, a state database, a socket directory: the
// configuration's fault), else 1. Last, with a ready file, its contents
// (ready()) are written atomically; a failure is logged and exits 1.
// nullopt: the service is up, go on serving.
template <typename Load, typename Detail, typename Start, typename Ready>
std::optional<int> StartService(const ServiceStart& service, Load load, Detail detail, Start start,
                                Ready ready) {
  auto config = load();
  if (!config.ok()) {
    std::cerr << service.name << ": " << config.status().message() << "\n";
    return kExitBadConfig;
  }
  ApplyLogLevel(config->log_level);
  spdlog::info("{} {} starting; config: {}{}", service.name, service.version,
               config->config_file.empty() ? "built-in defaults" : config->config_file,
               detail(*config));
  if (absl::Status s = start(*config); !s.ok()) {
    spdlog::error("{}", std::string(s.message()));
    return s.code() == absl::StatusCode::kFailedPrecondition ? kExitBadConfig : 1;
  }
  if (!service.ready_file.empty() && !WriteFileAtomically(service.ready_file, ready())) {
    spdlog::error("cannot write --ready-file {}", service.ready_file);
    return 1;
  }
  return std::nullopt;
}

}  // namespace straggler::common
