#pragma once
/// \file
/// kvmap::vmap: a function written for one sample, vectorized with functorch over the split
/// axis of DistViews on every rank, on zero-copy views of the local shards, chunked by a
/// Kokkos policy over the batch. kvmap::map_batches: the same scheduler for a function that
/// is already batch-aware (an AOTInductor or TorchScript model written for batches): it
/// receives each chunk as plain tensors, batch axis first.
#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvmap/config.hpp"
#include "kvmap/dist_view.hpp"
#include "kvmap/impl/kokkos_compat.hpp"
#include "kvmap/impl/vmap_core.hpp"
#include "kvmap/overlap.hpp"
#include "kvmap/tensor_bridge.hpp"

KVMAP_API_BEGIN
namespace kvmap {

/// How torch's own random functions behave inside f under kvmap::vmap (torch.vmap's
/// `randomness`): Error raises, Different draws per sample, Same draws once for all samples.
enum class Randomness { Error, Different, Same };
/// "error", "different", "same".
const char* name(Randomness r);

/// VmapOptions().chunk_size(kvmap::auto_chunk): the chunk size chosen by memory.
struct AutoChunk {};
/// The value that asks for a chunk size chosen by memory (VmapOptions::chunk_size).
inline constexpr AutoChunk auto_chunk{};

/// Fluent options: VmapOptions().out_dims({0, 1}).chunk_size(8). Setters validate.
class VmapOptions {
 public:
  /// One per output; a single value applies to all outputs. Negative dims count from the end.
  VmapOptions& out_dims(std::vector<std::int64_t> dims);
  /// Exactly one per output, a single value included (torch.vmap's tuple out_dims): a
  /// function with another number of outputs is an error, agreed on every rank.
  VmapOptions& out_dims_per_output(std::vector<std::int64_t> dims);
  /// How torch's own random functions behave inside f under vmap (as torch.vmap's
  /// randomness). map_batches accepts only the default: there f is an ordinary batched call.
  VmapOptions& randomness(Randomness r);
  /// Samples per chunk, per process (>= 1); std::nullopt: the whole local batch at once.
  /// Whatever the size, a chunk on which f runs out of memory (std::bad_alloc,
  /// c10::OutOfMemoryError, kvmap::OutOfMemoryError) runs again as two halves, down to one
  /// sample; only one sample that does not fit is an error (agreed like every other).
  VmapOptions& chunk_size(std::optional<std::int64_t> c);
  /// Samples per chunk chosen by memory, on each rank alone (no communication): the first
  /// two chunks (one sample, then as many as that allows) are probes that measure what f
  /// allocates per sample and per chunk through torch's memory reporting (the hook of
  /// torch's profiler, on the calling thread); later chunks take as many samples as fit the
  /// memory budget after the outputs, shared among the chunks in flight, and on the host no
  /// more than keep a chunk's temporaries in cache (docs/concepts.md, "Memory"). stats()
  /// reports the chunk size chosen and the bytes per sample measured.
  VmapOptions& chunk_size(AutoChunk);
  /// The bytes one call may allocate on this rank for its chunks and outputs (>= 1), for
  /// chunk_size(auto_chunk). std::nullopt: half of the host's MemAvailable divided among the
  /// node's ranks (host memory), 80% of the device's free memory (a CUDA GPU), read at each
  /// call.
  VmapOptions& memory_budget(std::optional<std::int64_t> bytes);
  /// map_batches only, with a chunk size (fixed or auto): every chunk reaches f with exactly
  /// that many rows, for programs compiled for one shape (AOTInductor with a static batch,
  /// CUDA graphs, torch.compile with static shapes). The last chunk is padded with copies of
  /// its last real row; kvmap::chunk_rows() says how many rows are real; the padding's
  /// outputs are dropped. A padded chunk that runs out of memory cannot shrink: an error
  /// naming a smaller chunk size.
  VmapOptions& pad_to_chunk(bool pad = true);
  /// Chunks in flight at once (>= 1), on the host execution space's threads, each under the
  /// caller's torch thread-local state: f must then be thread-safe. One at a time on
  /// LibTorch < 2.0 (functorch's bookkeeping there is not thread-safe) and in Same mode.
  VmapOptions& concurrency(int chunks_in_flight);

