// Trained models as the mapped function: TorchScript modules built in C++ (both LibTorch
// generations), a module saved by Python and loaded with torch::jit::load, and an
// AOTInductor package through map_batches. References: the model's formula in ATen on the
// gathered data, and the eager model's output saved by the exporting Python
// (tests/models/export_models.py, run by ctest before this test with the Python bindings'
// torch; its directory arrives in KVMAP_TEST_MODELS_DIR).
#include "support/vmap_test.hpp"

#include <torch/jit.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>
#include <torch/version.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>

#if __has_include(<torch/csrc/inductor/aoti_package/model_package_loader.h>)
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#define KVMAP_TEST_HAVE_AOTI 1
#endif

using namespace kvmap_test;
using kvmap::VmapOptions;

namespace {

// The potentials' roundings (the MLP below and the one export_models.py saves): a 3-term dot
// plus a bias (4), tanh (4), a 16-term dot plus a bias (17), the output bias (1).
constexpr std::int64_t kPotentialRoundings = 26;

std::vector<std::optional<int64_t>> chunk_sizes() {
  return {std::nullopt, std::optional<int64_t>(1), std::optional<int64_t>(4),
          std::optional<int64_t>(7)};
}

// Chunks in flight: several where this LibTorch runs them at once (>= 2.0).
std::vector<int> concurrencies() {
  return TORCH_VERSION_MAJOR >= 2 ? std::vector<int>{1, 2} : std::vector<int>{1};
}

// The directory of the Python-exported models, or empty (with the reason printed once).
std::string models_dir() {
  const char* dir = std::getenv("KVMAP_TEST_MODELS_DIR");
  if (dir == nullptr || *dir == '\0') {
    MESSAGE(
        "skipped: KVMAP_TEST_MODELS_DIR is not set (built without the Python bindings, "
        "so no Python torch saved the models)");
    return {};
  }
  return dir;
}

[[maybe_unused]] bool exists(const std::string& path) {
  return std::ifstream(path).good();
}

// A per-particle MLP potential in float32, its weights random but fixed.
struct Weights {
  at::Tensor w1, b1, w2, b2;
  Weights() {
    at::Generator g = at::detail::createCPUGenerator(7);
    auto f32 = at::TensorOptions().dtype(at::kFloat);
    w1 = at::randn({3, 16}, g, f32);
    b1 = at::randn({16}, g, f32);
    w2 = at::randn({16}, g, f32);
    b2 = at::randn({}, g, f32);
  }
  // The reference: the formula in ATen, in float64 on the float32 inputs the model sees.
  at::Tensor energy(const at::Tensor& x) const {
    auto f64 = [](const at::Tensor& t) { return t.to(at::kDouble); };
    return (at::tanh(at::matmul(f64(x.to(at::kFloat)), f64(w1)) + f64(b1)) * f64(w2)).sum(-1) +
           f64(b2);
  }
};

// The same potential as a TorchScript module built in C++ (Module::define; each call makes a
// module with its own compilation unit), its weights parameters that require grad, as a
// trained model's: LibTorch's graph executor then builds autodiff subgraphs from the second
// call on, which read tensors' data and so cannot run under functorch once built. kvmap::vmap
// runs TorchScript unoptimized; a module optimized by calls outside vmap is kept for those.
torch::jit::Module scripted_potential(const Weights& w) {
  torch::jit::Module m("Potential");
  m.register_parameter("w1", w.w1.clone().requires_grad_(true), false);
  m.register_parameter("b1", w.b1.clone().requires_grad_(true), false);
  m.register_parameter("w2", w.w2.clone().requires_grad_(true), false);
  m.register_parameter("b2", w.b2.clone().requires_grad_(true), false);
  m.define(R"JIT(
def forward(self, x):
    return (torch.tanh(torch.matmul(x, self.w1) + self.b1) * self.w2).sum(-1) + self.b2
)JIT");
  return m;
}

at::Tensor positions(int64_t n, std::uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  return at::randn({n, 3}, g, at::TensorOptions().dtype(at::kDouble));
}

}  // namespace

