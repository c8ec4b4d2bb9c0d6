// Python module torch_ridge._C: the ProcessGroupRidge class, a subclass of torch's own
// ProcessGroup (Backend on torch 2.x) type, so that torch.distributed can hold and call it.
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

#include "process_group_ridge.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "Ridge collectives as a torch.distributed backend";
  // The base class must be registered with pybind11 before the subclass refers to it.
  py::module::import("torch.distributed");

  py::class_<torch_ridge::ProcessGroupRidge, torch_ridge::RidgeBase,
             c10::intrusive_ptr<torch_ridge::ProcessGroupRidge>>(m, "ProcessGroupRidge")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout) {
             return c10::make_intrusive<torch_ridge::ProcessGroupRidge>(store, rank, size, timeout);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           // Creation waits for the other ranks: other Python threads keep running.
           py::call_guard<py::gil_scoped_release>());

  m.def("ridge_version", [] {
    int v = 0;
    ridgeGetVersion(&v);
    return v;
  });
  m.attr("torch_api") = TORCH_VERSION_MAJOR >= 2 ? "Backend" : "ProcessGroup";
#ifdef RIDGE_TORCH_CUDA
  m.attr("cuda") = true;
#else
  m.attr("cuda") = false;
#endif
}
