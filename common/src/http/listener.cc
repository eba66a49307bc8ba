#include "listener.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "request_head.h"

namespace straggler::common::http_detail {

Listener::Listener(ListenerOwner& server, size_t workers, Settings settings)
    : server_(server),
      settings_(settings),
      epoll_(::epoll_create1(EPOLL_CLOEXEC)),
      wake_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
      pool_(std::max<size_t>(workers, 1)) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;
  ::epoll_ctl(epoll_, EPOLL_CTL_ADD, wake_, &ev);
  poller_ = std::thread([this] { Run(); });
}

Listener::~Listener() {
  shutdown();
  server_.ListenerGone(this);
  connections_.clear();
  absl::MutexLock lock(&mu_);
  for (int sock : added_) ::close(sock);
  ::close(wake_);
  ::close(epoll_);
}

void Listener::shutdown() {
  if (stopping_.exchange(true)) return;
  Wake();
  if (poller_.joinable()) poller_.join();
  pool_.shutdown();  // requests at a worker finish; their connections close in ~Listener
  probes_.shutdown();
}

void Listener::Add(int sock) {
  {
    absl::MutexLock lock(&mu_);
    added_.push_back(sock);
  }
  Wake();
}

void Listener::Wake() {
  const uint64_t one = 1;
  (void)!::write(wake_, &one, sizeof one);
}

void Listener::Run() {
  BlockSigpipe();
  std::array<epoll_event, 128> events{};
  while (!stopping_.load()) {
    int timeout_ms = 1000;
    if (next_deadline_ != Clock::time_point::max()) {
      // A sweep visits every connection: at most one per kSweepEvery, however
      // many deadlines fall between.
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(
          std::max(next_deadline_, last_sweep_ + kSweepEvery) - Clock::now());
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1000));
    }
    const int n = ::epoll_wait(epoll_, events.data(), static_cast<int>(events.size()), timeout_ms);
    const Clock::time_point now = Clock::now();
    for (int i = 0; i < n; ++i) {
      auto* c = static_cast<Connection*>(events[i].data.ptr);
      if (c == nullptr) {
        uint64_t count;
        (void)!::read(wake_, &count, sizeof count);
        TakeQueued(now);
        continue;
      }
      if (c->state == Connection::State::kClosing) {
        Drain(c);
        continue;
      }
      if (c->state == Connection::State::kWriting) {
        Flush(c);
        continue;
      }
      if (c->state == Connection::State::kIdle) {
        SetDeadline(c, Connection::State::kReading, now + settings_.read_timeout);
      }
      Progress(c);
    }
    if (now >= next_deadline_ && now >= last_sweep_ + kSweepEvery) Sweep(now);
  }
}

void Listener::TakeQueued(Clock::time_point now) {
  std::vector<int> added;
  std::vector<std::pair<Connection*, bool>> returned;
  {
    absl::MutexLock lock(&mu_);
    added.swap(added_);
    returned.swap(returned_);
  }
  for (int sock : added) Open(sock, now);
  for (const auto& [c, keep] : returned) Resume(c, keep, now);
}

void Listener::Open(int sock, Clock::time_point now) {
  const int flags = ::fcntl(sock, F_GETFL);
  if (flags < 0 || ::fcntl(sock, F_SETFL, flags | O_NONBLOCK) < 0) {
    ::close(sock);
    return;
  }
  // A response goes out in a few writes (headers, body; TLS records). With
  // Nagle's algorithm a write waits while an earlier one is unacknowledged
  // (over TLS 1.3 the session tickets sent after the handshake), and the
  // client delays its ACK: every HTTPS request took 46 ms on loopback.
  const int one = 1;
  ::setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::unique_ptr<Connection> owned = server_.Open(sock);
  if (!owned) {
    ::close(sock);
    return;
  }
  Connection* c = owned.get();
  connections_.emplace(c, std::move(owned));
  c->requests_left = settings_.keep_alive_max_count;
  SetDeadline(c, Connection::State::kIdle, now + settings_.keep_alive_timeout);
  Watch(c, EPOLLIN);
}

// A connection back from a worker (or done sending a response's tail):
// sending the tail its worker handed over, closed, or waiting for its next
// request (already buffered or pending in TLS: read on now).
void Listener::Resume(Connection* c, bool keep, Clock::time_point now) {
  if (stopping_.load()) return Close(c);
  if (c->unsent() > 0) {
    c->keep_after = keep;
    SetDeadline(c, Connection::State::kWriting, c->write_deadline);
    return Flush(c);
  }
  if (!keep) return Close(c);
  if (!c->in.empty() || c->transport->Pending()) {
    SetDeadline(c, Connection::State::kReading, now + settings_.read_timeout);
    Progress(c);
    return;
  }
  SetDeadline(c, Connection::State::kIdle, now + settings_.keep_alive_timeout);
  Watch(c, EPOLLIN);
}

