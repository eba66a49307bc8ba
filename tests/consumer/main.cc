// Links against the installed libstraggler through both public headers and
// runs a client against an endpoint nobody listens on.
#include <cstdio>

#include <straggler/client.h>
#include <straggler/straggler_c.h>

#include "offline_client.h"

int main() {
  auto client = OfflineClient("consumer");
  if (!client) return 1;
  client->Report(0, 0, 0.01);
  straggler_options_t c;
  straggler_options_init(&c);
  std::printf("consumer ok: enqueued=%llu default queue=%zu\n",
              static_cast<unsigned long long>(client->Stats().enqueued), c.queue_capacity);
  return client->Stats().enqueued == 1 ? 0 : 1;
}
