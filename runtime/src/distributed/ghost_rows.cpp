// Host loops that move a ghost exchange's rows (see ghost_rows.hpp).
#include "ghost_rows.hpp"

#include <ATen/Parallel.h>
#include <c10/core/ScalarType.h>

#include <cstring>
#include <type_traits>

namespace kvmap::Detail {

namespace {

constexpr std::int64_t kGrain = 2048;  // rows per task of at::parallel_for

// Copies one row: 8-byte words where the row is made of them (the common float32 x 2k and
// float64 rows), else memcpy.
inline void copy_row(char* to, const char* from, std::int64_t bytes) {
  if (bytes % 8 == 0) {
    for (std::int64_t w = 0; w < bytes; w += 8) {
      std::uint64_t word;
      std::memcpy(&word, from + w, 8);
      std::memcpy(to + w, &word, 8);
    }
  } else {
    std::memcpy(to, from, static_cast<std::size_t>(bytes));
  }
}

// to[to_rows[k]] = from[from_rows[k]] for every k, rows of `bytes`; to_shift and from_shift
// are added to the row numbers. Rows written are distinct (a gather), so tasks may split k.
void gather_rows(char* to, const std::int64_t* to_rows, std::int64_t to_shift, const char* from,
                 const std::int64_t* from_rows, std::int64_t from_shift, std::int64_t n,
                 std::int64_t bytes) {
  at::parallel_for(0, n, kGrain, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t k = begin; k < end; ++k) {
      const std::int64_t t = to_rows ? to_rows[k] + to_shift : k + to_shift;
      const std::int64_t f = from_rows ? from_rows[k] + from_shift : k + from_shift;
      copy_row(to + t * bytes, from + f * bytes, bytes);
    }
  });
}

// to[to_rows[k]] += from[from_rows[k]] in the order of k (rows may repeat: one task).
template <class T>
void sum_rows_into(T* to, const std::int64_t* to_rows, std::int64_t to_shift, const T* from,
                   const std::int64_t* from_rows, std::int64_t from_shift, std::int64_t n,
                   std::int64_t width) {
  for (std::int64_t k = 0; k < n; ++k) {
    T* t = to + ((to_rows ? to_rows[k] : k) + to_shift) * width;
    const T* f = from + ((from_rows ? from_rows[k] : k) + from_shift) * width;
    for (std::int64_t e = 0; e < width; ++e) t[e] += f[e];
  }
}

template <class F>
void with_float_type(const at::Tensor& x, F&& f) {
  if (x.scalar_type() == at::kDouble)
    f(static_cast<double*>(nullptr));
  else
    f(static_cast<float*>(nullptr));
}

// Zeroes `bytes` bytes at `to`; memset's pointer must not be null even for zero bytes, and an
// empty tensor's data pointer is.
inline void zero_bytes(void* to, std::int64_t bytes) {
  if (bytes > 0) std::memset(to, 0, static_cast<std::size_t>(bytes));
}

void copy_owned(const at::Tensor& in, at::Tensor& out, std::int64_t owned) {
  const std::int64_t bytes = ghost_row_bytes(in);
  const char* from = static_cast<const char*>(in.data_ptr());
  char* to = static_cast<char*>(out.data_ptr());
  at::parallel_for(0, owned, 4 * kGrain, [&](std::int64_t begin, std::int64_t end) {
    std::memcpy(to + begin * bytes, from + begin * bytes,
                static_cast<std::size_t>((end - begin) * bytes));
  });
}

}  // namespace

std::int64_t ghost_row_bytes(const at::Tensor& x) {
  std::int64_t bytes = static_cast<std::int64_t>(x.element_size());
  for (std::int64_t d = 1; d < x.dim(); ++d) bytes *= x.size(d);
  return bytes;
}

bool host_rows_apply(const at::Tensor& x, bool reverse) {
  if (!x.is_cpu() || !x.is_contiguous()) return false;
  return !reverse || x.scalar_type() == at::kDouble || x.scalar_type() == at::kFloat;
}

void host_forward_local(const GhostRoutes& r, std::int64_t owned, const at::Tensor& in,
                        at::Tensor& out, at::Tensor& sent) {
  const std::int64_t bytes = ghost_row_bytes(in);
  if (out.data_ptr() != in.data_ptr()) copy_owned(in, out, owned);
  const char* from = static_cast<const char*>(in.data_ptr());
  std::int64_t packed = 0;
  for (const GhostRoutes::Peer& p : r.sends) {
    const auto n = static_cast<std::int64_t>(p.rows.size());
    gather_rows(static_cast<char*>(sent.data_ptr()), nullptr, packed, from, p.rows.data(), 0, n,
                bytes);
    packed += n;
  }
  gather_rows(static_cast<char*>(out.data_ptr()), r.self_ghost.data(), owned, from,
              r.self_row.data(), 0, static_cast<std::int64_t>(r.self_ghost.size()), bytes);
}

void host_forward_remote(const GhostRoutes& r, std::int64_t owned, const at::Tensor& received,
                         at::Tensor& out) {
  gather_rows(static_cast<char*>(out.data_ptr()), r.remote_ghost.data(), owned,
              static_cast<const char*>(received.data_ptr()), r.remote_pos.data(), 0,
              static_cast<std::int64_t>(r.remote_ghost.size()), ghost_row_bytes(out));
}

void host_reverse_local(const GhostRoutes& r, std::int64_t owned, const at::Tensor& in,
                        at::Tensor& out, at::Tensor& received) {
  const std::int64_t bytes = ghost_row_bytes(in);
  copy_owned(in, out, owned);
  if (out.size(0) > owned)
    zero_bytes(static_cast<char*>(out.data_ptr()) + owned * bytes, (out.size(0) - owned) * bytes);
  zero_bytes(received.data_ptr(), received.size(0) * bytes);
  const std::int64_t width = bytes / static_cast<std::int64_t>(in.element_size());
  with_float_type(in, [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    sum_rows_into(received.data_ptr<T>(), r.remote_pos.data(), 0, in.data_ptr<T>(),
                  r.remote_ghost.data(), owned, static_cast<std::int64_t>(r.remote_ghost.size()),
                  width);
  });
}

void host_reverse_remote(const GhostRoutes& r, std::int64_t owned, const at::Tensor& in,
                         const at::Tensor& sent, at::Tensor& out) {
  const std::int64_t width = ghost_row_bytes(in) / static_cast<std::int64_t>(in.element_size());
  with_float_type(in, [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    std::int64_t packed = 0;
    for (const GhostRoutes::Peer& p : r.sends) {
      const auto n = static_cast<std::int64_t>(p.rows.size());
      sum_rows_into(out.data_ptr<T>(), p.rows.data(), 0, sent.data_ptr<T>(), nullptr, packed, n,
                    width);
      packed += n;
    }
    sum_rows_into(out.data_ptr<T>(), r.self_row.data(), 0, in.data_ptr<T>(), r.self_ghost.data(),
                  owned, static_cast<std::int64_t>(r.self_ghost.size()), width);
  });
}

}  // namespace kvmap::Detail
