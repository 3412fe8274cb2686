// DistView::halo and kvmap::map_overlap at 1-4 ranks (every memory space of the build),
// against the gathered array padded as numpy.pad pads it, each rank's window cut out of it.
#include "support/kvmap_test.hpp"

#include <optional>
#include <vector>

using namespace kvmap_test;
using kvmap::Boundary;
using kvmap::DType;
using kvmap::Layout;
using kvmap::OverlapOptions;

namespace {

// numpy.pad of `full` along `axis` by (before, after) ("none": nothing added), then rank
// `r`'s window of it for `counts`.
at::Tensor reference_window(const at::Tensor& full, int axis,
                            const std::vector<std::int64_t>& counts, int r, std::int64_t before,
                            std::int64_t after, Boundary b, double constant) {
  const std::int64_t n = full.size(axis);
  std::int64_t start = 0;
  for (int q = 0; q < r; ++q) start += counts[static_cast<std::size_t>(q)];
  const std::int64_t own = counts[static_cast<std::size_t>(r)];
  std::int64_t lo = start - before, hi = start + own + after;
  if (b == Boundary::None) {
    lo = std::max<std::int64_t>(lo, 0);
    hi = std::min(hi, n);
  }
  std::vector<at::Tensor> rows;
  for (std::int64_t g = lo; g < hi; ++g) {
    std::int64_t s = g;
    if (g < 0 || g >= n) {
      switch (b) {
        case Boundary::Periodic: s = ((g % n) + n) % n; break;
        case Boundary::Reflect: s = g < 0 ? -g - 1 : 2 * n - g - 1; break;  // "symmetric"
        case Boundary::Nearest: s = g < 0 ? 0 : n - 1; break;               // "edge"
        default: s = -1; break;
      }
    }
    rows.push_back(s < 0 ? at::full_like(full.narrow(axis, 0, 1), constant)
                         : full.narrow(axis, s, 1));
  }
  if (rows.empty()) {
    std::vector<std::int64_t> shape(full.sizes().begin(), full.sizes().end());
    shape[static_cast<std::size_t>(axis)] = 0;
    return at::empty(shape, full.options());
  }
  return at::cat(rows, axis);
}

std::vector<std::int64_t> counts_with_empty_and_short(int P) {
  std::vector<std::int64_t> c(static_cast<std::size_t>(P), 1);
  if (P > 1) c[1] = 0;  // an empty rank
  c.back() += 2;
  return c;
}

View array_with_counts(const at::Tensor& full, int axis, const std::vector<std::int64_t>& counts) {
  std::int64_t start = 0;
  for (int q = 0; q < rank(); ++q) start += counts[static_cast<std::size_t>(q)];
  return View::from_local(
      full.narrow(axis, start, counts[static_cast<std::size_t>(rank())]).contiguous(), axis);
}

}  // namespace

TEST_CASE("halo: every boundary, balanced and uneven, split axis first and last") {
  const int P = nranks();
  for (Boundary b : {Boundary::None, Boundary::Periodic, Boundary::Reflect, Boundary::Nearest,
                     Boundary::Constant}) {
    for (int axis : {0, 2}) {
      for (bool uneven : {false, true}) {
        const std::vector<std::int64_t> counts =
            uneven ? counts_with_empty_and_short(P) : std::vector<std::int64_t>{};
        std::int64_t n = 3 * P + 1;
        if (uneven) {
          n = 0;
          for (auto c : counts) n += c;
        }
        std::vector<std::int64_t> shape{3, 2};
        shape.insert(shape.begin() + axis, n);
        const at::Tensor full = pattern(shape, at::kDouble, 11);
        const View x =
            uneven ? array_with_counts(full, axis, counts) : View::from_global(full, axis);
        const std::vector<std::int64_t> have = x.layout().counts();
        for (const auto& depth : {std::pair<std::int64_t, std::int64_t>{1, 1}, {2, 3}}) {
          // Named copies: INFO's lambda cannot capture structured bindings (clang 15).
          const std::int64_t before = depth.first, after = depth.second;
          INFO("boundary " << kvmap::name(b) << " axis " << axis << " uneven " << uneven
                           << " depth (" << before << ", " << after << ")");
          const at::Tensor ext = x.halo(OverlapOptions().depth(before, after).boundary(b, -4.5));
          if (have[static_cast<std::size_t>(rank())] == 0) {
            CHECK(ext.numel() == 0);
            continue;
          }
          CHECK(ext.is_contiguous());
          CHECK(at::equal(ext, reference_window(full, axis, have, rank(), before, after, b, -4.5)));
        }
      }
    }
  }
}

