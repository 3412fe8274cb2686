// A trained model as the mapped function: the same TorchScript potential called directly on
// the local batch, through kvmap::map_batches (the model sees whole chunks) and through
// kvmap::vmap (the model written for one particle, batched by functorch).
#include <ATen/ATen.h>
#include <torch/script.h>

#include "harness.hpp"
#include "mpi_transport.hpp"  // reductions of the contenders' figures over ranks
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

// The potential in float64 and its error bound: y_j = x . w1_j + b1_j is a 65-term sum (error
// <= gamma_65 (|x|@|w1| + |b1|)_j), which tanh passes on scaled by 1 - t^2 and rounds (4), the
// product with w2 rounds once more, and the 64-term sum adds gamma_64 sum|w2 t|.
Expected potential_expected(torch::jit::Module& model, const at::Tensor& direct,
                            const at::Tensor& x) {
  auto buffer = [&](const char* name) {
    return model.attr(name).toTensor().to(at::kCPU).to(at::kDouble);
  };
  const at::Tensor w1 = buffer("w1"), b1 = buffer("b1"), w2 = buffer("w2");
  const at::Tensor x64 = x.to(at::kCPU).to(at::kDouble);
  const at::Tensor t = at::tanh(at::matmul(x64, w1) + b1);
  const at::Tensor propagated =
      (w2.abs() * (1 - t * t) * (at::matmul(x64.abs(), w1.abs()) + b1.abs())).sum(-1);
  return {direct, (t * w2).sum(-1), {65 + 5 + 64, propagated + (t * w2).abs().sum(-1)}};
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
    const Expected expected = potential_expected(model, call(xl), xl);
    auto error_over_bound = [&](const char* contender, const at::Tensor& result) {
      return kvmap::Detail::transport(comm).allreduce_max(
          require_close("models", case_name, contender, result, expected));
    };
    const double e_direct = error_over_bound("direct batched call", expected.direct);
    const double e_batches = error_over_bound("kvmap::map_batches", batches(x).local());
    const double e_samples = error_over_bound("kvmap::vmap", samples(x).local());
    const int reps = n <= 1024 ? 200 : (report.settings().quick ? 5 : 21);
    const auto t = measure_interleaved(
        comm, report.settings(),
        {[&] { (void)call(xl); }, [&] { (void)batches(x); }, [&] { (void)samples(x); }}, reps);
    report.add(
        {"models", case_name, "direct batched call", t[0], {{"error_over_bound", e_direct}}, {}});
    report.add({"models",
                case_name,
                "kvmap::map_batches",
                t[1],
                {{"over_direct", t[1].median / t[0].median},
                 {"over_direct_min", t[1].min / t[0].min},
                 {"overhead_us", (t[1].median - t[0].median) * 1e6},
                 {"error_over_bound", e_batches}},
                {}});
    report.add({"models",
                case_name,
                "kvmap::vmap",
                t[2],
                {{"over_direct", t[2].median / t[0].median},
                 {"over_map_batches", t[2].median / t[1].median},
                 {"error_over_bound", e_samples}},
                {}});
  }
}

}  // namespace kvmap_perf
