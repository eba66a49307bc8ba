// A raw client connection to an HTTP(S) port on loopback (stragglerd's or
// straggler-agent's), over TLS when asked (the handshake done, the
// certificate not checked), that sends what it is told, as slowly as the
// test likes: the slowloris client of the HTTP deadline tests.
//
//   SlowClient client(port, /*tls=*/nullptr);
//   client.Send("GET /healthz HTTP/1.1\r\nHost: x\r\n");  // false: the server closed it
//
//   SlowlorisOutcome o = Slowloris(port, nullptr, 8, [&] { return Get("/healthz") == 200; });
//
// SlowClient is not thread-safe (one thread per client); Slowloris runs its
// clients on threads of its own.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace straggler::testing {

class SlowClient {
 public:
  SlowClient(int port, SSL_CTX* tls) {
    sock_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(sock_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return;
    if (tls == nullptr) {
      connected_ = true;
      return;
    }
    ssl_ = SSL_new(tls);
    connected_ = ssl_ != nullptr && SSL_set_fd(ssl_, sock_) == 1 && SSL_connect(ssl_) == 1;
  }
  ~SlowClient() {
    if (ssl_ != nullptr) SSL_free(ssl_);
    ::close(sock_);
  }
  SlowClient(const SlowClient&) = delete;
  SlowClient& operator=(const SlowClient&) = delete;

  bool connected() const { return connected_; }
  // False once the server has closed the connection (reset it, or closed
  // its end: a read of the raw socket sees the end of the stream).
  bool Send(const std::string& bytes) {
    const bool sent = ssl_ != nullptr
                          ? SSL_write(ssl_, bytes.data(), static_cast<int>(bytes.size())) ==
                                static_cast<int>(bytes.size())
                          : ::send(sock_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
                                static_cast<ssize_t>(bytes.size());
    char c;
    return sent && ::recv(sock_, &c, 1, MSG_DONTWAIT | MSG_PEEK) != 0;
  }

 private:
  int sock_ = -1;
  SSL* ssl_ = nullptr;
  bool connected_ = false;
};

struct SlowlorisOutcome {
  int connected = 0;         // slow clients that got a connection (and handshake)
  int closed_by_server = 0;  // ...that the server then closed
  bool served = false;       // what `normal_request` returned
};

// `clients` slowloris connections to `port` (TLS with a `tls` context): each
// sends a request line and then one header byte every 200 ms (well inside
// any per-read timeout) until the server closes it, the attack is over or a
// minute passed. After 300 ms (time to take the workers) `normal_request`
// runs; then the attack ends once the server has closed a slow client (or
// after 10 s more). A server with whole-request deadlines closes
// the slow ones and serves the normal request; one without them does
// neither while the attack lasts.
inline SlowlorisOutcome Slowloris(int port, SSL_CTX* tls, int clients,
                                  const std::function<bool()>& normal_request) {
  std::atomic<bool> done{false};
  std::atomic<int> connected{0};
  std::atomic<int> closed_by_server{0};
  std::vector<std::thread> slow;
  for (int i = 0; i < clients; ++i) {
    slow.emplace_back([&] {
      // SSL_write on a connection the server closed raises SIGPIPE.
      sigset_t pipe;
      sigemptyset(&pipe);
      sigaddset(&pipe, SIGPIPE);
      pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
      SlowClient client(port, tls);
      if (!client.connected()) return;
      ++connected;
      if (!client.Send("GET /healthz HTTP/1.1\r\nHost: x\r\n")) {
        ++closed_by_server;
        return;
      }
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (!done && std::chrono::steady_clock::now() < give_up) {
        if (!client.Send("X")) {
          ++closed_by_server;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let them take the workers
  SlowlorisOutcome out;
  out.served = normal_request();
  // A server that reads requests before giving them a worker serves the
  // normal one at once: keep the attack on until it cuts a slow one off.
  const auto cut_off_by = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (closed_by_server == 0 && std::chrono::steady_clock::now() < cut_off_by) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  done = true;
  for (auto& t : slow) t.join();
  out.connected = connected;
  out.closed_by_server = closed_by_server;
  return out;
}

// The value of one sample ("name{labels}") in a /metrics body; -1 when
// absent. The deadline tests read their slow-client counters with it.
inline double MetricSample(const std::string& body, const std::string& sample) {
  const std::string needle = "\n" + sample + " ";
  const size_t at = body.find(needle);
  if (at == std::string::npos) return -1;
  return std::stod(body.substr(at + needle.size()));
}

}  // namespace straggler::testing