TEST_CASE("a TorchScript module built in C++ through vmap and map_batches, float32 on float64") {
  const int P = nranks();
  const Weights w;
  // One module per use: vmap's stays unoptimized, map_batches' and the reference loop's are
  // optimized by the graph executor as any direct call.
  torch::jit::Module per_sample_model = scripted_potential(w);
  torch::jit::Module batched_model = scripted_potential(w);
  torch::jit::Module reference_model = scripted_potential(w);
  const at::Tensor full = positions(5 * P + 3, 31);
  const at::Tensor expected = w.energy(full);
  auto x = View::from_global(on_device(full), 0);
  // The models' parameters on the device the positions live on.
  for (torch::jit::Module* m : {&per_sample_model, &batched_model, &reference_model})
    m->to(device());
  auto energy_of = [](torch::jit::Module& m) {
    return [&m](const at::Tensor& r) { return m.forward({r.to(at::kFloat)}).toTensor(); };
  };
  at::Tensor loop;  // the module on one sample at a time
  {
    std::vector<at::Tensor> each;
    for (int64_t i = 0; i < full.size(0); ++i)
      each.push_back(reference_model.forward({on_device(full[i]).to(at::kFloat)}).toTensor());
    loop = at::stack(each).detach().cpu();
  }
  CHECK(kvmap::check_close(loop, expected, {kPotentialRoundings}));
  for (std::optional<int64_t> cs : chunk_sizes())
    for (int conc : concurrencies()) {
      INFO("chunk " << (cs ? *cs : -1) << " concurrency " << conc);
      const auto options = VmapOptions().chunk_size(cs).concurrency(conc);
      kvmap::DistView<TestMemSpace> per_sample =
          kvmap::vmap(energy_of(per_sample_model), options)(x);
      kvmap::DistView<TestMemSpace> batched =
          kvmap::map_batches(energy_of(batched_model), options)(x);
      CHECK(per_sample.gshape() == kvmap::Shape{full.size(0)});
      CHECK((per_sample.dtype() == kvmap::DType::Float32));
      CHECK(close(per_sample.allgather().cpu(), loop, kPotentialRoundings));
      CHECK(kvmap::check_close(batched.allgather().cpu(), expected, {kPotentialRoundings}));
    }
}

TEST_CASE("a TorchScript module called outside vmap too: optimization off from its first call") {
  // The documented way to share one module between vmap and direct calls (map_batches, a
  // loop): LibTorch's graph executor optimization off (thread-local) from the first call.
  const int P = nranks();
  const Weights w;
  torch::jit::Module model = scripted_potential(w);
  model.to(device());
  const at::Tensor full = positions(3 * P + 1, 34);
  auto x = View::from_global(on_device(full), 0);
  auto energy = [&](const at::Tensor& r) { return model.forward({r.to(at::kFloat)}).toTensor(); };
  torch::jit::GraphOptimizerEnabledGuard unoptimized(false);
  for (int round = 0; round < 3; ++round) {
    for (int64_t i = 0; i < full.size(0); ++i) (void)energy(on_device(full[i]));
    CHECK(kvmap::check_close(kvmap::map_batches(energy)(x).allgather().cpu(), w.energy(full),
                             {kPotentialRoundings}));
    CHECK(kvmap::check_close(kvmap::vmap(energy, VmapOptions().chunk_size(2))(x).allgather().cpu(),
                             w.energy(full), {kPotentialRoundings}));
  }
}

TEST_CASE("a TorchScript function compiled in C++ (torch::jit::compile) over two mapped inputs") {
  const int P = nranks();
  auto unit = torch::jit::compile(R"JIT(
def pair_energy(a, b):
    d = a - b
    return torch.exp(-(d * d).sum(-1)), torch.sqrt((d * d).sum(-1))
)JIT");
  torch::jit::Function& pair_energy = unit->get_function("pair_energy");
  const at::Tensor a_full = positions(4 * P + 1, 32), b_full = positions(4 * P + 1, 33);
  auto a = View::from_global(on_device(a_full), 0);
  auto b = View::from_global(on_device(b_full), 0);
  auto f = [&](const at::Tensor& x, const at::Tensor& y) {
    auto out = pair_energy({x, y}).toTuple();
    return std::make_tuple(out->elements()[0].toTensor(), out->elements()[1].toTensor());
  };
  const at::Tensor d = a_full - b_full;
  for (std::optional<int64_t> cs : chunk_sizes())
    for (int conc : concurrencies()) {
      const auto options = VmapOptions().chunk_size(cs).concurrency(conc);
      auto [e, r] = kvmap::vmap(f, options)(a, b);
      // a - b, squares, a 3-term sum, then exp (4) or a square root (1).
      CHECK(close(e.allgather().cpu(), at::exp(-(d * d).sum(-1)), 1 + 1 + 3 + 4));
      CHECK(close(r.allgather().cpu(), d.norm(2, -1), 1 + 1 + 3 + 1));
      auto [be, br] = kvmap::map_batches(f, options)(a, b);
      CHECK(close(be.allgather().cpu(), at::exp(-(d * d).sum(-1)), 1 + 1 + 3 + 4));
      CHECK(close(br.allgather().cpu(), d.norm(2, -1), 1 + 1 + 3 + 1));
    }
}

