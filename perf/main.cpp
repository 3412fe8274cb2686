// kvmap-perf: measures kvmap against the alternatives in the same run, under mpirun.
//   mpirun -np N kvmap-perf [--scenario NAME[,NAME...]] [--quick] [--json FILE]
//                           [--compiled DIR] [--version]
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <sstream>
#include <string>

#include "harness.hpp"
#include "kvmap/kvmap.hpp"

namespace {

const std::map<std::string, std::function<void(kvmap_perf::Report&)>>& scenarios() {
  static const std::map<std::string, std::function<void(kvmap_perf::Report&)>> s = {
      {"overhead", kvmap_perf::scenario_overhead},
      {"instructions", kvmap_perf::scenario_instructions},
      {"chunks", kvmap_perf::scenario_chunks},
      {"scaling", kvmap_perf::scenario_scaling},
      {"redistribution", kvmap_perf::scenario_redistribution},
      {"native", kvmap_perf::scenario_native},
      {"zero-copy", kvmap_perf::scenario_zero_copy},
      {"scale", kvmap_perf::scenario_scale},
      {"models", kvmap_perf::scenario_models},
      {"compiled", kvmap_perf::scenario_compiled},
      {"overlap", kvmap_perf::scenario_overlap},
  };
  return s;
}
const char* kOrder[] = {"zero-copy", "overhead", "models",         "compiled", "chunks",
                        "scaling",   "scale",    "redistribution", "native",   "overlap"};

int usage(int rc) {
  std::printf(
      "usage: mpirun -np N kvmap-perf [--scenario NAME[,NAME...]] [--quick] [--json FILE] "
      "[--compiled DIR] [--version]\n"
      "scenarios: zero-copy overhead models compiled chunks scaling scale redistribution native\n"
      "           overlap (default: all; compiled runs the AOTInductor programs that\n"
      "           perf/export_compiled.py DIR writes, given --compiled DIR),\n"
      "           instructions (under callgrind only: perf/instructions.py runs it)\n");
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--version") == 0) {
      std::printf("%s\n", kvmap::build_info());
      return 0;
    }
    if (std::strcmp(argv[i], "--help") == 0) return usage(0);
  }
  kvmap::ScopeGuard guard(argc, argv);
  int rc = 0;
  {
    kvmap_perf::Settings settings;
    std::vector<std::string> chosen;
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--quick") {
        settings.quick = true;
        settings.reps = 3;
      } else if (arg == "--json" && i + 1 < argc) {
        settings.json_path = argv[++i];
      } else if (arg == "--compiled" && i + 1 < argc) {
        settings.compiled_dir = argv[++i];
      } else if (arg == "--scenario" && i + 1 < argc) {
        std::stringstream ss(argv[++i]);
        std::string name;
        while (std::getline(ss, name, ',')) chosen.push_back(name);
      } else if (arg.rfind("--kokkos", 0) == 0) {
        continue;  // Kokkos' own options
      } else {
        std::fprintf(stderr, "kvmap-perf: unknown argument '%s'\n", arg.c_str());
        return usage(2);
      }
    }
    for (const auto& name : chosen) {
      if (!scenarios().count(name)) {
        std::fprintf(stderr, "kvmap-perf: unknown scenario '%s'\n", name.c_str());
        return usage(2);
      }
    }
    if (chosen.empty()) chosen.assign(std::begin(kOrder), std::end(kOrder));
    kvmap::Comm world = kvmap::Comm::world();
    kvmap_perf::Report report(world, settings);
    if (world.rank() == 0) {
      std::printf("kvmap-perf: %s, %d ranks%s\n", kvmap::build_info(), world.size(),
                  settings.quick ? ", quick" : "");
      for (const auto& [k, v] : kvmap_perf::machine())
        std::printf("  %s: %s\n", k.c_str(), v.c_str());
    }
    try {
      for (const auto& name : chosen) {
        scenarios().at(name)(report);
        report.print_scenario(name);
      }
      const int missed = report.evaluate_targets();
      report.print_scenario("targets");
      if (world.rank() == 0) {
        std::printf(
            "%d target(s) missed in this run (reported, not asserted: see docs/performance.md)\n",
            missed);
      }
      report.write_json();
    } catch (const std::exception& e) {
      // A contender that computes something else, or any failure, ends the whole job:
      // the other ranks may be waiting in a collective of the scenario.
      std::fprintf(stderr, "kvmap-perf (rank %d): %s\n", world.rank(), e.what());
      std::fflush(stderr);
      MPI_Abort(world.raw(), 1);
      rc = 1;
    }
  }
  return rc;
}
