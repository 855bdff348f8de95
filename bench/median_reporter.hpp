// Turns Google Benchmark's repetitions of each case into one row: the median time of one
// forward, its GFLOP/s and its fraction of the FMA peak at the case's thread count, as the
// probe measured it between the case's own repetitions.
#pragma once

#include <benchmark/benchmark.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_cases.hpp"
#include "fma_peak.hpp"

namespace attn::bench {

// FMA probe trials taken between each case's repetitions (fma_probe_gflops), by case name: on
// a shared machine a load that slows a case's repetitions slows its probes alike, so the
// fraction of their median is the kernel's, not the neighbours'.
class InterleavedProbes {
 public:
  void record(const std::string& name, double gflops) { trials_[name].push_back(gflops); }
  // The median of the case's trials, or 0 when it has none.
  double median(const std::string& name) const;

 private:
  std::map<std::string, std::vector<double>> trials_;
};

struct CaseResult {
  BenchCase bench_case;
  double seconds = 0.0;  // median over repetitions of (time of a repetition / its iterations)
  int repetitions = 0;
  double gflops = 0.0;
  double peak_gflops = 0.0;     // median of the probe trials between the case's repetitions
  double peak_fraction = 0.0;   // gflops / peak_gflops
  double ceiling_gflops = 0.0;  // the best of the probe trials before all cases
  // Weights cases: seconds / seconds of the forward case of the same shape and threads in
  // this run (0 when that case did not run).
  double vs_forward = 0.0;
};

// The --json object of one case: name, gflops, peak_gflops, peak_fraction, seconds, and the
// case's shape so that other tools (bench/peers.py) need not parse the name.
nlohmann::json to_json(const CaseResult& result);

class MedianReporter : public benchmark::BenchmarkReporter {
 public:
  // cases: by registered benchmark name. ceilings: by thread count. probes: filled while the
  // cases run.
  MedianReporter(std::map<std::string, BenchCase> cases, std::map<int, FmaPeak> ceilings,
                 const InterleavedProbes& probes);

  bool ReportContext(const Context& context) override;
  void ReportRuns(const std::vector<Run>& runs) override;

  // Each weights or backward case's median time over its forward case's, once every case has run
  // (fills vs_forward and prints a table).
  void report_ratios();

  const std::vector<CaseResult>& results() const { return results_; }
  // Names of cases whose runs reported an error.
  const std::vector<std::string>& failures() const { return failures_; }

 private:
  void report_case(const std::string& name, const std::vector<double>& seconds);

  std::map<std::string, BenchCase> cases_;
  std::map<int, FmaPeak> ceilings_;
  const InterleavedProbes& probes_;
  std::vector<CaseResult> results_;
  std::vector<std::string> failures_;
};

}  // namespace attn::bench
