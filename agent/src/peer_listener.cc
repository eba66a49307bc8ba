// UnixPeerListener: see peer_listener.h.
#include "peer_listener.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <grpcpp/server_posix.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "spdlog/spdlog.h"

namespace straggler::agent {

absl::StatusOr<std::unique_ptr<UnixPeerListener>> UnixPeerListener::Bind(
    const std::string& path) {
  auto fail = [&](const char* what) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on unix socket ", path, ": ", what, ": ", std::strerror(errno)));
  };
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr.sun_path) {
    return absl::InvalidArgumentError(absl::StrCat("unix socket path '", path, "' is empty or longer than ",
                                                   sizeof addr.sun_path - 1, " bytes"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  // A socket file left by an earlier agent (kill -9) would make bind fail.
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) unlink(path.c_str());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return fail("socket");
  if (bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    auto s = fail("bind");
    close(fd);
    return s;
  }
  if (listen(fd, SOMAXCONN) != 0) {
    auto s = fail("listen");
    close(fd);
    return s;
  }
  int wake[2];
  if (pipe2(wake, O_CLOEXEC) != 0) {
    auto s = fail("pipe2");
    close(fd);
    return s;
  }
  return std::unique_ptr<UnixPeerListener>(new UnixPeerListener(fd, wake[0], wake[1]));
}

UnixPeerListener::~UnixPeerListener() {
  Stop();
  close(fd_);
  close(wake_read_);
  close(wake_write_);
}

void UnixPeerListener::Serve(grpc::Server* server) {
  thread_ = std::thread([this, server] { Run(server); });
}

void UnixPeerListener::Stop() {
  if (!thread_.joinable()) return;
  const char byte = 1;
  while (write(wake_write_, &byte, 1) < 0 && errno == EINTR) {
  }
  thread_.join();
}

int64_t UnixPeerListener::PidOf(const std::string& peer) const {
  absl::string_view rest = peer;
  int fd = -1;
  if (!absl::ConsumePrefix(&rest, "fd:") || !absl::SimpleAtoi(rest, &fd)) return 0;
  absl::MutexLock lock(&mu_);
  auto it = pids_.find(fd);
  return it == pids_.end() ? 0 : it->second;
}

void UnixPeerListener::Run(grpc::Server* server) {
  pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_read_, POLLIN, 0}};
  for (;;) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("agent socket: poll failed: {}; no new trainer connections",
                    std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;  // Stop
    const int conn = accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (conn < 0) {
      // ECONNABORTED, EMFILE and friends: this connection is lost, the
      // listener is not (EMFILE clears as connections close).
      if (errno != EINTR && errno != EAGAIN) {
        spdlog::warn("agent socket: accept failed: {}", std::strerror(errno));
        if (errno == EMFILE || errno == ENFILE) poll(nullptr, 0, 100);
      }
      continue;
    }
    ucred cred{};
    socklen_t len = sizeof cred;
    int64_t pid = 0;
    if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) pid = cred.pid;
    {
      absl::MutexLock lock(&mu_);
      pids_[conn] = pid;
    }
    grpc::AddInsecureChannelFromFd(server, conn);  // gRPC owns conn from here
  }
}

}  // namespace straggler::agent
