#include "etcd_harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "cluster/etcd_client.h"

namespace straggler::cluster::testing {

using namespace std::chrono_literals;

namespace {

// A TCP socket bound to 127.0.0.1 on a port the kernel picks, listening
// when `backlog` > 0; -1 on failure.
int BindLoopback(int backlog, int* port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      (backlog > 0 && listen(fd, backlog) != 0) ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  *port = ntohs(addr.sin_port);
  return fd;
}

}  // namespace

int FreePort() {
  int port = -1;
  int fd = BindLoopback(0, &port);
  if (fd < 0) return -1;
  close(fd);
  return port;
}

Watch::OnEvents WatchRecorder::OnEvents() {
  return [this](int64_t revision, const std::vector<WatchEvent>& batch) {
    absl::MutexLock lock(&mu_);
    events_.insert(events_.end(), batch.begin(), batch.end());
    revisions_.push_back(revision);
  };
}

Watch::OnEnd WatchRecorder::OnEnd() {
  return [this](const absl::Status& reason) {
    absl::MutexLock lock(&mu_);
    ends_.push_back(reason);
  };
}

std::vector<WatchEvent> WatchRecorder::Events() const {
  absl::MutexLock lock(&mu_);
  return events_;
}

std::vector<std::string> WatchRecorder::Values() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const WatchEvent& e : events_) out.push_back(e.kv.value);
  return out;
}

std::vector<absl::Status> WatchRecorder::Ends() const {
  absl::MutexLock lock(&mu_);
  return ends_;
}

std::vector<int64_t> WatchRecorder::Revisions() const {
  absl::MutexLock lock(&mu_);
  return revisions_;
}

bool PollUntil(std::chrono::milliseconds limit, const std::function<bool()>& done) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (true) {
    if (done()) return true;
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

absl::StatusOr<std::unique_ptr<EtcdProcess>> EtcdProcess::Start() {
  std::filesystem::create_directories(STRAGGLER_CLUSTER_TEST_DIR);
  std::string pattern = std::string(STRAGGLER_CLUSTER_TEST_DIR) + "/etcd-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", pattern, " failed"));
  }
  // A free port can be taken by someone else before etcd binds it: retry.
  absl::Status last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::unique_ptr<EtcdProcess> etcd(new EtcdProcess(pattern, FreePort(), FreePort()));
    last = etcd->Spawn();
    if (last.ok()) last = etcd->WaitReady();
    if (last.ok()) return etcd;
    etcd->Kill();
    etcd->dir_.clear();  // keep the dir for the next attempt
    std::filesystem::remove_all(pattern + "/data");
  }
  std::filesystem::remove_all(pattern);
  return last;
}

EtcdProcess::EtcdProcess(std::string dir, int client_port, int peer_port)
    : dir_(std::move(dir)),
      client_port_(client_port),
      peer_port_(peer_port) {}

std::string EtcdProcess::endpoint() const { return absl::StrCat("127.0.0.1:", client_port_); }

EtcdProcess::~EtcdProcess() {
  Kill();
  if (!dir_.empty()) std::filesystem::remove_all(dir_);
}

absl::Status EtcdProcess::Spawn() {
  const std::string client = absl::StrCat("http://127.0.0.1:", client_port_);
  const std::string peer = absl::StrCat("http://127.0.0.1:", peer_port_);
  std::vector<std::string> args = {STRAGGLER_ETCD,
                                   "--name=test",
                                   "--data-dir=" + dir_ + "/data",
                                   "--listen-client-urls=" + client,
                                   "--advertise-client-urls=" + client,
                                   "--listen-peer-urls=" + peer,
                                   "--initial-advertise-peer-urls=" + peer,
                                   "--initial-cluster=test=" + peer,
                                   "--heartbeat-interval=50",
                                   "--election-timeout=500",
                                   "--logger=zap",
                                   "--log-outputs=stderr"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string log = dir_ + "/etcd.log";
  int log_fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) return absl::InternalError(absl::StrCat("cannot open ", log));
  pid_t pid = fork();
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec.
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // no etcd left behind by a crashed test
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(log_fd);
  if (pid < 0) return absl::InternalError("fork failed");
  pid_ = pid;
  return absl::OkStatus();
}

