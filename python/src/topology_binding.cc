// _straggler.topology_from_layout: straggler/topology.h for the
// `straggler.topology` module (python/straggler/topology.py).
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "straggler/topology.h"

namespace py = pybind11;

void BindTopology(py::module_& m) {
  m.def(
      "topology_from_layout",
      [](uint32_t rank, uint32_t data, uint32_t pipeline, uint32_t tensor, uint32_t context,
         const std::string& order) {
        straggler::ParallelLayout layout;
        layout.data = data;
        layout.pipeline = pipeline;
        layout.tensor = tensor;
        layout.context = context;
        layout.order = order;
        std::string error;
        const auto t = straggler::TopologyFromLayout(layout, rank, &error);
        if (!t) throw py::value_error(error);
        py::dict d;
        d["peer_group"] = t->peer_group;
        d["replica"] = t->replica;
        d["stage"] = t->stage;
        d["tensor_rank"] = t->tensor_rank;
        d["context_rank"] = t->context_rank;
        return d;
      },
      py::arg("rank"), py::arg("data"), py::arg("pipeline"), py::arg("tensor"),
      py::arg("context") = 1, py::arg("order") = "tp-cp-ep-dp-pp",
      "The topology of `rank` in a Megatron-style layout (straggler/topology.h): a dict of "
      "peer_group, replica, stage, tensor_rank, context_rank. ValueError names a bad value.");
}
