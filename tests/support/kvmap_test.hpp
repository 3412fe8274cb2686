#pragma once
// Helpers shared by kvmap's MPI tests.
// LibTorch first: Debian's c10 pulls in glog, whose CHECK(condition) must be defined before
// doctest's CHECK(...) so that doctest's definition is the one the tests use, with or
// without precompiled headers.
#include <ATen/ATen.h>
#include <c10/util/Logging.h>

#include <doctest/doctest.h>

#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

#include "kvmap/kvmap.hpp"
#include "tensor_blocks.hpp"
#include "hooks.hpp"       // the transport, for the tests' own collectives
#include "test_space.hpp"  // TestMemSpace, generated per Kokkos backend

namespace kvmap_test {

using View = kvmap::DistView<TestMemSpace>;

inline kvmap::Comm world() {
  return kvmap::Comm::world();
}
inline int rank() {
  return world().rank();
}
inline int nranks() {
  return world().size();
}

// Every rank of the world, in order (what a failure on every rank names).
inline std::vector<int> all_ranks() {
  std::vector<int> r;
  for (int i = 0; i < nranks(); ++i) r.push_back(i);
  return r;
}

// Runs a collective `call` that must fail: ranks in `bad` expect exception E whose message
// contains `text`, every other rank a RemoteError naming exactly `bad` with that text too.
template <class E>
void expect_collective_error(const std::function<void()>& call, const std::vector<int>& bad,
                             const std::string& text) {
  const bool me_bad = std::find(bad.begin(), bad.end(), rank()) != bad.end();
  bool threw = false;
  try {
    call();
  } catch (const kvmap::RemoteError& e) {
    threw = true;
    INFO("rank " << rank() << " got RemoteError: " << std::string(e.what()));
    CHECK_FALSE(me_bad);
    CHECK(e.failed_ranks() == bad);
    CHECK(std::string(e.what()).find(text) != std::string::npos);
  } catch (const E& e) {
    threw = true;
    INFO("rank " << rank() << " got: " << std::string(e.what()));
    CHECK(me_bad);
    CHECK(std::string(e.what()).find(text) != std::string::npos);
  } catch (const std::exception& e) {
    threw = true;
    FAIL_CHECK("rank " << rank() << " got an unexpected exception: " << std::string(e.what()));
  }
  CHECK_MESSAGE(threw, "rank " << rank() << " did not throw");
}

// Calls body(sub) on the members of every prefix sub-communicator {0..k-1}, k = 1..P
// (collective over the world; ranks outside a prefix skip that round).
inline void for_each_prefix_comm(const std::function<void(const kvmap::Comm&)>& body) {
  const int me = rank();
  for (int k = 1; k <= nranks(); ++k) {
    MPI_Comm raw;
    MPI_Comm_split(MPI_COMM_WORLD, me < k ? 0 : MPI_UNDEFINED, me, &raw);
    if (me < k) {
      kvmap::Comm sub(raw);
      MPI_Comm_free(&raw);
      body(sub);
    }
  }
}

// The torch device of TestMemSpace. References are built on the host and moved there, so
// the same tests run on every Kokkos backend.
inline at::Device device() {
  return kvmap::Detail::torch_device(kvmap::Impl::device_of<TestMemSpace>());
}
inline at::Tensor on_device(const at::Tensor& t) {
  return t.to(device());
}
inline at::TensorOptions on_device(at::ScalarType type) {
  return at::TensorOptions().dtype(type).device(device());
}

// Ranks 1 (or 0 when alone): the rank tests make misbehave.
inline int odd_rank() {
  return nranks() > 1 ? 1 : 0;
}

// A deterministic full tensor whose values are exact in every dtype (integers in [0, 97)),
// on the test device.
inline at::Tensor pattern(const std::vector<int64_t>& shape, at::ScalarType type, int salt = 0) {
  const int64_t n = kvmap::Impl::checked_numel(shape);
  at::Tensor v = (at::arange(n, at::kLong) * 37 + salt * 11) % 97;
  at::Tensor t;
  if (type == at::kBool) {
    t = (v % 2).to(at::kBool);
  } else if (type == at::kComplexFloat || type == at::kComplexDouble) {
    t = at::complex(v.to(at::kFloat), (v % 5).to(at::kFloat)).to(type);
  } else {
    t = v.to(type);
  }
  return on_device(t.reshape(shape));
}

inline std::vector<kvmap::DType> all_dtypes() {
  std::vector<kvmap::DType> out;
  for (int i = 0; i < kvmap::kNumDTypes; ++i) out.push_back(static_cast<kvmap::DType>(i));
  return out;
}

// Bitwise equality of two tensors of the same dtype and shape.
inline bool bit_equal(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined()) return false;
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  at::Tensor ac = a.contiguous().cpu(), bc = b.contiguous().cpu();
  return ac.numel() == 0 ||
         std::memcmp(ac.data_ptr(), bc.data_ptr(), ac.numel() * ac.element_size()) == 0;
}

}  // namespace kvmap_test