// Reads what the connection has (after the TLS handshake) and serves,
// refuses, or goes on waiting.
void Listener::Progress(Connection* c) {
  short wait = 0;
  if (c->tls != nullptr && !c->handshaken) {
    if (c->tls->Accept(wait) == 1) {
      c->handshaken = true;
    } else if (wait != 0) {
      Watch(c, wait == POLLOUT ? EPOLLOUT : EPOLLIN);
      return;
    } else {
      Close(c);
      return;
    }
  }
  for (;;) {
    const Verdict v = Judge(*c, settings_.max_body);
    if (v.kind == Verdict::kServe) return Dispatch(c);
    if (v.kind == Verdict::kRefuse) return Answer(c, v.status, v.message);
    if (c->expects_continue) {  // its client waits for this before it sends the body
      c->expects_continue = false;
      static constexpr char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
      (void)c->transport->Write(kContinue, sizeof kContinue - 1, wait);
    }
    // Through chunk_, so a connection's buffer holds what it sent, not a
    // chunk's worth for every trickled byte.
    const ssize_t n = c->transport->Read(chunk_.data(), chunk_.size(), wait);
    if (n > 0) {
      c->in.append(chunk_.data(), static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && wait != 0) {
      Watch(c, wait == POLLOUT ? EPOLLOUT : EPOLLIN);
      return;
    }
    // The peer closed, or the connection failed, mid-request or between
    // requests: nothing to answer.
    return Close(c);
  }
}

// Sends what it can of a handed-over response tail; when all is sent, the
// connection goes on as its worker decided (Resume).
void Listener::Flush(Connection* c) {
  while (c->unsent() > 0) {
    short wait = 0;
    const ssize_t n = c->transport->Write(c->out.data() + c->out_pos, c->unsent(), wait);
    if (n > 0) {
      c->out_pos += static_cast<size_t>(n);
      budget_.Give(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && wait != 0) {
      c->out_wait = wait;
      return Watch(c, wait == POLLOUT ? EPOLLOUT : EPOLLIN);
    }
    return Close(c);  // the reader went away
  }
  std::string().swap(c->out);
  c->out_pos = 0;
  Resume(c, c->keep_after, Clock::now());
}

void Listener::Dispatch(Connection* c) {
  Unwatch(c);
  c->state = Connection::State::kWorking;
  const auto write_timeout = settings_.write_timeout;
  (IsProbe(c->in) ? probes_ : pool_).enqueue([this, c, write_timeout] {
    const bool keep = server_.Serve(*c, write_timeout, budget_);
    {
      absl::MutexLock lock(&mu_);
      returned_.emplace_back(c, keep);
    }
    Wake();
  });
}

// Refuses the request without a worker: a short JSON error written once
// (it fits any socket buffer), then the connection is drained and closed.
void Listener::Answer(Connection* c, int status, const std::string& message) {
  const std::string body = std::string("{\"code\":\"") + ErrorCode(status) +
                           "\",\"message\":\"" + message + "\"}\n";
  const std::string response = "HTTP/1.1 " + std::to_string(status) + " " + Reason(status) +
                               "\r\nContent-Type: application/json\r\nContent-Length: " +
                               std::to_string(body.size()) +
                               "\r\nConnection: close\r\n\r\n" + body;
  short wait = 0;
  (void)c->transport->Write(response.data(), response.size(), wait);
  server_.CountRefused(status);
  ::shutdown(c->sock, SHUT_WR);
  std::string().swap(c->in);
  SetDeadline(c, Connection::State::kClosing, Clock::now() + kLinger);
  Watch(c, EPOLLIN);
}

void Listener::Drain(Connection* c) {
  char buf[kReadChunk];
  for (;;) {
    const ssize_t n = ::recv(c->sock, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    return Close(c);
  }
}

// Deadlines: an idle connection is closed; a request not whole in time is
// answered 408 and counted (a TLS handshake not done in time: closed and
// counted); a response tail not taken in time is dropped (reset, counted);
// a refused connection's drain ends.
void Listener::Sweep(Clock::time_point now) {
  last_sweep_ = now;
  std::vector<Connection*> expired;
  next_deadline_ = Clock::time_point::max();
  for (const auto& [c, owned] : connections_) {
    if (c->state == Connection::State::kWorking) continue;
    if (c->deadline <= now) {
      expired.push_back(c);
    } else {
      next_deadline_ = std::min(next_deadline_, c->deadline);
    }
  }
  for (Connection* c : expired) {
    switch (c->state) {
      case Connection::State::kReading:
        server_.CountSlow(0);
        if (c->tls == nullptr || c->handshaken) {
          Answer(c, 408,
                 "request not received whole within the read timeout of " +
                     std::to_string(settings_.read_timeout.count() / 1000) + " ms");
        } else {
          Close(c);
        }
        break;
      case Connection::State::kWriting:  // a response not taken in time
        server_.CountSlow(1);
        c->abort = true;
        Close(c);
        break;
      case Connection::State::kIdle:
      case Connection::State::kClosing:
        Close(c);
        break;
      case Connection::State::kWorking:
        break;
    }
  }
}

void Listener::SetDeadline(Connection* c, Connection::State state, Clock::time_point deadline) {
  c->state = state;
  c->deadline = deadline;
  next_deadline_ = std::min(next_deadline_, deadline);
}

void Listener::Watch(Connection* c, uint32_t events) {
  if (c->events == events) return;
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = c;
  if (::epoll_ctl(epoll_, c->events == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, c->sock, &ev) != 0) {
    return Close(c);
  }
  c->events = events;
}

void Listener::Unwatch(Connection* c) {
  if (c->events == 0) return;
  ::epoll_ctl(epoll_, EPOLL_CTL_DEL, c->sock, nullptr);
  c->events = 0;
}

void Listener::Close(Connection* c) {
  Unwatch(c);
  budget_.Give(c->unsent());
  connections_.erase(c);
}

}  // namespace straggler::common::http_detail
