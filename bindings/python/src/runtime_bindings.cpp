// kvmap's start and end in a Python process, versions, statistics, and check_close.
#include <ATen/ATen.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "dist_views.hpp"
#include "kvmap/host_allocator.hpp"
#include "mpi_process.hpp"
#include "runtime_start.hpp"

namespace kvmap::python {

// MPI and Kokkos start and end, versions, statistics.
void bind_runtime(py::module_& m) {
  m.def("_initialize", [] {
    if (!kvmap::Detail::mpi_initialized())
      throw kvmap::Error("kvmap: MPI is not initialized (import mpi4py.MPI first)");
    // `import kvmap` prints nothing: Kokkos' warnings (e.g. OpenMP's about OMP_PROC_BIND)
    // are off unless the user asked for them through KOKKOS_DISABLE_WARNINGS (or, in the
    // application, through Kokkos' own command line).
    std::vector<std::string> args{"kvmap"};
    if (!std::getenv("KOKKOS_DISABLE_WARNINGS")) args.emplace_back("--kokkos-disable-warnings");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int argc = static_cast<int>(args.size());
    char** argv_data = argv.data();
    kvmap::Detail::start_kokkos(argc, argv_data);
  });
  // The MPI library kvmap was linked with, as the running MPI names itself: compared with
  // mpi4py's at import (two MPI libraries in one process cannot share a communicator).
  m.def("_mpi_library_version", [] { return kvmap::Detail::mpi_library_version(); });
  m.def("_finalize", [] { kvmap::Detail::end_process_use(/*finalize_kokkos=*/true); });
  m.def("version", [] { return std::string(kvmap::version()); });
  m.def("build_info", [] { return std::string(kvmap::build_info()); });

  m.def("_stats", [] {
    const auto s = kvmap::stats();
    py::dict d;
    d["bytes_copied"] = s.bytes_copied;
    d["vmap_calls"] = s.vmap_calls;
    d["chunks_run"] = s.chunks_run;
    d["collectives"] = s.collectives;
    d["bytes_received"] = s.bytes_received;
    d["plans_built"] = s.plans_built;
    d["chunk_retries"] = s.chunk_retries;
    d["auto_chunk_size"] = s.auto_chunk_size;
    d["auto_bytes_per_sample"] = s.auto_bytes_per_sample;
    d["bytes_allocated"] = s.bytes_allocated;
    d["bytes_live"] = s.bytes_live;
    d["gpu_aware_mpi"] = s.gpu_aware_mpi;
    return d;
  });
  m.def("_reset_stats", [] { kvmap::reset_stats(); });

  // kvmap/host_allocator.hpp
  m.def(
      "install_host_allocator",
      [](std::size_t cache_bytes) {
        kvmap::HostAllocatorOptions o;
        o.cache_bytes = cache_bytes;
        kvmap::install_host_allocator(o);
      },
      py::arg("cache_bytes") = kvmap::HostAllocatorOptions{}.cache_bytes,
      "Makes kvmap's caching allocator torch's CPU allocator for every tensor allocated from "
      "now on in this process: blocks of 4 MiB and more are kept when freed, up to "
      "cache_bytes, and reused by the next tensor of about their size (no mmap, page faults and "
      "munmap per call). Also done at import with KVMAP_HOST_ALLOCATOR_MIB=<MiB>.");
  m.def(
      "uninstall_host_allocator", [] { kvmap::uninstall_host_allocator(); },
      "Gives torch's CPU allocator back and frees the kept blocks (live tensors keep theirs).");
  m.def(
      "host_allocator_usage",
      [] {
        const kvmap::HostAllocatorUsage u = kvmap::host_allocator_usage();
        py::dict d;
        d["installed"] = u.installed;
        d["reused"] = u.reused;
        d["fresh"] = u.fresh;
        d["small"] = u.small;
        d["returned"] = u.returned;
        d["bytes_kept"] = u.bytes_kept;
        d["bytes_kept_peak"] = u.bytes_kept_peak;
        d["bytes_in_use"] = u.bytes_in_use;
        return d;
      },
      "The host allocator's counters since it was installed (a dict).");
}

// (kvmap/tolerance.hpp), the check kvmap's own tests, examples and benchmarks use.
void bind_tolerance(py::module_& m) {
  py::class_<kvmap::Closeness>(m, "Closeness")
      .def_readonly("ok", &kvmap::Closeness::ok)
      .def_readonly("form", &kvmap::Closeness::form)
      .def_readonly("mismatch", &kvmap::Closeness::mismatch)
      .def_readonly("elements", &kvmap::Closeness::elements)
      .def_property_readonly("position",
                             [](const kvmap::Closeness& c) { return to_tuple(c.position); })
      .def_readonly("actual", &kvmap::Closeness::actual)
      .def_readonly("reference", &kvmap::Closeness::reference)
      .def_readonly("error", &kvmap::Closeness::error)
      .def_readonly("bound", &kvmap::Closeness::bound)
      .def_readonly("ratio", &kvmap::Closeness::ratio)
      .def_readonly("roundings", &kvmap::Closeness::roundings)
      .def("describe", &kvmap::Closeness::describe)
      .def("__bool__", [](const kvmap::Closeness& c) { return c.ok; })
      .def("__repr__",
           [](const kvmap::Closeness& c) { return "kvmap.Closeness(" + c.describe() + ")"; });
  m.def(
      "check_close",
      [](const at::Tensor& actual, const at::Tensor& reference, std::int64_t roundings,
         const py::object& magnitudes) {
        kvmap::ErrorBound bound{roundings, {}};
        if (py::isinstance<py::float_>(magnitudes) || py::isinstance<py::int_>(magnitudes)) {
          bound.magnitudes = at::full({}, magnitudes.cast<double>(), at::kDouble);
        } else if (!magnitudes.is_none()) {
          bound.magnitudes = magnitudes.cast<at::Tensor>();
        }
        return kvmap::check_close(actual, reference, bound);
      },
      py::arg("actual"), py::arg("reference"), py::kw_only(), py::arg("roundings") = 1,
      py::arg("magnitudes") = py::none(),
      "Whether `actual` is within the rounding-error bound of `reference`:\n"
      "|actual - reference| <= roundings * (u(actual) + u(reference)) * m, elementwise, with u\n"
      "the dtypes' unit roundoff and m the per-element sum of the terms' magnitudes\n"
      "(`magnitudes`, float64) or, without them, max |reference| (norm-wise). `roundings`\n"
      "counts the roundings along the longest chain making one element: k for a k-term sum or\n"
      "dot product, 1 per arithmetic operation, 4 per elementary function. Returns a Closeness\n"
      "(true when within; repr names the worst element, both values and the bound).");
}

}  // namespace kvmap::python
