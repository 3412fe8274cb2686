// A machine-learned potential in a particle code: a per-particle energy model trained in
// Python (a TorchScript file), applied to distributed float64 particle data.
//   energies  kvmap::vmap: the model written for one particle, vectorized over the shard;
//   forces    kvmap::map_batches: the model on each chunk of particles at once, and
//             F = -dE/dx by autograd of the chunk's summed energy (particles are
//             independent, so that gradient is per particle);
// checked against a float64 copy of the model and its central finite differences on a few
// particles per rank, within the rounding-error bound of float32 (kvmap::check_close).
//
//   mpirun -np 4 kvmap-ml-potential [model.pt] [--particles N] [--chunk C] [--roundings K]
// model.pt maps positions [..., 3] (float32) to energies [...]; without it the example builds
// a small one itself (torch::jit::Module::define), as Python would script it. K: roundings
// along the model's forward chain (default: the built-in model's 42; a 3-16-1 MLP has 26).
#include <kvmap/kvmap.hpp>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/script.h>

#include <mpi.h>

#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

// The stand-in for a trained model: E(x) = sum_j w2_j tanh(x . w1_j + b1_j) + b2, float32.
torch::jit::Module built_in_model() {
  at::Generator g = at::detail::createCPUGenerator(42);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  torch::jit::Module m("Potential");
  m.register_buffer("w1", at::randn({3, 32}, g, f32));
  m.register_buffer("b1", at::randn({32}, g, f32));
  m.register_buffer("w2", at::randn({32}, g, f32) / 8);
  m.register_buffer("b2", at::zeros({}, f32));
  m.define(R"JIT(
def forward(self, x):
    return (torch.tanh(torch.matmul(x, self.w1) + self.b1) * self.w2).sum(-1) + self.b2
)JIT");
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  kvmap::ScopeGuard guard(argc, argv);
  std::string path;
  std::int64_t particles = 10000, chunk = 2048;
  // A 3-term dot product and a bias (4), tanh (4), the weight (1), a 32-term sum (32), a bias.
  std::int64_t roundings = 42;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--particles" && i + 1 < argc) {
      particles = std::atoll(argv[++i]);
    } else if (a == "--chunk" && i + 1 < argc) {
      chunk = std::atoll(argv[++i]);
    } else if (a == "--roundings" && i + 1 < argc) {
      roundings = std::atoll(argv[++i]);
    } else if (a.rfind("--", 0) != 0) {
      path = a;
    }
  }
  int failed = 0;
  {
    torch::jit::Module model = path.empty() ? built_in_model() : torch::jit::load(path);
    model.eval();

    // Particle positions in float64, split over the ranks.
    auto positions = kvmap::random::normal({particles, 3}, kvmap::DType::Float64, 0);

    // Energies: the model called on ONE particle (r: [3]), cast to its float32.
    auto energies = kvmap::vmap(
        [&](const at::Tensor& r) { return model.forward({r.to(at::kFloat)}).toTensor(); },
        kvmap::VmapOptions().chunk_size(chunk))(positions);

    // Forces: the model on a chunk of particles (r: [chunk, 3]); grad mode on inside.
    auto forces = kvmap::map_batches(
        [&](const at::Tensor& r) {
          at::AutoGradMode grad(true);
          at::Tensor x = r.to(at::kFloat).requires_grad_(true);
          at::Tensor e = model.forward({x}).toTensor();
          return -torch::autograd::grad({e.sum()}, {x})[0].to(at::kDouble);
        },
        kvmap::VmapOptions().chunk_size(chunk))(positions);

    // Check on this rank's first particles: energies against a float64 copy of the model,
    // forces against its central differences, each within the rounding bound of float32
    // (norm-wise; the gradient runs the chain backwards too: twice the roundings). The
    // differences' own error (h^2/6 times the third derivative, plus u |E| / h) is about
    // 1e-10 here: far below.
    torch::jit::Module reference = model.deepcopy();
    reference.to(at::kDouble);
    const at::Tensor r = positions.local(), f = forces.local(), e = energies.local();
    const double h = 1e-5;
    std::vector<double> e64, fd;
    const std::int64_t checked = std::min<std::int64_t>(3, r.size(0));
    for (std::int64_t i = 0; i < checked; ++i) {
      for (int d = 0; d < 3; ++d) {
        at::Tensor up = r[i].clone(), down = r[i].clone();
        up[d] += h;
        down[d] -= h;
        fd.push_back(-(reference.forward({up}).toTensor().item<double>() -
                       reference.forward({down}).toTensor().item<double>()) /
                     (2 * h));
      }
      e64.push_back(reference.forward({r[i]}).toTensor().item<double>());
    }
    const auto f64 = at::TensorOptions().dtype(at::kDouble);
    // The model computes in float32: its results are compared as float32 (the forces came
    // back as float64 copies of float32 values).
    const kvmap::Closeness energy_check = kvmap::check_close(e.narrow(0, 0, checked).to(at::kFloat),
                                                             at::tensor(e64, f64), {roundings});
    const kvmap::Closeness force_check = kvmap::check_close(
        f.narrow(0, 0, checked).reshape({-1}).to(at::kFloat), at::tensor(fd, f64), {2 * roundings});
    double worst = std::max(energy_check.ratio, force_check.ratio);
    failed = energy_check && force_check ? 0 : 1;
    if (failed) {
      std::fprintf(stderr, "rank %d: energies %s; forces %s\n", positions.comm().rank(),
                   energy_check.describe().c_str(), force_check.describe().c_str());
    }
    double local_energy = e.to(at::kDouble).sum().item<double>(), total = 0, worst_all = 0;
    MPI_Allreduce(&local_energy, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&worst, &worst_all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (positions.comm().rank() == 0) {
      std::printf(
          "%s model, %lld particles on %d ranks: total energy %.6f, forces %s "
          "(largest error / rounding bound against float64 and finite differences %.3f)\n",
          path.empty() ? "built-in" : path.c_str(), static_cast<long long>(particles),
          positions.comm().size(), total, failed ? "WRONG" : "checked", worst_all);
    }
  }
  return failed;
}
