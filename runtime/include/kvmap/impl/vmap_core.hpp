#pragma once
// Implementation detail of kvmap/vmap.hpp, not API: the one vmap core its templates (and
// kvmap's Python bindings) call. Installed because those templates are.
#include <ATen/core/Tensor.h>

#include <cstddef>
#include <type_traits>
#include <vector>

#include "kvmap/config.hpp"
#include "kvmap/dist_view.hpp"
#include "kvmap/impl/kokkos_compat.hpp"

KVMAP_API_BEGIN
namespace kvmap {

class VmapOptions;
class OverlapOptions;

namespace Impl {

// How the core calls f: once per chunk under functorch's vmap, f written for one sample
// (kvmap::vmap), or once per chunk on the plain batched tensors (kvmap::map_batches).
enum class Mapping { Samples, Batches };

// Calls the user function with one tensor per DistView argument, in argument order: the
// batched chunk of a mapped (split) one, the whole local shard of a replicated one. A
// reference to a callable that outlives the call (no copy, no allocation: this is made on
// every vmap call); made from lvalues only.
class ArgsCall {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, ArgsCall>>>
  ArgsCall(F& f)  // NOLINT(google-explicit-constructor): a reference wrapper
      : object_(static_cast<void*>(&f)),
        call_([](void* o, const std::vector<at::Tensor>& a) -> std::vector<at::Tensor> {
          return (*static_cast<F*>(o))(a);
        }) {}
  std::vector<at::Tensor> operator()(const std::vector<at::Tensor>& per_array) const {
    return call_(object_, per_array);
  }

 private:
  void* object_;
  std::vector<at::Tensor> (*call_)(void*, const std::vector<at::Tensor>&);
};

// The one vmap core, compiled once per memory space, called by the C++ and Python
// front-ends of vmap and map_batches: slot mapping, communicator, agreement, chunks,
// no-aliasing rule, assembly.
// `arrays`: the `count` DistView arguments, which must stay as they are until the call
// returns (the C++ front-end points at the caller's arguments; the Python one at its own
// copies); `tensors`: the tensor arguments passed whole, which outputs must not share either.
// Returns one DistView per output of the function.
template <class M>
std::vector<DistView<M>> vmap_core(const DistView<M>* const* arrays, std::size_t count,
                                   const std::vector<at::Tensor>& tensors,
                                   const VmapOptions& options, Mapping mapping,
                                   const ArgsCall& call);
// NOLINTBEGIN(bugprone-macro-parentheses): Space is a type
#define KVMAP_EXTERN_VMAP_CORE(Space)                                             \
  extern template KVMAP_EXPORT std::vector<DistView<Space>> vmap_core<Space>(     \
      const DistView<Space>* const*, std::size_t, const std::vector<at::Tensor>&, \
      const VmapOptions&, Mapping, const ArgsCall&);
// NOLINTEND(bugprone-macro-parentheses)
KVMAP_FOR_EACH_MEMORY_SPACE(KVMAP_EXTERN_VMAP_CORE)
#undef KVMAP_EXTERN_VMAP_CORE

// The map_overlap core: the same arguments (every DistView argument mapped: split, with the
// same counts), f called once per rank that holds rows, on the extended blocks.
template <class M>
std::vector<DistView<M>> map_overlap_core(const DistView<M>* const* arrays, std::size_t count,
                                          const std::vector<at::Tensor>& tensors,
                                          const OverlapOptions& options, const ArgsCall& call);
// NOLINTBEGIN(bugprone-macro-parentheses): Space is a type
#define KVMAP_EXTERN_MAP_OVERLAP_CORE(Space)                                         \
  extern template KVMAP_EXPORT std::vector<DistView<Space>> map_overlap_core<Space>( \
      const DistView<Space>* const*, std::size_t, const std::vector<at::Tensor>&,    \
      const OverlapOptions&, const ArgsCall&);
// NOLINTEND(bugprone-macro-parentheses)
KVMAP_FOR_EACH_MEMORY_SPACE(KVMAP_EXTERN_MAP_OVERLAP_CORE)
#undef KVMAP_EXTERN_MAP_OVERLAP_CORE

}  // namespace Impl
}  // namespace kvmap
KVMAP_API_END
