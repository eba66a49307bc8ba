// Links against the installed libstraggler through both public headers and
// runs a client against an endpoint nobody listens on.
#include <cstdio>
#include <string>

#include <straggler/client.h>
#include <straggler/straggler_c.h>

int main() {
  straggler::ClientOptions o;
  o.endpoint = "127.0.0.1:1";
  o.job_id = "consumer";
  o.ranks = {0};
  o.world_size = 1;
  std::string error;
  auto client = straggler::Client::Create(o, &error);
  if (!client) {
    std::fprintf(stderr, "create failed: %s\n", error.c_str());
    return 1;
  }
  client->Report(0, 0, 0.01);
  straggler_options_t c;
  straggler_options_init(&c);
  std::printf("consumer ok: enqueued=%llu default queue=%zu\n",
              static_cast<unsigned long long>(client->Stats().enqueued), c.queue_capacity);
  return client->Stats().enqueued == 1 ? 0 : 1;
}
