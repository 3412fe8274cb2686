// A trained model as the mapped function: the same TorchScript potential called directly on
// the local batch, through kvmap::map_batches (the model sees whole chunks) and through
// kvmap::vmap (the model written for one particle, batched by functorch).
#include <ATen/ATen.h>
#include <torch/script.h>

#include "harness.hpp"
#include "kvmap/kvmap.hpp"

namespace kvmap_perf {

namespace {

// E(x) = sum_j w2_j tanh(x . w1_j + b1_j): 64 coordinates in, one energy out (float32).
torch::jit::Module potential() {
  at::Generator g = at::detail::createCPUGenerator(9);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  torch::jit::Module m("Potential");
  m.register_buffer("w1", at::randn({64, 64}, g, f32).to(data_device()));
  m.register_buffer("b1", at::randn({64}, g, f32).to(data_device()));
  m.register_buffer("w2", at::randn({64}, g, f32).to(data_device()));
  m.define(R"JIT(
def forward(self, x):
    return (torch.tanh(torch.matmul(x, self.w1) + self.b1) * self.w2).sum(-1)
)JIT");
  m.eval();
  return m;
}

}  // namespace

void scenario_models(Report& report) {
  const auto& comm = report.comm();
  torch::jit::Module model = potential();
  auto call = [&](const at::Tensor& x) { return model.forward({x}).toTensor(); };
  for (std::int64_t n : {16, 1024, 100000}) {
    report.progress("models: TorchScript potential, local batch " + std::to_string(n));
    const std::string case_name = "TorchScript potential n=" + std::to_string(n);
    auto x = kvmap::DistView<>::from_local(
        at::randn({n, 64}, at::detail::createCPUGenerator(200 + comm.rank()),
                  at::TensorOptions().dtype(at::kFloat))
            .to(data_device()),
        0, comm);
    const at::Tensor xl = x.local();
    auto batches = kvmap::map_batches(call);
    auto samples = kvmap::vmap(call);
    const at::Tensor direct = call(xl);
    require_same(at::allclose(batches(x).local(), direct, 1e-4, 1e-5), "models",
                 "kvmap::map_batches");
    require_same(at::allclose(samples(x).local(), direct, 1e-4, 1e-5), "models", "kvmap::vmap");
    const int reps = n <= 1024 ? 200 : (report.settings().quick ? 5 : 21);
    const auto t = measure_interleaved(
        comm, report.settings(),
        {[&] { (void)call(xl); }, [&] { (void)batches(x); }, [&] { (void)samples(x); }}, reps);
    report.add({"models", case_name, "direct batched call", t[0], {}, {}});
    report.add({"models",
                case_name,
                "kvmap::map_batches",
                t[1],
                {{"over_direct", t[1].median / t[0].median},
                 {"over_direct_min", t[1].min / t[0].min},
                 {"overhead_us", (t[1].median - t[0].median) * 1e6}},
                {}});
    report.add({"models",
                case_name,
                "kvmap::vmap",
                t[2],
                {{"over_direct", t[2].median / t[0].median},
                 {"over_map_batches", t[2].median / t[1].median}},
                {}});
  }
}

}  // namespace kvmap_perf