  /// The values the setters above set.
  ///@{
  const std::vector<std::int64_t>& out_dims() const { return out_dims_; }
  bool out_dims_per_output() const { return out_dims_per_output_; }
  Randomness randomness() const { return randomness_; }
  std::optional<std::int64_t> chunk_size() const { return chunk_size_; }
  bool auto_chunk_size() const { return auto_chunk_; }
  std::optional<std::int64_t> memory_budget() const { return memory_budget_; }
  bool pad_to_chunk() const { return pad_to_chunk_; }
  int concurrency() const { return concurrency_; }
  ///@}

 private:
  std::vector<std::int64_t> out_dims_{0};
  bool out_dims_per_output_ = false;
  Randomness randomness_ = Randomness::Error;
  std::optional<std::int64_t> chunk_size_;
  bool auto_chunk_ = false;
  std::optional<std::int64_t> memory_budget_;
  bool pad_to_chunk_ = false;
  int concurrency_ = 1;
};

/// Inside a function run by kvmap::vmap or kvmap::map_batches: how many samples of the chunk
/// being run are real (with VmapOptions::pad_to_chunk the others are padding); 0 outside.
std::int64_t chunk_rows();

/// Inside a function run by kvmap::vmap: per-sample random tensors of `shape` whose values
/// depend only on (kvmap seed, global sample index, call order) — the same for any number
/// of ranks and any chunk size. Inside kvmap::map_batches: the chunk's samples' values, as a
/// plain tensor [chunk length, *shape] (the same values as vmap gives each sample). Error
/// outside both. Uniform in [0, 1) / standard normal.
///@{
at::Tensor sample_uniform(at::IntArrayRef shape, at::ScalarType dtype = at::kFloat);
at::Tensor sample_normal(at::IntArrayRef shape, at::ScalarType dtype = at::kFloat);
///@}

namespace Impl {

template <class T>
struct is_dist_view : std::false_type {};
template <class M>
struct is_dist_view<DistView<M>> : std::true_type {};

template <class A, class Next>
struct pick_memory_space {
  using type = typename Next::type;
};
template <class M, class Next>
struct pick_memory_space<DistView<M>, Next> {
  using type = M;
};
/// The memory space of the first DistView argument (outputs live there).
template <class... Args>
struct first_memory_space {
  using type = Kokkos::DefaultExecutionSpace::memory_space;
};
template <class A, class... Rest>
struct first_memory_space<A, Rest...> {
  using type = typename pick_memory_space<A, first_memory_space<Rest...>>::type;
};

/// What f receives for an argument of type A: a tensor for DistViews, A itself otherwise.
template <class A>
using bound_t = std::conditional_t<is_dist_view<std::decay_t<A>>::value, at::Tensor,
                                   std::add_lvalue_reference_t<std::remove_reference_t<A>>>;

template <class R>
struct output_traits {
  static_assert(sizeof(R) == 0,
                "kvmap::vmap: the function must return at::Tensor, std::tuple<at::Tensor...> or "
                "std::vector<at::Tensor>");
};
template <>
struct output_traits<at::Tensor> {
  static std::vector<at::Tensor> to_list(at::Tensor t) { return {std::move(t)}; }
  template <class M>
  static DistView<M> from_list(std::vector<DistView<M>> v) {
    return std::move(v.front());
  }
};
template <>
struct output_traits<std::vector<at::Tensor>> {
  static std::vector<at::Tensor> to_list(std::vector<at::Tensor> v) { return v; }
  template <class M>
  static std::vector<DistView<M>> from_list(std::vector<DistView<M>> v) {
    return v;
  }
};
template <class... Ts>
struct output_traits<std::tuple<Ts...>> {
  static_assert((std::is_same_v<Ts, at::Tensor> && ...),
                "kvmap::vmap: a tuple returned by the function must hold only at::Tensor");
  static std::vector<at::Tensor> to_list(std::tuple<Ts...> t) {
    return std::apply([](auto&&... x) { return std::vector<at::Tensor>{std::move(x)...}; },
                      std::move(t));
  }
  template <class M, std::size_t... I>
  static auto from_list_impl(std::vector<DistView<M>>& v, std::index_sequence<I...>) {
    return std::make_tuple(std::move(v[I])...);
  }
  template <class M>
  static auto from_list(std::vector<DistView<M>> v) {
    return from_list_impl<M>(v, std::index_sequence_for<Ts...>{});
  }
};

/// The argument of f for argument `a`: its tensor (`slot` into `per_array`) for a DistView,
/// `a` itself otherwise.
template <class A>
decltype(auto) bind_argument(A& a, int slot, const std::vector<at::Tensor>& per_array) {
  if constexpr (is_dist_view<std::decay_t<A>>::value) {
    (void)a;
    return per_array[static_cast<std::size_t>(slot)];
  } else {
    (void)slot;
    (void)per_array;
    return static_cast<A&>(a);
  }
}

/// Calls f with the arguments, DistViews replaced by their tensors; its result as a list.
template <class F, class Tuple, std::size_t N, std::size_t... I>
std::vector<at::Tensor> call_bound(const F& f, Tuple& args, const std::array<int, N>& slot,
                                   const std::vector<at::Tensor>& per_array,
                                   std::index_sequence<I...>) {
  using R = std::decay_t<decltype(std::invoke(
      f, bind_argument(std::get<I>(args), slot[I], per_array)...))>;
  return output_traits<R>::to_list(
      std::invoke(f, bind_argument(std::get<I>(args), slot[I], per_array)...));
}

/// One call of a mapped function (vmap, map_batches, map_overlap): the DistView arguments by
/// address (they outlive the call; nothing is copied or allocated for them) and the tensor
/// arguments (for the no-aliasing rule) go to `core(arrays, count, tensors, f)`, which calls f
/// with one tensor per DistView; its DistViews come back shaped as f returns tensors.
template <class F, class Core, class... Args>
auto run_mapped(const F& f, const Core& core, Args&&... args) {
  using M = typename first_memory_space<std::decay_t<Args>...>::type;
  static_assert(((!is_dist_view<std::decay_t<Args>>::value ||
                  std::is_same_v<std::decay_t<Args>, DistView<M>>)&&...),
                "kvmap::vmap: every DistView argument must live in the same memory space");
  using R = std::decay_t<std::invoke_result_t<const F&, bound_t<Args>...>>;
  using Traits = output_traits<R>;
  std::array<const DistView<M>*, sizeof...(Args)> arrays{};
  std::size_t narrays = 0;
  std::vector<at::Tensor> tensors;
  std::array<int, sizeof...(Args)> slot{};  // index into `arrays`, or -1
  std::size_t i = 0;
  auto collect = [&](const auto& a) {
    using A = std::decay_t<decltype(a)>;
    slot[i] = -1;
    if constexpr (is_dist_view<A>::value) {
      slot[i] = static_cast<int>(narrays);
      arrays[narrays++] = &a;
    } else if constexpr (std::is_same_v<A, at::Tensor>) {
      tensors.push_back(a);
    }
    ++i;
  };
  (collect(args), ...);
  auto args_ref = std::forward_as_tuple(args...);
  auto call = [&](const std::vector<at::Tensor>& per_array) {
    return call_bound(f, args_ref, slot, per_array, std::index_sequence_for<Args...>{});
  };
  return Traits::template from_list<M>(core(arrays.data(), narrays, tensors, ArgsCall(call)));
}

}  // namespace Impl

/// What kvmap::vmap(f, options) and kvmap::map_batches(f, options) return: call it with
/// DistViews (mapped along their split axes; replicated ones and other arguments are passed
/// whole) to run f on every sample (vmap) or every chunk (map_batches); returns a DistView,
/// or a `std::tuple` or `std::vector` of them, as f returns a tensor or several.
template <class F>
class Vmapped {
 public:
  /// kvmap::vmap and kvmap::map_batches make it.
  Vmapped(F f, VmapOptions options, Impl::Mapping mapping = Impl::Mapping::Samples)
      : f_(std::move(f)), options_(std::move(options)), mapping_(mapping) {}

