// A trained model as the mapped function: the same TorchScript potential called directly on
// the local batch, through kvmap::map_batches (the model sees whole chunks) and through
// kvmap::vmap (the model written for one particle, batched by functorch); and a compiled
// program (AOTInductor) through kvmap::map_batches, chunked and padded, on Heat's comparison.
#include <ATen/ATen.h>
#include <torch/script.h>
#include <torch/version.h>

#include <cstdio>
#include <optional>

#if __has_include(<torch/csrc/inductor/aoti_package/model_package_loader.h>)
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#define KVMAP_PERF_HAVE_AOTI 1
#endif

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

// Heat's vmap comparison (perf/heat_vs_kvmap.py's compiled contenders) for C++: f(x) =
// tanh(x@W).sum(-1) on 64 float32 features compiled by AOTInductor (perf/export_compiled.py:
// a dynamic batch axis, and a static batch of 256 run with pad_to_chunk), against the eager
// direct call and kvmap::vmap of the per-sample function, unchunked and in chunks of 256.
void scenario_compiled(Report& report) {
  const auto& comm = report.comm();
  auto skipped = [&](const std::string& why) {
    if (comm.rank() == 0) std::printf("compiled: skipped (%s)\n", why.c_str());
  };
#if defined(KVMAP_PERF_HAVE_AOTI)
  const std::string& dir = report.settings().compiled_dir;
  if (dir.empty()) return skipped("no --compiled DIR; perf/export_compiled.py DIR writes it");
  if (!on_host()) return skipped("the programs are compiled for the CPU");
  torch::jit::Module weights = torch::jit::load(dir + "/tanh_sum_w.pt");
  const at::Tensor W = weights.attr("W").toTensor();
  torch::inductor::AOTIModelPackageLoader dynamic(dir + "/tanh_sum.pt2", "model", false, 1);
  torch::inductor::AOTIModelPackageLoader static256(dir + "/tanh_sum_b256.pt2", "model", false, 1);
  constexpr std::int64_t kChunk = 256;
  auto per_sample = [&](const at::Tensor& x) { return at::tanh(at::matmul(x, W)).sum(-1); };
  auto run_dynamic = [&](const at::Tensor& x) { return dynamic.run({x})[0]; };
  auto run_static = [&](const at::Tensor& x) { return static256.run({x})[0]; };
  for (std::int64_t n : {16, 1024, 100000}) {
    auto x = kvmap::DistView<>::from_local(
        at::randn({n, 64}, at::detail::createCPUGenerator(300 + comm.rank()),
                  at::TensorOptions().dtype(at::kFloat)),
        0, comm);
    const at::Tensor xl = x.local();
    const Expected expected = tanh_sum_expected(per_sample(xl), xl, W);
    // The chunked contenders are compared with the unchunked case's direct call too: the direct
    // call timed among chunked contenders runs with the allocator in another state (its
    // intermediate returned to the system between calls) and is slower than alone.
    double direct_unchunked = 0;
    for (std::optional<std::int64_t> chunk :
         {std::optional<std::int64_t>(), std::optional(kChunk)}) {
      if (chunk && n <= *chunk) continue;
      const std::string case_name =
          "tanh(x@W).sum(-1) n=" + std::to_string(n) + (chunk ? " chunk 256" : "");
      report.progress("compiled: " + case_name);
      const auto options = kvmap::VmapOptions().chunk_size(chunk);
      auto vf = kvmap::vmap(per_sample, options);
      auto mb = kvmap::map_batches(run_dynamic, options);
      auto padded =
          kvmap::map_batches(run_static, kvmap::VmapOptions().chunk_size(kChunk).pad_to_chunk());
      struct Contender {
        std::string name;
        std::function<at::Tensor()> call;
      };
      std::vector<Contender> contenders = {
          {"direct batched", [&] { return per_sample(xl); }},
          {"kvmap::vmap", [&] { return vf(x).local(); }},
          {"kvmap::map_batches + AOTInductor", [&] { return mb(x).local(); }},
      };
      if (chunk)
        contenders.push_back({"kvmap::map_batches + AOTInductor (batch 256, padded)",
                              [&] { return padded(x).local(); }});
      else
        contenders.push_back({"AOTInductor, direct", [&] { return run_dynamic(xl); }});
      std::vector<double> errors;
      std::vector<std::function<void()>> ops;
      for (const Contender& c : contenders) {
        errors.push_back(kvmap::Detail::transport(comm).allreduce_max(
            require_close("compiled", case_name, c.name, c.call(), expected)));
        ops.push_back([&c] { (void)c.call(); });
      }
      const int reps = n <= 1024 ? 200 : (report.settings().quick ? 5 : 21);
      const auto t = measure_interleaved(comm, report.settings(), ops, reps);
      if (!chunk) direct_unchunked = t[0].median;
      for (std::size_t i = 0; i < contenders.size(); ++i) {
        std::map<std::string, double> figures = {{"error_over_bound", errors[i]}};
        if (i > 0) figures["over_direct"] = t[i].median / t[0].median;
        if (i > 0 && chunk) figures["over_direct_unchunked"] = t[i].median / direct_unchunked;
        report.add({"compiled", case_name, contenders[i].name, t[i], figures, {}});
      }
    }
  }
#else
  skipped("LibTorch " TORCH_VERSION
          " has no AOTInductor (torch::inductor::AOTIModelPackageLoader, >= 2.6)");
#endif
}

}  // namespace kvmap_perf
