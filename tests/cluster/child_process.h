// Child processes of the cluster tests (rank drivers, stragglerctl): started
// with posix_spawn, stdout and stderr to files, waited for with a bound.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "etcd_harness.h"

extern char** environ;

namespace straggler::cluster::testing {

struct Child {
  pid_t pid = -1;  // -1: it could not be started
  std::string out;  // the files its stdout and stderr go to
  std::string err;
};

// Starts args[0] with `args`, its output in `<stem>.out` and `<stem>.err`.
inline Child Spawn(std::vector<std::string> args, const std::string& stem) {
  Child c;
  c.out = stem + ".out";
  c.err = stem + ".err";
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, 1, c.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&files, 2, c.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (posix_spawn(&c.pid, argv[0], &files, nullptr, argv.data(), environ) != 0) c.pid = -1;
  posix_spawn_file_actions_destroy(&files);
  return c;
}

inline std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The child's exit status (128 + signal when a signal ended it), or -1 (and
// the child killed) after `limit`.
inline int Finish(const Child& c, std::chrono::milliseconds limit) {
  if (c.pid < 0) return -1;
  int status = 0;
  const bool exited = PollUntil(limit, [&] { return waitpid(c.pid, &status, WNOHANG) == c.pid; });
  if (!exited) {
    kill(c.pid, SIGKILL);
    waitpid(c.pid, &status, 0);
    return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace straggler::cluster::testing
