// Small builders of straggler.proto requests, shared by the daemon's REST
// routes (daemon/src/api/rest_route.cc) and stragglerctl, which both write
// the same requests by hand otherwise.
//
// Header-only; no dependency beyond the message types it is given; safe from
// any thread.
#pragma once

#include <string>

namespace straggler::v1::requests {

// The request of a call on one job (any message with a job_id field), before
// its own parameters: ForJob<v1::GetWorkerRequest>("job-7").
template <class Request>
Request ForJob(const std::string& job) {
  Request request;
  request.set_job_id(job);
  return request;
}

}  // namespace straggler::v1::requests
