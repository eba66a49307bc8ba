// The deadline listener's poller (http_deadline.h): the state machine of
// every connection (idle, reading, at a worker, sending a tail, closing),
// their deadlines, and the hand-off to workers. Private to common/src/http*.
//
// Thread-safety: Add and shutdown may be called from any thread; everything
// else runs on the poller thread, or on a worker for the connection it holds.
#pragma once

#include <httplib.h>

#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "connection.h"

namespace straggler::common::http_detail {

class Listener;

// What a Listener needs of the server behind it (DeadlineServer, in
// http_deadline.cc): an interface, so that the two do not include each
// other. Open, CountSlow and CountRefused run on the poller thread, Serve on
// a worker, ListenerGone in ~Listener.
class ListenerOwner {
 public:
  virtual ~ListenerOwner() = default;
  // A new connection's transport (TLS or not), or null to refuse it.
  virtual std::unique_ptr<Connection> Open(int sock) = 0;
  // Serves the request buffered in `c`; true to keep the connection.
  virtual bool Serve(Connection& c, std::chrono::microseconds write_timeout,
                     UnsentBudget& budget) = 0;
  // A connection closed for a late request ([0]) or response ([1]).
  virtual void CountSlow(size_t phase) = 0;
  // An answer the poller gave itself (408, 413, 414, 431).
  virtual void CountRefused(int status) = 0;
  // The accept loop that used `listener` has ended.
  virtual void ListenerGone(Listener* listener) = 0;
};

// The listener's task queue: httplib's accept loop hands it each accepted
// socket (enqueue runs process_and_close_socket at once, which calls Add).
// One poller thread waits for every connection's bytes (epoll) and holds
// each request's deadline; only a request that has arrived whole (or a
// chunked one's head) goes to one of the `workers`, so slow or idle
// connections never hold a worker or delay one another.
class Listener final : public httplib::TaskQueue {
 public:
  struct Settings {
    std::chrono::microseconds read_timeout;
    std::chrono::microseconds write_timeout;
    std::chrono::seconds keep_alive_timeout;
    size_t keep_alive_max_count;
    size_t max_body;
  };

  Listener(ListenerOwner& server, size_t workers, Settings settings);
  ~Listener() override;
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  void enqueue(std::function<void()> fn) override { fn(); }
  // Stops the poller (closing every connection not at a worker), then lets
  // the workers finish the requests they have.
  void shutdown() override;

  // From the accept thread: a new connection.
  void Add(int sock);

 private:
  void Run();
  void Wake();
  void TakeQueued(Clock::time_point now);
  void Open(int sock, Clock::time_point now);
  void Resume(Connection* c, bool keep, Clock::time_point now);
  void Progress(Connection* c);
  void Flush(Connection* c);
  void Drain(Connection* c);
  void Dispatch(Connection* c);
  void Answer(Connection* c, int status, const std::string& message);
  void Sweep(Clock::time_point now);
  void SetDeadline(Connection* c, Connection::State state, Clock::time_point deadline);
  void Watch(Connection* c, uint32_t events);
  void Unwatch(Connection* c);
  void Close(Connection* c);

  ListenerOwner& server_;
  const Settings settings_;
  const int epoll_;
  const int wake_;  // eventfd
  UnsentBudget budget_{kMaxUnsentPerConnection, kMaxUnsentTotal};
  httplib::ThreadPool pool_;
  httplib::ThreadPool probes_{1};  // IsProbe requests: never queued behind others
  std::thread poller_;
  std::atomic<bool> stopping_{false};

  absl::Mutex mu_;
  std::vector<int> added_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<Connection*, bool>> returned_ ABSL_GUARDED_BY(mu_);  // (connection, keep)

  // Poller thread only (and the destructor, after it).
  std::unordered_map<Connection*, std::unique_ptr<Connection>> connections_;
  Clock::time_point next_deadline_ = Clock::time_point::max();
  Clock::time_point last_sweep_{};
  std::array<char, kReadChunk> chunk_{};
};

}  // namespace straggler::common::http_detail