  /// Runs f over the arguments' samples (collective over the first DistView's
  /// communicator): validation, the local chunks, one agreement, the outputs.
  template <class... Args>
  auto operator()(Args&&... args) const {
    return Impl::run_mapped(
        f_,
        [&](auto arrays, std::size_t count, const std::vector<at::Tensor>& tensors,
            const Impl::ArgsCall& call) {
          return Impl::vmap_core(arrays, count, tensors, options_, mapping_, call);
        },
        std::forward<Args>(args)...);
  }

  /// The options it runs with.
  const VmapOptions& options() const { return options_; }

 private:
  F f_;
  VmapOptions options_;
  Impl::Mapping mapping_;
};

/// What kvmap::map_overlap(f, options) returns: call it with DistViews (same counts along
/// their split axes) and any other arguments (passed to f whole); f receives each rank's blocks
/// extended by their halo rows (see docs/concepts.md, "map_overlap").
template <class F>
class Overlapped {
 public:
  /// Holds f and the options; kvmap::map_overlap builds it.
  Overlapped(F f, OverlapOptions options) : f_(std::move(f)), options_(options) {}

  /// Runs f on each rank's extended blocks (collective over the first DistView's
  /// communicator): one agreement, the halo rows, f, one agreement on its outputs.
  template <class... Args>
  auto operator()(Args&&... args) const {
    return Impl::run_mapped(
        f_,
        [&](auto arrays, std::size_t count, const std::vector<at::Tensor>& tensors,
            const Impl::ArgsCall& call) {
          return Impl::map_overlap_core(arrays, count, tensors, options_, call);
        },
        std::forward<Args>(args)...);
  }