TEST_CASE("map_overlap: a stencil with trim, its own rows without, several arrays") {
  const int P = nranks();
  const at::Tensor full = pattern({4 * P + 3, 3}, at::kDouble, 12);
  const at::Tensor other = pattern({4 * P + 3, 2}, at::kFloat, 13);
  const View x = View::from_global(full, 0);
  const View y = View::from_global(other, 0);
  // A moving sum over 3 rows of x, plus y's rows: with trim kvmap removes the added rows.
  auto window_sum = [](const at::Tensor& b, const at::Tensor& c, double scale) {
    at::Tensor s = at::zeros_like(b);
    if (b.size(0) > 2)
      s.narrow(0, 1, b.size(0) - 2)
          .copy_(b.narrow(0, 0, b.size(0) - 2) + b.narrow(0, 1, b.size(0) - 2) +
                 b.narrow(0, 2, b.size(0) - 2));
    return std::make_tuple(s * scale, c.to(at::kDouble).sum(1, true));
  };
  auto [s, cs] = kvmap::map_overlap(
      window_sum, OverlapOptions().depth(1).boundary(Boundary::Nearest))(x, y, 0.5);
  const at::Tensor padded =
      at::cat({full.narrow(0, 0, 1), full, full.narrow(0, full.size(0) - 1, 1)}, 0);
  const at::Tensor want = (padded.narrow(0, 0, full.size(0)) + padded.narrow(0, 1, full.size(0)) +
                           padded.narrow(0, 2, full.size(0))) *
                          0.5;
  CHECK(at::equal(s.allgather(), want));
  CHECK(at::equal(cs.allgather(), other.to(at::kDouble).sum(1, true)));
  CHECK(s.layout() == x.layout());
  // Without trim, f returns its own rows.
  auto own_rows = [](const at::Tensor& b) { return b.narrow(0, 1, b.size(0) - 2) * 3; };
  const View t = kvmap::map_overlap(
      own_rows, OverlapOptions().depth(1).boundary(Boundary::Periodic).trim(false))(x);
  CHECK(at::equal(t.allgather(), full * 3));
}

TEST_CASE("map_overlap: bad input is a ValueError on every rank, f's failure is agreed") {
  const int P = nranks();
  const View x = View::from_global(pattern({2 * P + 1, 3}, at::kDouble, 14), 0);
  auto same = [](const at::Tensor& b) { return b * 1; };
  expect_collective_error<kvmap::ValueError>(
      [&] { kvmap::map_overlap(same, OverlapOptions().depth(-1))(x); }, all_ranks(),
      "depth must be >= 0");
  expect_collective_error<kvmap::ValueError>(
      [&] {
        kvmap::map_overlap(same, OverlapOptions().depth(2 * P + 2).boundary(Boundary::Reflect))(x);
      },
      all_ranks(), "exceeds the");
  const View r = View::from_global(pattern({2 * P + 1, 3}, at::kDouble, 14), std::nullopt);
  expect_collective_error<kvmap::ValueError>(
      [&] { kvmap::map_overlap(same, OverlapOptions().depth(1))(r); }, all_ranks(), "replicated");
  // An output of the wrong extent: every rank that runs f (all here) raises ValueError.
  expect_collective_error<kvmap::ValueError>(
      [&] {
        kvmap::map_overlap([](const at::Tensor& b) { return b.narrow(0, 0, 1); },
                           OverlapOptions().depth(1).boundary(Boundary::Periodic))(x);
      },
      all_ranks(), "along the split axis 0 it must have");
  // f fails on one rank: that rank's error there, RemoteError elsewhere.
  const int odd = odd_rank();
  expect_collective_error<kvmap::TypeError>(
      [&] {
        kvmap::map_overlap(
            [&](const at::Tensor& b) {
              if (rank() == odd) throw kvmap::TypeError("no model on this rank");
              return b * 1;
            },
            OverlapOptions().depth(1))(x);
      },
      {odd}, "no model on this rank");
  // The communicator carries on.
  const View ok = kvmap::map_overlap(same, OverlapOptions().depth(1))(x);
  CHECK(at::equal(ok.allgather(), x.allgather()));
}
