#pragma once
// Every collective entry point of kvmap, each as one call on small arrays: what the fault
// tests drive through a failure on one rank before the agreement (plan), after it
// (execute), and in an allocation.
#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <vector>

#include "kvmap/kvmap.hpp"
#include "tensor_blocks.hpp"

namespace kvmap_test {

struct EntryPoint {
  const char* name;  // the fault site
  bool allocates;    // allocates DistView memory on rank `victim` (see entry_points)
  std::function<void()> call;
};

// x, y: (4P+2) x 3 float64, split 0, balanced. `victim` is the rank the tests make fail:
// gather collects onto it, so it is the rank that allocates the gathered array.
template <class M>
std::vector<EntryPoint> entry_points(const kvmap::DistView<M>& x, kvmap::DistView<M>& y,
                                     int victim) {
  using V = kvmap::DistView<M>;
  using kvmap::DType;
  const int P = x.comm().size(), me = x.comm().rank();
  // On the memory space's own device (from_global and scatter accept no other).
  const at::Device device = kvmap::Detail::torch_device(kvmap::Impl::device_of<M>());
  const at::Tensor full =
      at::arange(20, at::TensorOptions().dtype(at::kFloat).device(device)).reshape({5, 4});
  return {
      {"DistView::empty", true,
       [] {
         V::empty({6, 2}, DType::Float32, 0);
       }},
      {"DistView::zeros", true,
       [] {
         V::zeros({6, 2}, DType::Float32, 0);
       }},
      {"DistView::full", true,
       [] {
         V::full({6, 2}, 1.5, DType::Float64, 0);
       }},
      {"DistView::arange", true, [] { V::arange(9, DType::Int64, 0); }},
      {"DistView::from_local", false,
       [device] {
         V::from_local(at::zeros({2, 3}, at::TensorOptions().device(device)), 0);
       }},
      {"DistView::from_global", true, [full] { V::from_global(full, 0); }},
      {"DistView::scatter", true, [full, me] { V::scatter(me == 0 ? full : at::Tensor(), 0); }},
      {"DistView::redistribute", true,
       [&x, P] { x.redistribute(kvmap::Layout::balanced(x.gshape(), 1, P)); }},
      {"DistView::resplit", true, [&x] { x.resplit(1); }},
      {"DistView::balance", true, [&x] { x.balance(); }},
      {"DistView::gather", true, [&x, victim] { x.gather(victim); }},
      {"DistView::allgather", true, [&x] { x.allgather(); }},
      {"random::uniform", true, [] { kvmap::random::uniform<M>({8}, DType::Float32, 0); }},
      {"random::normal", true, [] { kvmap::random::normal<M>({8}, DType::Float64, 0); }},
      {"manual_seed", false, [] { kvmap::manual_seed(3); }},
      {"linalg::dot", false, [&x, &y] { kvmap::linalg::dot(x, y); }},
      {"linalg::nrm2", false, [&x] { kvmap::linalg::nrm2(x); }},
      {"linalg::axpby", false, [&x, &y] { kvmap::linalg::axpby(1.0, x, 0.0, y); }},
      // Chunked, so the outputs are kvmap allocations.
      {"vmap", true,
       [&x] {
         kvmap::vmap([](const at::Tensor& v) { return v * 2; },
                     kvmap::VmapOptions().chunk_size(2))(x);
       }},
  };
}

}  // namespace kvmap_test
