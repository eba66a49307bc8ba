// The PartialAllReduce bindings of _straggler: one Python class over the Gloo
// backend (CPU buffers: numpy arrays, CPU torch tensors) and the NCCL backend
// (CUDA torch tensors, reduced in place on the caller's current CUDA stream;
// host buffers are staged through the device).
//
//   reducer = straggler.PartialAllReduce(client, backend="nccl", device=local_rank)
//   reducer.all_reduce_average(cuda_tensor)   # on torch.cuda.current_stream()
//
// CUDA tensors are taken by data_ptr() and the stream by its handle
// (torch.cuda.current_stream(device).cuda_stream, asked through Python): the
// module does not link torch's C++ libraries. `backend="nccl"` in a module
// built without NCCL, or where no GPU is visible, raises RuntimeError naming
// the reason; it never falls back to Gloo.
//
// GIL: released around every call that can wait. Thread safety: one thread
// at a time per reducer, as the C++ class.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "module_internal.h"
#include "straggler/collective.h"
#include "straggler/collective_gloo.h"
#ifdef STRAGGLER_WITH_NCCL
#include "straggler/collective_nccl.h"
#endif

namespace straggler_py __attribute__((visibility("hidden"))) {
namespace {

// The backends this module was built with, for errors and straggler.backends().
std::vector<std::string> Backends() {
#ifdef STRAGGLER_WITH_NCCL
  return {"gloo", "nccl"};
#else
  return {"gloo"};
#endif
}

class PyPartialAllReduce {
 public:
  PyPartialAllReduce(std::shared_ptr<PyClient> client, std::unique_ptr<straggler::PartialAllReduce> reducer,
                     void* nccl, int device)
      : client_(std::move(client)), slot_(std::make_shared<PyClient::ReducerSlot>()), nccl_(nccl), device_(device) {
    slot_->reducer = std::move(reducer);
    client_->Attach(slot_);
  }
  ~PyPartialAllReduce() {
    py::gil_scoped_release release;  // closing Gloo pairs may wait on sockets, NCCL finalizes
    slot_->reducer.reset();
  }
  straggler::PartialAllReduce& Get() {
    if (!slot_->reducer) {
      throw std::runtime_error("straggler.PartialAllReduce: its Client was closed");
    }
    return *slot_->reducer;
  }
  bool IsNccl() const { return nccl_ != nullptr; }
  // A data-parallel group's reducer: the job's switch it follows, which other
  // groups of the process share (switch_from=). Weak: the group reducers in
  // the client's slots own it, so closing the client releases it with them.
  std::weak_ptr<straggler::JobSwitch> job_switch;
  int device() const { return device_; }
  // The stream of the next collectives (NCCL only; nullptr: the backend's own).
  void SetStream(void* stream) {
#ifdef STRAGGLER_WITH_NCCL
    Get();  // closed?
    if (nccl_ != nullptr) static_cast<straggler::NcclPartialAllReduce*>(nccl_)->SetStream(stream);
#else
    (void)stream;
#endif
  }