TEST_CASE("a module saved by Python (torch.jit.save), loaded with torch::jit::load") {
  const std::string dir = models_dir();
  if (dir.empty()) return;
  torch::jit::Module reference = torch::jit::load(dir + "/reference.pt");
  const at::Tensor full = reference.attr("positions").toTensor();
  const at::Tensor eager = reference.attr("energies").toTensor();
  // Loaded twice: one module for vmap, one for map_batches (see above).
  torch::jit::Module per_sample_model = torch::jit::load(dir + "/potential.pt", device());
  torch::jit::Module batched_model = torch::jit::load(dir + "/potential.pt", device());
  auto x = View::from_global(on_device(full), 0);
  auto energy_of = [](torch::jit::Module& m) {
    m.eval();
    return [&m](const at::Tensor& r) { return m.forward({r.to(at::kFloat)}).toTensor(); };
  };
  for (std::optional<int64_t> cs : chunk_sizes())
    for (int conc : concurrencies()) {
      INFO("chunk " << (cs ? *cs : -1) << " concurrency " << conc);
      const auto options = VmapOptions().chunk_size(cs).concurrency(conc);
      CHECK(close(kvmap::vmap(energy_of(per_sample_model), options)(x).allgather().cpu(), eager,
                  kPotentialRoundings));
      CHECK(close(kvmap::map_batches(energy_of(batched_model), options)(x).allgather().cpu(), eager,
                  kPotentialRoundings));
    }
}

#if defined(KVMAP_TEST_HAVE_AOTI)
// The models directory when the exporting torch wrote `package` and the test runs on the CPU
// (the packages are compiled for it); empty, with the reason as a message, otherwise.
std::string aoti_models_dir(const std::string& package) {
  const std::string dir = models_dir();
  if (dir.empty()) return dir;
  if (!exists(dir + "/" + package)) {
    MESSAGE("skipped: the exporting torch wrote no " << package << " (see export_models' output)");
    return {};
  }
  if (device().type() != at::kCPU) {
    MESSAGE("skipped: " << package << " is compiled for the CPU");
    return {};
  }
  return dir;
}
#endif

TEST_CASE("an AOTInductor package through map_batches, any chunking, against eager") {
#if defined(KVMAP_TEST_HAVE_AOTI)
  const std::string dir = aoti_models_dir("potential.pt2");
  if (dir.empty()) return;
  torch::jit::Module reference = torch::jit::load(dir + "/reference.pt");
  const at::Tensor full = reference.attr("positions").toTensor();
  const at::Tensor eager = reference.attr("energies").toTensor();
  // Two runners: two chunks may be in flight at once.
  torch::inductor::AOTIModelPackageLoader loader(dir + "/potential.pt2", "model", false, 2);
  auto x = View::from_global(full, 0);
  auto energy = [&](const at::Tensor& r) { return loader.run({r.to(at::kFloat)})[0]; };
  for (std::optional<int64_t> cs : chunk_sizes())
    for (int conc : {1, 2}) {
      INFO("chunk " << (cs ? *cs : -1) << " concurrency " << conc);
      auto e = kvmap::map_batches(energy, VmapOptions().chunk_size(cs).concurrency(conc))(x);
      CHECK(e.gshape() == kvmap::Shape{full.size(0)});
      CHECK(e.layout().counts() == x.layout().counts());
      CHECK(close(e.allgather(), eager, kPotentialRoundings));
    }
#else
  MESSAGE("skipped: LibTorch " TORCH_VERSION
          " has no AOTInductor (torch::inductor::"
          "AOTIModelPackageLoader, LibTorch >= 2.6)");
#endif
}

TEST_CASE("an AOTInductor package with a static batch of 64, padded, at every batch size 1-200") {
#if defined(KVMAP_TEST_HAVE_AOTI)
  const std::string dir = aoti_models_dir("potential_b64.pt2");
  if (dir.empty()) return;
  torch::jit::Module reference = torch::jit::load(dir + "/reference.pt");
  const at::Tensor positions = reference.attr("positions200").toTensor();
  const at::Tensor eager = reference.attr("energies200").toTensor();
  torch::inductor::AOTIModelPackageLoader loader(dir + "/potential_b64.pt2", "model", false, 1);
  std::int64_t rows_seen = 64;
  auto energy = [&](const at::Tensor& r) {
    rows_seen = std::min(rows_seen, r.size(0));
    return loader.run({r.to(at::kFloat)})[0];
  };
  for (std::int64_t n = 1; n <= 200; ++n) {
    CAPTURE(n);
    auto x = View::from_global(positions.narrow(0, 0, n), 0);
    auto e = kvmap::map_batches(energy, VmapOptions().chunk_size(64).pad_to_chunk())(x);
    CHECK(e.layout().counts() == x.layout().counts());
    CHECK(close(e.allgather(), eager.narrow(0, 0, n), kPotentialRoundings));
  }
  CHECK(rows_seen == 64);  // every call of the program had its one shape
#else
  MESSAGE("skipped: LibTorch " TORCH_VERSION
          " has no AOTInductor (torch::inductor::"
          "AOTIModelPackageLoader, LibTorch >= 2.6)");
#endif
}
