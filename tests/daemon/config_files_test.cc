// Config files that are hostile or broken (issue 28, items 10 and 14): a
// YAML alias bomb, an unclosed quote, a FIFO where a file is read, and the
// reload that would turn security off (SecurityDowngrades). The real daemon
// under the same files: tests/security/config_files_test.py and
// reload_auth_test.py.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "config/config.h"
#include "straggler/common/channel_security.h"
#include "straggler/common/config_reader.h"

namespace sd = straggler::daemon;

namespace {

// `levels` lines, each a list of nine aliases of the line before: 9^levels
// nodes once expanded, in 54 bytes a line (468 bytes for nine levels; the bomb had 540).
std::string AliasBomb(int levels, const std::string& under = "") {
  std::string text = under.empty() ? "" : under + ":\n";
  const std::string indent = under.empty() ? "" : "  ";
  text += indent + "a0: &a0 [x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i < levels; ++i) {
    const std::string prev = "*a" + std::to_string(i - 1);
    text += indent + "a" + std::to_string(i) + ": &a" + std::to_string(i) + " [";
    for (int k = 0; k < 9; ++k) text += (k ? ", " : "") + prev;
    text += "]\n";
  }
  return text;
}

std::string Refused(const std::string& text) {
  auto cfg = sd::ParseConfig(text, "t.yaml");
  REQUIRE_FALSE(cfg.ok());
  return std::string(cfg.status().message());
}

}  // namespace

TEST_CASE("yaml_bomb: a file whose aliases expand past the node bound is refused at once") {
  // 9^9 = 387 420 489 nodes from 468 bytes, walked in full before (the
  // issue's 540-byte bomb: 28 s of CPU at start, 50 s at each reload). Now
  // the walk stops at kMaxConfigNodes.
  const std::string bomb = AliasBomb(9);
  CHECK(bomb.size() < 600);
  CHECK_THAT(Refused(bomb), Catch::StartsWith("t.yaml:") &&
                                Catch::Contains("more than 100000 YAML nodes once its aliases "
                                                "are expanded (an alias bomb?)"));
  // The same under a key the daemon knows (the policy section's walk).
  CHECK_THAT(Refused(AliasBomb(9, "jobs")), Catch::Contains("(an alias bomb?)"));
  // Aliases used with measure still parse: a policy shared by two rules.
  auto shared = sd::ParseConfig(
      "jobs:\n  - match: a*\n    policy: &p {limit: 7}\n  - match: b*\n    policy: *p\n",
      "t.yaml");
  REQUIRE(shared.ok());
  REQUIRE(shared->jobs.size() == 2);
  CHECK(shared->jobs[1].policy.limit == 7);
  // Around the bound: 5 levels expand to ~75 000 nodes, walked and then
  // refused for their keys only; 6 levels to ~670 000.
  CHECK_THAT(Refused(AliasBomb(5)), Catch::Contains("unknown key 'a0'"));
  CHECK_THAT(Refused(AliasBomb(6)), Catch::Contains("(an alias bomb?)"));
}

TEST_CASE("yaml_bomb and other malformed files: an unclosed quote names the line it opens on") {
  // yaml-cpp 0.7 reads an unclosed quote on to the end of the file and takes
  // it all as the value: this was "log_level=info grpc_address: ... is not
  // one of trace, ...", naming neither the quote nor its line.
  CHECK(Refused("log_level: \"info\ngrpc_address: 127.0.0.1:0\npolicy:\n  limit: 5\n") ==
        "t.yaml:1: the quoted value opened here (\") is not closed on this line: a missing "
        "quote? (no key takes a value over several lines)");
  CHECK_THAT(Refused("policy:\n  kind: 'peer\n  limit: 5\n"),
             Catch::StartsWith("t.yaml:2: the quoted value opened here (')"));
  // A later quote closes it: yaml-cpp gives up a line later, where its
  // message points; the hint names the line that opened the quote.
  CHECK(Refused("log_level: \"info\ngrpc_address: \"127.0.0.1:0\"\n") ==
        "t.yaml:2: YAML syntax error: end of map not found (line 1 opens a quoted value that "
        "it does not close: a missing quote?)");
  // Quotes that close, escaped quotes, quotes inside words and comments: fine.
  auto ok = sd::ParseConfig(
      "log_level: 'info'  # it's \"fine\"\ngrpc_address: \"127.0.0.1:0\"\njobs:\n"
      "  - match: \"a\\\"b*\"\n  - match: 'it''s*'\n  - match: x'y\n",
      "t.yaml");
  REQUIRE(ok.ok());
  CHECK(ok->jobs[0].match == "a\"b*");
  CHECK(ok->jobs[1].match == "it's*");
  CHECK(ok->jobs[2].match == "x'y");
}

