// What the two halves of the _straggler extension share: the Python-side
// Client (PyClient, which owns the C++ client and closes the reducers built
// on it), the store over a torch.distributed Store (PyStore), and the
// reducer bindings' entry point. straggler_module.cc binds the client and
// membership types; reducers.cc binds PartialAllReduce (Gloo and NCCL).
//
// Thread safety: as the C++ classes (Client: any thread; PartialAllReduce:
// one thread at a time); every Python call from a C++ thread takes the GIL.
#pragma once

#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gloo/common/error.h>
#include <gloo/rendezvous/store.h>

#include "straggler/client.h"
#include "straggler/collective.h"

namespace straggler_py __attribute__((visibility("hidden"))) {

namespace py = pybind11;

inline std::chrono::milliseconds Millis(double seconds, const char* name) {
  if (!(seconds >= 0)) {  // also rejects NaN
    throw py::value_error(std::string(name) + "=" + std::to_string(seconds) +
                          " must be a non-negative number of seconds");
  }
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0 + 0.5));
}

// The Python object owns the C++ client and the Python callbacks. The C++
// callbacks hold only raw pointers to the latter: the client (and its
// background thread) is always destroyed first, with the GIL released so a
// callback waiting for the GIL can finish, and the Python callables are then
// released with the GIL held.
class PyClient {
 public:
  explicit PyClient(const straggler::ClientOptions& options) : options_(options) {
    std::string error;
    client_ = straggler::Client::Create(options, &error);
    if (!client_) throw py::value_error("straggler.Client: " + error);
  }
  ~PyClient() { Close(); }

  // A PartialAllReduce keeps a reference to the C++ client, so closing the
  // client first closes the reducers built on it (later calls on them raise).
  struct ReducerSlot {
    std::unique_ptr<straggler::PartialAllReduce> reducer;
  };
  void Attach(const std::shared_ptr<ReducerSlot>& slot) { reducers_.push_back(slot); }

  void Close() {
    if (!client_) return;
    std::vector<std::unique_ptr<straggler::PartialAllReduce>> reducers;
    for (const auto& weak : reducers_) {
      if (auto slot = weak.lock()) reducers.push_back(std::move(slot->reducer));
    }
    reducers_.clear();
    std::unique_ptr<straggler::Client> doomed = std::move(client_);
    py::gil_scoped_release release;
    reducers.clear();  // closing Gloo pairs may wait on sockets
    doomed.reset();    // flushes for at most 1 s, joins the background thread
  }

  const straggler::ClientOptions& Options() const { return options_; }

  straggler::Client& Get() {
    if (!client_) throw std::runtime_error("straggler.Client is closed");
    return *client_;
  }

  void OnMembershipChange(py::function callback) {
    callbacks_.push_back(std::make_unique<py::function>(std::move(callback)));
    py::function* fn = callbacks_.back().get();
    Get().OnMembershipChange([fn](const straggler::MembershipView& view) {
      // Python may be shutting down while the background thread still runs:
      // taking the GIL then would end the thread inside the interpreter.
      if (!Py_IsInitialized() || _Py_IsFinalizing()) return;
      py::gil_scoped_acquire gil;
      try {
        (*fn)(view);
      } catch (py::error_already_set& e) {
        // Nowhere to raise it on this thread: report it as unraisable (printed
        // on stderr) rather than lose it or take the client down.
        e.discard_as_unraisable("straggler.Client membership callback");
      }
    });
  }

 private:
  straggler::ClientOptions options_;
  std::vector<std::weak_ptr<ReducerSlot>> reducers_;
  std::vector<std::unique_ptr<py::function>> callbacks_;
  std::unique_ptr<straggler::Client> client_;  // declared last: destroyed first
};

// A gloo::rendezvous::Store over a Python object with torch.distributed
// Store's methods (set(key, bytes), get(key) -> bytes blocking until set,
// wait(keys, timedelta)): straggler.torch passes the store
// init_process_group made, so the job's contexts need no daemon to build.
// Called from the training thread inside begin_iteration, which has
// released the GIL: each call takes it. A Python exception (a timeout) is
// turned into gloo::IoException, which the backend reports as a
// CollectiveError.
class PyStore final : public gloo::rendezvous::Store {
 public:
  explicit PyStore(py::object store) : store_(std::move(store)) {}
  ~PyStore() override {
    // Dropped where the GIL is released (a reducer closing): take it to
    // release the Python object, unless the interpreter is going away.
    if (!Py_IsInitialized() || _Py_IsFinalizing()) {
      store_.release();
      return;
    }
    py::gil_scoped_acquire gil;
    store_ = py::object();
  }

  void set(const std::string& key, const std::vector<char>& data) override {
    Call("set", [&] { store_.attr("set")(key, py::bytes(data.data(), data.size())); });
  }
  std::vector<char> get(const std::string& key) override {
    std::vector<char> out;
    Call("get", [&] {
      const std::string v = store_.attr("get")(key).cast<std::string>();
      out.assign(v.begin(), v.end());
    });
    return out;
  }
  void wait(const std::vector<std::string>& keys) override {
    Call("wait", [&] { store_.attr("wait")(keys); });
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    Call("wait", [&] {
      py::object timedelta = py::module_::import("datetime").attr("timedelta");
      store_.attr("wait")(keys, timedelta(py::arg("milliseconds") = timeout.count()));
    });
  }

 private:
  template <class Fn>
  void Call(const char* what, Fn&& fn) {
    py::gil_scoped_acquire gil;
    try {
      fn();
    } catch (py::error_already_set& e) {
      throw gloo::IoException(std::string("the trainer's rendezvous store: ") + what + ": " +
                              e.what());
    }
  }

  py::object store_;
};

// Binds StepPlan and PartialAllReduce (reducers.cc).
void BindReducers(py::module_& m);

}  // namespace straggler_py
