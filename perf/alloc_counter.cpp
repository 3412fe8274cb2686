// Bytes allocated through operator new while counting is on (kvmap-perf's scale scenario):
// the global replacements count every C++ allocation of the process, libkvmap's included.
#include <atomic>
#include <cstdlib>
#include <new>

#include "harness.hpp"

#if defined(__CUDACC__)
// nvcc declares the global operator new __host__ __device__; these replacements run on the
// host only (a device allocation never reaches them).
#pragma nv_diag_suppress 20011
#endif

namespace {
std::atomic<bool> g_counting{false};
std::atomic<std::uint64_t> g_bytes{0};
std::atomic<std::uint64_t> g_count{0};

void* allocate(std::size_t n, std::size_t align) {
  if (g_counting.load(std::memory_order_relaxed)) {
    g_bytes.fetch_add(n, std::memory_order_relaxed);
    g_count.fetch_add(1, std::memory_order_relaxed);
  }
  void* p = nullptr;
  if (align <= alignof(std::max_align_t)) {
    p = std::malloc(n == 0 ? 1 : n);
  } else if (posix_memalign(&p, align, n == 0 ? align : n) != 0) {
    p = nullptr;
  }
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
}  // namespace

void* operator new(std::size_t n) {
  return allocate(n, alignof(std::max_align_t));
}
void* operator new[](std::size_t n) {
  return allocate(n, alignof(std::max_align_t));
}
void* operator new(std::size_t n, std::align_val_t a) {
  return allocate(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a) {
  return allocate(n, static_cast<std::size_t>(a));
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return allocate(n, alignof(std::max_align_t));
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return allocate(n, alignof(std::max_align_t));
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}

namespace kvmap_perf {
void count_allocations(bool on) {
  if (on) {
    g_bytes = 0;
    g_count = 0;
  }
  g_counting = on;
}
std::uint64_t allocated_bytes() {
  return g_bytes.load();
}
std::uint64_t allocations() {
  return g_count.load();
}
}  // namespace kvmap_perf