  /// The depth, boundary and trim of every call.
  const OverlapOptions& options() const { return options_; }

 private:
  F f_;
  OverlapOptions options_;
};

/// vmap(f, options)(args...): see docs/concepts.md ("vmap") and the members of Vmapped above.
template <class F>
Vmapped<F> vmap(F f, VmapOptions options = {}) {
  return Vmapped<F>(std::move(f), std::move(options));
}

/// map_batches(f, options)(args...): as vmap, but f receives each chunk's tensors with the
/// batch axis first as plain tensors (no functorch) and returns tensors whose first axis is
/// the chunk length; each output's batch axis then moves to its out_dim. See docs/concepts.md
/// ("map_batches").
template <class F>
Vmapped<F> map_batches(F f, VmapOptions options = {}) {
  return Vmapped<F>(std::move(f), std::move(options), Impl::Mapping::Batches);
}

/// map_overlap(f, options)(arrays..., other args...): Dask's map_overlap on DistViews split
/// along one axis. On each rank that holds rows, f receives its blocks extended along the split
/// axis by options' depth before and after (the rows beyond the global ends as its boundary
/// says, numpy.pad's meaning; contiguous tensors) and returns tensors with that many rows along
/// the same axis (trim: kvmap removes the added rows) or exactly its own rows (no trim). Returns
/// DistViews with the arrays' counts along that axis. Ranks without rows do not call f. Two
/// fixed-size agreements (before the halo rows move, and on f's outputs); only halo rows travel,
/// to the ranks that need them. See docs/concepts.md ("map_overlap").
template <class F>
Overlapped<F> map_overlap(F f, OverlapOptions options) {
  return Overlapped<F>(std::move(f), options);
}

}  // namespace kvmap
KVMAP_API_END
