// _straggler: the pybind11 extension behind the `straggler` Python package
// (python/straggler/). It wraps straggler::Client and PartialAllReduce for
// Python trainers - Gloo for CPU buffers, NCCL for CUDA tensors (bound in
// reducers.cc) - and the package adds the PyTorch DDP communication hook on
// top (straggler/torch.py).
//
//   import straggler
//   client = straggler.Client(job_id="j", rank=0, world_size=4)   # the rest from env
//   reducer = straggler.PartialAllReduce(client)
//   plan = reducer.begin_iteration(it)
//   reducer.all_reduce_average(numpy_or_torch_buffer)   # in place, no copy
//   # backend="nccl", device=LOCAL_RANK: CUDA tensors, on torch's current stream
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
#include <optional>
#include <string>
#include <vector>

#include "module_internal.h"

using namespace straggler_py;  // NOLINT: the module's own helpers

void BindTopology(py::module_& m);  // topology_binding.cc

namespace {

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
    else if (key == "gpu_model") o.gpu_model = v.cast<std::string>();
    else if (key == "iterations_per_epoch") o.iterations_per_epoch = v.cast<uint64_t>();
    else if (key == "monitor_only") o.monitor_only = v.cast<bool>();
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

}  // namespace

PYBIND11_MODULE(_straggler, m) {
  m.doc() = "stragglerd client library and partial all-reduce over Gloo or NCCL (see the straggler package)";

  py::register_exception<straggler::CollectiveError>(m, "CollectiveError", PyExc_RuntimeError);
  BindTopology(m);

  py::class_<straggler::ExcludedRankInfo>(m, "ExcludedRank")
      .def_readonly("rank", &straggler::ExcludedRankInfo::rank)
      .def_readonly("reason", &straggler::ExcludedRankInfo::reason)
      .def_readonly("detail", &straggler::ExcludedRankInfo::detail)
      // Hybrid jobs (docs/hybrid.md): the rank that took the replica out,
      // its peer group, the replica; None / "" in a pure data-parallel job.
      .def_readonly("culprit", &straggler::ExcludedRankInfo::culprit)
      .def_readonly("culprit_group", &straggler::ExcludedRankInfo::culprit_group)
      .def_readonly("replica", &straggler::ExcludedRankInfo::replica)
      .def("__repr__", [](const straggler::ExcludedRankInfo& e) {
        std::string r = "ExcludedRank(rank=" + std::to_string(e.rank) + ", reason='" + e.reason + "'";
        if (e.replica) r += ", replica=" + std::to_string(*e.replica);
        if (e.culprit) r += ", culprit=" + std::to_string(*e.culprit);
        return r + ")";
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
           "gpu_model (STRAGGLER_GPU_MODEL; default: torch.cuda.get_device_name() when torch "
           "is imported and CUDA is available), "
           "iterations_per_epoch, monitor_only (this trainer does not act on membership: "
           "never excluded, shown 'monitoring only'; cleared by the first membership_for), "
           "queue_capacity, max_batch, max_send_delay [s], "
           "tls_ca_file, tls_cert_file, tls_key_file, ...)")
      .def(
          "report",
          [](PyClient& c, uint64_t epoch, uint64_t iteration, double compute_seconds,
             std::optional<uint32_t> rank, std::optional<double> step_seconds,
             std::optional<double> collective_wait_seconds, std::optional<double> work,
             std::optional<double> input_wait_seconds, std::optional<double> optimizer_seconds) {
            straggler::Client& client = c.Get();
            const uint32_t r = rank.value_or(client.FirstRank());
            // Never blocks (a lock-free enqueue): no need to release the GIL.
            if (!work && !input_wait_seconds && !optimizer_seconds)
              return client.Report(r, epoch, iteration, compute_seconds, step_seconds,
                                   collective_wait_seconds);
            return client.Report(r, epoch, iteration, compute_seconds,
                                 straggler::StepDetails{step_seconds, collective_wait_seconds,
                                                        input_wait_seconds, optimizer_seconds,
                                                        work});
          },
          py::arg("epoch"), py::arg("iteration"), py::arg("compute_seconds"), py::kw_only(),
          py::arg("rank") = py::none(), py::arg("step_seconds") = py::none(),
          py::arg("collective_wait_seconds") = py::none(), py::arg("work") = py::none(),
          py::arg("input_wait_seconds") = py::none(), py::arg("optimizer_seconds") = py::none(),
          "Enqueue one iteration's compute time; never blocks. False when dropped. "
          "Optional: step_seconds, collective_wait_seconds, work (> 0, the job's unit: tokens, "
          "samples, ...), input_wait_seconds (blocked on the data loader and the copy to the "
          "device), optimizer_seconds; none of them is part of compute_seconds "
          "(docs/python.md). The daemon refuses a bad value, naming it: "
          "stats().last_rejection.")
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
      .def_property_readonly("gpu_model", [](PyClient& c) { return c.Options().gpu_model; })
      .def("on_membership_change", &PyClient::OnMembershipChange, py::arg("callback"),
           "callback(Membership) on the client's background thread, for each new version.")
      .def("close", &PyClient::Close, "Flush (at most 1 s) and stop; later calls raise.")
      .def("__enter__", [](std::shared_ptr<PyClient> c) { return c; })
      .def("__exit__", [](PyClient& c, py::args) { c.Close(); });

  BindReducers(m);
}
