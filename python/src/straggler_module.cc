// _straggler: the pybind11 extension behind the `straggler` Python package
// (python/straggler/). It wraps straggler::Client and the Gloo
// PartialAllReduce for Python trainers; the package adds the PyTorch DDP
// communication hook on top (straggler/torch.py).
//
//   import straggler
//   client = straggler.Client(job_id="j", rank=0, world_size=4)   # the rest from env
//   reducer = straggler.PartialAllReduce(client)
//   plan = reducer.begin_iteration(it)
//   reducer.all_reduce_average(numpy_or_torch_buffer)   # in place, no copy
//
// GIL: every call that can wait (membership_for, flush, begin_iteration, the
// collectives, closing) releases it, so other Python threads — and the
// client's own callback thread — keep running. Membership callbacks run on the
// client's background thread and take the GIL only for the Python call.
//
// Thread safety: as the C++ classes (Client: any thread; PartialAllReduce:
// one thread at a time).
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <gloo/common/error.h>
#include <gloo/rendezvous/store.h>

#include "straggler/client.h"
#include "straggler/collective.h"

namespace py = pybind11;

void BindTopology(py::module_& m);  // topology_binding.cc

namespace {

std::chrono::milliseconds Millis(double seconds, const char* name) {
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

class PyPartialAllReduce {
 public:
  PyPartialAllReduce(std::shared_ptr<PyClient> client, const straggler::GlooOptions& options)
      : client_(std::move(client)), slot_(std::make_shared<PyClient::ReducerSlot>()) {
    std::string error;
    slot_->reducer = straggler::CreateGlooPartialAllReduce(client_->Get(), options, &error);
    if (!slot_->reducer) throw py::value_error("straggler.PartialAllReduce: " + error);
    client_->Attach(slot_);
  }
  ~PyPartialAllReduce() {
    py::gil_scoped_release release;  // closing Gloo pairs may wait on sockets
    slot_->reducer.reset();
  }
  straggler::PartialAllReduce& Get() {
    if (!slot_->reducer) {
      throw std::runtime_error("straggler.PartialAllReduce: its Client was closed");
    }
    return *slot_->reducer;
  }

 private:
  std::shared_ptr<PyClient> client_;
  std::shared_ptr<PyClient::ReducerSlot> slot_;
};

// A writable, C-contiguous view of `obj` without a copy. Takes anything with
// the buffer protocol (numpy arrays, bytearray, memoryview) and CPU torch
// tensors, which in torch 1.13 do not export the protocol themselves but
// share their memory with tensor.detach().numpy().
struct WritableBuffer {
  py::object owner;  // keeps the exporting object alive
  py::buffer_info info;
};

WritableBuffer Writable(py::handle obj, const std::string& what) {
  py::object target = py::reinterpret_borrow<py::object>(obj);
  if (!PyObject_CheckBuffer(obj.ptr())) {
    if (py::hasattr(obj, "detach") && py::hasattr(obj, "numpy") && py::hasattr(obj, "device")) {
      const std::string device = py::str(obj.attr("device").attr("type"));
      if (device != "cpu") {
        throw py::value_error(what + ": tensor is on device '" + device +
                              "'; the Gloo backend reduces CPU tensors only");
      }
      target = obj.attr("detach")().attr("numpy")();
    } else {
      throw py::type_error(what + ": " + std::string(py::str(py::type::of(obj))) +
                           " supports neither the buffer protocol nor torch's .numpy()");
    }
  }
  py::buffer buffer = py::reinterpret_borrow<py::buffer>(target);
  py::buffer_info info;
  try {
    info = buffer.request(/*writable=*/true);
  } catch (py::error_already_set& e) {
    throw py::value_error(what + ": the buffer is not writable (" + std::string(e.what()) + ")");
  }
  // C-contiguous: every stride is the product of the later extents.
  py::ssize_t expected = info.itemsize;
  for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
    if (info.shape[d] != 1 && info.strides[d] != expected) {
      throw py::value_error(what + ": the buffer is not C-contiguous (dimension " +
                            std::to_string(d) + " has stride " + std::to_string(info.strides[d]) +
                            " bytes, expected " + std::to_string(expected) + ")");
    }
    expected *= info.shape[d];
  }
  return {std::move(target), std::move(info)};
}

py::dict ResultDict(const straggler::AllReduceResult& r) {
  py::dict d;
  d["participated"] = r.participated;
  d["version"] = r.version;
  d["active_ranks"] = r.active_ranks;
  return d;
}

straggler::ClientOptions ClientOptionsFrom(const py::kwargs& kw) {
  straggler::ClientOptions o = straggler::ClientOptions::FromEnv();
  for (auto item : kw) {
    const std::string key = py::str(item.first);
    py::handle v = item.second;
    if (key == "endpoint") o.endpoint = v.cast<std::string>();
    else if (key == "job_id") o.job_id = v.cast<std::string>();
    else if (key == "run_id") o.run_id = v.cast<std::string>();
    else if (key == "rank") o.ranks = {v.cast<uint32_t>()};
    else if (key == "ranks") o.ranks = v.cast<std::vector<uint32_t>>();
    else if (key == "world_size") o.world_size = v.cast<uint32_t>();
    else if (key == "local_rank") o.local_rank = v.cast<uint32_t>();
    else if (key == "node") o.node = v.cast<std::string>();
    else if (key == "gpu_uuid") o.gpu_uuid = v.cast<std::string>();
    else if (key == "cuda_visible_devices") o.cuda_visible_devices = v.cast<std::string>();
    else if (key == "peer_group") o.peer_group = v.cast<std::string>();
    else if (key == "replica") o.replica = v.cast<std::optional<uint32_t>>();
    else if (key == "iterations_per_epoch") o.iterations_per_epoch = v.cast<uint64_t>();
    else if (key == "queue_capacity") o.queue_capacity = v.cast<size_t>();
    else if (key == "max_batch") o.max_batch = v.cast<size_t>();
    else if (key == "max_send_delay") o.max_send_delay = Millis(v.cast<double>(), "max_send_delay");
    else if (key == "backoff_initial") o.backoff_initial = Millis(v.cast<double>(), "backoff_initial");
    else if (key == "backoff_max") o.backoff_max = Millis(v.cast<double>(), "backoff_max");
    else if (key == "tls_ca_file") o.tls_ca_file = v.cast<std::string>();
    else if (key == "tls_cert_file") o.tls_cert_file = v.cast<std::string>();
    else if (key == "tls_key_file") o.tls_key_file = v.cast<std::string>();
    else throw py::type_error("straggler.Client: unknown option '" + key + "'");
  }
  return o;
}

straggler::GlooOptions GlooOptionsFrom(PyClient& client, const py::kwargs& kw) {
  // Defaults from the client: the same daemon, job, rank and world size. A
  // client that reports through the node's agent (unix://) must name the
  // daemon for the rendezvous, which only stragglerd serves
  // (RendezvousEndpointFor: STRAGGLER_RENDEZVOUS_ENDPOINT, else refused).
  const straggler::ClientOptions& c = client.Options();
  straggler::GlooOptions o;
  o.rendezvous_endpoint = straggler::RendezvousEndpointFor(c);
  o.job_id = c.job_id;
  o.run_id = c.run_id;  // each launch its own rendezvous keys (docs/runs.md)
  if (!c.ranks.empty()) o.rank = c.ranks.front();
  o.world_size = c.world_size;
  for (auto item : kw) {
    const std::string key = py::str(item.first);
    py::handle v = item.second;
    if (key == "rendezvous_endpoint") o.rendezvous_endpoint = v.cast<std::string>();
    else if (key == "job_id") o.job_id = v.cast<std::string>();
    else if (key == "rank") o.rank = v.cast<uint32_t>();
    else if (key == "world_size") o.world_size = v.cast<uint32_t>();
    else if (key == "hostname") o.hostname = v.cast<std::string>();
    else if (key == "collective_timeout") o.collective_timeout = Millis(v.cast<double>(), "collective_timeout");
    else if (key == "membership_timeout") o.membership_timeout = Millis(v.cast<double>(), "membership_timeout");
    else if (key == "max_cached_contexts") o.max_cached_contexts = v.cast<size_t>();
    else if (key == "agreement_interval") o.agreement_interval = v.cast<uint32_t>();
    else if (key == "run_id") o.run_id = v.cast<std::string>();
    else if (key == "key_ttl") o.key_ttl = Millis(v.cast<double>(), "key_ttl");
    else if (key == "store") {
      if (!v.is_none()) o.rendezvous_store = std::make_shared<PyStore>(py::reinterpret_borrow<py::object>(v));
    }
    else throw py::type_error("straggler.PartialAllReduce: unknown option '" + key + "'");
  }
  return o;
}

}  // namespace