TEST_CASE("fifo: a FIFO where a file is read is refused before it is opened for reading") {
  char tmpl[] = "/tmp/stragglerd_fifo_XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  const std::string fifo = dir + "/key.pem";
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  // With no writer, reading a FIFO waited for ever (and the daemon, at
  // start, could not be stopped): now an error naming what it is.
  std::string out, error;
  CHECK_FALSE(straggler::ReadWholeFile(fifo, "tls key file", &out, &error));
  CHECK(error == "cannot read tls key file " + fifo +
                     ": not a regular file (a FIFO); give the path of a file");
  CHECK_FALSE(straggler::ReadBearerToken(fifo, &out, &error));
  CHECK_THAT(error, Catch::Contains("not a regular file (a FIFO)"));
  // The daemon's token file, through LoadConfig.
  const std::string config = dir + "/stragglerd.yaml";
  {
    FILE* f = std::fopen(config.c_str(), "w");
    REQUIRE(f != nullptr);
    std::fputs(("auth:\n  token_file: " + fifo + "\n").c_str(), f);
    std::fclose(f);
  }
  sd::ConfigSources flags;
  flags.config_file = config;
  auto cfg = sd::LoadConfig(flags, [](const char*) { return std::optional<std::string>(); });
  REQUIRE_FALSE(cfg.ok());
  CHECK_THAT(std::string(cfg.status().message()),
             Catch::Contains("auth.token_file: cannot read token file " + fifo +
                             ": not a regular file (a FIFO)"));
  // The config file itself.
  flags.config_file = fifo;
  cfg = sd::LoadConfig(flags, [](const char*) { return std::optional<std::string>(); });
  REQUIRE_FALSE(cfg.ok());
  CHECK_THAT(std::string(cfg.status().message()), Catch::Contains("is not a regular file"));
  // A directory keeps its own words.
  CHECK_FALSE(straggler::ReadWholeFile(dir, "tls cert file", &out, &error));
  CHECK(error == "cannot read tls cert file " + dir + ": Is a directory");
  std::remove(config.c_str());
  std::remove(fifo.c_str());
  rmdir(dir.c_str());
}

TEST_CASE("reload_auth: what a reload would turn off is named, each with its old value") {
  sd::DaemonConfig secure;
  secure.auth.token_file = "/etc/stragglerd/token";
  secure.auth.protect_reads = true;
  secure.tls.cert_file = "/etc/stragglerd/cert.pem";
  secure.tls.key_file = "/etc/stragglerd/key.pem";
  secure.tls.client_ca_file = "/etc/stragglerd/ca.pem";
  CHECK(sd::SecurityDowngrades(secure, secure).empty());
  // An empty file's config: every default, so everything off.
  const std::vector<std::string> all = sd::SecurityDowngrades(secure, sd::DaemonConfig{});
  REQUIRE(all.size() == 5);
  CHECK(all[0] == "the admin token (auth.token_file=/etc/stragglerd/token)");
  CHECK(all[1] == "the token on reads (auth.protect_reads=true)");
  CHECK(all[2] == "client certificates (tls.client_ca_file=/etc/stragglerd/ca.pem)");
  CHECK(all[3] == "TLS on the gRPC listener (tls.cert_file=/etc/stragglerd/cert.pem)");
  CHECK(all[4] == "TLS on the HTTP listener (tls.cert_file=/etc/stragglerd/cert.pem)");
  sd::DaemonConfig http_plain = secure;
  http_plain.tls.http = false;
  CHECK(sd::SecurityDowngrades(secure, http_plain) ==
        std::vector<std::string>{
            "TLS on the HTTP listener (tls.cert_file=/etc/stragglerd/cert.pem)"});
  // Turning things on, or changing the token file, weakens nothing.
  CHECK(sd::SecurityDowngrades(sd::DaemonConfig{}, secure).empty());
  sd::DaemonConfig other_token = secure;
  other_token.auth.token_file = "/etc/stragglerd/token2";
  CHECK(sd::SecurityDowngrades(secure, other_token).empty());
  // The key that allows it, and an empty file's mark.
  auto allow = sd::ParseConfig("security:\n  allow_downgrade: true\n", "t.yaml");
  REQUIRE(allow.ok());
  CHECK(allow->security.allow_downgrade);
  CHECK_FALSE(allow->empty_file);
  CHECK_FALSE(sd::DaemonConfig{}.security.allow_downgrade);
  for (const char* empty : {"", "# only a comment\n", "\n\n---\n"}) {
    auto cfg = sd::ParseConfig(empty, "t.yaml");
    REQUIRE(cfg.ok());
    CHECK(cfg->empty_file);
  }
  CHECK_THAT(Refused("security:\n  allow_downgrade: maybe\n"),
             Catch::Contains("security.allow_downgrade=maybe is not true or false"));
}
