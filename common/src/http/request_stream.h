// A worker's httplib::Stream over a connection the deadline listener
// (http_deadline.h) lent it for one request. Private to common/src/http*.
//
// Thread-safety: used by the one worker that holds the connection.
#pragma once

#include <httplib.h>

#include <chrono>
#include <cstring>
#include <string>

#include "connection.h"
#include "transport.h"

namespace straggler::common::http_detail {

// A worker's view of a connection for one request: what the poller buffered
// first, then (a chunked body) the socket itself, until the request's read
// deadline. Writes go to the socket without waiting; what the socket does
// not take at once is handed over (Connection::out) for the poller to send
// by the response's write deadline, so a reader slower than the socket
// buffer holds no worker (issue 15: 8 slow readers of a 9 MB /metrics held
// all 4 workers for the 5 s write timeout, and /healthz waited behind them).
// A tail over the UnsentBudget is written by the worker itself, within
// kOverBudgetPatience.
class RequestStream final : public httplib::Stream {
 public:
  RequestStream(Connection& c, std::chrono::microseconds write_timeout, UnsentBudget& budget)
      : c_(c), write_timeout_(write_timeout), budget_(budget) {}

  bool read_timed_out() const { return read_timed_out_; }
  bool write_timed_out() const { return write_timed_out_; }
  // Drops the bytes this request consumed; the rest (a pipelined request)
  // stays for the next. Notes the write deadline for the poller.
  void Consume() {
    c_.in.erase(0, pos_);
    pos_ = 0;
    c_.write_deadline = WriteDeadline();
  }

  bool is_readable() const override {
    return pos_ < c_.in.size() || c_.transport->Pending() ||
           WaitUntil(c_.sock, POLLIN, c_.deadline);
  }
  // Writes never wait (see write): writable unless the connection failed.
  bool is_writable() const override {
    pollfd p{c_.sock, POLLOUT, 0};
    return ::poll(&p, 1, 0) >= 0 && (p.revents & (POLLERR | POLLNVAL)) == 0;
  }

  ssize_t read(char* ptr, size_t size) override {
    if (pos_ == c_.in.size()) {
      c_.in.resize(kReadChunk);
      pos_ = 0;
      const ssize_t n = Retry(
          [&](short& wait) { return c_.transport->Read(c_.in.data(), c_.in.size(), wait); },
          c_.deadline, read_timed_out_);
      c_.in.resize(static_cast<size_t>(std::max<ssize_t>(n, 0)));
      if (n <= 0) return n;
    }
    const size_t n = std::min(size, c_.in.size() - pos_);
    std::memcpy(ptr, c_.in.data() + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }

  // All of `size` is written or handed over (httplib does not retry a short
  // write), or -1.
  ssize_t write(const char* ptr, size_t size) override {
    if (!writing_) {  // the response's first write starts its deadline
      writing_ = true;
      write_deadline_ = Clock::now() + write_timeout_;
    }
    if (size == 0) return 0;
    if (c_.unsent() > 0) {  // a tail is already handed over: the rest follows it
      if (Hold(ptr, size)) return static_cast<ssize_t>(size);
      if (!FlushHeld()) return -1;
    }
    size_t done = 0;
    while (done < size) {
      short wait = 0;
      const ssize_t n = c_.transport->Write(ptr + done, size - done, wait);
      if (n > 0) {
        done += static_cast<size_t>(n);
        continue;
      }
      if (n == 0 || wait == 0) return -1;  // the connection failed
      // Over TLS the retry must pass these same bytes: Hold keeps them
      // first in Connection::out (SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER).
      c_.out_wait = wait;
      if (Hold(ptr + done, size - done)) return static_cast<ssize_t>(size);
      if (!WaitUntil(c_.sock, wait, OverBudgetDeadline())) {
        write_timed_out_ = true;
        return -1;
      }
    }
    return static_cast<ssize_t>(size);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    PeerName(c_.sock, /*remote=*/true, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    PeerName(c_.sock, /*remote=*/false, ip, port);
  }
  socket_t socket() const override { return c_.sock; }

 private:
  template <class Step>
  ssize_t Retry(Step step, Clock::time_point deadline, bool& timed_out) {
    for (;;) {
      short wait = 0;
      const ssize_t n = step(wait);
      if (n >= 0 || wait == 0) return n;
      if (!WaitUntil(c_.sock, wait, deadline)) {
        timed_out = true;
        return -1;
      }
    }
  }
  Clock::time_point WriteDeadline() const {
    return writing_ ? write_deadline_ : Clock::now() + write_timeout_;
  }
  // The worker's own wait for a reader, once the rest did not fit the budget.
  Clock::time_point OverBudgetDeadline() {
    if (!over_budget_) {
      over_budget_ = true;
      over_budget_deadline_ = std::min(write_deadline_, Clock::now() + kOverBudgetPatience);
    }
    return over_budget_deadline_;
  }

  // Appends to the handed-over tail if the budget allows.
  bool Hold(const char* ptr, size_t size) {
    if (!budget_.Take(c_.unsent(), size)) return false;
    c_.out.append(ptr, size);
    return true;
  }

  // Sends the handed-over tail itself (more would not fit the budget),
  // within the write deadline.
  bool FlushHeld() {
    while (c_.unsent() > 0) {
      const ssize_t n = Retry(
          [&](short& wait) {
            return c_.transport->Write(c_.out.data() + c_.out_pos, c_.unsent(), wait);
          },
          OverBudgetDeadline(), write_timed_out_);
      if (n <= 0) return false;
      c_.out_pos += static_cast<size_t>(n);
      budget_.Give(static_cast<size_t>(n));
    }
    std::string().swap(c_.out);
    c_.out_pos = 0;
    return true;
  }

  Connection& c_;
  const std::chrono::microseconds write_timeout_;
  UnsentBudget& budget_;
  Clock::time_point write_deadline_{};
  bool writing_ = false;
  bool read_timed_out_ = false;
  bool write_timed_out_ = false;
  bool over_budget_ = false;
  Clock::time_point over_budget_deadline_{};
  size_t pos_ = 0;
};

}  // namespace straggler::common::http_detail
