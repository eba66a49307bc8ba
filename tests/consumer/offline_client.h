// The client each consumer program starts from: the only rank of a one-rank
// job whose endpoint nobody listens on (these programs prove that the
// installed package links and works, not that a daemon answers; a client
// never needs its daemon to be created or to enqueue reports).
#pragma once

#include <cstdio>
#include <memory>
#include <string>

#include <straggler/client.h>

// Null, with the reason on stderr, when creation fails.
inline std::unique_ptr<straggler::Client> OfflineClient(const char* job_id) {
  straggler::ClientOptions o;
  o.endpoint = "127.0.0.1:1";
  o.job_id = job_id;
  o.ranks = {0};
  o.world_size = 1;
  std::string error;
  auto client = straggler::Client::Create(o, &error);
  if (!client) std::fprintf(stderr, "%s: creating the client failed: %s\n", job_id, error.c_str());
  return client;
}