 private:
  std::shared_ptr<PyClient> client_;
  std::shared_ptr<PyClient::ReducerSlot> slot_;
  void* nccl_;  // the NCCL reducer in slot_ (owned there), or nullptr for Gloo
  int device_;
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


// A CUDA torch tensor, seen through its Python attributes only.
struct CudaTensor {
  void* ptr = nullptr;
  size_t count = 0;
  size_t itemsize = 0;
  std::string dtype;  // "torch.float32", ...
  int device = 0;
};

bool IsCudaTensor(py::handle obj) {
  return py::hasattr(obj, "is_cuda") && py::hasattr(obj, "data_ptr") && obj.attr("is_cuda").cast<bool>();
}

CudaTensor CudaTensorOf(py::handle obj, const std::string& what) {
  if (!obj.attr("is_contiguous")().cast<bool>()) {
    throw py::value_error(what + ": the CUDA tensor is not contiguous; it cannot be reduced in place");
  }
  CudaTensor t;
  t.ptr = reinterpret_cast<void*>(obj.attr("data_ptr")().cast<uintptr_t>());
  t.count = obj.attr("numel")().cast<size_t>();
  t.itemsize = obj.attr("element_size")().cast<size_t>();
  t.dtype = py::str(obj.attr("dtype"));
  t.device = obj.attr("device").attr("index").cast<int>();
  return t;
}

// The stream the collectives of `r` run on for this call: `stream` when
// given (a cudaStream_t as an int), else torch's current stream of the
// tensor's device, else (host buffers) the backend's own.
void ChooseStream(PyPartialAllReduce& r, const std::optional<uintptr_t>& stream, std::optional<int> tensor_device) {
  if (!r.IsNccl()) {
    if (stream) throw py::type_error("stream= is for backend='nccl'; the Gloo backend has no CUDA stream");
    return;
  }
  if (stream) {
    r.SetStream(reinterpret_cast<void*>(*stream));
  } else if (tensor_device) {
    py::object current = py::module_::import("torch").attr("cuda").attr("current_stream")(*tensor_device);
    r.SetStream(reinterpret_cast<void*>(current.attr("cuda_stream").cast<uintptr_t>()));
  } else {
    r.SetStream(nullptr);
  }
}

void RequireDevice(PyPartialAllReduce& r, const CudaTensor& t, const std::string& what) {
  if (!r.IsNccl()) {
    throw py::value_error(what + ": tensor is on device 'cuda:" + std::to_string(t.device) +
                          "'; the Gloo backend reduces CPU tensors only (backend='nccl' reduces CUDA tensors)");
  }
  if (t.device != r.device()) {
    throw py::value_error(what + ": tensor is on cuda:" + std::to_string(t.device) + " but this reducer's device is cuda:" +
                          std::to_string(r.device()));
  }
}

// The CollectiveOptions part both backends share: defaults from the client
// (the same daemon, job, run, rank and world size; a client that reports
// through the node's agent (unix://) must name the daemon for the rendezvous,
// which only stragglerd serves: RendezvousEndpointFor) ...
void FillCommonOptions(const straggler::ClientOptions& c, straggler::CollectiveOptions& o) {
  o.rendezvous_endpoint = straggler::RendezvousEndpointFor(c);
  o.job_id = c.job_id;
  o.run_id = c.run_id;  // each launch its own rendezvous keys (docs/runs.md)
  if (!c.ranks.empty()) o.rank = c.ranks.front();
  o.world_size = c.world_size;
}

// ... and its keyword arguments: false for a key that is not one of them.
bool SetCommonOption(straggler::CollectiveOptions& o, const std::string& key, py::handle v) {
  if (key == "rendezvous_endpoint") o.rendezvous_endpoint = v.cast<std::string>();
  else if (key == "job_id") o.job_id = v.cast<std::string>();
  else if (key == "rank") o.rank = v.cast<uint32_t>();
  else if (key == "world_size") o.world_size = v.cast<uint32_t>();
  else if (key == "collective_timeout") o.collective_timeout = Millis(v.cast<double>(), "collective_timeout");
  else if (key == "membership_timeout") o.membership_timeout = Millis(v.cast<double>(), "membership_timeout");
  else if (key == "agreement_interval") o.agreement_interval = v.cast<uint32_t>();
  else if (key == "run_id") o.run_id = v.cast<std::string>();
  else if (key == "key_ttl") o.key_ttl = Millis(v.cast<double>(), "key_ttl");
  else return false;
  return true;
}

// A torch.distributed.Store keyword (store=) as the backend's rendezvous store.
std::shared_ptr<PyStore> StoreOption(py::handle v) {
  if (v.is_none()) return nullptr;
  return std::make_shared<PyStore>(py::reinterpret_borrow<py::object>(v));
}

// A backend's options: the client's defaults, then the keywords, each one of
// CollectiveOptions', store=, or the backend's own (`own` returns false for a
// key it does not know: an unknown option).
template <class Options, class Own>
Options OptionsFrom(PyClient& client, const py::kwargs& kw, Own own) {
  Options o;
  FillCommonOptions(client.Options(), o);
  for (auto item : kw) {
    const std::string key = py::str(item.first);
    py::handle v = item.second;
    if (SetCommonOption(o, key, v)) continue;
    if (key == "store") { if (auto st = StoreOption(v)) o.rendezvous_store = st; }
    else if (!own(o, key, v)) throw py::type_error("straggler.PartialAllReduce: unknown option '" + key + "'");
  }
  return o;
}

straggler::GlooOptions GlooOptionsFrom(PyClient& client, const py::kwargs& kw) {
  return OptionsFrom<straggler::GlooOptions>(
      client, kw, [](straggler::GlooOptions& o, const std::string& key, py::handle v) {
        if (key == "hostname") o.hostname = v.cast<std::string>();
        else if (key == "max_cached_contexts") o.max_cached_contexts = v.cast<size_t>();
        else return false;
        return true;
      });
}

#ifdef STRAGGLER_WITH_NCCL
straggler::NcclOptions NcclOptionsFrom(PyClient& client, const py::kwargs& kw) {
  return OptionsFrom<straggler::NcclOptions>(
      client, kw, [](straggler::NcclOptions& o, const std::string& key, py::handle v) {
        if (key == "device") o.device = v.cast<int>();
        else if (key == "max_cached_communicators") o.max_cached_communicators = v.cast<size_t>();
        else if (key == "hostname" || key == "max_cached_contexts")
          throw py::type_error("straggler.PartialAllReduce: option '" + key + "' is for backend='gloo'");
        else return false;
        return true;
      });
}
#endif

// The keywords of a data-parallel group of a hybrid job (docs/hybrid.md).
struct GroupKeywords {
  std::optional<straggler::DataParallelGroup> group;
  std::vector<uint32_t> replica_of;
  PyPartialAllReduce* switch_from = nullptr;
};

// Takes the group keywords out of `kw` (the rest are the backend's options).
GroupKeywords TakeGroupKeywords(py::kwargs& kw) {
  GroupKeywords g;
  auto take = [&](const char* key) -> py::object {
    if (!kw.contains(key)) return py::none();
    py::object v = kw[key];
    PyDict_DelItemString(kw.ptr(), key);
    return v;
  };
  py::object ranks = take("group_ranks"), replicas = take("group_replicas"), name = take("group_name");
  py::object replica_of = take("replica_of"), from = take("switch_from");
  if (ranks.is_none()) {
    if (!replicas.is_none() || !name.is_none() || !replica_of.is_none() || !from.is_none()) {
      throw py::type_error("straggler.PartialAllReduce: group_replicas, group_name, replica_of and "
                           "switch_from are for a data-parallel group: pass group_ranks too");
    }
    return g;
  }
  straggler::DataParallelGroup group;
  group.ranks = ranks.cast<std::vector<uint32_t>>();
  group.replicas = replicas.is_none() ? group.ranks : replicas.cast<std::vector<uint32_t>>();
  group.name = name.is_none() ? "dp" : name.cast<std::string>();
  g.group = std::move(group);
  if (!replica_of.is_none()) g.replica_of = replica_of.cast<std::vector<uint32_t>>();
  if (!from.is_none()) {
    g.switch_from = from.cast<PyPartialAllReduce*>();
    if (!replica_of.is_none()) {
      throw py::type_error("straggler.PartialAllReduce: replica_of is the shared switch's (switch_from=); "
                           "pass it to the first group only");
    }
  }
  return g;
}

// A group's switch: switch_from's, or a new one over a job-wide reducer of
// the same backend and options (`make_job`).
template <class MakeJob>
std::shared_ptr<straggler::JobSwitch> SwitchFor(const GroupKeywords& g, uint32_t world_size, MakeJob make_job) {
  if (g.switch_from != nullptr) {
    auto sw = g.switch_from->job_switch.lock();
    if (!sw) {
      throw py::value_error("straggler.PartialAllReduce: switch_from= is not a data-parallel group's reducer "
                            "(or its client was closed)");
    }
    return sw;
  }
  std::string error;
  auto sw = straggler::JobSwitch::Create(make_job(), g.replica_of, world_size, &error);
  if (!sw) throw py::value_error("straggler.PartialAllReduce: " + error);
  return sw;
}

std::unique_ptr<PyPartialAllReduce> MakeReducer(std::shared_ptr<PyClient> client, const std::string& backend,
                                                py::kwargs kw) {
  const GroupKeywords g = TakeGroupKeywords(kw);
  if (backend == "gloo") {
    for (const char* nccl_only : {"device", "max_cached_communicators"}) {
      if (kw.contains(nccl_only)) {
        throw py::type_error(std::string("straggler.PartialAllReduce: option '") + nccl_only +
                             "' is for backend='nccl'");
      }
    }
    straggler::GlooOptions o = GlooOptionsFrom(*client, kw);
    std::string error;
    if (g.group) {
      // (Gloo builds nothing at creation: no wait, the GIL may stay held.)
      std::shared_ptr<straggler::JobSwitch> sw = SwitchFor(g, o.world_size, [&] {
        auto job = straggler::CreateGlooPartialAllReduce(client->Get(), o, &error);
        if (!job) throw py::value_error("straggler.PartialAllReduce: " + error);
        return job;
      });
      auto r = straggler::CreateGlooGroupPartialAllReduce(client->Get(), sw, *g.group, o, &error);
      if (!r) throw py::value_error("straggler.PartialAllReduce: " + error);
      auto py = std::make_unique<PyPartialAllReduce>(std::move(client), std::move(r), nullptr, -1);
      py->job_switch = sw;
      return py;
    }
    auto r = straggler::CreateGlooPartialAllReduce(client->Get(), o, &error);
    if (!r) throw py::value_error("straggler.PartialAllReduce: " + error);
    return std::make_unique<PyPartialAllReduce>(std::move(client), std::move(r), nullptr, -1);
  }
  if (backend != "nccl") {
    throw py::value_error("straggler.PartialAllReduce: backend='" + backend + "' is neither 'gloo' nor 'nccl'");
  }
#ifndef STRAGGLER_WITH_NCCL
  throw std::runtime_error(
      "straggler.PartialAllReduce(backend='nccl'): this straggler module was built without the NCCL "
      "backend (CUDA or NCCL >= 2.27 was not found when it was built; see docs/gpu.md). It does not "
      "fall back to Gloo: pass backend='gloo' for CPU tensors");
#else
  straggler::NcclOptions o = NcclOptionsFrom(*client, kw);
  // Argument errors first (ValueError), then whether a GPU is there (RuntimeError).
  if (std::string why = o.Validate(); !why.empty()) throw py::value_error("straggler.PartialAllReduce: " + why);
  std::string why;
  if (straggler::NcclVisibleDevices(&why) == 0) {
    throw std::runtime_error("straggler.PartialAllReduce(backend='nccl'): no CUDA device is visible to this "
                             "process (" + why + "). It does not fall back to Gloo: pass backend='gloo' "
                             "for CPU tensors");
  }
  std::unique_ptr<straggler::NcclPartialAllReduce> r;
  std::shared_ptr<straggler::JobSwitch> sw;
  std::string error;
  {
    py::gil_scoped_release release;  // builds the full communicator: waits for every rank
    if (g.group) {
      // The job's switch on NCCL too (its own world communicator), the group
      // on a communicator of the group's ranks.
      sw = SwitchFor(g, o.world_size, [&]() -> std::unique_ptr<straggler::PartialAllReduce> {
        auto job = straggler::CreateNcclPartialAllReduce(client->Get(), o, &error);
        if (!job) throw straggler::CollectiveError("straggler.PartialAllReduce(backend='nccl'): " + error);
        return job;
      });
      r = straggler::CreateNcclGroupPartialAllReduce(client->Get(), sw, *g.group, o, &error);
    } else {
      r = straggler::CreateNcclPartialAllReduce(client->Get(), o, &error);
    }
  }
  if (!r) throw straggler::CollectiveError("straggler.PartialAllReduce(backend='nccl'): " + error);
  const int device = r->Device();  // -1 resolved to the device current at creation
  straggler::NcclPartialAllReduce* raw = r.get();
  auto py = std::make_unique<PyPartialAllReduce>(std::move(client), std::move(r), raw, device);
  py->job_switch = sw;
  return py;
#endif
}

}  // namespace

void BindReducers(py::module_& m) {
  m.def("backends", &Backends, "The PartialAllReduce backends this module was built with.");
#ifdef STRAGGLER_WITH_NCCL
  m.def("nccl_runtime", &straggler::NcclRuntimeDescription,
        "The libnccl loaded in this process and which membership calls it allows (revoke, grow).");
#endif

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
      .def(py::init([](std::shared_ptr<PyClient> client, const std::string& backend, py::kwargs kw) {
             return MakeReducer(std::move(client), backend, std::move(kw));
           }),
           py::arg("client"), py::arg("backend") = "gloo",
           "PartialAllReduce(client, backend='gloo', rendezvous_endpoint=..., job_id=..., rank=..., "
           "world_size=..., collective_timeout=30.0 [s], membership_timeout=5.0 [s], "
           "agreement_interval=1, run_id='', store=None (a torch.distributed Store: rendezvous "
           "through it, no daemon needed), key_ttl=600.0 [s]; Gloo: hostname='127.0.0.1', "
           "max_cached_contexts=4; NCCL: device=-1 (the current CUDA device; pass LOCAL_RANK), "
           "max_cached_communicators=3. A data-parallel group of a hybrid job (docs/hybrid.md): "
           "group_ranks=[global ranks], group_replicas=[their replicas], group_name='stage0', and "
           "either replica_of=[replica of every rank] (the first group of the process: builds the "
           "job's switch) or switch_from=<that group's reducer> (the process's other groups))")
      .def(
          "begin_iteration",
          [](PyPartialAllReduce& r, uint64_t iteration) {
            straggler::PartialAllReduce& reducer = r.Get();
            py::gil_scoped_release release;  // may wait for the membership and a rendezvous
            return reducer.BeginIteration(iteration);
          },
          py::arg("iteration"))
      .def(
          "all_reduce_average",
          [](PyPartialAllReduce& r, py::handle data, std::optional<uintptr_t> stream) {
            straggler::AllReduceResult result;
            if (IsCudaTensor(data)) {
              const CudaTensor t = CudaTensorOf(data, "all_reduce_average");
              RequireDevice(r, t, "all_reduce_average");
              ChooseStream(r, stream, t.device);
              straggler::PartialAllReduce& reducer = r.Get();
              if (t.dtype == "torch.float32") {
                std::span<float> s(static_cast<float*>(t.ptr), t.count);
                py::gil_scoped_release release;
                result = reducer.AllReduceAverage(s);
              } else if (t.dtype == "torch.float64") {
                std::span<double> s(static_cast<double*>(t.ptr), t.count);
                py::gil_scoped_release release;
                result = reducer.AllReduceAverage(s);
              } else {
                throw py::type_error("all_reduce_average: CUDA tensor of " + t.dtype +
                                     " is neither torch.float32 nor torch.float64");
              }
              return ResultDict(result);
            }
            WritableBuffer b = Writable(data, "all_reduce_average");
            ChooseStream(r, stream, std::nullopt);
            straggler::PartialAllReduce& reducer = r.Get();
            const py::ssize_t n = b.info.size;
            if (b.info.format == py::format_descriptor<float>::format() && b.info.itemsize == 4) {
              std::span<float> s(static_cast<float*>(b.info.ptr), static_cast<size_t>(n));
              py::gil_scoped_release release;
              result = reducer.AllReduceAverage(s);
            } else if (b.info.format == py::format_descriptor<double>::format() &&
                       b.info.itemsize == 8) {
              std::span<double> s(static_cast<double*>(b.info.ptr), static_cast<size_t>(n));
              py::gil_scoped_release release;
              result = reducer.AllReduceAverage(s);
            } else {
              throw py::type_error("all_reduce_average: buffer format '" + b.info.format +
                                   "' (itemsize " + std::to_string(b.info.itemsize) +
                                   ") is neither float32 nor float64");
            }
            return ResultDict(result);
          },
          py::arg("data"), py::kw_only(), py::arg("stream") = py::none(),
          "Average `data` in place among the active ranks: float32/float64, contiguous - a "
          "numpy array or CPU tensor (Gloo; NCCL stages it through the device) or a CUDA tensor "
          "(NCCL, on `stream`: a cudaStream_t as an int, default torch's current stream of "
          "the tensor's device). Returns {participated, version, active_ranks}.")
      .def(
          "sync_parameters",
          [](PyPartialAllReduce& r, py::sequence buffers, std::optional<uintptr_t> stream) {
            std::vector<WritableBuffer> held;
            std::vector<straggler::ParameterBuffer> views;
            std::optional<int> cuda_device;
            for (size_t i = 0; i < buffers.size(); ++i) {
              const std::string what = "sync_parameters[" + std::to_string(i) + "]";
              if (IsCudaTensor(buffers[i])) {
                const CudaTensor t = CudaTensorOf(buffers[i], what);
                RequireDevice(r, t, what);
                cuda_device = t.device;
                views.push_back({t.ptr, t.count * t.itemsize});
                continue;
              }
              held.push_back(Writable(buffers[i], what));
              views.push_back({held.back().info.ptr,
                               static_cast<size_t>(held.back().info.size * held.back().info.itemsize)});
            }
            ChooseStream(r, stream, cuda_device);
            straggler::PartialAllReduce& reducer = r.Get();
            py::gil_scoped_release release;
            return reducer.SyncParameters(views);
          },
          py::arg("buffers"), py::kw_only(), py::arg("stream") = py::none(),
          "When the plan says sync_parameters: overwrite every buffer (host buffers, or CUDA "
          "tensors with backend='nccl') with the lowest active rank's (byte-wise broadcast). "
          "Returns whether it broadcast.")
      .def_property_readonly("backend", [](PyPartialAllReduce& r) { return r.IsNccl() ? "nccl" : "gloo"; })
      .def_property_readonly("device", [](PyPartialAllReduce& r) -> std::optional<int> {
        if (!r.IsNccl()) return std::nullopt;
        return r.device();
      })
      .def_property_readonly("plan", [](PyPartialAllReduce& r) { return r.Get().Plan(); });
}

}  // namespace straggler_py
