// `stragglerctl top JOB`: the web console's job view in a terminal. Every
// interval it reads the job, its ranks, its membership and its new events
// (QueryService) and redraws: one line per rank (state, counter, ratio,
// reason), then the newest events. It runs until SIGINT or SIGTERM.
//
//   TopOptions o{.job = "resnet-42", .interval_ms = 1000, .events = 8};
//   int rc = RunTop(stub, o, prepare, stop_signals, std::cout);
//
// Not thread-safe; one call at a time.
#pragma once

#include <signal.h>

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "straggler/v1/straggler.grpc.pb.h"

namespace stragglerctl {

struct TopOptions {
  std::string job;
  int interval_ms = 1000;
  int events = 8;           // newest events shown under the table
  bool clear_screen = true;  // ANSI clear before each frame (a terminal)
};

// One frame of the view, without screen control: pure, for tests too.
std::string RenderTop(const straggler::v1::Job& job, const straggler::v1::ListWorkersResponse& workers,
                      const std::vector<straggler::v1::Event>& newest_events);

// Redraws every options.interval_ms until one of `signals` (blocked by the
// caller in every thread) arrives: 0 then. A failed call ends it: `on_error`
// reports it and its return value is returned. `prepare` sets each call's
// deadline and token.
int RunTop(straggler::v1::QueryService::Stub& query, const TopOptions& options,
           const std::function<void(grpc::ClientContext&)>& prepare, const sigset_t& signals,
           std::ostream& out, const std::function<int(const grpc::Status&)>& on_error);

}  // namespace stragglerctl