absl::Status EtcdProcess::WaitReady() {
  // A gRPC connection made while etcd starts (its port bound, its server not
  // yet serving) was seen to stall for seconds in the HTTP/2 handshake
  // (docs/cluster.md, "Threads and connections"): wait for etcd's "serving client traffic" line before the first call.
  absl::Status last = absl::UnavailableError("etcd never said it serves client traffic");
  std::unique_ptr<EtcdClient> client;
  bool ready = PollUntil(std::chrono::seconds(20), [&] {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      last = absl::InternalError(absl::StrCat("etcd (", STRAGGLER_ETCD, ") exited with status ",
                                              status, " (127: not installed? Debian package "
                                              "etcd-server)"));
      return true;
    }
    if (client == nullptr) {
      if (Log().find("serving client traffic", log_start_) == std::string::npos) return false;
      auto connected = EtcdClient::Connect({.endpoints = endpoint(), .call_timeout = 2s});
      if (!connected.ok()) {
        last = connected.status();
        return true;
      }
      client = *std::move(connected);
    }
    last = client->Get("/ready-probe").status();
    return last.ok();
  });
  if (ready && last.ok()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(last.message(), "; etcd log:\n", LogTail()));
}

std::string EtcdProcess::Log() const {
  std::ifstream in(dir_ + "/etcd.log");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string EtcdProcess::LogTail() const {
  std::string all = Log();
  return all.size() > 4000 ? all.substr(all.size() - 4000) : all;
}

void EtcdProcess::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
}

absl::Status EtcdProcess::Restart() {
  Kill();
  log_start_ = Log().size();  // the next "serving client traffic" is the new run's
  if (absl::Status s = Spawn(); !s.ok()) return s;
  return WaitReady();
}

absl::StatusOr<std::unique_ptr<TcpProxy>> TcpProxy::Start(int upstream_port) {
  int port = -1;
  int fd = BindLoopback(16, &port);
  if (fd < 0) return absl::InternalError("proxy: cannot listen on 127.0.0.1");
  return std::unique_ptr<TcpProxy>(new TcpProxy(fd, port, upstream_port));
}

TcpProxy::TcpProxy(int listen_fd, int port, int upstream_port)
    : listen_fd_(listen_fd), port_(port), upstream_port_(upstream_port) {
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

TcpProxy::~TcpProxy() {
  stopping_ = true;
  shutdown(listen_fd_, SHUT_RDWR);
  acceptor_.join();
  close(listen_fd_);
  Cut();
  std::vector<std::thread> pumps;
  {
    absl::MutexLock lock(&mu_);
    pumps.swap(pumps_);
  }
  for (std::thread& t : pumps) t.join();
  absl::MutexLock lock(&mu_);
  for (int fd : open_fds_) close(fd);
}

std::string TcpProxy::endpoint() const { return absl::StrCat("127.0.0.1:", port_); }

void TcpProxy::Cut() {
  absl::MutexLock lock(&mu_);
  cut_ = true;
  // shutdown, not close: the pumps still own the descriptors and close them.
  for (int fd : open_fds_) shutdown(fd, SHUT_RDWR);
}

void TcpProxy::Heal() {
  absl::MutexLock lock(&mu_);
  cut_ = false;
}

void TcpProxy::AcceptLoop() {
  while (!stopping_) {
    int down = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (down < 0) continue;
    absl::MutexLock lock(&mu_);
    int up = cut_ ? -1 : socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(upstream_port_);
    if (up < 0 || connect(up, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      if (up >= 0) close(up);
      close(down);
      continue;
    }
    open_fds_.push_back(down);
    open_fds_.push_back(up);
    pumps_.emplace_back([this, down, up] { Pump(down, up); });
    pumps_.emplace_back([this, down, up] { Pump(up, down); });
  }
}

// Copies `from` to `to` until either side ends, then ends both. Descriptors
// are closed only by the destructor, so that Cut() never shuts down a
// number the process has reused for another socket.
void TcpProxy::Pump(int from, int to) {
  char buf[16384];
  while (true) {
    ssize_t n = read(from, buf, sizeof(buf));
    if (n <= 0) break;
    ssize_t off = 0;
    while (off < n) {
      ssize_t w = send(to, buf + off, n - off, MSG_NOSIGNAL);
      if (w <= 0) break;
      off += w;
    }
    if (off < n) break;
  }
  shutdown(from, SHUT_RDWR);
  shutdown(to, SHUT_RDWR);
}

}  // namespace straggler::cluster::testing
