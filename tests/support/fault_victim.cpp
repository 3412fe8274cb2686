// A kvmap job that runs collectives until it is killed: each rank writes its pid to
// <dir>/rank<r>.pid, then loops over redistributions and vmaps. Used by kill_rank.py.
#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <unistd.h>

#include "kvmap/kvmap.hpp"

int main(int argc, char** argv) {
  kvmap::ScopeGuard guard(argc, argv);
  {
    const std::string dir = argc > 1 ? argv[1] : ".";
    const kvmap::Comm world = kvmap::Comm::world();
    {
      std::ofstream pid(dir + "/rank" + std::to_string(world.rank()) + ".pid");
      pid << getpid() << "\n";
    }
    world.barrier();
    auto x = kvmap::random::normal({4096, 32}, kvmap::DType::Float32, 0, world, 1);
    const auto start = std::chrono::steady_clock::now();
    // Bounded, so a lost signal cannot leave it running for ever.
    while (std::chrono::steady_clock::now() - start < std::chrono::seconds(120)) {
      auto y =
          kvmap::vmap([](const at::Tensor& v) { return v.tanh().sum(); })(x.resplit(1).resplit(0));
      (void)y;
    }
  }
  return 0;
}
