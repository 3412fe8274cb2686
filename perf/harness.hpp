#pragma once
// kvmap-perf's measuring kit: repeated timed runs across ranks, records, output.
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kvmap/comm.hpp"
#include "kvmap/tolerance.hpp"

namespace kvmap_perf {

struct Settings {
  bool quick = false;
  int warmup = 1;
  int reps = 5;
  std::string json_path;
  std::string compiled_dir;  // the "compiled" scenario's programs (perf/export_compiled.py)
};

// Median and range of a run's wall time, each sample the slowest rank's time.
struct Timing {
  double median = 0, min = 0, max = 0;
  int reps = 0;
};

// Whether kvmap-perf's arrays (DistView<>, the default memory space) live in host memory, and
// the torch device they map to (scenarios put their tensors there).
bool on_host();
at::Device data_device();

// Times `op` (after `warmup` untimed calls) on every rank of comm.
Timing measure(const kvmap::Comm& comm, const Settings& s, const std::function<void()>& op,
               int reps_override = 0);

// Times several contenders round-robin (rep i of every contender before rep i + 1 of any),
// so drifts of a noisy machine hit all of them alike.
std::vector<Timing> measure_interleaved(const kvmap::Comm& comm, const Settings& s,
                                        const std::vector<std::function<void()>>& ops,
                                        int reps_override = 0);

// One line of the results: a scenario, a case, a contender and its figures.
struct Record {
  std::string scenario, case_name, contender;
  Timing time;
  std::map<std::string, double> figures;  // e.g. "ratio", "bytes_per_s", "peak_mib"
  std::map<std::string, std::string> notes;
};

class Report {
 public:
  Report(const kvmap::Comm& comm, Settings settings);
  void add(Record r);
  // Human table on rank 0; JSON lines (with the machine description) when asked.
  void print_scenario(const std::string& scenario) const;
  // Evaluates the project's performance targets on the figures measured in this run and
  // adds them as records of the scenario "targets" (one per target that was measured).
  // Returns how many measured targets were missed. Never fails the run: timings are
  // reported, not asserted.
  int evaluate_targets();
  void write_json() const;
  void progress(const std::string& line) const;
  const Settings& settings() const { return settings_; }
  const kvmap::Comm& comm() const { return comm_; }

 private:
  kvmap::Comm comm_;
  Settings settings_;
  std::vector<Record> records_;
};

// Description of the machine and build: cores, ranks, Kokkos backend, LibTorch, BLAS.
std::map<std::string, std::string> machine();

// Peak resident set since the last reset_peak_rss(), in MiB (Linux /proc).
void reset_peak_rss();
double peak_rss_mib();
double current_rss_mib();

// C++ allocations of the whole process (operator new) while counting is on; on() restarts.
void count_allocations(bool on);
std::uint64_t allocated_bytes();
std::uint64_t allocations();

// Throws std::runtime_error("...contender X computes something else...") unless ok: for
// results that must be exact (data movement, counters).
void require_same(bool ok, const std::string& scenario, const std::string& contender);

// What a floating-point contender must compute: the direct call's result (what the timings
// compare against), the same computation in float64, and the rounding-error bound that
// follows from the computation (kvmap::check_close).
struct Expected {
  at::Tensor direct;
  at::Tensor exact;
  kvmap::ErrorBound bound;
};

// Checks `actual` against expected.exact under expected.bound and returns error / bound at the
// worst element (reported as the figure "error_over_bound"). Outside the bound it throws: the
// message names the scenario, the case, the contender, the worst element, the contender's,
// the direct call's and the float64 value there, and the bound; no timing is reported.
double require_close(const std::string& scenario, const std::string& case_name,
                     const std::string& contender, const at::Tensor& actual,
                     const Expected& expected);

// The expected result of Heat's vmap comparison, f(x) = tanh(x@W).sum(-1), for `direct`
// computed on x (float64 and the rounding bound).
Expected tanh_sum_expected(const at::Tensor& direct, const at::Tensor& x, const at::Tensor& W);

std::string format_seconds(double s);

// Scenarios.
void scenario_overhead(Report& report);
void scenario_instructions(Report& report);
void scenario_chunks(Report& report);
void scenario_scaling(Report& report);
void scenario_redistribution(Report& report);
void scenario_native(Report& report);
void scenario_zero_copy(Report& report);
void scenario_scale(Report& report);
void scenario_models(Report& report);
void scenario_compiled(Report& report);
void scenario_overlap(Report& report);

}  // namespace kvmap_perf
