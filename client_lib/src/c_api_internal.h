// The definition behind the opaque straggler_client_t, private to this source
// tree: libstraggler_cuda's C ABI (client_lib/cuda) reaches the C++ client
// of a straggler_client_t through it. Both libraries are built from the same
// tree in one build, so they always agree on this layout.
#pragma once

#include <memory>

#include "straggler/client.h"

struct straggler_client {
  std::unique_ptr<straggler::Client> client;
};