PYBIND11_MODULE(_straggler, m) {
  m.doc() = "stragglerd client library and Gloo partial all-reduce (see the straggler package)";

  py::register_exception<straggler::CollectiveError>(m, "CollectiveError", PyExc_RuntimeError);
  BindTopology(m);

  py::class_<straggler::ExcludedRankInfo>(m, "ExcludedRank")
      .def_readonly("rank", &straggler::ExcludedRankInfo::rank)
      .def_readonly("reason", &straggler::ExcludedRankInfo::reason)
      .def_readonly("detail", &straggler::ExcludedRankInfo::detail)
      .def("__repr__", [](const straggler::ExcludedRankInfo& e) {
        return "ExcludedRank(rank=" + std::to_string(e.rank) + ", reason='" + e.reason + "')";
      });

  py::class_<straggler::MembershipView>(m, "Membership")
      .def_readonly("ok", &straggler::MembershipView::ok)
      .def_readonly("version", &straggler::MembershipView::version)
      .def_readonly("effective_iteration", &straggler::MembershipView::effective_iteration)
      .def_readonly("world_size", &straggler::MembershipView::world_size)
      .def_readonly("lead_iterations", &straggler::MembershipView::lead_iterations)
      .def_readonly("incarnation", &straggler::MembershipView::incarnation)
      .def_readonly("excluded", &straggler::MembershipView::excluded)
      .def("is_excluded", &straggler::MembershipView::IsExcluded, py::arg("rank"))
      .def_property_readonly("active_ranks", &straggler::MembershipView::ActiveRanks)
      .def("__repr__", [](const straggler::MembershipView& v) {
        std::string ex;
        for (const auto& e : v.excluded) ex += (ex.empty() ? "" : ",") + std::to_string(e.rank);
        return "Membership(version=" + std::to_string(v.version) + ", effective_iteration=" +
               std::to_string(v.effective_iteration) + ", excluded=[" + ex + "], ok=" +
               (v.ok ? "True" : "False") + ")";
      });

  py::class_<straggler::ClientStats>(m, "ClientStats")
      .def_readonly("enqueued", &straggler::ClientStats::enqueued)
      .def_readonly("dropped", &straggler::ClientStats::dropped)
      .def_readonly("report_wakes", &straggler::ClientStats::report_wakes,
                    "report() calls that woke the client's sleeping sender thread")
      .def_readonly("sent", &straggler::ClientStats::sent)
      .def_readonly("acked", &straggler::ClientStats::acked)
      .def_readonly("rejected", &straggler::ClientStats::rejected)
      .def_readonly("duplicates", &straggler::ClientStats::duplicates)
      .def_readonly("reconnects", &straggler::ClientStats::reconnects)
      .def_readonly("connected", &straggler::ClientStats::connected)
      .def_readonly("upstream_unavailable", &straggler::ClientStats::upstream_unavailable,
                    "behind a straggler-agent whose stream to the daemon is down")
      .def_readonly("last_rejection", &straggler::ClientStats::last_rejection)
      .def("__repr__", [](const straggler::ClientStats& s) {
        const auto n = [](uint64_t v) { return std::to_string(v); };
        const auto b = [](bool v) { return std::string(v ? "True" : "False"); };
        // The daemon's message may hold quotes: Python's repr() escapes them.
        return "ClientStats(enqueued=" + n(s.enqueued) + ", dropped=" + n(s.dropped) +
               ", report_wakes=" + n(s.report_wakes) + ", sent=" + n(s.sent) +
               ", acked=" + n(s.acked) + ", rejected=" + n(s.rejected) +
               ", duplicates=" + n(s.duplicates) + ", reconnects=" + n(s.reconnects) +
               ", connected=" + b(s.connected) +
               ", upstream_unavailable=" + b(s.upstream_unavailable) + ", last_rejection=" +
               py::repr(py::str(s.last_rejection)).cast<std::string>() + ")";
      });

  py::class_<PyClient, std::shared_ptr<PyClient>>(m, "Client")
      .def(py::init([](const py::kwargs& kw) {
             return std::make_shared<PyClient>(ClientOptionsFrom(kw));
           }),
           "Client(**options): options from the environment (RANK, WORLD_SIZE, LOCAL_RANK, "
           "STRAGGLER_ENDPOINT, STRAGGLER_JOB_ID, ...), overridden by keyword arguments "
           "(endpoint, job_id, run_id, rank or ranks, world_size, local_rank, node, "
           "peer_group, replica (docs/topology.md; straggler.topology computes both), "
           "iterations_per_epoch, queue_capacity, max_batch, max_send_delay [s], "
           "tls_ca_file, tls_cert_file, tls_key_file, ...)")
      .def(
          "report",
          [](PyClient& c, uint64_t epoch, uint64_t iteration, double compute_seconds,
             std::optional<uint32_t> rank, std::optional<double> step_seconds,
             std::optional<double> collective_wait_seconds) {
            straggler::Client& client = c.Get();
            // Never blocks (a lock-free enqueue): no need to release the GIL.
            return client.Report(rank.value_or(client.FirstRank()), epoch, iteration,
                                 compute_seconds, step_seconds, collective_wait_seconds);
          },
          py::arg("epoch"), py::arg("iteration"), py::arg("compute_seconds"), py::kw_only(),
          py::arg("rank") = py::none(), py::arg("step_seconds") = py::none(),
          py::arg("collective_wait_seconds") = py::none(),
          "Enqueue one iteration's compute time; never blocks. False when dropped.")
      .def(
          "membership_for",
          [](PyClient& c, uint64_t iteration, double timeout, std::optional<uint32_t> rank) {
            const auto t = Millis(timeout, "timeout");
            straggler::Client& client = c.Get();
            py::gil_scoped_release release;
            return client.MembershipFor(iteration, t, rank);
          },
          py::arg("iteration"), py::arg("timeout") = 5.0, py::arg("rank") = py::none(),
          "The membership in force at `iteration` (switch rule); ok=False on timeout.")
      .def("readmission_after",
           [](PyClient& c, uint64_t iteration, std::optional<uint32_t> rank) {
             return c.Get().ReadmissionAfter(iteration, rank);
           },
           py::arg("iteration"), py::arg("rank") = py::none(),
           "For a rank excluded at `iteration`: the first received version that includes "
           "it again (rejoin at its effective_iteration), else None.")
      .def("current_membership", [](PyClient& c) { return c.Get().CurrentMembership(); })
      .def(
          "flush",
          [](PyClient& c, double timeout) {
            const auto t = Millis(timeout, "timeout");
            straggler::Client& client = c.Get();
            py::gil_scoped_release release;
            return client.Flush(t);
          },
          py::arg("timeout") = 5.0)
      .def("stats", [](PyClient& c) { return c.Get().Stats(); })
      .def_property_readonly("rank", [](PyClient& c) { return c.Get().FirstRank(); })
      .def_property_readonly("job_id", [](PyClient& c) { return c.Options().job_id; })
      .def_property_readonly("run_id", [](PyClient& c) { return c.Options().run_id; })
      .def_property_readonly("peer_group", [](PyClient& c) { return c.Options().peer_group; })
      .def_property_readonly("replica", [](PyClient& c) { return c.Options().replica; })
      .def("on_membership_change", &PyClient::OnMembershipChange, py::arg("callback"),
           "callback(Membership) on the client's background thread, for each new version.")
      .def("close", &PyClient::Close, "Flush (at most 1 s) and stop; later calls raise.")
      .def("__enter__", [](std::shared_ptr<PyClient> c) { return c; })
      .def("__exit__", [](PyClient& c, py::args) { c.Close(); });

  py::class_<straggler::StepPlan>(m, "StepPlan")
      .def_readonly("iteration", &straggler::StepPlan::iteration)
      .def_readonly("version", &straggler::StepPlan::version)
      .def_readonly("effective_iteration", &straggler::StepPlan::effective_iteration)
      .def_readonly("certain", &straggler::StepPlan::certain)
      .def_readonly("deferred_version", &straggler::StepPlan::deferred_version,
                    "nonzero: a newer membership this rank knew but did not apply at this "
                    "iteration (a rank of the group was not yet certain of it, or the group "
                    "has not taken this readmitted rank in yet); tried again next iteration")
      .def_readonly("participating", &straggler::StepPlan::participating)
      .def_readonly("active_ranks", &straggler::StepPlan::active_ranks)
      .def_readonly("sync_parameters", &straggler::StepPlan::sync_parameters)
      .def_readonly("root", &straggler::StepPlan::root)
      .def_readonly("rejoin_iteration", &straggler::StepPlan::rejoin_iteration,
                    "when not participating and a known version readmits this rank: the "
                    "iteration to skip to (certain there at once); else None")
      .def("__repr__", [](const straggler::StepPlan& p) {
        std::string act;
        for (uint32_t r : p.active_ranks) act += (act.empty() ? "" : ",") + std::to_string(r);
        return "StepPlan(iteration=" + std::to_string(p.iteration) + ", version=" +
               std::to_string(p.version) + ", participating=" +
               (p.participating ? "True" : "False") + ", active_ranks=[" + act +
               "], sync_parameters=" + (p.sync_parameters ? "True" : "False") + ")";
      });

  py::class_<PyPartialAllReduce>(m, "PartialAllReduce")
      .def(py::init([](std::shared_ptr<PyClient> client, const py::kwargs& kw) {
             straggler::GlooOptions o = GlooOptionsFrom(*client, kw);
             return std::make_unique<PyPartialAllReduce>(std::move(client), o);
           }),
           py::arg("client"),
           "PartialAllReduce(client, rendezvous_endpoint=..., job_id=..., rank=..., "
           "world_size=..., hostname='127.0.0.1', collective_timeout=30.0 [s], "
           "membership_timeout=5.0 [s], agreement_interval=1, max_cached_contexts=4, run_id='', "
           "store=None (a torch.distributed Store: rendezvous through it, no daemon needed), "
           "key_ttl=600.0 [s])")
      .def(
          "begin_iteration",
          [](PyPartialAllReduce& r, uint64_t iteration) {
            py::gil_scoped_release release;  // may wait for the membership and a rendezvous
            return r.Get().BeginIteration(iteration);
          },
          py::arg("iteration"))
      .def(
          "all_reduce_average",
          [](PyPartialAllReduce& r, py::handle data) {
            WritableBuffer b = Writable(data, "all_reduce_average");
            const py::ssize_t n = b.info.size;
            straggler::AllReduceResult result;
            if (b.info.format == py::format_descriptor<float>::format() && b.info.itemsize == 4) {
              std::span<float> s(static_cast<float*>(b.info.ptr), static_cast<size_t>(n));
              py::gil_scoped_release release;
              result = r.Get().AllReduceAverage(s);
            } else if (b.info.format == py::format_descriptor<double>::format() &&
                       b.info.itemsize == 8) {
              std::span<double> s(static_cast<double*>(b.info.ptr), static_cast<size_t>(n));
              py::gil_scoped_release release;
              result = r.Get().AllReduceAverage(s);
            } else {
              throw py::type_error("all_reduce_average: buffer format '" + b.info.format +
                                   "' (itemsize " + std::to_string(b.info.itemsize) +
                                   ") is neither float32 nor float64");
            }
            return ResultDict(result);
          },
          py::arg("data"),
          "Average `data` (float32/float64, C-contiguous, writable) in place among the "
          "active ranks. Returns {participated, version, active_ranks}.")
      .def(
          "sync_parameters",
          [](PyPartialAllReduce& r, py::sequence buffers) {
            std::vector<WritableBuffer> held;
            std::vector<straggler::ParameterBuffer> views;
            for (size_t i = 0; i < buffers.size(); ++i) {
              held.push_back(Writable(buffers[i], "sync_parameters[" + std::to_string(i) + "]"));
              views.push_back({held.back().info.ptr,
                               static_cast<size_t>(held.back().info.size * held.back().info.itemsize)});
            }
            py::gil_scoped_release release;
            return r.Get().SyncParameters(views);
          },
          py::arg("buffers"),
          "When the plan says sync_parameters: overwrite every buffer with the lowest "
          "active rank's (byte-wise broadcast). Returns whether it broadcast.")
      .def_property_readonly("plan", [](PyPartialAllReduce& r) { return r.Get().Plan(); });
}
